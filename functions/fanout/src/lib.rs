//! Fanout: Kinesis (events of one conversation per record, in order) → the live WebSocket
//! connections of the conversation's current members, through the API Gateway Management API
//! (docs/event-pipeline.md).
//!
//! Per batch: records are grouped by conversation; per conversation one Query reads the current
//! members, ⌈members/100⌉ BatchGetItem their live connections; `read.updated` is coalesced to the
//! highest watermark per member; above 200 members `message.new` is pushed without content. Each
//! connection gets its frames in order; connections are served concurrently (bounded). `410 Gone`
//! deletes the connection record. Any other push failure reports the conversation's earliest record
//! (ReportBatchItemFailures): Lambda redelivers from there (at-least-once; clients dedupe).

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};
use aws_sdk_apigatewaymanagement::primitives::Blob;
use chat_shared::events::plan::{coalesce_reads, group_by_conversation, BatchFailures};
use chat_shared::events::{Event, EventBatch};
use chat_shared::{ChatError, ChatStore, Config, ConnectionStore, ConversationId, UserId};
use futures::stream::{self, StreamExt};

/// Pushes in flight at once per invocation.
const PUSH_CONCURRENCY: usize = 32;

#[derive(Clone, Debug)]
pub struct Fanout {
    chat: ChatStore,
    connections: ConnectionStore,
    management: aws_sdk_apigatewaymanagement::Client,
}

enum Push {
    Delivered,
    Gone,
    Failed,
}

impl Fanout {
    pub fn new(
        chat: ChatStore,
        connections: ConnectionStore,
        management: aws_sdk_apigatewaymanagement::Client,
    ) -> Self {
        Fanout {
            chat,
            connections,
            management,
        }
    }

    pub async fn from_env() -> Result<Self, lambda_runtime::Error> {
        let config = Config::from_env()?;
        config.init_telemetry();
        let sdk = config.sdk_config().await;
        let db = config.dynamodb_client(&sdk);
        let management = config
            .management_client(&sdk)
            .ok_or("WS_MANAGEMENT_ENDPOINT is not set")?;
        Ok(Fanout::new(
            config.chat_store(&sdk),
            ConnectionStore::new(db, config.connections_table.clone()),
            management,
        ))
    }

    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let records = &event.records;
        let mut failures = BatchFailures::default();
        let mut events = Vec::new();
        for (i, record) in records.iter().enumerate() {
            match serde_json::from_slice::<EventBatch>(&record.kinesis.data) {
                Ok(batch) => events.extend(batch.events.into_iter().map(|e| (e, i))),
                Err(e) => {
                    tracing::error!(error = %e, sequence = record.kinesis.sequence_number, "undecodable Kinesis record");
                    failures.fail(i);
                }
            }
        }
        let outcomes = stream::iter(group_by_conversation(events))
            .map(|group| async move {
                let first = group.first_record();
                let conversation = group.conversation_id.clone();
                match self.deliver(&conversation, group.into_events()).await {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!(%conversation, error = ?e, "fanout failed; batch will be retried");
                        Some(first)
                    }
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        for i in outcomes.into_iter().flatten() {
            failures.fail(i);
        }
        let mut response = KinesisEventResponse::default();
        if let Some(i) = failures.earliest() {
            let mut failure = KinesisBatchItemFailure::default();
            failure.item_identifier = Some(records[i].kinesis.sequence_number.clone());
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// Pushes one conversation's events to its members' live connections.
    async fn deliver(
        &self,
        conversation: &ConversationId,
        events: Vec<Event>,
    ) -> Result<(), ChatError> {
        let Some((_, members)) = self.chat.load_conversation(conversation).await? else {
            return Ok(());
        };
        let users: Vec<UserId> = members.into_iter().map(|m| m.member_id).collect();
        let frames: Vec<String> = coalesce_reads(events)
            .iter()
            .map(|e| serde_json::to_string(&e.for_audience(users.len())))
            .collect::<Result<_, _>>()
            .map_err(ChatError::internal)?;
        if frames.is_empty() {
            return Ok(());
        }
        let now = chat_shared::time::unix_seconds(chat_shared::time::now());
        let connections = self.connections.live_connections(&users, now).await?;
        let frames = &frames;
        let results = stream::iter(connections)
            .map(|(user, connection)| async move {
                for frame in frames {
                    match self.push(&connection, frame).await {
                        Push::Delivered => {}
                        Push::Gone => {
                            // Gone for good: forget it, and do not fail the batch.
                            return self.connections.remove(&user, &connection).await;
                        }
                        Push::Failed => {
                            return Err(ChatError::internal(format!("push to {connection} failed")))
                        }
                    }
                }
                Ok(())
            })
            .buffer_unordered(PUSH_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        results.into_iter().collect()
    }

    async fn push(&self, connection: &str, frame: &str) -> Push {
        let sent = self
            .management
            .post_to_connection()
            .connection_id(connection)
            .data(Blob::new(frame.as_bytes()))
            .send()
            .await;
        match sent {
            Ok(_) => Push::Delivered,
            Err(e) => {
                use aws_sdk_apigatewaymanagement::operation::post_to_connection::PostToConnectionError;
                if matches!(
                    e.as_service_error(),
                    Some(PostToConnectionError::GoneException(_))
                ) {
                    Push::Gone
                } else {
                    tracing::warn!(connection, error = %aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e), "push failed");
                    Push::Failed
                }
            }
        }
    }
}
