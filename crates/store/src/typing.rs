//! Typing state and presence in ConnectionsTable (docs/data-model.md, "Typing and presence").
//!
//! | pk | sk | item |
//! |---|---|---|
//! | `Y#<conversationId>` | `T` | typing: map `t` of connection id → `"<start ms, 13 digits> <userId>"`, `ver` bumped by every start and stop, `sent`/`sentAt` (the set last pushed and when), `expiresAt` (TTL, an hour after the last start) |
//! | `U#<userId>` | `P` | presence (connections.rs), with `lastActiveAt` (ms) written when a connection closes |
//! | `U#<userId>` | `V` | `hidden`: the user shows offline (no TTL: it outlives connections) |
//! | `U#<userId>` | `Q` | the last presence push: `online` as pushed, `sentAt` (ms), `expiresAt` (TTL, a day) |
//! | `W#<connectionId>` | `U` | owner (connections.rs), with `typingIn`: the conversations it typed in, for `$disconnect` |
//!
//! A refreshing typist costs 1 UpdateItem of ≤ 1 KB (20 typists' entries are ~800 bytes): 1 write
//! unit; the first start of a connection in a conversation adds 1 small UpdateItem of its owner
//! item, and a push (at most one a second per conversation) 1 UpdateItem of the state.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use std::collections::HashMap;

use super::attrs::{get_n, get_s, Item};
use super::connections::{conditional_failed, ConnectionStore};
use super::{batch_get, keys, sdk_error};
use crate::retry::Deadline;
use chat_domain::error::ChatError;
use chat_domain::typing::{presence_of, start_cutoff, Presence};
use chat_domain::{ConversationId, UserId};

/// How long the typing state of a quiet conversation is kept before TTL removes it.
const TYPING_ITEM_TTL_SECS: i64 = 60 * 60;
/// How long `lastActiveAt` is kept after the last connection closed (TTL of the presence item).
const LAST_ACTIVE_KEPT_SECS: i64 = 30 * 24 * 60 * 60;

/// A conversation's typing state as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypingSnapshot {
    /// Connection id, user, start (unix ms).
    pub entries: Vec<(String, UserId, i64)>,
    pub sent: Option<String>,
    pub sent_at: Option<i64>,
    pub ver: u64,
}

impl TypingSnapshot {
    fn from_item(item: &Item) -> TypingSnapshot {
        let entries = item
            .get("t")
            .and_then(|v| v.as_m().ok())
            .map(|m| {
                m.iter()
                    .filter_map(|(c, v)| {
                        let (ms, user) = v.as_s().ok()?.split_once(' ')?;
                        Some((c.clone(), UserId::parse(user)?, ms.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        TypingSnapshot {
            entries,
            sent: get_s(item, "sent").map(str::to_owned),
            sent_at: get_n(item, "sentAt").map(|n| n as i64),
            ver: get_n(item, "ver").unwrap_or(0),
        }
    }

    /// The (user, start) pairs, for `typing_now`.
    pub fn starts(&self) -> Vec<(UserId, i64)> {
        self.entries
            .iter()
            .map(|(_, u, s)| (u.clone(), *s))
            .collect()
    }
}

/// 13 digits, so that entries compare as strings in time order.
fn entry_value(user: &UserId, started_ms: i64) -> String {
    format!("{started_ms:013} {user}")
}

fn typing_key(id: &ConversationId) -> Item {
    keys::key(format!("Y#{id}"), "T")
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

    /// A `start` of `connection` (of `user`) in `id` at `now_ms`: the state after it, or None
    /// when it came within 2 s of the connection's last accepted start (ignored). DynamoDB:
    /// 1 UpdateItem (2 for the first start of an idle conversation), + 1 UpdateItem of the owner
    /// item on the connection's first start in the conversation.
    pub async fn typing_start(
        &self,
        id: &ConversationId,
        connection: &str,
        user: &UserId,
        now_ms: i64,
    ) -> Result<Option<TypingSnapshot>, ChatError> {
        let value = AttributeValue::S(entry_value(user, now_ms));
        // An entry is older than the cutoff iff its string sorts below the next millisecond's.
        let below = AttributeValue::S(format!("{:013}", start_cutoff(now_ms) + 1));
        let ttl = n(now_ms / 1000 + TYPING_ITEM_TTL_SECS);
        let mut old = None;
        for _ in 0..3 {
            let updated = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(typing_key(id)))
                .update_expression("SET t.#c = :v, expiresAt = :ttl ADD ver :one")
                .condition_expression(
                    "attribute_exists(t) AND (attribute_not_exists(t.#c) OR t.#c < :below)",
                )
                .expression_attribute_names("#c", connection)
                .expression_attribute_values(":v", value.clone())
                .expression_attribute_values(":below", below.clone())
                .expression_attribute_values(":ttl", ttl.clone())
                .expression_attribute_values(":one", n(1))
                .return_values(ReturnValue::AllOld)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match updated {
                Ok(out) => {
                    old = Some(out.attributes.unwrap_or_default());
                    break;
                }
                Err(e) => match e.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(f)
                        if f.item().is_some_and(|i| i.contains_key("t")) =>
                    {
                        return Ok(None);
                    }
                    UpdateItemError::ConditionalCheckFailedException(_) => {}
                    other => return Err(ChatError::internal(format!("UpdateItem: {other}"))),
                },
            }
            // No map yet: create it with this entry.
            let created = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(typing_key(id)))
                .update_expression("SET t = :m, expiresAt = :ttl ADD ver :one")
                .condition_expression("attribute_not_exists(t)")
                .expression_attribute_values(
                    ":m",
                    AttributeValue::M(HashMap::from([(connection.to_owned(), value.clone())])),
                )
                .expression_attribute_values(":ttl", ttl.clone())
                .expression_attribute_values(":one", n(1))
                .return_values(ReturnValue::AllOld)
                .send()
                .await;
            match created {
                Ok(out) => {
                    old = Some(out.attributes.unwrap_or_default());
                    break;
                }
                Err(e) if conditional_failed(&e) => continue,
                Err(e) => return Err(sdk_error("UpdateItem", e)),
            }
        }
        let Some(old) = old else {
            return Err(ChatError::Throttled);
        };
        let mut state = TypingSnapshot::from_item(&old);
        let first = !state.entries.iter().any(|(c, _, _)| c == connection);
        state.entries.retain(|(c, _, _)| c != connection);
        state
            .entries
            .push((connection.to_owned(), user.clone(), now_ms));
        state.ver += 1;
        if first {
            self.note_typing_in(connection, id).await?;
        }
        Ok(Some(state))
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
        match r {
            Ok(_) => Ok(()),
            Err(e) if conditional_failed(&e) => Ok(()),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// A `stop` (or the close) of `connection` in `id`: the state after it, or None when it was
    /// not typing there. 1 UpdateItem.
    pub async fn typing_stop(
        &self,
        id: &ConversationId,
        connection: &str,
    ) -> Result<Option<TypingSnapshot>, ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(typing_key(id)))
            .update_expression("REMOVE t.#c ADD ver :one")
            .condition_expression("attribute_exists(t.#c)")
            .expression_attribute_names("#c", connection)
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match r {
            Ok(out) => Ok(Some(TypingSnapshot::from_item(
                &out.attributes.unwrap_or_default(),
            ))),
            Err(e) if conditional_failed(&e) => Ok(None),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// The typing state of `id`. 1 strongly consistent GetItem.
    pub async fn typing_state(&self, id: &ConversationId) -> Result<TypingSnapshot, ChatError> {
        Ok(TypingSnapshot::from_item(
            &self.item_at(typing_key(id)).await?,
        ))
    }

    /// Claims the push of `sent` at `now_ms`: succeeds only if the state is still `seen` (same
    /// version, same last push), so one caller pushes each set; removes the expired entries
    /// `prune` on the way. 1 UpdateItem.
    pub async fn claim_typing_push(
        &self,
        id: &ConversationId,
        seen: &TypingSnapshot,
        sent: &str,
        prune: &[&str],
        now_ms: i64,
    ) -> Result<bool, ChatError> {
        let mut update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(typing_key(id)))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":sent", AttributeValue::S(sent.to_owned()))
            .expression_attribute_values(":ver", n(seen.ver as i64));
        let mut expression = "SET sentAt = :now, sent = :sent".to_owned();
        if !prune.is_empty() {
            let names: Vec<String> = (0..prune.len()).map(|i| format!("t.#p{i}")).collect();
            for (i, c) in prune.iter().enumerate() {
                update = update.expression_attribute_names(format!("#p{i}"), *c);
            }
            expression.push_str(&format!(" REMOVE {}", names.join(", ")));
        }
        let condition = match seen.sent_at {
            Some(at) => {
                update = update.expression_attribute_values(":at", n(at));
                "ver = :ver AND sentAt = :at"
            }
            None => "ver = :ver AND attribute_not_exists(sentAt)",
        };
        let r = update
            .update_expression(expression)
            .condition_expression(condition)
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if conditional_failed(&e) => Ok(false),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
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

    /// `setPresenceVisibility`: `visible: false` shows `user` offline. 1 PutItem or DeleteItem.
    pub async fn set_presence_visible(
        &self,
        user: &UserId,
        visible: bool,
    ) -> Result<(), ChatError> {
        if visible {
            self.db
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(visibility_key(user)))
                .send()
                .await
                .map_err(|e| sdk_error("DeleteItem", e))?;
        } else {
            let mut item = visibility_key(user);
            item.insert("hidden".into(), AttributeValue::Bool(true));
            self.db
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| sdk_error("PutItem", e))?;
        }
        Ok(())
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
                let live = presence
                    .and_then(|p| p.get("connections"))
                    .and_then(|m| m.as_m().ok())
                    .map(|m| {
                        m.values()
                            .filter(|e| {
                                e.as_n()
                                    .ok()
                                    .and_then(|n| n.parse::<i64>().ok())
                                    .is_some_and(|exp| exp > now_unix)
                            })
                            .count()
                    })
                    .unwrap_or(0);
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
