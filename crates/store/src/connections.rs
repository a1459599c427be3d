//! Live WebSocket connections (ConnectionsTable): who is online, for the fanout.
//!
//! | pk | sk | item |
//! |---|---|---|
//! | `U#<userId>` | `P` | presence: map `connections` of connection id → expiry (unix s, to the millisecond), `ver` bumped by every write |
//! | `W#<connectionId>` | `U` | owner: `userId`, so `$disconnect` (which only knows the connection) can clean up |
//!
//! Both carry `expiresAt` for TTL: API Gateway closes any connection after 2 hours, so a record
//! whose `$disconnect` was lost goes away by itself. A connection's registration time is its
//! expiry minus [`CONNECTION_TTL_SECS`]; the presence map keeps it to the millisecond (a decimal
//! number of seconds), so that connections opened within one second still go oldest first
//! (found by probing: 11 opened within 0.6 s dropped a newer one). TTL attributes stay whole
//! seconds. The presence item stays bounded: registering prunes the
//! expired entries and keeps at most [`MAX_CONNECTIONS_PER_USER`] (the oldest go first). The
//! fanout reads presence items 100 at a time (BatchGetItem): 10 calls for a 1,000-member group
//! instead of 1,000 queries.

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use aws_sdk_dynamodb::Client;
use futures::future::try_join_all;
use std::collections::HashMap;

use super::attrs::{get_n, Item};
use super::{batch_get, keys, sdk_error};
use crate::retry::{Deadline, Retry};
use crate::typing::{closed_values, CLOSED_SET};
use chat_domain::error::ChatError;
use chat_domain::{ConversationId, UserId};

/// How long `$connect` and the fanout's reads may retry (their functions time out after 10 s and
/// 60 s).
const RETRY_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// API Gateway's maximum connection duration.
pub const CONNECTION_TTL_SECS: i64 = 2 * 60 * 60;

/// Live connections a user may hold at once (phones, laptops, tabs). Registering one more drops
/// the record of the oldest, which then receives no pushes (docs/api.md §15.1). It keeps the
/// presence item, which the fanout reads for every event, small.
pub const MAX_CONNECTIONS_PER_USER: usize = 10;

/// A live connection as the fanout sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveConnection {
    pub user: UserId,
    pub connection_id: String,
    /// As recorded (unix ms); the fanout's conditional delete names it, so it deletes only the
    /// registration it saw.
    pub expires_at_ms: i64,
}

impl LiveConnection {
    /// When it registered, in unix seconds.
    pub fn registered_at(&self) -> i64 {
        whole_seconds(self.expires_at_ms) - CONNECTION_TTL_SECS
    }
}

fn whole_seconds(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

/// A TTL attribute's value (whole unix seconds, as DynamoDB's TTL reads them).
fn ttl_value(expires_ms: i64) -> AttributeValue {
    AttributeValue::N(whole_seconds(expires_ms).to_string())
}

/// A presence entry's expiry as stored: seconds with three decimals.
fn expiry_value(expires_ms: i64) -> AttributeValue {
    AttributeValue::N(format!(
        "{}.{:03}",
        whole_seconds(expires_ms),
        expires_ms.rem_euclid(1000)
    ))
}

/// A stored expiry in unix ms: whole seconds (as written before milliseconds were kept) or
/// seconds with a fraction. Read for every presence entry the fanout sees: no allocation.
pub(crate) fn expiry_ms(n: &str) -> Option<i64> {
    let (secs, frac) = n.split_once('.').unwrap_or((n, ""));
    let secs: i64 = secs.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = (frac.bytes().chain(std::iter::repeat(b'0')).take(3))
        .fold(0, |ms, digit| ms * 10 + i64::from(digit - b'0'));
    Some(secs * 1000 + ms)
}

/// Which entries of a presence map (connection id → expiry in unix ms) registering `new` must
/// remove: every expired one, then the oldest (earliest expiry, i.e. earliest registration) beyond
/// `max`, never `new` itself.
pub fn prune_plan(entries: &[(String, i64)], new: &str, now_ms: i64, max: usize) -> Vec<String> {
    let (expired, mut live): (Vec<_>, Vec<_>) = entries
        .iter()
        .partition(|(id, exp)| *exp <= now_ms && id != new);
    let mut out: Vec<String> = expired.into_iter().map(|(id, _)| id.clone()).collect();
    if live.len() > max {
        live.sort_by(|a, b| (a.0 == new, a.1, &a.0).cmp(&(b.0 == new, b.1, &b.0)));
        let excess = live.len() - max;
        out.extend(live.into_iter().take(excess).map(|(id, _)| id.clone()));
    }
    out
}

/// A presence item's entries: connection id → expiry in unix ms.
pub(crate) fn connection_map(item: &Item) -> Vec<(String, i64)> {
    item.get("connections")
        .and_then(|v| v.as_m().ok())
        .map(|m| {
            m.iter()
                .map(|(id, exp)| {
                    let exp = exp.as_n().ok().and_then(|n| expiry_ms(n)).unwrap_or(0);
                    (id.clone(), exp)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What one attempt at removing pruned presence entries did.
enum Removal {
    Done,
    /// A concurrent change of the presence won: plan again.
    Raced,
    /// DynamoDB trouble (logged): left for the user's next registration.
    Failed,
}

pub(crate) fn conditional_failed<E: ProvideErrorMetadata>(e: &E) -> bool {
    e.code() == Some("ConditionalCheckFailedException")
}

/// The outcome of a conditional write `call` whose failed condition means there was nothing to
/// do (the item gone, or already as wanted): done either way.
pub(crate) fn done_unless_failed<T, E, R>(
    call: &str,
    r: Result<T, aws_sdk_dynamodb::error::SdkError<E, R>>,
) -> Result<(), ChatError>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match r {
        Ok(_) => Ok(()),
        Err(e) if conditional_failed(&e) => Ok(()),
        Err(e) => Err(sdk_error(call, e)),
    }
}

#[derive(Clone, Debug)]
pub struct ConnectionStore {
    pub(crate) db: Client,
    pub(crate) table: String,
}

fn presence_key(user: &UserId) -> Item {
    keys::key(keys::user_connections_pk(user), keys::PRESENCE_SK)
}

fn owner_key(connection_id: &str) -> Item {
    keys::key(
        keys::connection_pk(connection_id),
        keys::CONNECTION_OWNER_SK,
    )
}

impl ConnectionStore {
    pub fn new(db: Client, table: impl Into<String>) -> Self {
        ConnectionStore {
            db,
            table: table.into(),
        }
    }

    /// An UpdateItem of `user`'s presence item (its connection map and version).
    fn update_presence(&self, user: &UserId) -> UpdateItemFluentBuilder {
        self.db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(presence_key(user)))
    }

    /// `$connect`: records the connection, and prunes the user's presence (expired entries, and
    /// the oldest beyond [`MAX_CONNECTIONS_PER_USER`]). DynamoDB: 1 PutItem + 1 UpdateItem (2 for
    /// a user's first connection), + 1 UpdateItem when something is pruned (+ GetItem and
    /// UpdateItem again if a concurrent change of the same user's presence wins the race).
    /// `now_ms`: unix ms.
    pub async fn register(
        &self,
        user: &UserId,
        connection_id: &str,
        now_ms: i64,
    ) -> Result<(), ChatError> {
        let expires_ms = now_ms + CONNECTION_TTL_SECS * 1000;
        let expires = expiry_value(expires_ms);
        let ttl = ttl_value(expires_ms);
        let mut owner = owner_key(connection_id);
        owner.insert("userId".into(), AttributeValue::S(user.to_string()));
        owner.insert("expiresAt".into(), ttl.clone());
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(owner))
            .send()
            .await
            .map_err(|e| sdk_error("PutItem", e))?;
        let deadline = Deadline::after(RETRY_BUDGET);
        let presence = self
            .add_presence(user, connection_id, &expires, &ttl, deadline)
            .await?;
        // Pruning is best effort: the connection is recorded; what cannot be pruned now (the
        // deadline passed, DynamoDB trouble) is pruned by the user's next registration.
        self.prune_presence(user, connection_id, now_ms, presence, deadline)
            .await;
        Ok(())
    }

    /// Removes the presence's expired entries and the oldest beyond
    /// [`MAX_CONNECTIONS_PER_USER`], planning again from the presence read anew when a
    /// concurrent change wins; gives up at the deadline or on an error. DynamoDB: nothing when
    /// nothing is to be pruned, else 1 UpdateItem (+ 1 GetItem and 1 UpdateItem per lost race).
    async fn prune_presence(
        &self,
        user: &UserId,
        connection_id: &str,
        now_ms: i64,
        mut presence: Item,
        deadline: Deadline,
    ) {
        let mut retry = Retry::until(deadline);
        loop {
            let prune = prune_plan(
                &connection_map(&presence),
                connection_id,
                now_ms,
                MAX_CONNECTIONS_PER_USER,
            );
            if prune.is_empty() {
                return;
            }
            if !retry.next_now() {
                tracing::warn!(user = %user, "presence not pruned before the deadline");
                return;
            }
            match self.remove_entries(user, &presence, &prune).await {
                Removal::Raced => {}
                Removal::Done | Removal::Failed => return,
            }
            // Someone else changed the presence meanwhile: plan again from what it is now.
            match self.presence_item(user).await {
                Ok(item) => presence = item,
                Err(e) => {
                    tracing::warn!(user = %user, error = ?e, "presence not pruned");
                    return;
                }
            }
        }
    }

    /// Removes the entries `prune` from the presence, if it is still the version read.
    /// DynamoDB: 1 UpdateItem.
    async fn remove_entries(&self, user: &UserId, presence: &Item, prune: &[String]) -> Removal {
        // Conditional on the version the plan was made from: a concurrent registration or
        // removal changes which entries are the oldest.
        let version = get_n(presence, "ver").unwrap_or(0);
        let mut update = self
            .update_presence(user)
            .condition_expression("ver = :v")
            .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()));
        let mut names = Vec::new();
        for (i, id) in prune.iter().enumerate() {
            update = update.expression_attribute_names(format!("#r{i}"), id);
            names.push(format!("connections.#r{i}"));
        }
        let pruned = update
            .update_expression(format!("REMOVE {} ADD ver :one", names.join(", ")))
            .send()
            .await;
        match pruned {
            Ok(_) => {
                tracing::info!(user = %user, pruned = prune.len(), "presence pruned");
                Removal::Done
            }
            Err(e) if conditional_failed(&e) => Removal::Raced,
            Err(e) => {
                tracing::warn!(user = %user, error = %sdk_error("UpdateItem", e), "presence not pruned");
                Removal::Failed
            }
        }
    }

    /// Adds the entry (creating the map for a first connection; `ttl` is the item's TTL, whole
    /// seconds); returns the presence item as written.
    async fn add_presence(
        &self,
        user: &UserId,
        connection_id: &str,
        expires: &AttributeValue,
        ttl: &AttributeValue,
        deadline: Deadline,
    ) -> Result<Item, ChatError> {
        let mut retry = Retry::until(deadline);
        while retry.next().await {
            // Add to the existing map, or create the map; the conditions make the two race-free.
            // `:exp` (the entry) or `:map` (a map of it alone).
            let values = |(name, value): (&str, AttributeValue)| {
                HashMap::from([
                    (name.to_owned(), value),
                    (":ttl".to_owned(), ttl.clone()),
                    (":one".to_owned(), AttributeValue::N("1".into())),
                ])
            };
            let entry = HashMap::from([(connection_id.to_owned(), expires.clone())]);
            let tries = [
                (
                    "SET connections.#c = :exp, expiresAt = :ttl ADD ver :one",
                    "attribute_exists(connections)",
                    Some(HashMap::from([("#c".to_owned(), connection_id.to_owned())])),
                    values((":exp", expires.clone())),
                ),
                (
                    "SET connections = :map, expiresAt = :ttl ADD ver :one",
                    "attribute_not_exists(connections)",
                    None,
                    values((":map", AttributeValue::M(entry))),
                ),
            ];
            for (update, condition, names, values) in tries {
                let written = self
                    .update_presence(user)
                    .update_expression(update)
                    .condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(Some(values))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await;
                match written {
                    Ok(out) => return Ok(out.attributes.unwrap_or_default()),
                    Err(e) if !conditional_failed(&e) => return Err(sdk_error("UpdateItem", e)),
                    Err(_) => {}
                }
            }
        }
        Err(ChatError::Throttled)
    }

    /// `$disconnect`: forgets the connection; returns its user if it was known, with the
    /// conversations it typed in (`typing_start`). DynamoDB: 1 DeleteItem + 1 UpdateItem.
    pub async fn unregister(
        &self,
        connection_id: &str,
        now_unix: i64,
    ) -> Result<Option<(UserId, Vec<ConversationId>)>, ChatError> {
        self.unregister_as(connection_id, Some(now_unix)).await
    }

    /// `unregister` of a connection its handshake refused after registering it (a suspension
    /// made meanwhile): it never opened, so it leaves no `lastActiveAt` (found by probing: a user
    /// who never connected showed one). DynamoDB: as `unregister`.
    pub async fn unregister_refused(&self, connection_id: &str) -> Result<(), ChatError> {
        self.unregister_as(connection_id, None).await.map(|_| ())
    }

    /// `closed_at`: when the connection closed (None: it never opened).
    async fn unregister_as(
        &self,
        connection_id: &str,
        closed_at: Option<i64>,
    ) -> Result<Option<(UserId, Vec<ConversationId>)>, ChatError> {
        let old = self
            .db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(owner_key(connection_id)))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| sdk_error("DeleteItem", e))?;
        let user = old
            .attributes()
            .and_then(|a| a.get("userId"))
            .and_then(|v| v.as_s().ok())
            .and_then(|u| UserId::parse(u));
        let typing_in = old
            .attributes()
            .and_then(|a| a.get("typingIn"))
            .and_then(|v| v.as_ss().ok())
            .map(|ids| {
                ids.iter()
                    .filter_map(|c| ConversationId::parse(c))
                    .collect()
            })
            .unwrap_or_default();
        match user {
            Some(user) => {
                self.forget_presence(&user, connection_id, closed_at)
                    .await?;
                Ok(Some((user, typing_in)))
            }
            None => Ok(None),
        }
    }

    /// The fanout's delete of a connection API Gateway called gone (or refused): only the
    /// registration it saw (same expiry), so it never removes a newer one. Returns whether the
    /// presence entry was removed. DynamoDB: 1 UpdateItem (+ 1 DeleteItem when it was).
    pub async fn forget_if_unchanged(
        &self,
        connection: &LiveConnection,
    ) -> Result<bool, ChatError> {
        let expires = expiry_value(connection.expires_at_ms);
        let removed = self
            .update_presence(&connection.user)
            .update_expression(format!("REMOVE connections.#c {CLOSED_SET} ADD ver :one"))
            .set_expression_attribute_values(Some(
                closed_values(chat_domain::time::unix_seconds(chat_domain::time::now()))
                    .into_iter()
                    .collect(),
            ))
            .condition_expression("connections.#c = :exp")
            .expression_attribute_names("#c", &connection.connection_id)
            .expression_attribute_values(":exp", expires.clone())
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await;
        match removed {
            Ok(_) => {}
            Err(e) if conditional_failed(&e) => return Ok(false),
            Err(e) => return Err(sdk_error("UpdateItem", e)),
        }
        let owner = self
            .db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(owner_key(&connection.connection_id)))
            .condition_expression("expiresAt = :exp")
            .expression_attribute_values(":exp", ttl_value(connection.expires_at_ms))
            .send()
            .await;
        match owner {
            Ok(_) => Ok(true),
            Err(e) if conditional_failed(&e) => Ok(true),
            Err(e) => Err(sdk_error("DeleteItem", e)),
        }
    }

    async fn forget_presence(
        &self,
        user: &UserId,
        connection_id: &str,
        closed_at: Option<i64>,
    ) -> Result<(), ChatError> {
        let (closed, values) = match closed_at {
            Some(now_unix) => (CLOSED_SET, closed_values(now_unix).into_iter().collect()),
            None => ("", std::collections::HashMap::new()),
        };
        let r = self
            .update_presence(user)
            .update_expression(format!("REMOVE connections.#c {closed} ADD ver :one"))
            .set_expression_attribute_values(Some(values))
            .condition_expression("attribute_exists(connections)")
            .expression_attribute_names("#c", connection_id)
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await;
        done_unless_failed("UpdateItem", r)
    }

    /// Closes every live connection of `user` through the Management API (`DeleteConnection`:
    /// API Gateway then runs `$disconnect`, which unregisters it). A connection already gone
    /// (`410`) counts as closed. Returns how many were open. DynamoDB: 1 GetItem; then 1
    /// DeleteConnection per connection, at once.
    #[cfg(feature = "management")]
    pub async fn close_all(
        &self,
        management: &aws_sdk_apigatewaymanagement::Client,
        user: &UserId,
    ) -> Result<usize, ChatError> {
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        let ids: Vec<String> = connection_map(&self.presence_item(user).await?)
            .into_iter()
            .filter(|(_, expires_ms)| *expires_ms > now * 1000)
            .map(|(id, _)| id)
            .collect();
        let closes = ids.iter().map(|id| async move {
            match management
                .delete_connection()
                .connection_id(id)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.code() == Some("GoneException") => Ok(()),
                Err(e) => Err(ChatError::internal(format!(
                    "DeleteConnection: {}",
                    aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e)
                ))),
            }
        });
        try_join_all(closes).await?;
        Ok(ids.len())
    }

    /// The presence entries of one user as stored (connection id → expiry in unix ms), expired
    /// ones included.
    /// DynamoDB: 1 GetItem, strongly consistent.
    pub async fn presence(&self, user: &UserId) -> Result<Vec<(String, i64)>, ChatError> {
        let mut entries = connection_map(&self.presence_item(user).await?);
        entries.sort();
        Ok(entries)
    }

    /// A user's presence item (empty when none). 1 GetItem, strongly consistent.
    async fn presence_item(&self, user: &UserId) -> Result<Item, ChatError> {
        self.item_at(presence_key(user)).await
    }

    /// The item at `key` (empty when none). 1 GetItem, strongly consistent.
    pub(crate) async fn item_at(&self, key: Item) -> Result<Item, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        Ok(out.item.unwrap_or_default())
    }

    /// The unexpired connections of these users. DynamoDB: ⌈users/100⌉ BatchGetItem,
    /// concurrently.
    pub async fn live_connections(
        &self,
        users: &[UserId],
        now_unix: i64,
    ) -> Result<Vec<LiveConnection>, ChatError> {
        let batches = users.chunks(100).map(|chunk| {
            let keys = chunk.iter().map(presence_key).collect();
            batch_get(
                &self.db,
                &self.table,
                keys,
                false,
                Deadline::after(RETRY_BUDGET),
            )
        });
        let mut out = Vec::new();
        for item in try_join_all(batches).await?.into_iter().flatten() {
            let Some(user) = item
                .get(keys::PK)
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| pk.strip_prefix("U#"))
                .and_then(UserId::parse)
            else {
                continue;
            };
            for (id, expires_at_ms) in connection_map(&item) {
                if expires_at_ms > now_unix * 1000 {
                    out.push(LiveConnection {
                        user: user.clone(),
                        connection_id: id,
                        expires_at_ms,
                    });
                }
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, i64)]) -> Vec<(String, i64)> {
        list.iter().map(|(id, e)| (id.to_string(), *e)).collect()
    }

    #[test]
    fn pruning_drops_expired_entries() {
        let now = 10_000;
        let e = entries(&[
            ("old", now - 1),
            ("edge", now),
            ("live", now + 1),
            ("new", now + 7200),
        ]);
        let mut plan = prune_plan(&e, "new", now, 10);
        plan.sort();
        assert_eq!(plan, vec!["edge", "old"]);
        assert!(prune_plan(&entries(&[("new", now + 7200)]), "new", now, 10).is_empty());
    }

    #[test]
    fn the_bound_evicts_the_oldest_but_never_the_new_one() {
        let now = 10_000;
        let mut e: Vec<(String, i64)> = (0..12)
            .map(|i| (format!("c{i:02}"), now + 100 + i))
            .collect();
        e.push(("new".into(), now + 7200));
        // 13 live, bound 10: the three oldest go.
        assert_eq!(prune_plan(&e, "new", now, 10), vec!["c00", "c01", "c02"]);
        // The new entry is kept even when it is not the latest expiry (a clock running behind).
        let e = entries(&[("a", now + 50), ("b", now + 60), ("new", now + 1)]);
        assert_eq!(prune_plan(&e, "new", now, 2), vec!["a"]);
        // Exactly at the bound: nothing.
        let e: Vec<(String, i64)> = (0..10).map(|i| (format!("c{i}"), now + 1 + i)).collect();
        assert!(prune_plan(&e, "c9", now, 10).is_empty());
    }

    #[test]
    fn registration_time_is_expiry_minus_the_ttl() {
        let c = LiveConnection {
            user: UserId::parse("u").unwrap(),
            connection_id: "x=".into(),
            expires_at_ms: (1_000 + CONNECTION_TTL_SECS) * 1000 + 999,
        };
        assert_eq!(c.registered_at(), 1_000);
    }

    #[test]
    fn expiries_are_stored_to_the_millisecond_and_whole_seconds_still_read() {
        let AttributeValue::N(stored) = expiry_value(1_733_590_000_045) else {
            unreachable!()
        };
        assert_eq!(stored, "1733590000.045");
        assert_eq!(expiry_ms(&stored), Some(1_733_590_000_045));
        // As written before milliseconds were kept, and as DynamoDB may normalise decimals.
        assert_eq!(expiry_ms("1733590000"), Some(1_733_590_000_000));
        assert_eq!(expiry_ms("1733590000.5"), Some(1_733_590_000_500));
        assert_eq!(expiry_ms("1733590000.12"), Some(1_733_590_000_120));
        assert_eq!(expiry_ms("x"), None);
        assert_eq!(expiry_ms("1.x"), None);
    }

    #[test]
    fn connections_opened_within_one_second_still_go_oldest_first() {
        let now = 10_000_000;
        // Eleven registrations 50 ms apart, ids in the reverse order of their age.
        let e: Vec<(String, i64)> = (0..11)
            .map(|i| (format!("c{:02}", 10 - i), now + 7_200_000 + 50 * i))
            .collect();
        assert_eq!(prune_plan(&e, "c00", now, 10), vec!["c10"]);
    }
}
