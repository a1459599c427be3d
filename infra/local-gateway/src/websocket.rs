//! The WebSocket API: `ws://HOST:PORT/?token=…`, routes `$connect`, `$disconnect` and `$default`
//! to the ws-connection handler with API Gateway's WebSocket event shape.
//!
//! The upgrade request is the `$connect` event: a non-2xx answer refuses the handshake with that
//! status (e.g. 401). Client frames are routed as template.yaml's `$request.body.action` selects:
//! `{"action":"typing",…}` is a `typing` event to the handler, `{"action":"hello"}` a `hello`
//! event (nothing is sent back but what it
//! posts); anything else hits `$default`, which is a mock integration there, so nothing is
//! invoked; frames posted to
//! the Management API reach the client as text frames; any close is a `$disconnect` event. Like
//! API Gateway, a connection is closed after 2 hours (the idle timeout is not emulated).

use std::net::SocketAddr;
use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use bytes::Bytes;
use chat_store::connections::CONNECTION_TTL_SECS;
use futures::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use time::OffsetDateTime;
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::handlers::Handlers;
use crate::http::{response, Body};
use crate::registry::{Command, Info, Registry};
use crate::shutdown::Shutdown;

pub(crate) struct WebSocketApi {
    pub(crate) handlers: Handlers,
    pub(crate) registry: Registry,
    pub(crate) stage: String,
    /// `requestContext.domainName`: the address clients connect to.
    pub(crate) domain: String,
    pub(crate) shutdown: Shutdown,
}

/// What the route events of one connection share.
#[derive(Clone)]
struct Connection {
    id: String,
    connected_at: OffsetDateTime,
    source_ip: String,
    user_agent: Option<String>,
}

impl WebSocketApi {
    pub(crate) async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<Body> {
        let Some(key) = websocket_key(req.headers()) else {
            return response(StatusCode::UPGRADE_REQUIRED, "expected a WebSocket upgrade");
        };
        let now = OffsetDateTime::now_utc();
        let connection = Connection {
            id: new_connection_id(),
            connected_at: now,
            source_ip: peer.ip().to_string(),
            user_agent: header(req.headers(), "user-agent"),
        };
        let (commands, kill) = self.registry.add(
            &connection.id,
            Info {
                connected_at: now,
                last_active_at: now,
                source_ip: connection.source_ip.clone(),
                user_agent: connection.user_agent.clone(),
            },
        );

        let mut event = self.event(&connection, "$connect", "CONNECT");
        event["headers"] = headers_json(req.headers(), false);
        event["multiValueHeaders"] = headers_json(req.headers(), true);
        let (single, multi) = query_json(req.uri().query().unwrap_or(""));
        event["queryStringParameters"] = single;
        event["multiValueQueryStringParameters"] = multi;
        let status = match self.handlers.websocket(event).await {
            Ok(status) => status,
            Err(e) => {
                tracing::error!(error = %e, "$connect handler failed");
                500
            }
        };
        if !(200..300).contains(&status) {
            self.registry.remove(&connection.id);
            let status = u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return response(status, Bytes::new());
        }

        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(self.clone().session(connection, upgrade, commands, kill));
        let mut r = response(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
        let h = r.headers_mut();
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(
            SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_str(&derive_accept_key(key.as_bytes())).expect("base64 is ASCII"),
        );
        r
    }

    /// One open connection, from the upgrade to its `$disconnect`.
    async fn session(
        self: Arc<Self>,
        connection: Connection,
        upgrade: OnUpgrade,
        mut commands: mpsc::Receiver<Command>,
        kill: Arc<Notify>,
    ) {
        let (code, reason) = match upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                self.pump(&connection, socket, &mut commands, &kill).await
            }
            Err(e) => (1006, format!("upgrade failed: {e}")),
        };
        self.registry.remove(&connection.id);
        let mut event = self.event(&connection, "$disconnect", "DISCONNECT");
        event["headers"] = json!({ "Host": self.domain });
        event["requestContext"]["disconnectStatusCode"] = json!(code);
        event["requestContext"]["disconnectReason"] = json!(reason);
        match self.handlers.websocket(event).await {
            Ok(status) if (200..300).contains(&status) => {}
            Ok(status) => tracing::warn!(connection = connection.id, status, "$disconnect failed"),
            Err(e) => tracing::error!(connection = connection.id, error = %e, "$disconnect failed"),
        }
    }

    /// Moves frames both ways until the socket closes; returns the close code and reason.
    async fn pump<S>(
        self: &Arc<Self>,
        connection: &Connection,
        socket: WebSocketStream<S>,
        commands: &mut mpsc::Receiver<Command>,
        kill: &Notify,
    ) -> (u16, String)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (mut sink, mut stream) = socket.split();
        let close = |code: CloseCode, reason: &'static str| {
            Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            }))
        };
        let id = connection.id.as_str();
        // API Gateway's maximum connection duration, which the connection record's TTL matches:
        // without it a local connection would outlive its record and silently get nothing.
        let max_duration = std::time::Duration::from_secs(CONNECTION_TTL_SECS.unsigned_abs());
        let expiry = tokio::time::sleep(max_duration);
        tokio::pin!(expiry);
        let (code, reason) = loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Send(frame)) => {
                        // A write the client does not read would wait for ever: a kill ends it.
                        tokio::select! {
                            sent = sink.send(frame) => if let Err(e) = sent {
                                break (1006, e.to_string());
                            },
                            _ = kill.notified() => return dropped(),
                        }
                    }
                    Some(Command::Close) | None => {
                        let _ = sink.send(close(CloseCode::Normal, "")).await;
                        break (1000, "closed through the Management API".into());
                    }
                },
                incoming = stream.next() => match incoming {
                    Some(Ok(Message::Text(text))) => {
                        self.registry.touch(id);
                        self.route(connection, text.to_string(), false);
                    }
                    Some(Ok(Message::Binary(data))) => {
                        self.registry.touch(id);
                        self.route(connection, STANDARD.encode(&data), true);
                    }
                    Some(Ok(Message::Close(frame))) => {
                        break frame.map_or((1005, String::new()), |f| (f.code.into(), f.reason.to_string()));
                    }
                    Some(Ok(_)) => self.registry.touch(id),
                    Some(Err(e)) => break (1006, e.to_string()),
                    None => break (1006, "connection lost".into()),
                },
                // Dropped (its queue filled): the socket goes without a close frame, which would
                // wait behind the frames the client is not reading.
                _ = kill.notified() => return dropped(),
                _ = &mut expiry => {
                    let _ = sink.send(close(CloseCode::Away, "Going away")).await;
                    break (1001, "maximum connection duration reached".into());
                }
                _ = self.shutdown.wait() => {
                    let _ = sink.send(close(CloseCode::Away, "gateway shutting down")).await;
                    break (1001, "gateway shutting down".into());
                }
            }
        };
        // Flushes a pending close reply; ignored if the peer is already gone.
        let _ = sink.close().await;
        (code, reason)
    }

    /// A client frame: an event of the route its `action` selects; its response is not sent back.
    fn route(self: &Arc<Self>, connection: &Connection, body: String, base64: bool) {
        let Some(route) = route_key(&body, base64) else {
            return;
        };
        let mut event = self.event(connection, route, "MESSAGE");
        event["requestContext"]["messageId"] = json!(uuid::Uuid::new_v4().to_string());
        event["body"] = json!(body);
        event["isBase64Encoded"] = json!(base64);
        let api = self.clone();
        tokio::spawn(async move {
            if let Err(e) = api.handlers.websocket(event).await {
                tracing::error!(error = %e, "$default handler failed");
            }
        });
    }

    /// The parts of a route event every route has.
    fn event(&self, connection: &Connection, route: &str, event_type: &str) -> Value {
        let now = OffsetDateTime::now_utc();
        let request_id = uuid::Uuid::new_v4().to_string();
        json!({
            "requestContext": {
                "routeKey": route,
                "eventType": event_type,
                "messageDirection": "IN",
                "connectionId": connection.id,
                "connectedAt": epoch_millis(connection.connected_at),
                "requestTimeEpoch": epoch_millis(now),
                "requestTime": request_time(now),
                "requestId": request_id,
                "extendedRequestId": request_id,
                "stage": self.stage,
                "apiId": "local",
                "domainName": self.domain,
                "identity": {
                    "sourceIp": connection.source_ip,
                    "userAgent": connection.user_agent,
                },
            },
            "isBase64Encoded": false,
        })
    }
}

/// The close of a connection dropped for not reading its frames (`Registry::send`): 1008,
/// policy; its client sees the socket end (1006) and reconnects.
fn dropped() -> (u16, String) {
    (
        1008,
        "dropped: the client was not reading its frames".into(),
    )
}

/// The routes with a function behind them (template.yaml); `$default` (None) is API Gateway's
/// mock integration. Like `$request.body.action`, only a JSON text frame's top-level `action`
/// selects; a frame that is not JSON, or names no such route, falls to `$default`.
fn route_key(body: &str, base64: bool) -> Option<&'static str> {
    const ROUTES: [&str; 2] = ["typing", "hello"];
    if base64 {
        return None;
    }
    let v: Value = serde_json::from_str(body).ok()?;
    let action = v.get("action")?.as_str()?;
    ROUTES.into_iter().find(|r| *r == action)
}

/// The `Sec-WebSocket-Key` of a WebSocket upgrade request.
fn websocket_key(headers: &HeaderMap) -> Option<String> {
    let upgrade = header(headers, "upgrade")?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    header(headers, SEC_WEBSOCKET_KEY.as_str())
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Like API Gateway's: 12 random URL-safe characters and `=`.
fn new_connection_id() -> String {
    let random = uuid::Uuid::new_v4();
    format!("{}=", URL_SAFE_NO_PAD.encode(&random.as_bytes()[..9]))
}

fn epoch_millis(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// `09/Feb/2026:10:00:00 +0000`
fn request_time(t: OffsetDateTime) -> String {
    let month = format!("{:?}", t.month());
    format!(
        "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
        t.day(),
        &month[..3],
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `headers` (one value each, repeated headers joined with `,`) or `multiValueHeaders`.
fn headers_json(headers: &HeaderMap, multi: bool) -> Value {
    let mut out = Map::new();
    for name in headers.keys() {
        let values: Vec<&str> = headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let value = if multi {
            json!(values)
        } else {
            json!(values.join(","))
        };
        out.insert(name.as_str().to_owned(), value);
    }
    Value::Object(out)
}

/// `queryStringParameters` (last value wins) and `multiValueQueryStringParameters`, percent-decoded;
/// both null when there is no query.
fn query_json(query: &str) -> (Value, Value) {
    let mut single = Map::new();
    let mut multi: Map<String, Value> = Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let (k, v) = (decode(k), decode(v));
        single.insert(k.clone(), json!(v));
        match multi.entry(k).or_insert_with(|| json!([])) {
            Value::Array(values) => values.push(json!(v)),
            _ => unreachable!("only arrays are inserted"),
        }
    }
    if single.is_empty() {
        (Value::Null, Value::Null)
    } else {
        (Value::Object(single), Value::Object(multi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ids_look_like_api_gateways() {
        let id = new_connection_id();
        assert_eq!(id.len(), 13);
        assert!(id.ends_with('='));
        assert!(id[..12]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(id, new_connection_id());
    }

    #[test]
    fn frames_are_routed_on_their_action() {
        assert_eq!(route_key(r#"{"action":"typing"}"#, false), Some("typing"));
        assert_eq!(route_key(r#"{"action":"hello"}"#, false), Some("hello"));
        assert_eq!(route_key(r#"{"action":"dance"}"#, false), None);
        assert_eq!(route_key("not json", false), None);
        assert_eq!(route_key(r#"{"action":"typing"}"#, true), None);
    }

    #[test]
    fn query_parameters() {
        let (single, multi) = query_json("token=a%2Eb.c&x=1&x=2");
        assert_eq!(single, json!({"token": "a.b.c", "x": "2"}));
        assert_eq!(multi, json!({"token": ["a.b.c"], "x": ["1", "2"]}));
        assert_eq!(query_json(""), (Value::Null, Value::Null));
    }

    #[test]
    fn request_time_format() {
        let t = OffsetDateTime::from_unix_timestamp(1_770_631_200).unwrap();
        assert_eq!(request_time(t), "09/Feb/2026:10:00:00 +0000");
    }
}
