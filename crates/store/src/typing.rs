//! Typing state and presence in ConnectionsTable (docs/data-model.md, "Typing and presence").
//!
//! | pk | sk | item |
//! |---|---|---|
//! | `Y#<conversationId>` | `T#<connectionId>` | one typing connection: `userId`, `startedAt` (ms, its last accepted start), `stoppedAt` (ms, a `stop` or the close since), `expiresAt` (TTL, 2 h after the last change) |
//! | `Y#<conversationId>` | `S` | the last push's claim: `sentAt` (ms, when claimed), `readAt` (ms, when its claimant reads the set, at the earliest), `expiresAt` (TTL, an hour) |
//! | `Y#<conversationId>` | `S#<userId>` | in a direct conversation, the same per recipient: each change there is news to one member only (the other's own typing is left out of what they are sent), so each member's frames are throttled alone (SPEC §16: a second per recipient) |
//! | `U#<userId>` | `P` | presence (connections.rs), with `lastActiveAt` (ms) written when a connection closes |
//! | `U#<userId>` | `V` | `hidden`, `hiddenAt` (ms): the user shows offline (no TTL: it outlives connections) |
//! | `U#<userId>` | `Q` | the last presence push: `online` as pushed, `sentAt` (ms), `expiresAt` (TTL, a day) |
//! | `W#<connectionId>` | `U` | owner (connections.rs), with `typingIn`: the conversations it typed in, for `$disconnect` |
//!
//! A `start` or `stop` writes its connection's item alone (≤ ~300 bytes with a 128-character user
//! id: 1 write unit however many type and however long their ids); the set is one strongly
//! consistent Query of the conversation's items; a push (at most one a second per conversation)
//! is claimed by a conditional PutItem of the small `S` item, and its claimant reads the set
//! after the claim (chat_domain::typing::push_due).

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};

use super::attrs::{get_n, get_s, Item};
use super::connections::{
    conditional_failed, done_unless_failed, ConnectionStore, CONNECTION_TTL_SECS,
};
use super::{batch_get, keys, sdk_error};
use crate::retry::Deadline;
use chat_domain::error::ChatError;
use chat_domain::typing::{
    presence_of, start_cutoff, LastPush, Presence, TypingEntry, TYPING_TTL_MS,
};
use chat_domain::{ConversationId, UserId};

/// How long the last push's claim of a quiet conversation is kept before TTL removes it.
const SENT_ITEM_TTL_SECS: i64 = 60 * 60;
/// How long `lastActiveAt` is kept after the last connection closed (TTL of the presence item).
const LAST_ACTIVE_KEPT_SECS: i64 = 30 * 24 * 60 * 60;
/// The sort key prefix of a connection's typing item.
const ENTRY_SK: &str = "T#";

/// A conversation's typing state as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypingSnapshot {
    pub entries: Vec<TypingEntry>,
    /// The last push (none: never, or over an hour ago).
    pub last: LastPush,
    /// A direct conversation's last push to each member (`S#<userId>`).
    pub lanes: Vec<(UserId, LastPush)>,
}

impl TypingSnapshot {
    /// The last push to `lane` (a direct conversation's member), or the conversation's.
    pub fn last_for(&self, lane: Option<&UserId>) -> LastPush {
        match lane {
            None => self.last,
            Some(user) => self
                .lanes
                .iter()
                .find(|(u, _)| u == user)
                .map(|(_, last)| *last)
                .unwrap_or_default(),
        }
    }
}

fn entry_of(item: &Item) -> Option<TypingEntry> {
    Some(TypingEntry {
        connection: get_s(item, keys::SK)?.strip_prefix(ENTRY_SK)?.to_owned(),
        user: UserId::parse(get_s(item, "userId")?)?,
        started_ms: get_n(item, "startedAt")? as i64,
        stopped_ms: get_n(item, "stoppedAt").map(|n| n as i64),
    })
}

fn typing_pk(id: &ConversationId) -> String {
    format!("Y#{id}")
}

fn entry_key(id: &ConversationId, connection: &str) -> Item {
    keys::key(typing_pk(id), format!("{ENTRY_SK}{connection}"))
}

/// The sort key prefix of a direct conversation's per-recipient claims.
const LANE_SK: &str = "S#";

fn sent_key(id: &ConversationId, lane: Option<&UserId>) -> Item {
    match lane {
        None => keys::key(typing_pk(id), "S"),
        Some(user) => keys::key(typing_pk(id), format!("{LANE_SK}{user}")),
    }
}

fn last_push_of(item: &Item) -> LastPush {
    LastPush {
        claimed_ms: get_n(item, "sentAt").map(|n| n as i64),
        read_ms: get_n(item, "readAt").map(|n| n as i64),
    }
}

fn presence_push_key(user: &UserId) -> Item {
    keys::key(keys::user_connections_pk(user), "Q")
}

fn visibility_key(user: &UserId) -> Item {
    keys::key(keys::user_connections_pk(user), "V")
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

impl ConnectionStore {
    /// The user a connection belongs to (None: not registered). 1 GetItem.
    pub async fn owner(&self, connection_id: &str) -> Result<Option<UserId>, ChatError> {
        let key = keys::key(
            keys::connection_pk(connection_id),
            keys::CONNECTION_OWNER_SK,
        );
        let item = self.item_at(key).await?;
        Ok(get_s(&item, "userId").and_then(UserId::parse))
    }

    /// A `start` of `connection` (of `user`) in `id`, its frame come at `now_ms`: whether it was
    /// accepted: not within 2 s of the connection's last accepted start, a `stop` since or not
    /// (SPEC §16: a connection's starts beyond one per 2 s are ignored).
    /// DynamoDB: 1 UpdateItem of the connection's item (an ignored start fails its condition,
    /// billed all the same), + 1 UpdateItem of the owner item when the connection had no item in
    /// `id` (its first start there).
    pub async fn typing_start(
        &self,
        id: &ConversationId,
        connection: &str,
        user: &UserId,
        now_ms: i64,
    ) -> Result<bool, ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(entry_key(id, connection)))
            .update_expression(
                "SET userId = :u, startedAt = :now, expiresAt = :ttl REMOVE stoppedAt",
            )
            // startedAt < cutoff + 1: the last accepted start is at least 2 s old.
            .condition_expression("attribute_not_exists(startedAt) OR startedAt < :below")
            .expression_attribute_values(":u", AttributeValue::S(user.to_string()))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":below", n(start_cutoff(now_ms) + 1))
            .expression_attribute_values(":ttl", n(now_ms / 1000 + CONNECTION_TTL_SECS))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        let first = match r {
            Ok(out) => out.attributes.is_none_or(|a| a.is_empty()),
            Err(e) if conditional_failed(&e) => return Ok(false),
            Err(e) => return Err(sdk_error("UpdateItem", e)),
        };
        if first {
            self.note_typing_in(connection, id).await?;
        }
        Ok(true)
    }

    /// Records on the connection's owner item that it types in `id`, so that its `$disconnect`
    /// stops it there. 1 UpdateItem (nothing when the connection is already gone).
    async fn note_typing_in(&self, connection: &str, id: &ConversationId) -> Result<(), ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(
                keys::connection_pk(connection),
                keys::CONNECTION_OWNER_SK,
            )))
            .update_expression("ADD typingIn :c")
            .condition_expression("attribute_exists(userId)")
            .expression_attribute_values(":c", AttributeValue::Ss(vec![id.to_string()]))
            .send()
            .await;
        done_unless_failed("UpdateItem", r)
    }

    /// A `stop` of `connection` in `id`, its frame come at `now_ms`, or its close: whether it
    /// stopped a typist (false: it was not typing there, or had expired). The item stays, marked
    /// stopped: the next push tells who was shown it that it stopped, and the connection's next
    /// start finds it (no second note on the owner item). 1 UpdateItem.
    pub async fn typing_stop(
        &self,
        id: &ConversationId,
        connection: &str,
        now_ms: i64,
    ) -> Result<bool, ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(entry_key(id, connection)))
            .update_expression("SET stoppedAt = :now, expiresAt = :ttl")
            .condition_expression("startedAt > :expired AND attribute_not_exists(stoppedAt)")
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":expired", n(now_ms - TYPING_TTL_MS))
            .expression_attribute_values(":ttl", n(now_ms / 1000 + CONNECTION_TTL_SECS))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if conditional_failed(&e) => Ok(false),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// The typing state of `id`: every connection's item and the set last pushed. 1 strongly
    /// consistent Query (a read unit per 4 KB: ~15 typists with 128-character ids, more with
    /// shorter), one more per MB.
    pub async fn typing_state(&self, id: &ConversationId) -> Result<TypingSnapshot, ChatError> {
        let mut state = TypingSnapshot::default();
        let mut start = None;
        loop {
            let page = self
                .db
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", AttributeValue::S(typing_pk(id)))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error("Query", e))?;
            for item in page.items.unwrap_or_default() {
                let sk = get_s(&item, keys::SK).unwrap_or_default();
                if sk == "S" {
                    state.last = last_push_of(&item);
                } else if let Some(user) = sk.strip_prefix(LANE_SK).and_then(UserId::parse) {
                    state.lanes.push((user, last_push_of(&item)));
                } else if let Some(entry) = entry_of(&item) {
                    state.entries.push(entry);
                }
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(state),
            }
        }
    }

    /// Claims a push at `now_ms` (to `lane` alone: a direct conversation's member), its claimant
    /// to read the set at `read_ms`: succeeds only if the last push is still the one read
    /// (`seen`), so that one caller pushes, at most one a second. (Also moves a late push's own
    /// claim on: chat_domain::typing::renewed_claim.) 1 PutItem of a small item (1 write unit).
    pub async fn claim_typing_push(
        &self,
        id: &ConversationId,
        lane: Option<&UserId>,
        seen: LastPush,
        now_ms: i64,
        read_ms: i64,
    ) -> Result<bool, ChatError> {
        let mut item = sent_key(id, lane);
        item.insert("sentAt".into(), n(now_ms));
        item.insert("readAt".into(), n(read_ms));
        item.insert("expiresAt".into(), n(now_ms / 1000 + SENT_ITEM_TTL_SECS));
        let put = self
            .db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        let put = match seen.claimed_ms {
            Some(at) => put
                .condition_expression("sentAt = :at")
                .expression_attribute_values(":at", n(at)),
            None => put.condition_expression("attribute_not_exists(sentAt)"),
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if conditional_failed(&e) => Ok(false),
            Err(e) => Err(sdk_error("PutItem", e)),
        }
    }

    /// Removes these (inactive) entries of `id`, each only if its connection has not started
    /// again since it was read. 1 conditional DeleteItem each, concurrently.
    pub async fn prune_typing(
        &self,
        id: &ConversationId,
        entries: &[&TypingEntry],
    ) -> Result<(), ChatError> {
        let deletes = entries.iter().map(|e| async move {
            let r = self
                .db
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(entry_key(id, &e.connection)))
                .condition_expression("startedAt = :seen")
                .expression_attribute_values(":seen", n(e.started_ms))
                .send()
                .await;
            done_unless_failed("DeleteItem", r)
        });
        futures::future::try_join_all(deletes).await.map(|_| ())
    }

    /// What `user`'s direct peers were last told of their presence, and when (ms). 1 strongly
    /// consistent GetItem.
    pub async fn presence_pushed(
        &self,
        user: &UserId,
    ) -> Result<(Option<bool>, Option<i64>), ChatError> {
        let item = self.item_at(presence_push_key(user)).await?;
        let online = item.get("online").and_then(|v| v.as_bool().ok()).copied();
        Ok((online, get_n(&item, "sentAt").map(|n| n as i64)))
    }

    /// Claims the push of `online` at `now_ms`, if the last push is still the one read
    /// (`seen_at`): one caller pushes each change. 1 PutItem.
    pub async fn claim_presence_push(
        &self,
        user: &UserId,
        online: bool,
        seen_at: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, ChatError> {
        let mut item = presence_push_key(user);
        item.insert("online".into(), AttributeValue::Bool(online));
        item.insert("sentAt".into(), n(now_ms));
        item.insert("expiresAt".into(), n(now_ms / 1000 + 24 * 60 * 60));
        let put = self
            .db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        let put = match seen_at {
            Some(at) => put
                .condition_expression("sentAt = :at")
                .expression_attribute_values(":at", n(at)),
            None => put.condition_expression("attribute_not_exists(sentAt)"),
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if conditional_failed(&e) => Ok(false),
            Err(e) => Err(sdk_error("PutItem", e)),
        }
    }

    /// `setPresenceVisibility`: `visible: false` shows `user` offline, from when it first hid
    /// (`hiddenAt`: hiding again keeps it); `visible: true` shows it again, and a `lastActiveAt`
    /// of a connection that closed while it was hidden as that moment instead (found by probing:
    /// turning visible again showed when its last hidden session ended). DynamoDB: hiding, 1
    /// conditional PutItem; showing, 1 DeleteItem (+ 1 conditional UpdateItem of the presence
    /// when it was hidden).
    pub async fn set_presence_visible(
        &self,
        user: &UserId,
        visible: bool,
    ) -> Result<(), ChatError> {
        if !visible {
            let mut item = visibility_key(user);
            item.insert("hidden".into(), AttributeValue::Bool(true));
            // To the second, as every lastActiveAt (docs/api.md §38).
            let now = chat_domain::time::unix_seconds(chat_domain::time::now());
            item.insert("hiddenAt".into(), n(now * 1000));
            let put = self
                .db
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(pk)")
                .send()
                .await;
            return match put {
                Ok(_) => Ok(()),
                Err(e) if conditional_failed(&e) => Ok(()),
                Err(e) => Err(sdk_error("PutItem", e)),
            };
        }
        let shown = self
            .db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(visibility_key(user)))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| sdk_error("DeleteItem", e))?;
        let Some(hidden_at) = shown.attributes.as_ref().and_then(|i| get_n(i, "hiddenAt")) else {
            return Ok(());
        };
        let clamped = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(
                keys::user_connections_pk(user),
                keys::PRESENCE_SK,
            )))
            .update_expression("SET lastActiveAt = :hidden")
            .condition_expression("lastActiveAt > :hidden")
            .expression_attribute_values(":hidden", n(hidden_at as i64))
            .send()
            .await;
        match clamped {
            Ok(_) => Ok(()),
            Err(e) if conditional_failed(&e) => Ok(()),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// `presence`: each user's presence, in the order asked. DynamoDB: ⌈2 × users / 100⌉
    /// BatchGetItem (the presence and visibility items), concurrently.
    pub async fn presence_of(
        &self,
        users: &[UserId],
        now_unix: i64,
    ) -> Result<Vec<Presence>, ChatError> {
        let keys: Vec<Item> = users
            .iter()
            .flat_map(|u| {
                [
                    keys::key(keys::user_connections_pk(u), keys::PRESENCE_SK),
                    visibility_key(u),
                ]
            })
            .collect();
        let batches = keys.chunks(100).map(|chunk| {
            batch_get(
                &self.db,
                &self.table,
                chunk.to_vec(),
                false,
                Deadline::after(std::time::Duration::from_secs(3)),
            )
        });
        let items: Vec<Item> = futures::future::try_join_all(batches)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let find = |pk: &str, sk: &str| {
            items
                .iter()
                .find(|i| get_s(i, keys::PK) == Some(pk) && get_s(i, keys::SK) == Some(sk))
        };
        Ok(users
            .iter()
            .map(|u| {
                let pk = keys::user_connections_pk(u);
                let presence = find(&pk, keys::PRESENCE_SK);
                let live = presence.map_or(0, |p| {
                    crate::connections::connection_map(p)
                        .iter()
                        .filter(|(_, expires_ms)| *expires_ms > now_unix * 1000)
                        .count()
                });
                let last = presence
                    .and_then(|p| get_n(p, "lastActiveAt"))
                    .and_then(|ms| {
                        time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok()
                    })
                    .map(chat_domain::time::rfc3339);
                let hidden = find(&pk, "V").is_some();
                presence_of(u.clone(), live, last, hidden)
            })
            .collect())
    }
}

/// What a presence removal writes besides the removal: when the connection closed, and a TTL
/// that keeps it for [`LAST_ACTIVE_KEPT_SECS`].
pub(crate) fn closed_values(now_unix: i64) -> [(String, AttributeValue); 2] {
    [
        (":closed".into(), n(now_unix * 1000)),
        (":kept".into(), n(now_unix + LAST_ACTIVE_KEPT_SECS)),
    ]
}

/// The update-expression part that goes with [`closed_values`].
pub(crate) const CLOSED_SET: &str = "SET lastActiveAt = :closed, expiresAt = :kept";
