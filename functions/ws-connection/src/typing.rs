//! Typing frames (SPEC §16, docs/api.md §37): a member's `start`/`stop` changes the
//! conversation's typing state (chat_store::typing); the whole current set then goes to the
//! other online members straight through the Management API, at most once a second per
//! conversation: no stream, no Kinesis, nothing stored but the state itself. Presence pushes
//! (§38) go the same way, to a user's online direct peers when a connection opens or closes.
//! A typist who goes quiet without `stop` is pushed as stopped by its start's expiry check
//! (`TypingQueue`, delayed by the typing time), which this function runs too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chat_domain::typing::{
    error_frame, expired_start, may_have_shown_someone, parse_client_frame, prunable, push_due,
    renewed_claim, typing_event, typing_now, Broadcast, ClientFrame, ExpiryCheck, LastPush,
    TypingEntry, TypingState, EXPIRY_CHECK_DELAY_SECS, FRAME_INTERVAL_MS, FRAME_SLACK_MS,
    SETTLE_MS,
};
use chat_domain::{ChatError, ConversationId, UserId};
use chat_store::connections::LiveConnection;
use chat_store::presence_push::Pusher;
use chat_store::{ChatStore, ConnectionStore};

/// Reads of the set one change may take before its invocation leaves the push: the first, the
/// one after waiting out the second (twice if that push's claim was moved on), and two more after
/// a claim lost to another invocation.
const PUBLISH_ROUNDS: usize = 5;
/// The longest wait for a push's second to be over (the frame interval and its slack).
const MAX_WAIT_MS: i64 = FRAME_INTERVAL_MS + FRAME_SLACK_MS;

/// A conversation's member ids and the `membersVersion` they belong to.
type MemberList = (u64, Arc<Vec<UserId>>);

#[derive(Clone, Debug)]
pub struct Typing {
    chat: ChatStore,
    connections: ConnectionStore,
    /// The Management API posts (and the presence pushes, shared with `PUT /me/presence`).
    pusher: Pusher,
    /// Member ids per conversation under their `membersVersion` (as the fanout keeps them).
    members: Arc<Mutex<HashMap<ConversationId, MemberList>>>,
    /// Where accepted starts queue their expiry checks (none: expiry is not pushed by itself).
    expiry: Option<ExpiryQueue>,
}

/// The expiry checks' delay queue (template `TypingQueue`).
#[derive(Clone, Debug)]
pub struct ExpiryQueue {
    pub sqs: aws_sdk_sqs::Client,
    pub url: String,
}

impl ExpiryQueue {
    /// Queues `check`, due when its start would expire. 1 SendMessage.
    async fn queue(&self, check: &ExpiryCheck) -> Result<(), ChatError> {
        let body = serde_json::to_string(check).map_err(ChatError::internal)?;
        self.sqs
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .delay_seconds(EXPIRY_CHECK_DELAY_SECS)
            .send()
            .await
            .map_err(|e| {
                ChatError::internal(format!(
                    "SendMessage: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                ))
            })?;
        Ok(())
    }
}

fn now_ms() -> i64 {
    chat_domain::time::unix_millis(chat_domain::time::now()) as i64
}

impl Typing {
    pub fn new(
        chat: ChatStore,
        connections: ConnectionStore,
        management: Option<aws_sdk_apigatewaymanagement::Client>,
    ) -> Self {
        Typing {
            pusher: Pusher::new(chat.clone(), connections.clone(), management),
            chat,
            connections,
            members: Arc::default(),
            expiry: None,
        }
    }

    /// Accepted starts queue their expiry checks in `queue`.
    pub fn with_expiry(self, queue: Option<ExpiryQueue>) -> Self {
        Typing {
            expiry: queue,
            ..self
        }
    }

    /// A client frame on the `typing` route. A bad frame is answered to its connection alone
    /// (`{"type":"error",…}`); a non-member's frame, a blocked member's `start`, an early
    /// `start` and a `stop` of nobody are ignored. DynamoDB: 2 GetItem (owner, member item), 1 UpdateItem of the connection's
    /// typing item, 1 Query of the set (2 when the change waits out the second), and when a
    /// frame goes out 1 PutItem (the claim; 1 more when its posts ran late), 1 Query (the set,
    /// read after the claim) + the push's reads.
    pub async fn frame(&self, connection: &str, body: &[u8]) -> Result<(), ChatError> {
        self.frame_at(connection, body, now_ms()).await
    }

    /// [`Self::frame`] of a frame come at `at_ms` (its start or stop is stamped with it).
    pub async fn frame_at(
        &self,
        connection: &str,
        body: &[u8],
        at_ms: i64,
    ) -> Result<(), ChatError> {
        let frame = match parse_client_frame(body) {
            Ok(ClientFrame::Typing(frame)) => frame,
            Ok(ClientFrame::Ping) => return Ok(()),
            Err(e) => {
                self.pusher
                    .post(connection, &error_frame(&e).to_string())
                    .await;
                return Ok(());
            }
        };
        let Some(user) = self.connections.owner(connection).await? else {
            return Ok(());
        };
        // A member whose peer blocks it types to nobody (docs/api.md §28); its `stop` still
        // ends a start from before the block.
        match self.chat.member_blocked(&frame.conversation, &user).await? {
            None => return Ok(()),
            Some(true) if frame.state == TypingState::Start => return Ok(()),
            Some(_) => {}
        }
        let id = &frame.conversation;
        match frame.state {
            TypingState::Start => {
                if self
                    .connections
                    .typing_start(id, connection, &user, at_ms)
                    .await?
                {
                    let check = ExpiryCheck {
                        conversation_id: id.clone(),
                        connection: connection.to_owned(),
                        started_at: at_ms,
                    };
                    let (published, ()) =
                        tokio::join!(self.publish(id, &user, now_ms()), self.queue_expiry(&check));
                    published?;
                }
            }
            TypingState::Stop => {
                if self.connections.typing_stop(id, connection, at_ms).await? {
                    self.publish(id, &user, now_ms()).await?;
                }
            }
        }
        Ok(())
    }

    /// Queues the accepted start's expiry check. A check not queued leaves the typist shown
    /// until the next push or the clients' own 6 s (the SDK's): logged, not failed.
    async fn queue_expiry(&self, check: &ExpiryCheck) {
        if let Some(queue) = &self.expiry {
            if let Err(e) = queue.queue(check).await {
                tracing::warn!(conversation = %check.conversation_id, error = %e, "typing expiry check not queued");
            }
        }
    }

    /// A start's expiry check is due: unless the connection started again or stopped since, its
    /// expiry is a change, pushed as any other (`publish`: the claim, the second, the set without
    /// it). DynamoDB: 1 Query of the set; when it expired, `publish`'s reads and writes.
    pub async fn expiry_due(&self, check: &ExpiryCheck) -> Result<(), ChatError> {
        let id = &check.conversation_id;
        let state = self.connections.typing_state(id).await?;
        let Some(expired) = expired_start(&state.entries, check) else {
            return Ok(());
        };
        let Some(typist) = state
            .entries
            .iter()
            .find(|e| e.connection == check.connection)
            .map(|e| e.user.clone())
        else {
            return Ok(());
        };
        // SQS counts whole seconds from the send, after the stamp: never early, but wait if so.
        let early = (expired - now_ms()).clamp(0, MAX_WAIT_MS);
        tokio::time::sleep(Duration::from_millis(early as u64)).await;
        self.publish(id, &typist, expired).await
    }

    /// One frame to one connection (through the Management API, once).
    pub async fn post(&self, connection: &str, frame: &str) {
        self.pusher.post(connection, frame).await;
    }

    /// `$disconnect`: the closed connection (of `user`) stops typing wherever it typed.
    pub async fn closed(&self, connection: &str, user: &UserId, typing_in: &[ConversationId]) {
        for id in typing_in {
            let stopped = match self.connections.typing_stop(id, connection, now_ms()).await {
                Ok(true) => self.publish(id, user, now_ms()).await,
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = stopped {
                tracing::warn!(connection, conversation = %id, error = %e, "typing not stopped");
            }
        }
    }

    /// `user` left `id` (removed, banned or gone; the fanout's `member.removed`): its typing
    /// there ends at once and the others are sent the set without it, as for a `stop` (found by
    /// probing: a removed typist stayed in everyone's set until its start expired, up to 6 s).
    /// DynamoDB: 1 Query of the set; when it was typing, 1 UpdateItem per connection it typed
    /// on and `publish`'s reads and writes.
    pub async fn left(&self, id: &ConversationId, user: &UserId) -> Result<(), ChatError> {
        let now = now_ms();
        let state = self.connections.typing_state(id).await?;
        let mut stopped = false;
        for entry in state.entries.iter().filter(|e| &e.user == user) {
            if entry.typing_at(now) {
                stopped |= self
                    .connections
                    .typing_stop(id, &entry.connection, now)
                    .await?;
            }
        }
        if stopped {
            self.publish(id, user, now_ms()).await?;
        }
        Ok(())
    }

    /// A connection of `user` opened or closed (chat_store::presence_push, shared with
    /// `PUT /me/presence`).
    pub async fn presence_changed(&self, user: &UserId) -> Result<(), ChatError> {
        self.pusher.presence_changed(user).await
    }

    /// After a change of `changer`'s typing written by `done` (this clock, when the write
    /// returned): sees that a push sends it (chat_domain::typing::push_due). Another invocation's
    /// claim that reads the set after it, or a later change's writer, does; else this one claims
    /// the push, at once or when the last push's second is over (waiting for it here), then reads
    /// the set and sends it. In a direct conversation the change is news to the peer alone, whose
    /// frames are throttled on their own (`lane`): the other member's pushes do not delay it.
    async fn publish(
        &self,
        id: &ConversationId,
        changer: &UserId,
        done: i64,
    ) -> Result<(), ChatError> {
        let lane = self.lane(id, changer).await?;
        let lane = lane.as_ref();
        for _ in 0..PUBLISH_ROUNDS {
            let state = self.connections.typing_state(id).await?;
            let now = now_ms();
            let last = state.last_for(lane);
            // A lane's pushes carry the other member's changes only (its own are never news to it).
            let changes: Vec<TypingEntry> = match lane {
                Some(recipient) => state
                    .entries
                    .iter()
                    .filter(|e| &e.user != recipient)
                    .cloned()
                    .collect(),
                None => state.entries.clone(),
            };
            match push_due(&changes, last, done, now) {
                Broadcast::Nothing => return Ok(()),
                Broadcast::At(at) => {
                    let wait = (at - now).clamp(0, MAX_WAIT_MS) as u64;
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                Broadcast::Now => {
                    if self
                        .connections
                        .claim_typing_push(id, lane, last, now, now + SETTLE_MS)
                        .await?
                    {
                        return self.claimed(id, lane, now, last.read_ms).await;
                    }
                    // Another invocation claimed it since the read: read again.
                }
            }
        }
        Ok(())
    }

    /// The push claimed at `claimed`: after [`SETTLE_MS`] (the changes written meanwhile, a
    /// burst of starts, go in it; who is online is read meanwhile) reads the set and sends it;
    /// moves the claim on if the posts ran late; prunes. `last_read`: when the last push read its
    /// set.
    async fn claimed(
        &self,
        id: &ConversationId,
        lane: Option<&UserId>,
        claimed: i64,
        last_read: Option<i64>,
    ) -> Result<(), ChatError> {
        let settle = tokio::time::sleep(Duration::from_millis(SETTLE_MS as u64));
        let (online, ()) = tokio::join!(self.online_members(id, claimed), settle);
        let (members, mut online) = online?;
        if let Some(recipient) = lane {
            online.retain(|c| &c.user == recipient);
        }
        let current = self.connections.typing_state(id).await?;
        let now = now_ms();
        self.push(id, &current.entries, last_read, now, &members, online)
            .await;
        if let Some(as_if) = renewed_claim(claimed, now_ms()) {
            // Else the next push could reach a recipient within a second of this one.
            let claim = LastPush {
                claimed_ms: Some(claimed),
                read_ms: Some(claimed + SETTLE_MS),
            };
            self.connections
                .claim_typing_push(id, lane, claim, as_if, claimed + SETTLE_MS)
                .await?;
        }
        let prune = prunable(&current.entries, now);
        if !prune.is_empty() {
            self.connections.prune_typing(id, &prune).await?;
        }
        Ok(())
    }

    /// The conversation's members and their online connections. Reads: 1 GetItem
    /// (membersVersion; + 1 Query when the membership changed), ⌈members/100⌉ BatchGetItem of the
    /// presence items.
    async fn online_members(
        &self,
        id: &ConversationId,
        now: i64,
    ) -> Result<(Arc<Vec<UserId>>, Vec<LiveConnection>), ChatError> {
        let Some(members) = self.member_list(id).await? else {
            return Ok((Arc::default(), Vec::new()));
        };
        let online = self.connections.live_connections(&members, now / 1000);
        Ok((members.clone(), online.await?))
    }

    /// The set at `now` to every online member who is shown someone typing, or may have been by
    /// the last push (its set read at `last_read`), in the same order every time (so that each
    /// recipient's frames are as far apart as the pushes' claims). Only current `members` are
    /// shown: a typist removed from the group meanwhile is not, though its entry has not expired.
    async fn push(
        &self,
        id: &ConversationId,
        entries: &[TypingEntry],
        last_read: Option<i64>,
        now: i64,
        members: &[UserId],
        online: Vec<LiveConnection>,
    ) {
        let mut typing = typing_now(entries, now);
        typing.retain(|t| members.contains(t));
        let mut online: Vec<_> = online
            .into_iter()
            .filter(|c| {
                typing.iter().any(|t| *t != c.user)
                    || may_have_shown_someone(entries, &c.user, last_read)
            })
            .collect();
        online.sort_by(|a, b| a.connection_id.cmp(&b.connection_id));
        self.pusher
            .post_all(online, |user| {
                serde_json::to_string(&typing_event(id, &typing, user)).unwrap_or_default()
            })
            .await;
    }

    /// Who a change of `changer`'s typing is news to, when that is one member alone: in a
    /// direct conversation, the peer (a recipient's own typing is left out of what it is sent).
    /// None: a group (its pushes are throttled per conversation). Reads: `member_list`'s, none
    /// once the pair is known.
    async fn lane(
        &self,
        id: &ConversationId,
        changer: &UserId,
    ) -> Result<Option<UserId>, ChatError> {
        if !id.is_direct() {
            return Ok(None);
        }
        let members = self.member_list(id).await?.unwrap_or_default();
        Ok(members.iter().find(|u| *u != changer).cloned())
    }

    /// The member ids, from the cache while `membersVersion` is unchanged (a direct
    /// conversation's pair never changes: from the cache with no read). None: no such
    /// conversation. 1 GetItem (+ 1 Query and 1 GetItem when it changed).
    async fn member_list(
        &self,
        id: &ConversationId,
    ) -> Result<Option<Arc<Vec<UserId>>>, ChatError> {
        if id.is_direct() {
            if let Some((_, users)) = self.members.lock().unwrap().get(id) {
                return Ok(Some(users.clone()));
            }
        }
        let Some(version) = self.chat.members_version(id).await? else {
            return Ok(None);
        };
        if let Some((v, users)) = self.members.lock().unwrap().get(id) {
            if *v == version {
                return Ok(Some(users.clone()));
            }
        }
        let Some((read, users)) = self.chat.member_ids(id).await? else {
            return Ok(None);
        };
        let users = Arc::new(users);
        if read == version {
            self.members
                .lock()
                .unwrap()
                .insert(id.clone(), (version, users.clone()));
        }
        Ok(Some(users))
    }
}
