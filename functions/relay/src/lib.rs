//! Relay: the chat table's stream (the outbox) → Kinesis, partition key = conversation id.
//!
//! Order: stream records of one item arrive in order, and every conversation-level event comes
//! from the conversation item (shared::events), so one conversation's events are already in `seq`
//! order here. The relay packs them into one Kinesis record per conversation per batch, so no two
//! records of a conversation race inside a PutRecords call. When a record fails, the earliest
//! stream record behind it is reported (ReportBatchItemFailures): Lambda redelivers from there,
//! nothing is lost and nothing before it is repeated.

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use chat_shared::events::{events_from_change, sdk_item, Event, EventBatch};
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

/// Events of one conversation bound for one Kinesis record, with the index of the earliest stream
/// record they come from (what to report if the put fails).
struct Outgoing {
    conversation_id: String,
    events: Vec<Event>,
    first_record: usize,
}

/// Splits one conversation's events into records under the Kinesis size limit, in order.
fn chunks(conversation_id: &str, events: Vec<(Event, usize)>) -> Vec<Outgoing> {
    let mut out: Vec<Outgoing> = Vec::new();
    let mut bytes = 0;
    for (event, record) in events {
        let size = serde_json::to_vec(&event).map_or(MAX_RECORD_BYTES, |v| v.len());
        match out.last_mut() {
            Some(last) if bytes + size <= MAX_RECORD_BYTES => last.events.push(event),
            _ => {
                bytes = 0;
                out.push(Outgoing {
                    conversation_id: conversation_id.to_owned(),
                    events: vec![event],
                    first_record: record,
                });
            }
        }
        bytes += size;
    }
    out
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
        let mut failed: Option<usize> = None;

        // Each conversation's events in stream order, with the record each one comes from.
        let mut per_conversation: Vec<(String, Vec<(Event, usize)>)> = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let old = sdk_item(&record.change.old_image);
            let new = sdk_item(&record.change.new_image);
            let events = match events_from_change(&old, &new) {
                Ok(e) => e,
                Err(e) => {
                    // Not ours to skip: report it (and so everything after it) for retry; after the
                    // retries it goes to the on-failure destination, never silently away.
                    tracing::error!(error = ?e, event_id = record.event_id, "undecodable stream record");
                    failed = Some(i);
                    break;
                }
            };
            for event in events {
                let conversation = event.conversation_id().to_owned();
                match per_conversation
                    .iter_mut()
                    .find(|(c, _)| *c == conversation)
                {
                    Some((_, list)) => list.push((event, i)),
                    None => per_conversation.push((conversation, vec![(event, i)])),
                }
            }
        }
        // Round k holds the k-th chunk of every conversation.
        let mut rounds: Vec<Vec<Outgoing>> = Vec::new();
        for (conversation_id, events) in per_conversation {
            for (k, chunk) in chunks(&conversation_id, events).into_iter().enumerate() {
                if rounds.len() <= k {
                    rounds.push(Vec::new());
                }
                rounds[k].push(chunk);
            }
        }

        // A conversation whose chunk failed sends nothing more, so its events never enter Kinesis
        // out of order.
        let mut broken: std::collections::HashSet<String> = Default::default();
        for round in rounds {
            let pending: Vec<Outgoing> = round
                .into_iter()
                .filter(|o| !broken.contains(&o.conversation_id))
                .collect();
            for calls in pending.chunks(MAX_RECORDS_PER_CALL) {
                for failure in self.put(calls).await {
                    let o = &calls[failure];
                    broken.insert(o.conversation_id.clone());
                    failed = Some(failed.map_or(o.first_record, |f| f.min(o.first_record)));
                }
            }
        }

        let mut response = DynamoDbEventResponse::default();
        if let Some(i) = failed {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = records[i].change.sequence_number.clone();
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// One PutRecords call; returns the indexes of the entries that did not make it.
    async fn put(&self, batch: &[Outgoing]) -> Vec<usize> {
        let mut entries = Vec::with_capacity(batch.len());
        for o in batch {
            let payload = EventBatch {
                conversation_id: o.conversation_id.clone(),
                events: o.events.clone(),
            };
            let data = serde_json::to_vec(&payload).expect("events serialize");
            match PutRecordsRequestEntry::builder()
                .partition_key(&o.conversation_id)
                .data(Blob::new(data))
                .build()
            {
                Ok(e) => entries.push(e),
                Err(e) => {
                    tracing::error!(error = %e, "bad Kinesis entry");
                    return (0..batch.len()).collect();
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
                (0..batch.len()).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64, body_bytes: usize) -> Event {
        Event::MessageNew {
            conversation_id: "c".into(),
            seq,
            sender_id: Some("u".into()),
            client_msg_id: Some("id".into()),
            body: Some("x".repeat(body_bytes)),
            created_at: Some("t".into()),
        }
    }

    #[test]
    fn chunks_keep_order_and_the_size_limit() {
        let events = vec![
            (message(1, 400_000), 0),
            (message(2, 400_000), 3),
            (message(3, 400_000), 7),
            (message(4, 10), 8),
        ];
        let out = chunks("c", events);
        let seqs: Vec<Vec<u64>> = out
            .iter()
            .map(|o| {
                o.events
                    .iter()
                    .map(|e| match e {
                        Event::MessageNew { seq, .. } => *seq,
                        _ => 0,
                    })
                    .collect()
            })
            .collect();
        assert_eq!(seqs, vec![vec![1, 2], vec![3, 4]]);
        assert_eq!(
            out.iter().map(|o| o.first_record).collect::<Vec<_>>(),
            vec![0, 7]
        );
        for o in &out {
            let payload = EventBatch {
                conversation_id: o.conversation_id.clone(),
                events: o.events.clone(),
            };
            assert!(serde_json::to_vec(&payload).unwrap().len() < 1024 * 1024);
        }
        assert_eq!(chunks("c", vec![(message(1, 5), 2)]).len(), 1);
    }
}
