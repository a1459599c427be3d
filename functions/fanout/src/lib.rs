//! Fanout: Kinesis (events of one conversation per record, in order) → the live WebSocket
//! connections of the conversation's current members, through the API Gateway Management API
//! (docs/event-pipeline.md, "Fanout").
//!
//! Per batch: records are grouped by conversation; per conversation one Query reads the current
//! members, ⌈members/100⌉ BatchGetItem their live connections; the frames are planned by
//! `events::plan::frames_for` (read receipts coalesced; above 200 members the light
//! `message.new`, consecutive ones coalesced). Each connection gets its frames in order;
//! connections are served concurrently, at most [`PUSH_CONCURRENCY`] pushes in flight per
//! invocation.
//!
//! Failures are handled per connection (`events::policy`): `410`/`400`/`403` delete the record
//! (not a young one, and only the registration that was read), `429`/`5xx`/timeouts are retried
//! here with jitter and then given up for this batch. A Kinesis record is reported failed
//! (ReportBatchItemFailures) only when the fanout's own reads fail: one member's bad connection
//! never makes Lambda redeliver the events to everyone else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};
use aws_sdk_apigatewaymanagement::config::retry::RetryConfig;
use aws_sdk_apigatewaymanagement::config::timeout::TimeoutConfig;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use chat_shared::events::plan::{frames_for, group_by_conversation, BatchFailures};
use chat_shared::events::policy::{
    attempts_for, may_forget, push_backoff, PushResult, PUSH_ATTEMPT_TIMEOUT, SUSPECT_SECS,
};
use chat_shared::events::{Event, EventBatch};
use chat_shared::store::connections::LiveConnection;
use chat_shared::{ChatError, ChatStore, Config, ConnectionStore, ConversationId, UserId};
use futures::stream::{self, StreamExt};
use tokio::sync::Semaphore;

/// PostToConnection calls in flight at once per invocation, across all conversations of the
/// batch (measured: docs/event-pipeline.md, "Fanout").
pub const PUSH_CONCURRENCY: usize = 64;

/// Member lists a warm instance keeps (a 1,000-member list is ~40 KB).
const MEMBER_LISTS_CACHED: usize = 5_000;

/// Conversations of a batch whose reads and pushes run at once.
const CONVERSATIONS_AT_ONCE: usize = 8;

/// Counters since start (the per-invocation numbers are logged): what the pushes did.
#[derive(Debug, Default)]
pub struct FanoutStats {
    delivered: AtomicU64,
    retries: AtomicU64,
    gave_up: AtomicU64,
    forgotten: AtomicU64,
    kept_in_grace: AtomicU64,
    undeliverable: AtomicU64,
}

macro_rules! getters {
    ($($name:ident: $doc:literal),*) => {
        impl FanoutStats {
            $(#[doc = $doc] pub fn $name(&self) -> u64 { self.$name.load(Ordering::Relaxed) })*
        }
    };
}

getters!(
    delivered: "Frames delivered.",
    retries: "Push attempts after a 429, 5xx or timeout.",
    gave_up: "Times a connection was given up for the rest of a batch after its retries.",
    forgotten: "Connection records deleted after 410/400/403.",
    kept_in_grace: "410/400/403 answers for connections younger than the grace, records kept.",
    undeliverable: "Frames a connection could not take (e.g. 413), skipped."
);

impl FanoutStats {
    fn add(&self, counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn snapshot(&self) -> [u64; 6] {
        [
            self.delivered(),
            self.retries(),
            self.gave_up(),
            self.forgotten(),
            self.kept_in_grace(),
            self.undeliverable(),
        ]
    }
}

/// A conversation's member ids and the `membersVersion` they belong to.
type MemberList = (u64, Arc<Vec<UserId>>);

#[derive(Clone, Debug)]
pub struct Fanout {
    chat: ChatStore,
    connections: ConnectionStore,
    management: aws_sdk_apigatewaymanagement::Client,
    /// Connections that recently exhausted their retries, until when (`policy::SUSPECT_SECS`).
    /// Per warm instance: a lost entry only costs one more round of retries.
    suspects: Arc<Mutex<HashMap<String, Instant>>>,
    /// Member ids per conversation with the `membersVersion` they belong to. Every membership
    /// change bumps the version (in the same transaction as the member items), so a cached list
    /// with the current version is the current membership: a 1,000-member group costs one small
    /// GetItem per batch instead of a Query of 1,000 items.
    members: Arc<Mutex<HashMap<ConversationId, MemberList>>>,
    stats: Arc<FanoutStats>,
}

/// What happened to one connection's frames.
enum Outcome {
    Done,
    /// Gone or refused: its record is deleted (unless too young).
    Forget,
    /// Still failing after the retries: skip its remaining frames of this batch.
    GiveUp,
}

impl Fanout {
    /// `management` gets the fanout's own retry policy: the SDK's retries off (they would retry
    /// inside ours, and its retry quota would stop retries for every connection after a burst of
    /// failures on a few), and a time limit per attempt.
    pub fn new(
        chat: ChatStore,
        connections: ConnectionStore,
        management: aws_sdk_apigatewaymanagement::Client,
    ) -> Self {
        let conf = management
            .config()
            .to_builder()
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(PUSH_ATTEMPT_TIMEOUT)
                    .build(),
            )
            .build();
        Fanout {
            chat,
            connections,
            management: aws_sdk_apigatewaymanagement::Client::from_conf(conf),
            suspects: Arc::default(),
            members: Arc::default(),
            stats: Arc::default(),
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

    pub fn stats(&self) -> Arc<FanoutStats> {
        self.stats.clone()
    }

    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let started = Instant::now();
        let before = self.stats.snapshot();
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
        let groups = group_by_conversation(events);
        let conversations = groups.len();
        let slots = Arc::new(Semaphore::new(PUSH_CONCURRENCY));
        let outcomes = stream::iter(groups)
            .map(|group| {
                let slots = slots.clone();
                async move {
                    let first = group.first_record();
                    let conversation = group.conversation_id.clone();
                    match self.deliver(&conversation, group.into_events(), &slots).await {
                        Ok(()) => None,
                        Err(e) => {
                            tracing::warn!(%conversation, error = ?e, "fanout reads failed; batch will be retried");
                            Some(first)
                        }
                    }
                }
            })
            .buffer_unordered(CONVERSATIONS_AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        let read_failures = outcomes.iter().flatten().count() as u64;
        for i in outcomes.into_iter().flatten() {
            failures.fail(i);
        }
        let after = self.stats.snapshot();
        let d = |k: usize| after[k] - before[k];
        // CloudWatch metrics (EMF, with CHAT_METRICS=emf); the zeros of the rare ones are left out.
        chat_shared::telemetry::count("Pushes", d(0));
        for (name, n) in [
            ("PushRetries", d(1)),
            ("PushesGivenUp", d(2)),
            ("ConnectionsGone", d(3)),
            ("GoneInGrace", d(4)),
            ("PushesUndeliverable", d(5)),
            ("FanoutReadFailures", read_failures),
        ] {
            if n > 0 {
                chat_shared::telemetry::count(name, n);
            }
        }
        // The per-invocation figures (one line, the metrics to chart).
        tracing::info!(
            records = records.len(),
            conversations,
            delivered = d(0),
            retries = d(1),
            gave_up = d(2),
            forgotten = d(3),
            kept_in_grace = d(4),
            undeliverable = d(5),
            ms = started.elapsed().as_millis() as u64,
            "fanout batch"
        );
        let mut response = KinesisEventResponse::default();
        if let Some(i) = failures.earliest() {
            let mut failure = KinesisBatchItemFailure::default();
            failure.item_identifier = Some(records[i].kinesis.sequence_number.clone());
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// Pushes one conversation's events to its members' live connections. Fails only when the
    /// reads fail; push failures are handled per connection.
    async fn deliver(
        &self,
        conversation: &ConversationId,
        events: Vec<Event>,
        slots: &Semaphore,
    ) -> Result<(), ChatError> {
        let started = Instant::now();
        let Some(users) = self.members(conversation).await? else {
            return Ok(());
        };
        let frames: Vec<String> = frames_for(events, users.len())
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()
            .map_err(ChatError::internal)?;
        if frames.is_empty() {
            return Ok(());
        }
        let now = chat_shared::time::unix_seconds(chat_shared::time::now());
        let members_read = started.elapsed();
        let connections = self.connections.live_connections(&users, now).await?;
        let reads = started.elapsed();
        let online = connections.len();
        let frames = &frames;
        stream::iter(connections)
            .map(|connection| async move {
                match self.push_frames(&connection, frames, slots).await {
                    Outcome::Done => {}
                    Outcome::Forget => self.forget(&connection).await,
                    Outcome::GiveUp => {
                        let n = self.stats.add(&self.stats.gave_up);
                        tracing::warn!(
                            connection = connection.connection_id,
                            user = %connection.user,
                            %conversation,
                            gave_up_total = n,
                            "push still failing after retries; skipping this connection for the batch"
                        );
                    }
                }
            })
            .buffer_unordered(PUSH_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        tracing::debug!(
            %conversation,
            members = users.len(),
            online,
            frames = frames.len(),
            members_ms = members_read.as_millis() as u64,
            presence_ms = (reads - members_read).as_millis() as u64,
            push_ms = (started.elapsed() - reads).as_millis() as u64,
            "conversation delivered"
        );
        Ok(())
    }

    /// The current members (None: no such conversation). DynamoDB: 1 GetItem, + 1 Query when the
    /// membership changed since this instance last read it.
    async fn members(&self, id: &ConversationId) -> Result<Option<Arc<Vec<UserId>>>, ChatError> {
        let Some(version) = self.chat.members_version(id).await? else {
            return Ok(None);
        };
        if let Some((v, users)) = self.members.lock().unwrap().get(id) {
            if *v == version {
                return Ok(Some(users.clone()));
            }
        }
        let Some((version, users)) = self.chat.member_ids(id).await? else {
            return Ok(None);
        };
        let users = Arc::new(users);
        let mut cache = self.members.lock().unwrap();
        // Bounded: a warm instance forgets everything now and then rather than growing.
        if cache.len() >= MEMBER_LISTS_CACHED {
            cache.clear();
        }
        cache.insert(id.clone(), (version, users.clone()));
        Ok(Some(users))
    }

    /// One connection's frames, in order.
    async fn push_frames(
        &self,
        connection: &LiveConnection,
        frames: &[String],
        slots: &Semaphore,
    ) -> Outcome {
        let id = connection.connection_id.as_str();
        let suspect = self.is_suspect(id);
        for frame in frames {
            match self.push(id, frame, attempts_for(suspect), slots).await {
                PushResult::Delivered => {
                    self.stats.add(&self.stats.delivered);
                }
                PushResult::Gone | PushResult::Rejected => return Outcome::Forget,
                PushResult::Transient => {
                    self.mark_suspect(id);
                    return Outcome::GiveUp;
                }
                PushResult::Undeliverable => {
                    self.stats.add(&self.stats.undeliverable);
                    tracing::warn!(connection = id, "frame refused; skipped");
                }
            }
        }
        if suspect {
            self.suspects.lock().unwrap().remove(id);
        }
        Outcome::Done
    }

    /// One frame, with up to `attempts` attempts for transient failures. A push slot is held only
    /// while a request is in flight, not while waiting to retry.
    async fn push(
        &self,
        connection: &str,
        frame: &str,
        attempts: u32,
        slots: &Semaphore,
    ) -> PushResult {
        let mut result = PushResult::Transient;
        for attempt in 1..=attempts {
            if attempt > 1 {
                self.stats.add(&self.stats.retries);
                tokio::time::sleep(push_backoff(attempt - 1)).await;
            }
            let _slot = slots.acquire().await.expect("never closed");
            result = self.post(connection, frame).await;
            if result != PushResult::Transient {
                break;
            }
        }
        result
    }

    async fn post(&self, connection: &str, frame: &str) -> PushResult {
        let sent = self
            .management
            .post_to_connection()
            .connection_id(connection)
            .data(Blob::new(frame.as_bytes()))
            .send()
            .await;
        match sent {
            Ok(_) => PushResult::Delivered,
            Err(e) => {
                let status = e.raw_response().map(|r| r.status().as_u16());
                let result = PushResult::of_failure(status);
                if result != PushResult::Gone {
                    tracing::debug!(connection, ?status, error = %aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e), "push failed");
                }
                result
            }
        }
    }

    /// Deletes the record of a connection API Gateway called gone or refused, unless it was
    /// registered within the grace (its handshake may still be completing). A failed delete is
    /// logged only: the next push finds the connection gone again.
    async fn forget(&self, connection: &LiveConnection) {
        let now = chat_shared::time::unix_seconds(chat_shared::time::now());
        if !may_forget(connection.registered_at(), now) {
            self.stats.add(&self.stats.kept_in_grace);
            tracing::info!(
                connection = connection.connection_id,
                "gone or refused right after $connect; record kept"
            );
            return;
        }
        match self.connections.forget_if_unchanged(connection).await {
            Ok(true) => {
                self.stats.add(&self.stats.forgotten);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(connection = connection.connection_id, error = %e, "deleting a gone connection failed")
            }
        }
    }

    fn is_suspect(&self, connection: &str) -> bool {
        let suspects = self.suspects.lock().unwrap();
        suspects
            .get(connection)
            .is_some_and(|until| *until > Instant::now())
    }

    fn mark_suspect(&self, connection: &str) {
        let now = Instant::now();
        let mut suspects = self.suspects.lock().unwrap();
        // Bounded: expired entries go whenever the map grows large.
        if suspects.len() >= 10_000 {
            suspects.retain(|_, until| *until > now);
        }
        suspects.insert(
            connection.to_owned(),
            now + Duration::from_secs(SUSPECT_SECS),
        );
    }
}
