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
    /// Moves what an older version stored where this one no longer reads it (`relocated`): group
    /// members written before the member shards, `pk = M#<conversationId>`, to their shard's
    /// partition; a direct conversation's members (`pk = M#<conversationId>`) and change head
    /// (`pk = H#<conversationId>, sk = H`), written before they joined its log partition, into it
    /// (`keys::member_key`, `keys::change_head_key`). Per such item: a PutItem of the new key only
    /// if absent (a member that re-joined since, or a head a change has written since, keeps its
    /// newer item), then the DeleteItem of the old one; stopped in between, the next run deletes
    /// it. DynamoDB: a Scan of the table in 4 parallel segments (only those items returned).
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
                .filter_expression(
                    "(begins_with(pk, :m) AND begins_with(sk, :m)) \
                     OR (begins_with(pk, :h) AND sk = :head)",
                )
                .expression_attribute_values(":m", AttributeValue::S("M#".into()))
                .expression_attribute_values(":h", AttributeValue::S("H#d-".into()))
                .expression_attribute_values(
                    ":head",
                    AttributeValue::S(keys::CHANGE_HEAD_SK.into()),
                )
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| sdk_error("Scan", e))?;
            report.scanned += page.scanned_count().max(0) as u64;
            for item in page.items.unwrap_or_default() {
                if let Some(moved) = relocated(&item) {
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

/// The item at the key this version reads it from, if `item` is in a layout it no longer reads:
/// a group's member in the partition before the shards (`pk = M#<conversationId>`), or a direct
/// conversation's member or change head outside its log partition (`pk = M#…`, `pk = H#…`).
fn relocated(item: &Item) -> Option<Item> {
    let (pk, sk) = (get_s(item, keys::PK)?, get_s(item, keys::SK)?);
    let new_key = if let Some(id) = pk.strip_prefix("M#").and_then(ConversationId::parse) {
        keys::member_key(&id, &UserId::parse(sk.strip_prefix("M#")?)?)
    } else {
        let id = ConversationId::parse(pk.strip_prefix("H#")?)?;
        if sk != keys::CHANGE_HEAD_SK {
            return None;
        }
        keys::change_head_key(&id)
    };
    if get_s(&new_key, keys::PK) == Some(pk) {
        return None;
    }
    let mut moved = item.clone();
    moved.extend(new_key);
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
    fn members_and_heads_in_an_old_layout_move_and_nothing_else() {
        let u = UserId::parse("u1").unwrap();
        let group = ConversationId::group(&u, None);
        let moved = relocated(&member(&format!("M#{group}"), "u1")).expect("moves");
        assert_eq!(moved, {
            let mut m = member("", "u1");
            m.extend(keys::member_key(&group, &u));
            m
        });
        let new_layout = get_s(&moved, keys::PK).unwrap().to_owned();
        assert_ne!(new_layout, format!("M#{group}"));
        assert_eq!(relocated(&moved), None, "already in its shard");

        let direct = ConversationId::direct(&u, &UserId::parse("u2").unwrap());
        let moved = relocated(&member(&format!("M#{direct}"), "u1")).expect("moves");
        assert_eq!(
            get_s(&moved, keys::PK),
            Some(format!("C#{direct}").as_str())
        );
        assert_eq!(
            moved.get("lastReadSeq"),
            Some(&AttributeValue::N("7".into()))
        );
        assert_eq!(relocated(&moved), None, "already in the log partition");

        let head = |pk: String, sk: &str| {
            Item::from([
                (keys::PK.to_owned(), AttributeValue::S(pk)),
                (keys::SK.to_owned(), AttributeValue::S(sk.to_owned())),
                ("changeSeq".to_owned(), AttributeValue::N("3".into())),
            ])
        };
        let moved = relocated(&head(format!("H#{direct}"), "H")).expect("moves");
        assert_eq!(moved, head(format!("C#{direct}"), "H"));
        assert_eq!(relocated(&moved), None);
        // A group's head stays in its change log; records and keys are never moved.
        assert_eq!(relocated(&head(format!("H#{group}"), "H")), None);
        assert_eq!(
            relocated(&head(format!("H#{direct}"), "H#00000000000000000001")),
            None
        );
        assert_eq!(relocated(&head(format!("C#{direct}"), "C")), None);
    }
}
