//! The Lambda handlers, called in-process the way Lambda calls them: with the event as JSON
//! (deserialized into the same `aws_lambda_events` types, which also proves the event's shape),
//! and with the response read back as JSON.

use aws_config::SdkConfig;
use aws_lambda_events::event::apigw::ApiGatewayWebsocketProxyRequest;
use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use chat_shared::auth::TokenVerifier;
use chat_shared::{Config, ConnectionStore};
use fanout::Fanout;
use inbox_index::InboxIndex;
use relay::Relay;
use serde_json::{json, Value};
use ws_connection::WsConnection;

use crate::Error;

#[derive(Clone)]
pub(crate) struct Handlers {
    ws: WsConnection,
    relay: Relay,
    fanout: Fanout,
    inbox_index: InboxIndex,
}

impl Handlers {
    /// Builds the handlers like their `from_env`, from `config` (with its endpoints filled in).
    pub(crate) async fn new(config: &Config, sdk: &SdkConfig) -> Result<Handlers, Error> {
        let verifier = TokenVerifier::from_config(&config.auth)
            .await
            .map_err(|e| {
                format!("{e} (set CHAT_AUTH_MODE=local to verify HS256 tokens locally)")
            })?;
        // Each function's clients as its own (its IAM role: `Config::for_function`).
        let connections = |config: &Config| {
            ConnectionStore::new(
                config.dynamodb_client(sdk),
                config.connections_table.clone(),
            )
        };
        let (ws, relay) = (
            config.for_function("ws-connection"),
            config.for_function("relay"),
        );
        let (fanout, index) = (
            config.for_function("fanout"),
            config.for_function("inbox-index"),
        );
        let management = fanout
            .management_client(sdk)
            .ok_or("no Management API endpoint")?;
        Ok(Handlers {
            ws: WsConnection::new(connections(&ws), verifier),
            relay: Relay::new(
                relay.kinesis_client(sdk),
                relay.event_stream.clone(),
                relay.chat_store(sdk),
            ),
            fanout: Fanout::new(fanout.chat_store(sdk), connections(&fanout), management),
            inbox_index: InboxIndex::new(index.chat_store(sdk).with_budget(inbox_index::BUDGET)),
        })
    }

    /// The fanout's push counters.
    pub(crate) fn fanout_stats(&self) -> std::sync::Arc<fanout::FanoutStats> {
        self.fanout.stats()
    }

    /// A WebSocket route event → the response's `statusCode`.
    pub(crate) async fn websocket(&self, event: Value) -> Result<i64, Error> {
        let event: ApiGatewayWebsocketProxyRequest = serde_json::from_value(event)?;
        Ok(self.ws.handle(event).await.status_code)
    }

    /// DynamoDB stream records → the relay's response (`batchItemFailures`).
    pub(crate) async fn relay(&self, records: Vec<Value>) -> Result<Value, Error> {
        let event: DynamoDbEvent = serde_json::from_value(json!({ "Records": records }))?;
        Ok(serde_json::to_value(self.relay.handle(event).await)?)
    }

    /// DynamoDB stream records → the inbox indexer's response (`batchItemFailures`).
    pub(crate) async fn inbox_index(&self, records: Vec<Value>) -> Result<Value, Error> {
        let event: DynamoDbEvent = serde_json::from_value(json!({ "Records": records }))?;
        Ok(serde_json::to_value(self.inbox_index.handle(event).await)?)
    }

    /// Kinesis records → the fanout's response (`batchItemFailures`).
    pub(crate) async fn fanout(&self, records: Vec<Value>) -> Result<Value, Error> {
        let event: KinesisEvent = serde_json::from_value(json!({ "Records": records }))?;
        Ok(serde_json::to_value(self.fanout.handle(event).await)?)
    }
}
