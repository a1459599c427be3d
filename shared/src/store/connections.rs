//! Live WebSocket connections (ConnectionsTable): who is online, for the fanout.
//!
//! | pk | sk | item |
//! |---|---|---|
//! | `U#<userId>` | `P` | presence: map `connections` of connection id → expiry (unix s) |
//! | `W#<connectionId>` | `U` | owner: `userId`, so `$disconnect` (which only knows the connection) can clean up |
//!
//! Both carry `expiresAt` for TTL: API Gateway closes any connection after 2 hours, so a record
//! whose `$disconnect` was lost goes away by itself. The fanout reads presence items 100 at a
//! time (BatchGetItem): 10 calls for a 1,000-member group instead of 1,000 queries.

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use aws_sdk_dynamodb::Client;
use futures::future::try_join_all;
use std::collections::HashMap;

use super::attrs::Item;
use super::{batch_get, keys, sdk_error};
use crate::domain::UserId;
use crate::error::ChatError;
use crate::retry::{Deadline, Retry};

/// How long `$connect` and the fanout's reads may retry (their functions time out after 10 s and
/// 60 s).
const RETRY_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// API Gateway's maximum connection duration.
pub const CONNECTION_TTL_SECS: i64 = 2 * 60 * 60;

#[derive(Clone, Debug)]
pub struct ConnectionStore {
    db: Client,
    table: String,
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

    /// `$connect`: records the connection. DynamoDB: 1 PutItem + 1 UpdateItem (2 for a user's
    /// first connection).
    pub async fn register(
        &self,
        user: &UserId,
        connection_id: &str,
        now_unix: i64,
    ) -> Result<(), ChatError> {
        let expires = AttributeValue::N((now_unix + CONNECTION_TTL_SECS).to_string());
        let mut owner = owner_key(connection_id);
        owner.insert("userId".into(), AttributeValue::S(user.to_string()));
        owner.insert("expiresAt".into(), expires.clone());
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(owner))
            .send()
            .await
            .map_err(|e| sdk_error("PutItem", e))?;
        let mut retry = Retry::until(Deadline::after(RETRY_BUDGET));
        while retry.next().await {
            // Add to the existing map, or create the map; the conditions make the two race-free.
            let add = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(presence_key(user)))
                .update_expression("SET connections.#c = :exp, expiresAt = :exp")
                .condition_expression("attribute_exists(connections)")
                .expression_attribute_names("#c", connection_id)
                .expression_attribute_values(":exp", expires.clone())
                .send()
                .await;
            match add {
                Ok(_) => return Ok(()),
                Err(e) if e.code() != Some("ConditionalCheckFailedException") => {
                    return Err(sdk_error("UpdateItem", e))
                }
                Err(_) => {}
            }
            let create = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(presence_key(user)))
                .update_expression("SET connections = :map, expiresAt = :exp")
                .condition_expression("attribute_not_exists(connections)")
                .expression_attribute_values(
                    ":map",
                    AttributeValue::M(HashMap::from([(connection_id.to_owned(), expires.clone())])),
                )
                .expression_attribute_values(":exp", expires.clone())
                .send()
                .await;
            match create {
                Ok(_) => return Ok(()),
                Err(e) if e.code() != Some("ConditionalCheckFailedException") => {
                    return Err(sdk_error("UpdateItem", e))
                }
                Err(_) => {}
            }
        }
        Err(ChatError::Throttled)
    }

    /// `$disconnect`: forgets the connection; returns its user if it was known.
    /// DynamoDB: 1 DeleteItem + 1 UpdateItem.
    pub async fn unregister(&self, connection_id: &str) -> Result<Option<UserId>, ChatError> {
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
        if let Some(user) = &user {
            self.forget_presence(user, connection_id).await?;
        }
        Ok(user)
    }

    /// A connection the Management API called gone (410): forget it.
    pub async fn remove(&self, user: &UserId, connection_id: &str) -> Result<(), ChatError> {
        self.db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(owner_key(connection_id)))
            .send()
            .await
            .map_err(|e| sdk_error("DeleteItem", e))?;
        self.forget_presence(user, connection_id).await
    }

    async fn forget_presence(&self, user: &UserId, connection_id: &str) -> Result<(), ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(presence_key(user)))
            .update_expression("REMOVE connections.#c")
            .condition_expression("attribute_exists(connections)")
            .expression_attribute_names("#c", connection_id)
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// The unexpired connections of these users, as `(user, connection id)`.
    /// DynamoDB: ⌈users/100⌉ BatchGetItem, concurrently.
    pub async fn live_connections(
        &self,
        users: &[UserId],
        now_unix: i64,
    ) -> Result<Vec<(UserId, String)>, ChatError> {
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
            let Some(conns) = item.get("connections").and_then(|v| v.as_m().ok()) else {
                continue;
            };
            for (id, exp) in conns {
                let expires = exp
                    .as_n()
                    .ok()
                    .and_then(|n| n.parse::<i64>().ok())
                    .unwrap_or(0);
                if expires > now_unix {
                    out.push((user.clone(), id.clone()));
                }
            }
        }
        out.sort();
        Ok(out)
    }
}
