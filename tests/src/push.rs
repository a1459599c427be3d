//! Push test harness: the local gateway (WebSocket API, Management API, stream → relay → Kinesis
//! → fanout pollers) in-process against the test emulator, and a WebSocket client.
//!
//! One gateway per test binary, like the emulator, shared by its tests (which use their own user
//! ids): gateways do not share their connections, so two gateways on one emulator would each fan
//! out every event and answer 410 for (and so delete) each other's connections. It runs on its own
//! runtime thread, since each `#[tokio::test]` has a runtime that ends with the test.

use std::sync::OnceLock;
use std::time::Duration;

use chat_domain::UserId;
use chat_store::config::AuthMode;
use chat_store::{Config, ConnectionStore};
use futures::{SinkExt, StreamExt};
use local_gateway::{Gateway, GatewayConfig, PipelineConfig, RunningGateway, StartingPosition};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{token, TestApp, TEST_SECRET};

/// The handlers' settings for the test emulator (local HS256 auth with the tests' secret), with
/// its Kinesis (`server::kinesis_endpoint`: DynamoDB Local has none).
pub fn chat_config() -> Config {
    Config {
        auth: AuthMode::Local {
            secret: TEST_SECRET.as_bytes().to_vec(),
        },
        kinesis_endpoint: Some(crate::server::kinesis_endpoint()),
        // The fanout signs pushed attachments' URLs for the S3 gate, as the handlers do.
        attachments_bucket: Some(crate::ATTACHMENTS_BUCKET.into()),
        attachments_s3_endpoint: Some(crate::server::s3_gate_endpoint()),
        ..crate::config()
    }
}

/// Free ports; the pipeline from LATEST (the emulator may hold other tests' history) and with
/// short retry backoffs.
pub fn gateway_config() -> GatewayConfig {
    let mut config = GatewayConfig::new(chat_config());
    config.ws_addr.set_port(0);
    config.management_addr.set_port(0);
    config.pipeline = Some(PipelineConfig {
        starting_position: StartingPosition::Latest,
        retry_backoff: Duration::from_millis(50),
        ..PipelineConfig::default()
    });
    config
}

/// The test binary's gateway, started on first use.
pub fn gateway() -> &'static RunningGateway {
    static GATEWAY: OnceLock<RunningGateway> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        let config = gateway_config();
        crate::server::on_own_runtime("local-gateway", || async move {
            if std::env::var_os("RUST_LOG").is_some() {
                chat_store::telemetry::init(false, None);
            }
            let started = Gateway::start(config).await.map_err(|e| e.to_string());
            (started, ())
        })
        .expect("local gateway starts")
    })
}

/// The connection records (what `$connect` writes and the fanout reads).
pub async fn connection_store() -> ConnectionStore {
    let config = chat_config();
    let sdk = config.sdk_config().await;
    ConnectionStore::new(
        config.dynamodb_client(&sdk),
        config.connections_table.clone(),
    )
}

/// Registers `connection` of `user` again as if it had connected a minute ago: past the grace in
/// which a refusal (a 410, a 403) is taken for a handshake.
pub async fn register_a_minute_ago(store: &ConnectionStore, user: &str, connection: &str) {
    let user = UserId::parse(user).unwrap();
    store
        .register(&user, connection, (now_unix() - 60) * 1000)
        .await
        .unwrap();
}

/// Waits until `user` has no connection record left (`$disconnect` removed it).
pub async fn until_unregistered(store: &ConnectionStore, user: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while !connection_ids(store, user).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "$disconnect did not unregister"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a test, failing it if it takes longer than `limit` seconds.
pub async fn bounded<F: std::future::Future>(limit: u64, test: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(limit), test)
        .await
        .expect("test took too long")
}

/// A new app with a direct conversation of two new users, `a` connected to the gateway: (app,
/// a, b, conversation, a's client).
pub async fn connected_direct() -> (TestApp, String, String, String, WsClient) {
    let t = TestApp::new().await;
    let (a, b, conv) = t.new_direct().await;
    let wa = WsClient::connect(&a).await;
    (t, a, b, conv, wa)
}

/// `t` whose conversations function reaches the gateway's Management API (suspensions close
/// connections; `PUT /me/presence` pushes presence).
pub async fn with_management(t: crate::TestApp) -> crate::TestApp {
    let config = chat_store::Config {
        ws_management_endpoint: Some(gateway().management_url.clone()),
        ..chat_config()
    }
    .for_function("conversations");
    let sdk = config.sdk_config().await;
    let sessions = conversations::Sessions::of(&config, &sdk).expect("a management endpoint");
    t.with_sessions(sessions)
}

/// The user's live connection ids, as the fanout sees them.
pub async fn connection_ids(store: &ConnectionStore, user: &str) -> Vec<String> {
    let now = chat_domain::time::unix_seconds(chat_domain::time::now());
    store
        .live_connections(&[UserId::parse(user).unwrap()], now)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.connection_id)
        .collect()
}

pub fn now_unix() -> i64 {
    chat_domain::time::unix_seconds(chat_domain::time::now())
}

/// A WebSocket client of the gateway.
pub struct WsClient {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pub closed: bool,
}

impl WsClient {
    /// Connects to the shared gateway as `user`.
    pub async fn connect(user: &str) -> WsClient {
        let url = format!("{}?token={}", gateway().ws_url, token(user));
        Self::connect_url(&url)
            .await
            .unwrap_or_else(|status| panic!("handshake refused: {status}"))
    }

    /// Connects; a refused handshake gives its HTTP status.
    pub async fn connect_url(url: &str) -> Result<WsClient, u16> {
        match tokio_tungstenite::connect_async(url).await {
            Ok((socket, _)) => Ok(WsClient {
                socket,
                closed: false,
            }),
            Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
            Err(e) => panic!("WebSocket connect to {url} failed: {e}"),
        }
    }

    /// The next event (JSON text frame) within `within`; None on timeout or close.
    pub async fn next_event(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        while !self.closed {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()?;
            match frame {
                Some(Ok(Message::Text(text))) => {
                    return Some(serde_json::from_str(&text).expect("JSON event"))
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => self.closed = true,
                Some(Ok(_)) => {}
            }
        }
        None
    }

    /// Raw text of the next text frame within `within`.
    pub async fn next_text(&mut self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()??
            {
                Ok(Message::Text(text)) => return Some(text.to_string()),
                Ok(Message::Close(_)) | Err(_) => {
                    self.closed = true;
                    return None;
                }
                Ok(_) => {}
            }
        }
    }

    /// Events until `done(events so far)`; panics with what arrived when `within` runs out.
    pub async fn until(&mut self, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + within;
        let mut events = Vec::new();
        while !done(&events) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_event(left).await {
                Some(e) => events.push(e),
                None => panic!("timed out (closed: {}); got {events:#?}", self.closed),
            }
        }
        events
    }

    /// Events until `done`, then all that arrives within `quiet` after (what must not come).
    pub async fn until_quiet(
        &mut self,
        within: Duration,
        quiet: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let events = self.until(within, done).await;
        [events, self.drain(quiet).await].concat()
    }

    /// Events until `conversation`'s `message.new` at `seq`.
    pub async fn until_message(
        &mut self,
        within: Duration,
        conversation: &str,
        seq: u64,
    ) -> Vec<Value> {
        self.until(within, |e| has(e, "message.new", conversation, Some(seq)))
            .await
    }

    /// Everything that arrives within `period`.
    pub async fn drain(&mut self, period: Duration) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + period;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_event(left).await {
                Some(e) => events.push(e),
                None => return events,
            }
        }
    }

    /// Waits for the server to close the socket.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        while !self.closed {
            if self.next_event(within).await.is_none() && !self.closed {
                return false;
            }
        }
        true
    }

    /// Asks the connection's own id (`{"action":"hello"}`, docs/api.md §15.4); panics when no
    /// `hello` frame comes within 10 s. Events that come before it are dropped.
    pub async fn hello(&mut self) -> String {
        self.send_text(r#"{"action":"hello"}"#).await;
        let events = self
            .until(Duration::from_secs(10), |e| {
                e.last().is_some_and(|e| e["type"] == "hello")
            })
            .await;
        let hello = events.last().unwrap();
        assert!(hello["userId"].is_string(), "whose connection: {hello}");
        hello["connectionId"].as_str().unwrap().to_owned()
    }

    pub async fn send_text(&mut self, text: &str) {
        self.socket.send(Message::text(text)).await.unwrap();
    }

    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// Whether `events` has an event of `kind` in `conversation` (with `seq`, if given).
pub fn has(events: &[Value], kind: &str, conversation: &str, seq: Option<u64>) -> bool {
    events.iter().any(|e| {
        e["type"] == kind
            && e["conversationId"] == conversation
            && seq.is_none_or(|s| e["seq"] == s)
    })
}

/// `conversation`'s `message.new` at `seq` in `events`.
pub fn message<'a>(events: &'a [Value], conversation: &str, seq: u64) -> &'a Value {
    events
        .iter()
        .find(|e| {
            has(
                std::slice::from_ref(e),
                "message.new",
                conversation,
                Some(seq),
            )
        })
        .unwrap_or_else(|| panic!("no message.new {conversation} {seq}: {events:#?}"))
}

/// `message.new` seqs of a conversation in arrival order, each only at its first arrival.
pub fn first_seqs(events: &[Value], conversation: &str) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .filter(|e| e["type"] == "message.new" && e["conversationId"] == conversation)
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| seen.insert(*s))
        .collect()
}

fn member_pk(conversation: &str, user: &str) -> String {
    let id = chat_domain::ConversationId::parse(conversation).unwrap();
    chat_store::keys::members_pk(&id, &chat_domain::UserId::parse(user).unwrap())
}

/// A member item changing its read watermark, as a Lambda DynamoDB stream record.
pub fn read_record(sequence: &str, conversation: &str, user: &str, from: u64, to: u64) -> Value {
    let image = |seq: u64| {
        json!({
            "pk": {"S": member_pk(conversation, user)}, "sk": {"S": format!("M#{user}")},
            "conversationId": {"S": conversation}, "memberId": {"S": user},
            "lastReadSeq": {"N": seq.to_string()},
        })
    };
    json!({
        "eventID": uuid::Uuid::new_v4().simple().to_string(), "eventName": "MODIFY",
        "eventVersion": "1.1", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1_700_000_000,
            "Keys": {"pk": image(to)["pk"], "sk": image(to)["sk"]},
            "NewImage": image(to), "OldImage": image(from),
            "SequenceNumber": sequence, "SizeBytes": 100, "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    })
}
