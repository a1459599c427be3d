//! One-off upgrades of what an older version stored (README, "Upgrading"). Each is idempotent,
//! safe to stop at any point and to run again, and run by the archiver function on request.

use aws_sdk_dynamodb::types::AttributeValue;
use chat_domain::error::ChatError;
use chat_domain::{ConversationId, UserId};

use super::attrs::{get_s, Item};
use super::retry::Deadline;
use super::{keys, sdk_error, ChatStore};

/// What `migrate_member_shards` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberMigration {
    /// Items scanned (of the whole table).
    pub scanned: u64,
    /// Members moved to their shard.
    pub moved: u64,
    /// False when the deadline came first: run it again (what moved is not scanned for again).
    pub done: bool,
}

/// Parallel scan segments.
const SEGMENTS: i32 = 4;

impl ChatStore {
    /// Moves group members written before the member shards, `pk = M#<conversationId>`, to
    /// their shard's partition (`keys::member_key`), which is all this version reads. Per such
    /// member: a PutItem of the new key only if absent (a member that re-joined since keeps its
    /// newer item), then the DeleteItem of the old one; stopped in between, the next run deletes
    /// it. DynamoDB: a Scan of the table in 4 parallel segments (only member items returned).
    pub async fn migrate_member_shards(
        &self,
        until: Deadline,
    ) -> Result<MemberMigration, ChatError> {
        let segments = (0..SEGMENTS).map(|segment| self.migrate_segment(segment, until));
        let mut total = MemberMigration {
            done: true,
            ..Default::default()
        };
        for part in futures::future::try_join_all(segments).await? {
            total.scanned += part.scanned;
            total.moved += part.moved;
            total.done &= part.done;
        }
        Ok(total)
    }

    async fn migrate_segment(
        &self,
        segment: i32,
        until: Deadline,
    ) -> Result<MemberMigration, ChatError> {
        let mut report = MemberMigration::default();
        let mut start = None;
        loop {
            if until.passed() {
                return Ok(report);
            }
            let page = self
                .db
                .scan()
                .table_name(&self.table)
                .segment(segment)
                .total_segments(SEGMENTS)
                .filter_expression("begins_with(pk, :m) AND begins_with(sk, :m)")
                .expression_attribute_values(":m", AttributeValue::S("M#".into()))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| sdk_error("Scan", e))?;
            report.scanned += page.scanned_count().max(0) as u64;
            for item in page.items.unwrap_or_default() {
                if let Some(moved) = sharded(&item) {
                    self.move_member(item, moved).await?;
                    report.moved += 1;
                }
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        report.done = true;
        Ok(report)
    }

    /// 1 PutItem (if absent), 1 DeleteItem.
    async fn move_member(&self, old: Item, new: Item) -> Result<(), ChatError> {
        let put = self
            .db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(new))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        if let Err(e) = put {
            if !e
                .as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception())
            {
                return Err(sdk_error("PutItem", e));
            }
        }
        let key = keys::key(
            get_s(&old, keys::PK).unwrap_or_default().to_owned(),
            get_s(&old, keys::SK).unwrap_or_default(),
        );
        self.db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .send()
            .await
            .map_err(|e| sdk_error("DeleteItem", e))?;
        Ok(())
    }
}

/// The item at its shard's key, if `item` is a group's member in the layout before the shards
/// (`pk = M#<conversationId>` of a group; a direct conversation's members stay there).
fn sharded(item: &Item) -> Option<Item> {
    let id = ConversationId::parse(get_s(item, keys::PK)?.strip_prefix("M#")?)?;
    let user = UserId::parse(get_s(item, keys::SK)?.strip_prefix("M#")?)?;
    if keys::member_shards(&id) == 1 {
        return None;
    }
    let mut moved = item.clone();
    moved.extend(keys::member_key(&id, &user));
    Some(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(pk: &str, user: &str) -> Item {
        Item::from([
            (keys::PK.to_owned(), AttributeValue::S(pk.to_owned())),
            (keys::SK.to_owned(), AttributeValue::S(format!("M#{user}"))),
            ("lastReadSeq".to_owned(), AttributeValue::N("7".into())),
        ])
    }

    #[test]
    fn only_a_groups_members_in_the_old_layout_move() {
        let u = UserId::parse("u1").unwrap();
        let group = ConversationId::group(&u, None);
        let moved = sharded(&member(&format!("M#{group}"), "u1")).expect("moves");
        assert_eq!(moved, {
            let mut m = member("", "u1");
            m.extend(keys::member_key(&group, &u));
            m
        });
        let new_layout = get_s(&moved, keys::PK).unwrap().to_owned();
        assert_ne!(new_layout, format!("M#{group}"));
        assert_eq!(sharded(&moved), None, "already in its shard");
        let direct = ConversationId::direct(&u, &UserId::parse("u2").unwrap());
        assert_eq!(sharded(&member(&format!("M#{direct}"), "u1")), None);
    }
}
