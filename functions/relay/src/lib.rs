//! Relay: the chat table's stream (the outbox) → Kinesis, partition key = conversation id
//! (docs/event-pipeline.md).
//!
//! Content: the conversation item carries only the last message's preview, so for messages a
//! record names without their content (a group commit, a long body) the relay reads them from the
//! table, one Query per conversation per batch; conversations above 200 members are pushed light
//! and need no read.
//!
//! Order: stream records of one item arrive in order, and every conversation-level event comes
//! from the conversation item (`chat_store::stream`), so one conversation's events are already in
//! `seq` order here. The relay packs them into one Kinesis record per conversation per PutRecords
//! call (`events::plan::put_rounds`), so no two records of a conversation race inside a call.
//!
//! Entries Kinesis refuses (throttling) are put again here, with jittered backoff, before the
//! next round, so a conversation's later records never overtake them. Only when that keeps
//! failing for [`PUT_RETRY_BUDGET`] is the earliest stream record behind a refused entry reported
//! (ReportBatchItemFailures): Lambda redelivers from there (the mapping retries until the record
//! expires from the stream, template.yaml), nothing is lost and nothing before it is repeated.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord as StreamRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use chat_domain::events::plan::{
    group_by_conversation, put_rounds, BatchFailures, ConversationEvents, OutgoingRecord,
};
use chat_domain::events::Event;
use chat_domain::retry::Backoff;
use chat_domain::ConversationId;
use chat_lambda::{batch_response, Error, EventHandler, SdkConfig};
use chat_store::stream::events_from_change;
use chat_store::{ChatStore, Config};

/// Stay well under Kinesis' 1 MiB per record.
const MAX_RECORD_BYTES: usize = 900 * 1024;
/// PutRecords takes 500 records.
const MAX_RECORDS_PER_CALL: usize = 500;

/// How long one invocation keeps putting refused entries again (of the function's 60 s timeout).
/// A Kinesis throttle clears within a second or two; past this the records are reported and
/// Lambda redelivers them.
pub const PUT_RETRY_BUDGET: Duration = Duration::from_secs(20);

/// Wait before putting refused entries again (`retry` is 1-based): random in 1 ms ..=
/// 50 ms · 2^(retry−1), at most 2 s. Full jitter spreads the retries of concurrent relays.
pub const PUT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Every event of the batch in stream order, with the record it comes from, and the
/// conversations whose messages need their content read. Decoding stops at the first record
/// it cannot decode, reported failed.
fn events_of(
    records: &[StreamRecord],
    failures: &mut BatchFailures,
) -> (Vec<(Event, usize)>, HashSet<ConversationId>) {
    let mut events = Vec::new();
    let mut fill = HashSet::new();
    for (i, record) in records.iter().enumerate() {
        match events_from_change(&record.change.old_image, &record.change.new_image) {
            Ok(change) => {
                if change.fill {
                    fill.extend(change.events.iter().map(|e| e.conversation_id().clone()));
                }
                events.extend(change.events.into_iter().map(|e| (e, i)));
            }
            Err(e) => {
                // Not ours to skip: report it (and so everything after it) for retry; after the
                // retries it goes to the on-failure destination, never silently away.
                tracing::error!(error = ?e, event_id = record.event_id, "undecodable stream record");
                failures.fail(i);
                break;
            }
        }
    }
    (events, fill)
}

#[derive(Clone, Debug)]
pub struct Relay {
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
    chat: ChatStore,
    max_record_bytes: usize,
    retry_budget: Duration,
}

impl Relay {
    pub fn new(
        kinesis: aws_sdk_kinesis::Client,
        stream: impl Into<String>,
        chat: ChatStore,
    ) -> Self {
        Relay {
            kinesis,
            stream: stream.into(),
            chat,
            max_record_bytes: MAX_RECORD_BYTES,
            retry_budget: PUT_RETRY_BUDGET,
        }
    }

    /// Smaller Kinesis records (tests: many records per conversation without megabytes of data).
    pub fn with_max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes;
        self
    }

    /// Another in-process retry budget (tests).
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    pub async fn handle(&self, event: StreamEvent) -> DynamoDbEventResponse {
        let started = Instant::now();
        let records = &event.records;
        let mut failures = BatchFailures::default();
        let (events, fill) = events_of(records, &mut failures);

        // Round k holds the k-th record of each conversation; a round is put completely (refused
        // entries again, with backoff) before the next one starts. A conversation whose record
        // could not be put within the budget sends nothing more, so its events never enter
        // Kinesis out of order.
        let mut broken = HashSet::new();
        let (mut put, mut retries) = (0, 0);
        let mut groups = group_by_conversation(events);
        for group in groups
            .iter_mut()
            .filter(|g| fill.contains(&g.conversation_id))
        {
            if let Err(e) = self.fill_content(group).await {
                tracing::warn!(conversation = %group.conversation_id, error = ?e, "reading messages failed; batch will be retried");
                broken.insert(group.conversation_id.clone());
                failures.fail(group.first_record());
            }
        }
        groups.retain(|g| !broken.contains(&g.conversation_id));
        for round in put_rounds(groups, self.max_record_bytes) {
            let pending: Vec<OutgoingRecord> = round
                .into_iter()
                .filter(|o| !broken.contains(&o.batch.conversation_id))
                .collect();
            let (round_put, round_retries) = self
                .put_round(pending, started, &mut broken, &mut failures)
                .await;
            put += round_put;
            retries += round_retries;
        }
        chat_store::telemetry::count("RelayRecordsPut", put as u64);
        if retries > 0 {
            chat_store::telemetry::count("RelayPutRetries", retries as u64);
        }
        if let Some(i) = failures.earliest() {
            // Records Lambda will deliver again, from the earliest reported one.
            chat_store::telemetry::count("RelayRecordsFailed", (records.len() - i) as u64);
        }
        // Always when something was retried or failed, else one batch in CHAT_LOG_EVERY (the
        // metrics above count them all).
        let ms = started.elapsed().as_millis() as u64;
        let abnormal = retries > 0 || !broken.is_empty() || failures.earliest().is_some();
        if chat_store::telemetry::batch_line_due(abnormal, ms) {
            tracing::info!(
                records = records.len(),
                kinesis_records = put,
                retries,
                failed = broken.len(),
                ms,
                "relay batch"
            );
        }

        batch_response(records, failures.earliest())
    }

    /// Puts one round, refused entries again with backoff, until all are in or the budget
    /// (counted from `started`) is spent: then their conversations are broken and their
    /// earliest records reported. Returns the entries put and the retries.
    async fn put_round(
        &self,
        mut pending: Vec<OutgoingRecord>,
        started: Instant,
        broken: &mut HashSet<ConversationId>,
        failures: &mut BatchFailures,
    ) -> (usize, usize) {
        let (mut put, mut retries) = (0, 0);
        let mut retry = 0;
        while !pending.is_empty() {
            let mut refused = Vec::new();
            for call in pending.chunks(MAX_RECORDS_PER_CALL) {
                let failed = self.put(call).await;
                put += call.len() - failed.len();
                refused.extend(failed.into_iter().map(|i| call[i].clone()));
            }
            if refused.is_empty() {
                break;
            }
            retry += 1;
            let wait = PUT_BACKOFF.wait(retry);
            if started.elapsed() + wait > self.retry_budget {
                for o in &refused {
                    tracing::error!(conversation = %o.batch.conversation_id, retries = retry - 1, "Kinesis keeps refusing the record; reporting it for redelivery");
                    broken.insert(o.batch.conversation_id.clone());
                    failures.fail(o.first_record);
                }
                break;
            }
            retries += refused.len();
            tokio::time::sleep(wait).await;
            pending = refused;
        }
        (put, retries)
    }

    /// Gives light `message.new` events their content, read from the table (1 Query), and change
    /// events the message as it is now (1 BatchGetItem of the messages and their counts, at the
    /// same time). A message no longer in the table (archived) leaves its change event light.
    async fn fill_content(
        &self,
        group: &mut ConversationEvents,
    ) -> Result<(), chat_domain::ChatError> {
        let seqs = group
            .events
            .iter()
            .filter(|(e, _)| e.is_light())
            .filter_map(|(e, _)| match e {
                Event::MessageNew { seq, .. } => Some(*seq),
                _ => None,
            });
        let changed: BTreeSet<u64> = group
            .events
            .iter()
            .filter(|(e, _)| e.lacks_message())
            .filter_map(|(e, _)| e.as_change().map(|(_, c)| c.seq))
            .collect();
        let id: &ConversationId = &group.conversation_id;
        let new_messages = async {
            match (seqs.clone().min(), seqs.max()) {
                (Some(from), Some(to)) => self.chat.messages_between(id, from, to).await,
                _ => Ok(Vec::new()),
            }
        };
        let changed_messages = async {
            if changed.is_empty() {
                Ok(Default::default())
            } else {
                self.chat.messages_now(id, &changed, 0).await
            }
        };
        let (new_messages, changed_messages) = tokio::try_join!(new_messages, changed_messages)?;
        let found: HashMap<u64, Event> = new_messages
            .iter()
            .map(|m| (m.seq, Event::message_new(m)))
            .collect();
        for (event, _) in group.events.iter_mut() {
            if let Event::MessageNew {
                seq, body: None, ..
            } = event
            {
                if let Some(full) = found.get(seq) {
                    *event = full.clone();
                }
            }
            let seq = event.as_change().map(|(_, c)| c.seq);
            if let Some(m) = seq.and_then(|seq| changed_messages.get(&seq)) {
                event.set_message(m.clone());
            }
        }
        Ok(())
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

impl EventHandler for Relay {
    type Event = StreamEvent;
    type Response = DynamoDbEventResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        let kinesis = config.kinesis_client(sdk);
        Ok(Relay::new(
            kinesis,
            &config.event_stream,
            config.chat_store(sdk),
        ))
    }

    fn handle(&self, event: StreamEvent) -> impl Future<Output = DynamoDbEventResponse> + Send {
        Relay::handle(self, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_backoff_is_jittered_and_bounded() {
        for retry in 1..40 {
            let d = PUT_BACKOFF.wait(retry);
            assert!(
                d >= Duration::from_millis(1) && d <= Duration::from_secs(2),
                "{d:?}"
            );
        }
        assert!(PUT_BACKOFF.wait(1) <= Duration::from_millis(50));
        // Enough retries fit the budget to ride out a throttle of several seconds.
        let worst: Duration = (1..=12).map(|r| PUT_BACKOFF.ceiling(r)).sum();
        assert!(worst < PUT_RETRY_BUDGET, "{worst:?}");
    }
}
