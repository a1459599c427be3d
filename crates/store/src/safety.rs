//! Safety (docs/api.md §27–§30, docs/data-model.md §10): blocks, bans, reports and suspensions.

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{json, Value};

use super::attrs::{get_s, Item};
use super::conversations::ban_version_is;
use super::items::SuspensionItem;
use super::items::{from_item, to_item, BanItem, BlockItem, ReportItem};
use super::{keys, reason_failed, sdk_error, tx, ChatStore, TxOutcome};
use chat_domain::conversation::{check_ban, check_membership_change, check_not_banned};
use chat_domain::error::ChatError;
use chat_domain::safety::{cursor, PageQuery, ReportRequest, REPORT_TTL_SECS};
use chat_domain::{ConversationId, UserId};

/// How long a suspension state read stays true in an instance: none, deployed (every request
/// reads it, so a suspension reaches every instance at once; docs/cost.md "Suspensions"). Tests
/// that count a handler's own calls remember it longer (`ChatStore::with_suspension_ttl`).
pub const SUSPENSION_TTL: std::time::Duration = std::time::Duration::ZERO;

impl ChatStore {
    /// `blockUser` / `unblockUser`: the block item, and in the same transaction the mark on the
    /// blocked user's member item of their direct conversation (if there is one), on which every
    /// send of theirs there conditions (`blocked`), so a send either commits before the block or
    /// is refused. Without the conversation, the transaction checks it is still absent; its
    /// creation checks the block items in turn (`create_direct`). DynamoDB: 1 TransactWriteItems
    /// (2 when the first guess about the conversation was wrong).
    pub async fn set_block(
        &self,
        blocker: &UserId,
        blocked: &UserId,
        on: bool,
    ) -> Result<(), ChatError> {
        let table = &self.table;
        let key = keys::block_key(blocker, blocked);
        let block = if on {
            let item = BlockItem {
                user_id: blocked.clone(),
                created_at: chat_domain::time::now_rfc3339(),
            };
            let mut full = to_item(&item, String::new(), "")?;
            full.extend(key);
            tx::put(table, full, None, &[])?
        } else {
            tx::delete_unconditionally(table, key)?
        };
        let member = keys::member_key(&ConversationId::direct(blocker, blocked), blocked);
        let mut exists = true;
        let mut retry = self.retry();
        while retry.next().await {
            let mark = match (exists, on) {
                (true, true) => tx::update(
                    table,
                    member.clone(),
                    "SET blocked = :t",
                    Some("attribute_exists(pk)"),
                    &[(":t", AttributeValue::Bool(true))],
                )?,
                (true, false) => tx::update(
                    table,
                    member.clone(),
                    "REMOVE blocked",
                    Some("attribute_exists(pk)"),
                    &[],
                )?,
                (false, _) => tx::check(table, member.clone(), "attribute_not_exists(pk)", &[])?,
            };
            match self.transact(vec![block.clone(), mark]).await? {
                TxOutcome::Committed => return Ok(()),
                TxOutcome::Cancelled(r) if reason_failed(&r, 1).is_some() => exists = !exists,
                _ => {}
            }
        }
        Err(ChatError::Throttled)
    }

    /// `blocks`: the users the caller blocks, by id. DynamoDB: 1 Query.
    pub async fn blocks(&self, caller: &UserId, page: &PageQuery) -> Result<Value, ChatError> {
        let (items, next) = self
            .page_of(keys::blocks_pk(caller), keys::BLOCK_PREFIX, page)
            .await?;
        let blocks = items
            .into_iter()
            .map(from_item::<BlockItem, _>)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(json!({"blocks": blocks, "nextCursor": next}))
    }

    /// Which of `pairs` (blocker, blocked) are blocks: strongly consistent BatchGetItem of their
    /// keys, 100 a call.
    pub(crate) async fn blocks_among(
        &self,
        pairs: &[(&UserId, &UserId)],
    ) -> Result<Vec<(UserId, UserId)>, ChatError> {
        let mut found = Vec::new();
        for chunk in pairs.chunks(100) {
            let wanted = chunk.iter().map(|(a, b)| keys::block_key(a, b)).collect();
            for item in self.batch_get(wanted, true).await? {
                let blocker = get_s(&item, keys::PK)
                    .and_then(|pk| pk.strip_prefix(keys::BLOCK_PREFIX))
                    .and_then(UserId::parse);
                let block: BlockItem = from_item(item)?;
                if let Some(b) = blocker {
                    found.push((b, block.user_id));
                }
            }
        }
        Ok(found)
    }

    /// Refuses (`403 blocked`) adding any of `users` who blocks `caller`. DynamoDB: 1
    /// BatchGetItem per 100 users.
    pub(crate) async fn check_not_blocked_by(
        &self,
        caller: &UserId,
        users: &[&UserId],
    ) -> Result<(), ChatError> {
        let pairs: Vec<(&UserId, &UserId)> = users.iter().map(|u| (*u, caller)).collect();
        match self.blocks_among(&pairs).await?.first() {
            Some((blocker, _)) => Err(ChatError::Blocked(format!(
                "user {blocker} has blocked you"
            ))),
            None => Ok(()),
        }
    }

    /// Who may be added to `id` by `caller`: nobody banned from it (`403 forbidden`), nobody who
    /// blocks `caller` (`403 blocked`). 1 strongly consistent BatchGetItem of both kinds of keys
    /// (≤ 49 users: 98 keys).
    pub(crate) async fn check_admission(
        &self,
        caller: &UserId,
        id: &ConversationId,
        users: &[&UserId],
    ) -> Result<(), ChatError> {
        if users.is_empty() {
            return Ok(());
        }
        let bans = users.iter().map(|u| keys::ban_key(id, u));
        let blocks = users.iter().map(|u| keys::block_key(u, caller));
        let found = self.batch_get(bans.chain(blocks).collect(), true).await?;
        let (mut banned, mut blockers) = (Vec::new(), Vec::new());
        for item in found {
            let pk = get_s(&item, keys::PK).unwrap_or_default().to_owned();
            match pk.strip_prefix(keys::BLOCK_PREFIX).and_then(UserId::parse) {
                Some(blocker) => blockers.push(blocker),
                None => banned.push(from_item::<BanItem, _>(item)?.user_id),
            }
        }
        check_not_banned(users, &banned)?;
        match blockers.first() {
            Some(blocker) => Err(ChatError::Blocked(format!(
                "user {blocker} has blocked you"
            ))),
            None => Ok(()),
        }
    }

    /// `banMember`: the ban item, `banVersion` + 1 (which every add conditions on), and, if the
    /// user is a member, its removal, in one transaction conditioned on what was read.
    /// `unbanMember`: the ban item deleted. Owner and admins only. DynamoDB: 1 BatchGetItem
    /// (conversation, caller, target) + 1 TransactWriteItems (a DeleteItem to lift a ban).
    pub async fn set_ban(
        &self,
        caller: &UserId,
        id: &ConversationId,
        target: &UserId,
        on: bool,
    ) -> Result<(), ChatError> {
        let mut retry = self.retry();
        while retry.next().await {
            let (conversation, target_member) = self.read_membership(caller, id, target).await?;
            check_membership_change(conversation.kind)?;
            check_ban(
                caller,
                target,
                conversation.owner_id.as_ref(),
                &conversation.admin_ids,
            )?;
            if !on {
                let lifted = self
                    .db
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(keys::ban_key(id, target)))
                    .send()
                    .await;
                return lifted.map(|_| ()).map_err(|e| sdk_error("DeleteItem", e));
            }
            let ban = BanItem {
                user_id: target.clone(),
                banned_by: caller.clone(),
                created_at: chat_domain::time::now_rfc3339(),
            };
            let mut item = to_item(&ban, String::new(), "")?;
            item.extend(keys::ban_key(id, target));
            let mut parts = vec![tx::put(&self.table, item, None, &[])?];
            if target_member {
                parts.extend(self.removal_parts(&conversation, target, true)?);
            } else {
                let (condition, mut values) = ban_version_is(conversation.ban_version);
                values.push((":one", super::attrs::n(1)));
                parts.push(tx::update(
                    &self.table,
                    keys::conversation_key(id),
                    "ADD banVersion :one",
                    Some(condition),
                    &values,
                )?);
                parts.push(tx::check(
                    &self.table,
                    keys::member_key(id, target),
                    "attribute_not_exists(pk)",
                    &[],
                )?);
            }
            if let TxOutcome::Committed = self.transact(parts).await? {
                return Ok(());
            }
        }
        Err(ChatError::Throttled)
    }

    /// `reportMessage`: a snapshot of the message as the caller (a member) sees it now, kept
    /// with the report for 30 days (the table's TTL), apart from the message, so that neither an
    /// edit nor a deletion changes it (docs/api.md §19, §29). DynamoDB: the message's read
    /// (`message_for_member`) + 1 PutItem.
    pub async fn report(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        request: &ReportRequest,
    ) -> Result<Value, ChatError> {
        let message = self.message_for_member(caller, id, seq).await?;
        let now = chat_domain::time::now();
        let report = ReportItem {
            report_id: uuid::Uuid::new_v4().to_string(),
            conversation_id: id.clone(),
            seq,
            reporter_id: caller.clone(),
            reason: request.reason,
            note: request.note.clone(),
            created_at: chat_domain::time::rfc3339(now),
            message,
            ttl: chat_domain::time::unix_seconds(now) + REPORT_TTL_SECS,
        };
        let sk = keys::report_sk(&report.created_at, &report.report_id);
        let item = to_item(&report, keys::REPORTS_PK.to_owned(), sk)?;
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| sdk_error("PutItem", e))?;
        Ok(json!({"reportId": report.report_id, "createdAt": report.created_at}))
    }

    /// `moderationReports`: open reports, oldest first, each snapshot's files with fresh URLs
    /// as on any read (a moderator judges a photo by looking at it; found by probing: they had
    /// none). Signing is local; a deleted message's files are gone, and their URLs say so (403).
    /// DynamoDB: 1 Query.
    pub async fn reports(&self, page: &PageQuery) -> Result<Value, ChatError> {
        let (items, next) = self
            .page_of(keys::REPORTS_PK.to_owned(), keys::REPORT_PREFIX, page)
            .await?;
        let mut reports = items
            .into_iter()
            .map(from_item::<ReportItem, _>)
            .collect::<Result<Vec<_>, ChatError>>()?;
        for r in &mut reports {
            let m = &mut r.message;
            self.sign_attachment_list(&m.conversation_id, &mut m.attachments)
                .await?;
        }
        let reports = reports
            .into_iter()
            .map(|r| {
                let mut r = serde_json::to_value(r).map_err(ChatError::internal)?;
                r.as_object_mut().map(|o| o.remove("ttl"));
                Ok(r)
            })
            .collect::<Result<Vec<_>, ChatError>>()?;
        Ok(json!({"reports": reports, "nextCursor": next}))
    }

    /// One page of the items of `pk` whose sort key starts with `prefix`, after the cursor, and
    /// the cursor of the next page (None: the last). 1 strongly consistent Query (a block or a
    /// report shows in the next list).
    async fn page_of(
        &self,
        pk: String,
        prefix: &str,
        page: &PageQuery,
    ) -> Result<(Vec<Item>, Option<String>), ChatError> {
        let mut q = self
            .db
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :p)")
            .consistent_read(true)
            .expression_attribute_values(":pk", AttributeValue::S(pk.clone()))
            .expression_attribute_values(":p", AttributeValue::S(prefix.to_owned()))
            // One more than the page: a page that ends the list says so (no cursor to an
            // empty page).
            .limit(page.limit as i32 + 1);
        if let Some(after) = &page.after {
            q = q.set_exclusive_start_key(Some(keys::key(pk, after.clone())));
        }
        let out = q.send().await.map_err(|e| sdk_error("Query", e))?;
        let stopped_early = out.last_evaluated_key.is_some();
        let mut items = out.items.unwrap_or_default();
        let more = items.len() > page.limit as usize;
        items.truncate(page.limit as usize);
        // More, or DynamoDB stopped at 1 MB before the page was full: on from the last shown.
        let next = if more || stopped_early {
            items.last().and_then(|i| get_s(i, keys::SK)).map(cursor)
        } else {
            None
        };
        Ok((items, next))
    }

    /// `suspendUser` / `unsuspendUser` (moderators): the suspension item put or deleted, then
    /// the user's limits item marked or unmarked (`mark_suspended`: every instance refuses the
    /// user's sends at once, whatever it remembered). DynamoDB: 1 PutItem or DeleteItem, 1
    /// UpdateItem (with rate limits on).
    pub async fn set_suspension(
        &self,
        moderator: &UserId,
        user: &UserId,
        on: bool,
    ) -> Result<(), ChatError> {
        let key = keys::suspension_key(user);
        let done = if on {
            let item = SuspensionItem {
                user_id: user.clone(),
                suspended_by: moderator.clone(),
                created_at: chat_domain::time::now_rfc3339(),
            };
            let mut full = to_item(&item, String::new(), "")?;
            full.extend(key);
            let put = self
                .db
                .put_item()
                .table_name(&self.table)
                .set_item(Some(full));
            put.send()
                .await
                .map(|_| ())
                .map_err(|e| sdk_error("PutItem", e))
        } else {
            let delete = self
                .db
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(key));
            delete
                .send()
                .await
                .map(|_| ())
                .map_err(|e| sdk_error("DeleteItem", e))
        };
        done?;
        suspensions::learn(user, on);
        self.mark_suspended(user, on).await
    }

    /// Whether `user` is suspended: what every request checks (docs/api.md §30; a send under rate
    /// limits is checked by its limit's own write instead). Read afresh unless known in this
    /// instance for `with_suspension_ttl` (none by default). DynamoDB: none when known, else 1
    /// eventually consistent GetItem of a key (0.5 read units); no answer: `Throttled`.
    pub async fn is_suspended(&self, user: &UserId) -> Result<bool, ChatError> {
        if let Some(known) = suspensions::known(user, self.suspension_ttl) {
            return Ok(known);
        }
        // Nothing was done yet: a read that got no answer refuses the request with a 429.
        self.read_suspension(user, false)
            .await
            .map_err(super::nothing_done)
    }

    /// Whether `user` is suspended now, whatever this instance knew: what a WebSocket `$connect`
    /// asks after registering its connection. A suspension writes its item before it reads the
    /// user's connections to close them, so either it finds this connection or this read finds
    /// it (a connection that outlived a suspension would take the user's pushes until it
    /// closed). DynamoDB: 1 strongly consistent GetItem of a key (1 read unit).
    pub async fn is_suspended_now(&self, user: &UserId) -> Result<bool, ChatError> {
        self.read_suspension(user, true).await
    }

    async fn read_suspension(&self, user: &UserId, consistent: bool) -> Result<bool, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::suspension_key(user)))
            .projection_expression("pk")
            .consistent_read(consistent)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        let suspended = out.item.is_some();
        suspensions::learn(user, suspended);
        Ok(suspended)
    }
}

/// What this instance (a process: one Lambda instance) knows of users' suspensions, and since
/// when.
mod suspensions {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use chat_domain::UserId;

    /// Users remembered at most (then forgotten all at once: a cache, not a store).
    const MAX: usize = 10_000;

    fn map() -> &'static Mutex<HashMap<UserId, (bool, Instant)>> {
        static MAP: OnceLock<Mutex<HashMap<UserId, (bool, Instant)>>> = OnceLock::new();
        MAP.get_or_init(Default::default)
    }

    pub fn known(user: &UserId, ttl: Duration) -> Option<bool> {
        let m = map().lock().ok()?;
        m.get(user)
            .filter(|(_, at)| at.elapsed() < ttl)
            .map(|(s, _)| *s)
    }

    pub fn learn(user: &UserId, suspended: bool) {
        if let Ok(mut m) = map().lock() {
            if m.len() >= MAX {
                m.clear();
            }
            m.insert(user.clone(), (suspended, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::suspensions::{known, learn};
    use chat_domain::UserId;
    use std::time::Duration;

    #[test]
    fn a_suspension_state_is_known_for_its_ttl_and_then_read_again() {
        let user = UserId::parse(&format!("u-{}", uuid::Uuid::new_v4().simple())).unwrap();
        assert_eq!(known(&user, Duration::from_secs(10)), None, "never read");
        learn(&user, true);
        assert_eq!(known(&user, Duration::from_secs(10)), Some(true));
        learn(&user, false);
        assert_eq!(
            known(&user, Duration::from_secs(10)),
            Some(false),
            "lifted here: at once"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            known(&user, Duration::from_millis(10)),
            None,
            "past the ttl: read again"
        );
    }
}
