//! Frames straight to connections through the Management API (no stream, no Kinesis): typing
//! sets and presence pushes (SPEC §16, docs/api.md §37–§38). Shared by `$connect`/`$disconnect`
//! (ws-connection) and `PUT /me/presence` (conversations), so a visibility change reaches the
//! direct peers by the same path, under the same once-per-10-s claim, as a connection change.

use std::time::Duration;

use aws_sdk_apigatewaymanagement::primitives::Blob;
use chat_domain::events::policy::{may_forget, PushResult};
use chat_domain::typing::{presence_event, presence_push, Broadcast};
use chat_domain::{ChatError, UserId};
use futures::StreamExt;

use crate::connections::LiveConnection;
use crate::{ChatStore, ConnectionStore};

/// Posts in flight at once per push (300 online members: ~10 rounds).
const POSTS_IN_FLIGHT: usize = 32;
/// Claims lost to a concurrent change before this invocation leaves the push to it.
const CLAIM_ROUNDS: usize = 3;
/// The direct conversations (most recently active first) whose peers hear of a presence change.
const PRESENCE_PEERS: i32 = 100;
/// A push whose posts end later than this after its claim moves the claim to their end.
const POSTS_LATE_MS: i64 = 100;

fn now_ms() -> i64 {
    chat_domain::time::unix_millis(chat_domain::time::now()) as i64
}

#[derive(Clone, Debug)]
pub struct Pusher {
    chat: ChatStore,
    connections: ConnectionStore,
    management: Option<aws_sdk_apigatewaymanagement::Client>,
}

impl Pusher {
    pub fn new(
        chat: ChatStore,
        connections: ConnectionStore,
        management: Option<aws_sdk_apigatewaymanagement::Client>,
    ) -> Self {
        Pusher {
            chat,
            connections,
            management,
        }
    }

    pub fn chat(&self) -> &ChatStore {
        &self.chat
    }

    pub fn connections(&self) -> &ConnectionStore {
        &self.connections
    }

    /// `user`'s presence (a connection opened or closed, or the visibility changed): when that
    /// changed what their direct peers were last told, tell the online ones, at most once per
    /// 10 s per user (a change within that goes out when the 10 s are over, waiting here).
    pub async fn presence_changed(&self, user: &UserId) -> Result<(), ChatError> {
        for _ in 0..CLAIM_ROUNDS {
            match self.presence_once(user).await? {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// One round of [`Self::presence_changed`]: pushes if due now; Some(wait) when the push is
    /// held back by the 10 s (the caller waits and asks again). Reads: 1 BatchGetItem (presence,
    /// visibility), 1 GetItem (the last push); a push: 1 PutItem (its claim), the peers (1 Query
    /// + 1 BatchGetItem), their connections (1 BatchGetItem), and a PostToConnection each.
    pub async fn presence_once(&self, user: &UserId) -> Result<Option<Duration>, ChatError> {
        let now = now_ms();
        let presence = self
            .connections
            .presence_of(std::slice::from_ref(user), now / 1000)
            .await?;
        let Some(current) = presence.first() else {
            return Ok(None);
        };
        let (sent, sent_at) = self.connections.presence_pushed(user).await?;
        match presence_push(current.online, sent, sent_at, now) {
            Broadcast::Nothing => Ok(None),
            Broadcast::At(at) => Ok(Some(Duration::from_millis(
                (at - now).clamp(0, 10_000) as u64
            ))),
            Broadcast::Now => {
                let claimed = self
                    .connections
                    .claim_presence_push(user, current.online, sent_at, now)
                    .await?;
                if claimed {
                    let peers = self.chat.direct_peers(user, PRESENCE_PEERS).await?;
                    let frame = presence_event(current).to_string();
                    let online = self
                        .connections
                        .live_connections(&peers, now / 1000)
                        .await?;
                    self.post_all(online, |_| frame.clone()).await;
                    // Posts that ran late move the claim to when they ended, so that peers get
                    // the next push 10 s after this one reached them (found by probing: 9.3 s
                    // apart under load, the claim's time counting from before the reads).
                    let done = now_ms();
                    if done - now > POSTS_LATE_MS {
                        self.connections
                            .claim_presence_push(user, current.online, Some(now), done)
                            .await?;
                    }
                }
                Ok(None)
            }
        }
    }

    /// Each connection its frame, [`POSTS_IN_FLIGHT`] at once; a gone one is forgotten.
    pub async fn post_all(
        &self,
        connections: Vec<LiveConnection>,
        frame: impl Fn(&UserId) -> String,
    ) {
        let frame = &frame;
        let posts = connections.into_iter().map(|c| async move {
            if self.post(&c.connection_id, &frame(&c.user)).await == PushResult::Gone {
                self.forget(&c).await;
            }
        });
        futures::stream::iter(posts)
            .buffer_unordered(POSTS_IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
    }

    /// One frame to one connection, once: a lost typing or presence frame is replaced by the
    /// next one (and `POST /presence` is always current).
    pub async fn post(&self, connection: &str, frame: &str) -> PushResult {
        let Some(management) = &self.management else {
            return PushResult::Undeliverable;
        };
        let sent = management
            .post_to_connection()
            .connection_id(connection)
            .data(Blob::new(frame.as_bytes()))
            .send()
            .await;
        match sent {
            Ok(_) => PushResult::Delivered,
            Err(e) => PushResult::of_failure(e.raw_response().map(|r| r.status().as_u16())),
        }
    }

    /// A connection API Gateway called gone no longer counts as online (presence, the fanout).
    async fn forget(&self, connection: &LiveConnection) {
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        if may_forget(connection.registered_at(), now) {
            if let Err(e) = self.connections.forget_if_unchanged(connection).await {
                tracing::warn!(connection = connection.connection_id, error = %e, "gone connection kept");
            }
        }
    }
}
