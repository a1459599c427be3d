//! Relay: the chat table's stream (the outbox) → Kinesis, partition key = conversation id
//! (docs/event-pipeline.md).
//!
//! Order: stream records of one item arrive in order, and every conversation-level event comes
//! from the conversation item (`events::stream`), so one conversation's events are already in
//! `seq` order here. The relay packs them into one Kinesis record per conversation per PutRecords
//! call (`events::plan::put_rounds`), so no two records of a conversation race inside a call. When
//! a record fails, the earliest stream record behind it is reported (ReportBatchItemFailures):
//! Lambda redelivers from there, nothing is lost and nothing before it is repeated.

use std::collections::HashSet;

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use chat_shared::events::plan::{group_by_conversation, put_rounds, BatchFailures, OutgoingRecord};
use chat_shared::events::stream::events_from_change;
use chat_shared::Config;

/// Stay well under Kinesis' 1 MiB per record.
const MAX_RECORD_BYTES: usize = 900 * 1024;
/// PutRecords takes 500 records.
const MAX_RECORDS_PER_CALL: usize = 500;

#[derive(Clone, Debug)]
pub struct Relay {
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
}

impl Relay {
    pub fn new(kinesis: aws_sdk_kinesis::Client, stream: impl Into<String>) -> Self {
        Relay {
            kinesis,
            stream: stream.into(),
        }
    }

    pub async fn from_env() -> Result<Self, lambda_runtime::Error> {
        let config = Config::from_env()?;
        let sdk = config.sdk_config().await;
        Ok(Relay::new(config.kinesis_client(&sdk), config.event_stream))
    }

    pub async fn handle(&self, event: StreamEvent) -> DynamoDbEventResponse {
        let records = &event.records;
        let mut failures = BatchFailures::default();

        // Every event of the batch in stream order, with the record it comes from.
        let mut events = Vec::new();
        for (i, record) in records.iter().enumerate() {
            match events_from_change(&record.change.old_image, &record.change.new_image) {
                Ok(found) => events.extend(found.into_iter().map(|e| (e, i))),
                Err(e) => {
                    // Not ours to skip: report it (and so everything after it) for retry; after the
                    // retries it goes to the on-failure destination, never silently away.
                    tracing::error!(error = ?e, event_id = record.event_id, "undecodable stream record");
                    failures.fail(i);
                    break;
                }
            }
        }

        // A conversation whose record failed sends nothing more, so its events never enter
        // Kinesis out of order.
        let mut broken = HashSet::new();
        for round in put_rounds(group_by_conversation(events), MAX_RECORD_BYTES) {
            let pending: Vec<OutgoingRecord> = round
                .into_iter()
                .filter(|o| !broken.contains(&o.batch.conversation_id))
                .collect();
            for call in pending.chunks(MAX_RECORDS_PER_CALL) {
                for failed in self.put(call).await {
                    broken.insert(call[failed].batch.conversation_id.clone());
                    failures.fail(call[failed].first_record);
                }
            }
        }

        let mut response = DynamoDbEventResponse::default();
        if let Some(i) = failures.earliest() {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = records[i].change.sequence_number.clone();
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// One PutRecords call; returns the indexes of the entries that did not make it.
    async fn put(&self, call: &[OutgoingRecord]) -> Vec<usize> {
        let mut entries = Vec::with_capacity(call.len());
        for o in call {
            let data = serde_json::to_vec(&o.batch).expect("events serialize");
            match PutRecordsRequestEntry::builder()
                .partition_key(o.batch.conversation_id.as_str())
                .data(Blob::new(data))
                .build()
            {
                Ok(e) => entries.push(e),
                Err(e) => {
                    tracing::error!(error = %e, "bad Kinesis entry");
                    return (0..call.len()).collect();
                }
            }
        }
        match self
            .kinesis
            .put_records()
            .stream_name(&self.stream)
            .set_records(Some(entries))
            .send()
            .await
        {
            Ok(out) => out
                .records()
                .iter()
                .enumerate()
                .filter(|(_, r)| r.error_code().is_some())
                .map(|(i, r)| {
                    tracing::warn!(
                        code = r.error_code(),
                        message = r.error_message(),
                        "Kinesis record not put"
                    );
                    i
                })
                .collect(),
            Err(e) => {
                tracing::error!(error = %aws_sdk_kinesis::error::DisplayErrorContext(&e), "PutRecords failed");
                (0..call.len()).collect()
            }
        }
    }
}
