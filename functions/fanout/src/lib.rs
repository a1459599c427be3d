//! Fanout: Kinesis (events of one conversation per record, in order) → the live WebSocket
//! connections of the conversation's current members, through the API Gateway Management API.
//! How a batch is served (who is in the conversation, who is online, the frames, the pushes) and
//! the failure policy per connection: docs/event-pipeline.md, "Fanout". What each part decides
//! is pure and tested where it lives: `events::plan` (frames), `events::policy` (an answer's
//! fate), `events::redelivery` (what a record already reached).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::KinesisEventResponse;
use aws_sdk_apigatewaymanagement::config::retry::RetryConfig;
use aws_sdk_apigatewaymanagement::config::timeout::TimeoutConfig;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use chat_domain::events::plan::{
    frames_for, group_by_conversation, BatchFailures, ConversationEvents,
};
use chat_domain::events::policy::{
    may_forget, PushResult, PUSH_ATTEMPTS, PUSH_ATTEMPT_TIMEOUT, PUSH_BACKOFF,
};
use chat_domain::events::redelivery::{due_for, Connections, Redeliveries};
use chat_domain::events::{Event, EventBatch};
use chat_domain::{ChatError, ConversationId, UserId};
use chat_lambda::{batch_response, Error, EventHandler, SdkConfig};
use chat_store::connections::LiveConnection;
use chat_store::{ChatStore, Config, ConnectionStore, PushState};
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
    already_delivered: AtomicU64,
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
    retries: "Push attempts after a 429, 5xx, 403 or timeout.",
    gave_up: "Times a connection still failed after its retries (its record is reported failed).",
    forgotten: "Connection records deleted after 410/400.",
    kept_in_grace: "410/400 answers for connections younger than the grace, records kept.",
    undeliverable: "Frames a connection could not take (e.g. 413), skipped.",
    already_delivered: "Redelivered records this instance had already got through to everyone."
);

impl FanoutStats {
    fn add(&self, counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn snapshot(&self) -> [u64; 7] {
        [
            self.delivered(),
            self.retries(),
            self.gave_up(),
            self.forgotten(),
            self.kept_in_grace(),
            self.undeliverable(),
            self.already_delivered(),
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
    /// Whom the records of a batch reported failed reached, for their redelivery.
    redeliveries: Arc<Mutex<Redeliveries>>,
    /// Member ids per conversation with the `membersVersion` they belong to. Every membership
    /// change bumps the version (in the same transaction as the member items), so a cached list
    /// with the current version is the current membership: a 1,000-member group costs one small
    /// GetItem per batch instead of a Query of 1,000 items.
    members: Arc<Mutex<HashMap<ConversationId, MemberList>>>,
    stats: Arc<FanoutStats>,
    /// Typing's publisher, for members who leave while typing (`member.removed`).
    typing: ws_connection::Typing,
}

/// What happened to one connection's frames.
enum Outcome {
    Done,
    /// Gone or refused: its record is deleted (unless too young).
    Forget,
    /// Still failing after the retries: skip its remaining frames; the records are reported.
    GiveUp,
}

/// What one conversation's records of a batch reached.
struct Pushed {
    /// Some connection still failed after its retries: its records must be delivered again.
    gave_up: bool,
    /// The connections that have all of them now (pushed, or needing nothing more).
    reached: Connections,
}

impl Pushed {
    fn everyone() -> Pushed {
        Pushed {
            gave_up: false,
            reached: Connections::default(),
        }
    }
}

/// A conversation's records (their indexes in the batch) and what delivering them did.
type ConversationOutcome = (Vec<usize>, Result<Pushed, ChatError>);

/// Reports the earliest record of each conversation that was not delivered (its reads failed,
/// or a connection gave up); returns how many conversations failed each way.
fn report_undelivered(
    outcomes: &[ConversationOutcome],
    failures: &mut BatchFailures,
) -> (u64, u64) {
    let (mut read_failures, mut push_failures) = (0u64, 0u64);
    for (in_group, pushed) in outcomes {
        let failed = match pushed {
            Err(_) => {
                read_failures += 1;
                true
            }
            Ok(p) if p.gave_up => {
                push_failures += 1;
                true
            }
            Ok(_) => false,
        };
        if let (true, Some(first)) = (failed, in_group.iter().min()) {
            failures.fail(*first);
        }
    }
    (read_failures, push_failures)
}

/// A conversation's members and what else the fanout read of it.
type Members = (Arc<Vec<UserId>>, PushState);

/// A plan's key: the records due (indexes in the batch) and the events among them that came from
/// the connection (`Event::is_from`: for most connections, none).
type PlanKey = (Vec<usize>, Vec<usize>);

/// The frames of a set of a conversation's records, planned once per `PlanKey` (most
/// connections need all of them).
struct FramePlans<'a> {
    events: &'a [(Event, usize)],
    members: usize,
    plans: HashMap<PlanKey, Arc<Vec<String>>>,
}

impl<'a> FramePlans<'a> {
    fn new(events: &'a [(Event, usize)], members: usize) -> Self {
        FramePlans {
            events,
            members,
            plans: HashMap::new(),
        }
    }

    /// The frames of the records `due` (indexes in the batch) for the connection `to` (None:
    /// any).
    fn frames(
        &mut self,
        due: &[usize],
        to: Option<&LiveConnection>,
    ) -> Result<Arc<Vec<String>>, ChatError> {
        let to = to.map(|c| (&c.user, c.connection_id.as_str()));
        let own = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, (e, _))| to.is_some_and(|(user, id)| e.is_from(user, id)))
            .map(|(k, _)| k)
            .collect();
        let key = (due.to_vec(), own);
        if let Some(frames) = self.plans.get(&key) {
            return Ok(frames.clone());
        }
        let chosen = self
            .events
            .iter()
            .filter(|(_, i)| due.contains(i))
            .map(|(e, _)| e.clone())
            .collect();
        let frames: Vec<String> = frames_for(chosen, self.members, to)
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()
            .map_err(ChatError::internal)?;
        let frames = Arc::new(frames);
        self.plans.insert(key, frames.clone());
        Ok(frames)
    }

    /// How many sets were planned.
    fn len(&self) -> usize {
        self.plans.len()
    }
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
        let management = aws_sdk_apigatewaymanagement::Client::from_conf(conf);
        Fanout {
            typing: ws_connection::Typing::new(
                chat.clone(),
                connections.clone(),
                Some(management.clone()),
            ),
            chat,
            connections,
            management,
            redeliveries: Arc::default(),
            members: Arc::default(),
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<FanoutStats> {
        self.stats.clone()
    }

    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let started = Instant::now();
        let before = self.stats.snapshot();
        let records = &event.records;
        // A record's id for the redelivery memory: its eventID (shard and sequence number; a
        // sequence number alone is unique per shard only).
        let ids: Vec<&str> = records
            .iter()
            .map(|r| r.event_id.as_deref().unwrap_or(&r.kinesis.sequence_number))
            .collect();
        let mut failures = BatchFailures::default();
        let events = self.events_to_push(records, &ids, started, &mut failures);
        let departures = departures(&events);
        let groups = group_by_conversation(events);
        let conversations = groups.len();
        let outcomes = self.deliver_all(groups, &ids).await;
        self.stop_typing_of(departures).await;
        let read_and_push_failures = report_undelivered(&outcomes, &mut failures);
        if let Some(earliest) = failures.earliest() {
            // Lambda delivers the records from `earliest` on again: remember whom they reached.
            self.remember_reached(&outcomes, earliest, &ids, started);
        }
        self.log_batch(
            before,
            records.len(),
            conversations,
            read_and_push_failures,
            started,
        );
        batch_response(records, failures.earliest())
    }

    /// Members who left (`member.removed`) stop typing there at once, the others told
    /// (`Typing::left`). Best effort: a typist left in the set expires within 6 s anyway.
    async fn stop_typing_of(&self, departures: Vec<(ConversationId, UserId)>) {
        for (id, user) in departures {
            if let Err(e) = self.typing.left(&id, &user).await {
                tracing::warn!(conversation = %id, error = %e, "a departed member's typing not stopped");
            }
        }
    }

    /// The events of the records this instance has not already got through to everyone, each
    /// with its record's index; an undecodable record is reported failed.
    fn events_to_push(
        &self,
        records: &[KinesisEventRecord],
        ids: &[&str],
        started: Instant,
        failures: &mut BatchFailures,
    ) -> Vec<(Event, usize)> {
        let mut events = Vec::new();
        let memory = self.redeliveries.lock().unwrap();
        for (i, record) in records.iter().enumerate() {
            if memory.reached_everyone(ids[i], started) {
                self.stats.add(&self.stats.already_delivered);
                continue;
            }
            match serde_json::from_slice::<EventBatch>(&record.kinesis.data) {
                Ok(batch) => events.extend(batch.events.into_iter().map(|e| (e, i))),
                Err(e) => {
                    tracing::error!(error = %e, sequence = record.kinesis.sequence_number, "undecodable Kinesis record");
                    failures.fail(i);
                }
            }
        }
        events
    }

    /// Delivers the conversations, [`CONVERSATIONS_AT_ONCE`] at a time, sharing the
    /// invocation's [`PUSH_CONCURRENCY`] push slots.
    async fn deliver_all(
        &self,
        groups: Vec<ConversationEvents>,
        ids: &[&str],
    ) -> Vec<ConversationOutcome> {
        let slots = Arc::new(Semaphore::new(PUSH_CONCURRENCY));
        stream::iter(groups)
            .map(|group| {
                let slots = slots.clone();
                async move {
                    let conversation = group.conversation_id.clone();
                    let mut in_group: Vec<usize> = group.events.iter().map(|(_, i)| *i).collect();
                    in_group.dedup();
                    let pushed = self.deliver(&conversation, group.events, ids, &slots).await;
                    if let Err(e) = &pushed {
                        tracing::warn!(%conversation, error = ?e, "fanout reads failed; its records will be delivered again");
                    }
                    (in_group, pushed)
                }
            })
            .buffer_unordered(CONVERSATIONS_AT_ONCE)
            .collect::<Vec<_>>()
            .await
    }

    /// Remembers whom the records from `earliest` on reached, for their redelivery.
    fn remember_reached(
        &self,
        outcomes: &[ConversationOutcome],
        earliest: usize,
        ids: &[&str],
        started: Instant,
    ) {
        let mut memory = self.redeliveries.lock().unwrap();
        for (in_group, pushed) in outcomes {
            let Ok(pushed) = pushed else { continue };
            for &i in in_group.iter().filter(|&&i| i >= earliest) {
                if pushed.gave_up {
                    memory.some(ids[i], &pushed.reached, started);
                } else {
                    memory.everyone(ids[i], started);
                }
            }
        }
    }

    /// The batch's metrics and its log line, from the counters' change since `before`.
    fn log_batch(
        &self,
        before: [u64; 7],
        records: usize,
        conversations: usize,
        (read_failures, push_failures): (u64, u64),
        started: Instant,
    ) {
        let after = self.stats.snapshot();
        let d = |k: usize| after[k] - before[k];
        // CloudWatch metrics (EMF, with CHAT_METRICS=emf); the zeros of the rare ones are left out.
        chat_store::telemetry::count("Pushes", d(0));
        for (name, n) in [
            ("PushRetries", d(1)),
            ("PushesGivenUp", d(2)),
            ("ConnectionsGone", d(3)),
            ("GoneInGrace", d(4)),
            ("PushesUndeliverable", d(5)),
            ("RecordsAlreadyDelivered", d(6)),
            ("FanoutReadFailures", read_failures),
            ("FanoutPushFailures", push_failures),
        ] {
            if n > 0 {
                chat_store::telemetry::count(name, n);
            }
        }
        // The per-invocation figures (the metrics above count them all): always when a push was
        // retried, given up or failed, or a read failed; else one batch in CHAT_LOG_EVERY.
        let ms = started.elapsed().as_millis() as u64;
        let abnormal = d(1) + d(2) + d(5) + read_failures + push_failures > 0;
        if !chat_store::telemetry::batch_line_due(abnormal, ms) {
            return;
        }
        tracing::info!(
            records,
            conversations,
            delivered = d(0),
            retries = d(1),
            gave_up = d(2),
            forgotten = d(3),
            kept_in_grace = d(4),
            undeliverable = d(5),
            already_delivered = d(6),
            read_failures,
            push_failures,
            ms,
            "fanout batch"
        );
    }

    /// Pushes one conversation's events (each with the index of its record; `ids` are the
    /// records' ids) to its members' live connections, each connection only the records an
    /// earlier invocation did not get through to it. Fails only when the reads fail.
    async fn deliver(
        &self,
        conversation: &ConversationId,
        events: Vec<(Event, usize)>,
        ids: &[&str],
        slots: &Semaphore,
    ) -> Result<Pushed, ChatError> {
        let started = Instant::now();
        let Some((users, state)) = self.members(conversation, &events).await? else {
            return Ok(Pushed::everyone());
        };
        let mut records: Vec<usize> = events.iter().map(|(_, i)| *i).collect();
        records.dedup();
        // Content deleted since these events were relayed is not pushed (docs/data-model.md §8.4).
        let deleted = self.deleted(conversation, &events, state).await?;
        let mut events: Vec<(Event, usize)> = events
            .into_iter()
            .map(|(e, i)| (e.without_deleted(&deleted), i))
            .collect();
        // Attachments' URLs, fresh for this push as for every read (a local signature, no
        // request); above 200 members the frames are light and carry none.
        if users.len() <= chat_domain::events::FULL_PUSH_MAX_MEMBERS {
            for (e, _) in events.iter_mut() {
                if let Some(list) = e.attachments_mut() {
                    self.chat.sign_attachment_list(conversation, list).await?;
                }
            }
        }
        let mut plans = FramePlans::new(&events, users.len());
        if plans.frames(&records, None)?.is_empty() {
            return Ok(Pushed::everyone());
        }
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        let members_read = started.elapsed();
        let connections = self.connections.live_connections(&users, now).await?;
        let reads = started.elapsed();
        let online = connections.len();
        let mut reached: HashSet<String> = HashSet::new();
        let mut jobs = Vec::with_capacity(connections.len());
        for (connection, due) in self.due_per_connection(connections, &records, ids) {
            let frames = plans.frames(&due, Some(&connection))?;
            if frames.is_empty() {
                reached.insert(connection.connection_id);
            } else {
                jobs.push((connection, frames));
            }
        }
        let outcomes = stream::iter(jobs)
            .map(|(connection, frames)| self.push_to(connection, frames, conversation, slots))
            .buffer_unordered(PUSH_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut gave_up = false;
        for (connection, got_through) in outcomes {
            if got_through {
                reached.insert(connection);
            } else {
                gave_up = true;
            }
        }
        tracing::debug!(
            %conversation,
            members = users.len(),
            online,
            frame_sets = plans.len(),
            members_ms = members_read.as_millis() as u64,
            presence_ms = (reads - members_read).as_millis() as u64,
            push_ms = (started.elapsed() - reads).as_millis() as u64,
            "conversation delivered"
        );
        Ok(Pushed {
            gave_up,
            reached: Arc::new(reached),
        })
    }

    /// Each connection with the records (indexes) it still needs: those an earlier invocation
    /// did not get through to it.
    fn due_per_connection(
        &self,
        connections: Vec<LiveConnection>,
        records: &[usize],
        ids: &[&str],
    ) -> Vec<(LiveConnection, Vec<usize>)> {
        let memory = self.redeliveries.lock().unwrap();
        let at = Instant::now();
        connections
            .into_iter()
            .map(|connection| {
                let all = records.iter().map(|&i| (i, ids[i]));
                let due = due_for(&memory, all, &connection.connection_id, at);
                (connection, due)
            })
            .collect()
    }

    /// Pushes one connection its frames and acts on the outcome; returns the connection's id
    /// and whether it got through (a forgotten connection counts as reached).
    async fn push_to(
        &self,
        connection: LiveConnection,
        frames: Arc<Vec<String>>,
        conversation: &ConversationId,
        slots: &Semaphore,
    ) -> (String, bool) {
        let outcome = match self.push_frames(&connection, &frames, slots).await {
            Outcome::Done => true,
            Outcome::Forget => {
                self.forget(&connection).await;
                true
            }
            Outcome::GiveUp => {
                let n = self.stats.add(&self.stats.gave_up);
                tracing::warn!(
                    connection = connection.connection_id,
                    user = %connection.user,
                    %conversation,
                    gave_up_total = n,
                    "push still failing after retries; its records will be delivered again"
                );
                false
            }
        };
        (connection.connection_id, outcome)
    }

    /// The current members and the recently deleted seqs (None: no such conversation).
    /// DynamoDB: 1 GetItem, + 1 Query and 1 GetItem when the membership changed since this
    /// instance last read it. Nothing for `events` without content (read receipts) of a direct
    /// conversation whose members it holds: its two members never change, and there is no
    /// content to withhold.
    async fn members(
        &self,
        id: &ConversationId,
        events: &[(Event, usize)],
    ) -> Result<Option<Members>, ChatError> {
        if id.is_direct() && !events.iter().any(|(e, _)| e.has_content()) {
            if let Some((version, users)) = self.members.lock().unwrap().get(id).cloned() {
                let state = PushState {
                    members_version: version,
                    deleted: Vec::new(),
                    deleted_dropped_at: None,
                };
                return Ok(Some((users, state)));
            }
        }
        let Some(state) = self.chat.push_state(id).await? else {
            return Ok(None);
        };
        let users = self.member_list(id, state.members_version).await?;
        Ok(users.map(|users| (users, state)))
    }

    /// The seqs whose content `events` must not carry: the recently deleted ones and, of the
    /// content read before an older deletion fell off that list, the deleted ones. DynamoDB:
    /// none, or 1 BatchGetItem when some content is that old.
    async fn deleted(
        &self,
        id: &ConversationId,
        events: &[(Event, usize)],
        state: PushState,
    ) -> Result<Vec<u64>, ChatError> {
        let dropped = state.deleted_dropped_at.as_deref();
        let old: BTreeSet<u64> = events
            .iter()
            .filter_map(|(e, _)| e.content_to_check(&state.deleted, dropped))
            .collect();
        let mut deleted = state.deleted;
        if !old.is_empty() {
            deleted.extend(self.chat.deleted_among(id, &old).await?);
        }
        Ok(deleted)
    }

    /// The members of membership version `version` (as read), from the cache while current.
    async fn member_list(
        &self,
        id: &ConversationId,
        version: u64,
    ) -> Result<Option<Arc<Vec<UserId>>>, ChatError> {
        if let Some((v, users)) = self.members.lock().unwrap().get(id) {
            if *v == version {
                return Ok(Some(users.clone()));
            }
        }
        let Some((read_version, users)) = self.chat.member_ids(id).await? else {
            return Ok(None);
        };
        let users = Arc::new(users);
        if !cacheable(version, read_version) {
            // A membership change landed between the versions read before and after the
            // Query: its members may be of either. Good for this batch, never kept: the next
            // batch reads again.
            return Ok(Some(users));
        }
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
        for frame in frames {
            match self.push(id, frame, PUSH_ATTEMPTS, slots).await {
                PushResult::Delivered => {
                    self.stats.add(&self.stats.delivered);
                }
                PushResult::Gone | PushResult::Rejected => return Outcome::Forget,
                PushResult::Transient => return Outcome::GiveUp,
                PushResult::Undeliverable => {
                    self.stats.add(&self.stats.undeliverable);
                    tracing::warn!(connection = id, "frame refused; skipped");
                }
            }
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
                tokio::time::sleep(PUSH_BACKOFF.wait(attempt - 1)).await;
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
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
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
}

impl EventHandler for Fanout {
    type Event = KinesisEvent;
    type Response = KinesisEventResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        let management = config
            .management_client(sdk)
            .ok_or("WS_MANAGEMENT_ENDPOINT is not set")?;
        let chat = config.chat_store(sdk);
        Ok(Fanout::new(chat, config.connection_store(sdk), management))
    }

    fn handle(&self, event: KinesisEvent) -> impl Future<Output = KinesisEventResponse> + Send {
        Fanout::handle(self, event)
    }
}

/// The (conversation, user) of every member who left in `events`.
fn departures(events: &[(Event, usize)]) -> Vec<(ConversationId, UserId)> {
    events
        .iter()
        .filter_map(|(e, _)| match e {
            Event::MemberRemoved {
                conversation_id,
                user_ids,
            } => Some(
                user_ids
                    .iter()
                    .map(|u| (conversation_id.clone(), u.clone())),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Whether a member list read by a Query may be kept under its version: only when the version
/// read just before it (a strongly consistent GetItem) is the same. A Query reads a collection's
/// items one after the other, so next to a membership change it may see the conversation item's
/// new version and members of before; with the version unchanged across both reads, every member
/// it read is at least as new as that version, and a later change shows as a new version.
fn cacheable(version_before: u64, version_read: u64) -> bool {
    version_before == version_read
}

#[cfg(test)]
mod cache_tests {
    #[test]
    fn a_member_list_is_kept_only_under_an_unchanged_version() {
        assert!(super::cacheable(7, 7));
        assert!(
            !super::cacheable(7, 8),
            "a change between the reads: not kept"
        );
        assert!(!super::cacheable(8, 7));
    }
}
