//! The Lambda handlers, called in-process the way Lambda calls them: with the event as JSON
//! (deserialized into the same `aws_lambda_events` types, which also proves the event's shape),
//! and with the response read back as JSON.

use aws_config::SdkConfig;
use aws_lambda_events::event::apigw::ApiGatewayWebsocketProxyRequest;
use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use chat_lambda::EventHandler;
use chat_store::Config;
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
    /// Builds the handlers as `chat_lambda::run` does, from `config` (with its endpoints
    /// filled in), each with its own function's clients (its IAM role: `Config::for_function`).
    pub(crate) async fn new(config: &Config, sdk: &SdkConfig) -> Result<Handlers, Error> {
        Ok(Handlers {
            ws: build(config, sdk, "ws-connection").await.map_err(|e| {
                format!("{e} (set CHAT_AUTH_MODE=local to verify HS256 tokens locally)")
            })?,
            relay: build(config, sdk, "relay").await?,
            fanout: build(config, sdk, "fanout").await?,
            inbox_index: build(config, sdk, "inbox-index").await?,
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

    /// Typing's due expiry checks (an SQS event) → the ws-connection function's response.
    pub(crate) async fn expiry_checks(
        &self,
        event: aws_lambda_events::event::sqs::SqsEvent,
    ) -> aws_lambda_events::event::sqs::SqsBatchResponse {
        self.ws.expiry_checks(event).await
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

/// One function's handler, built with its own configuration.
async fn build<H: EventHandler>(
    config: &Config,
    sdk: &SdkConfig,
    function: &str,
) -> Result<H, chat_lambda::Error> {
    H::from_config(&config.for_function(function), sdk).await
}
