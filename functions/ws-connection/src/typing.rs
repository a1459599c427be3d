//! Typing frames (SPEC §16, docs/api.md §37): a member's `start`/`stop` changes the
//! conversation's typing state (chat_store::typing); the whole current set then goes to the
//! other online members straight through the Management API, at most once a second per
//! conversation: no stream, no Kinesis, nothing stored but the state itself. Presence pushes
//! (§38) go the same way, to a user's online direct peers when a connection opens or closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chat_domain::typing::{
    broadcast, error_frame, expired_entries, parse_client_frame, signature, typing_event,
    typing_now, Broadcast, ClientFrame, TypingState,
};
use chat_domain::{ChatError, ConversationId, UserId};
use chat_store::presence_push::Pusher;
use chat_store::typing::TypingSnapshot;
use chat_store::{ChatStore, ConnectionStore};

/// Claims lost to a concurrent change before this invocation leaves the push to it.
const CLAIM_ROUNDS: usize = 3;

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
        }
    }

    /// A client frame on the `typing` route. A bad frame is answered to its connection alone
    /// (`{"type":"error",…}`); a non-member's frame, an early `start` and a `stop` of nobody are
    /// ignored. DynamoDB: 2 GetItem (owner, member item), 1 UpdateItem of the state, and when a
    /// frame goes out 1 UpdateItem (the claim) + the push's reads.
    pub async fn frame(&self, connection: &str, body: &[u8]) -> Result<(), ChatError> {
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
        if !self.chat.is_member(&frame.conversation, &user).await? {
            return Ok(());
        }
        let now = now_ms();
        let state = match frame.state {
            TypingState::Start => {
                self.connections
                    .typing_start(&frame.conversation, connection, &user, now)
                    .await?
            }
            TypingState::Stop => {
                self.connections
                    .typing_stop(&frame.conversation, connection)
                    .await?
            }
        };
        match state {
            Some(state) => self.publish(&frame.conversation, state).await,
            None => Ok(()),
        }
    }

    /// `$disconnect`: the closed connection stops typing wherever it typed.
    pub async fn closed(&self, connection: &str, typing_in: &[ConversationId]) {
        for id in typing_in {
            let stopped = match self.connections.typing_stop(id, connection).await {
                Ok(Some(state)) => self.publish(id, state).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = stopped {
                tracing::warn!(connection, conversation = %id, error = %e, "typing not stopped");
            }
        }
    }

    /// A connection of `user` opened or closed (chat_store::presence_push, shared with
    /// `PUT /me/presence`).
    pub async fn presence_changed(&self, user: &UserId) -> Result<(), ChatError> {
        self.pusher.presence_changed(user).await
    }

    /// Sends the current set if it is due: at once, or (changed within a second of the last
    /// frame) when that second is over, waiting for it here; whoever claims the push sends it.
    async fn publish(
        &self,
        id: &ConversationId,
        mut state: TypingSnapshot,
    ) -> Result<(), ChatError> {
        for _ in 0..CLAIM_ROUNDS {
            let now = now_ms();
            let typing = typing_now(&state.starts(), now);
            let current = signature(&typing);
            match broadcast(&current, state.sent.as_deref(), state.sent_at, now) {
                Broadcast::Nothing => return Ok(()),
                Broadcast::At(at) => {
                    // ≤ 1 s: the frame interval. Another start or stop meanwhile may push first.
                    let wait = (at - now).clamp(0, 1_000) as u64;
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    let mine = state.ver;
                    state = self.connections.typing_state(id).await?;
                    if state.ver != mine {
                        // A later change: its writer, which saw this one in the state it
                        // updated, publishes the set. Only the last writer of a second claims
                        // (a failed claim is a billed write: 20 typists woke 20 claims for one).
                        return Ok(());
                    }
                }
                Broadcast::Now => {
                    let prune = expired_entries(&state.entries, now);
                    if !self
                        .connections
                        .claim_typing_push(id, &state, &current, &prune, now)
                        .await?
                    {
                        // Changed or pushed since read: the writer of that change publishes.
                        return Ok(());
                    }
                    let before: Vec<UserId> = state
                        .sent
                        .as_deref()
                        .unwrap_or_default()
                        .split(',')
                        .filter_map(UserId::parse)
                        .collect();
                    return self.push(id, &typing, &before).await;
                }
            }
        }
        Ok(())
    }

    /// The set to every online member whose view of it is not empty before and after. Reads:
    /// 1 GetItem (membersVersion; + 1 Query when the membership changed), ⌈members/100⌉
    /// BatchGetItem of the presence items.
    async fn push(
        &self,
        id: &ConversationId,
        typing: &[UserId],
        before: &[UserId],
    ) -> Result<(), ChatError> {
        let Some(members) = self.member_list(id).await? else {
            return Ok(());
        };
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        let online = self.connections.live_connections(&members, now).await?;
        let only_self = |set: &[UserId], u: &UserId| set.iter().all(|t| t == u);
        let online = online
            .into_iter()
            .filter(|c| !(only_self(typing, &c.user) && only_self(before, &c.user)))
            .collect();
        self.pusher
            .post_all(online, |user| {
                serde_json::to_string(&typing_event(id, typing, user)).unwrap_or_default()
            })
            .await;
        Ok(())
    }

    /// The member ids, from the cache while `membersVersion` is unchanged. None: no such
    /// conversation. 1 GetItem (+ 1 Query and 1 GetItem when it changed).
    async fn member_list(
        &self,
        id: &ConversationId,
    ) -> Result<Option<Arc<Vec<UserId>>>, ChatError> {
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
