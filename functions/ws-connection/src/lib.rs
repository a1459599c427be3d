//! WebSocket `$connect` / `$disconnect` / `typing` / `hello` (route selection on `$request.body.action`;
//! `$default`, the keep-alive pings, is API Gateway's mock integration and never comes here).
//!
//! `$connect` carries the user's token in `?token=` (browsers cannot set headers on a WebSocket):
//! it is verified here, and a connection without a valid token is refused (401). The connection is
//! then recorded for the fanout, with a TTL matching API Gateway's 2-hour limit. A suspended
//! user's connection is refused (403, docs/api.md §30).
//!
//! The same function runs typing's expiry checks (an SQS event from `TypingQueue`, typing.rs).

use aws_lambda_events::event::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use chat_domain::typing::ExpiryCheck;
use chat_domain::ChatError;
use chat_http::auth::TokenVerifier;
use chat_lambda::{Error, EventHandler, SdkConfig};
use chat_store::{ChatStore, Config, ConnectionStore};
use std::future::Future;

mod typing;
pub use typing::{ExpiryQueue, Typing};

#[derive(Clone, Debug)]
pub struct WsConnection {
    connections: ConnectionStore,
    verifier: TokenVerifier,
    typing: Typing,
    /// Where suspensions are read (none: nobody is refused for one).
    chat: Option<ChatStore>,
}

fn status(code: i64) -> ApiGatewayProxyResponse {
    let mut r = ApiGatewayProxyResponse::default();
    r.status_code = code;
    r
}

impl WsConnection {
    pub fn new(connections: ConnectionStore, verifier: TokenVerifier, typing: Typing) -> Self {
        WsConnection {
            connections,
            verifier,
            typing,
            chat: None,
        }
    }

    /// Refusing suspended users' connections, read in `chat`.
    pub fn with_suspensions(self, chat: ChatStore) -> Self {
        WsConnection {
            chat: Some(chat),
            ..self
        }
    }

    pub async fn handle(&self, event: ApiGatewayWebsocketProxyRequest) -> ApiGatewayProxyResponse {
        let ctx = &event.request_context;
        let connection = ctx.connection_id.clone().unwrap_or_default();
        let route = ctx
            .route_key
            .as_deref()
            .or(ctx.event_type.as_deref())
            .unwrap_or_default();
        let result = match route {
            "$connect" | "CONNECT" => self.connect(&event, &connection).await,
            "$disconnect" | "DISCONNECT" => self.disconnect(&connection).await,
            "typing" => self.typing.frame(&connection, &body(&event)).await,
            "hello" => self.hello(&connection).await,
            // Anything else is a ping that keeps the socket open.
            _ => Ok(()),
        };
        match result {
            Ok(()) => status(200),
            Err(e) => {
                if !matches!(e, ChatError::Unauthorized(_) | ChatError::Suspended) {
                    tracing::error!(connection, error = %e, detail = ?e, "websocket route failed");
                }
                status(e.status().into())
            }
        }
    }

    /// `{"action":"hello"}`: the connection is told its own id, which the client then names in
    /// `X-Connection-Id` so that the pushes of its own sends and reads skip it (docs/api.md
    /// §15.4), and its user's id. DynamoDB: 1 GetItem (the owner item); then one post, once: a
    /// lost answer only means echoes (the client may ask again).
    async fn hello(&self, connection: &str) -> Result<(), ChatError> {
        let user = self.connections.owner(connection).await?;
        let frame = chat_domain::events::hello_frame(connection, user.as_ref());
        self.typing.post(connection, &frame).await;
        Ok(())
    }

    async fn disconnect(&self, connection: &str) -> Result<(), ChatError> {
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        if let Some((user, typing_in)) = self.connections.unregister(connection, now).await? {
            self.typing.closed(connection, &user, &typing_in).await;
            self.typing.presence_changed(&user).await?;
        }
        Ok(())
    }

    async fn connect(
        &self,
        event: &ApiGatewayWebsocketProxyRequest,
        connection: &str,
    ) -> Result<(), ChatError> {
        let token = handshake_token(event)?;
        let now = chat_domain::time::now();
        let user = self
            .verifier
            .verify(token, chat_domain::time::unix_seconds(now))
            .await?;
        // Read strongly consistent (not as REST requests do): a suspended user's
        // handshake is refused before anything is registered (a registration undone would move
        // its `lastActiveAt` and push presence), and a lifted suspension admits it at once.
        if let Some(chat) = &self.chat {
            if chat.is_suspended_now(&user).await? {
                return Err(ChatError::Suspended);
            }
        }
        let now_ms = chat_domain::time::unix_millis(now) as i64;
        self.connections.register(&user, connection, now_ms).await?;
        // Registered, then read again: a suspension made meanwhile either closes this
        // connection or is seen here.
        if let Some(chat) = &self.chat {
            let suspended = match chat.is_suspended_now(&user).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = self.connections.unregister_refused(connection).await;
                    return Err(e);
                }
            };
            if suspended {
                self.connections.unregister_refused(connection).await?;
                return Err(ChatError::Suspended);
            }
        }
        // Not awaited: the handshake must not wait out the 10 s a push may be held back. (On
        // Lambda the task runs while the instance does; a push it misses waits for the next
        // change, and POST /presence is always current.)
        let typing = self.typing.clone();
        tokio::spawn(async move {
            if let Err(e) = typing.presence_changed(&user).await {
                tracing::warn!(user = %user, error = %e, "presence not pushed");
            }
        });
        Ok(())
    }
}

/// A client frame's bytes (API Gateway base64-encodes binary frames).
fn body(event: &ApiGatewayWebsocketProxyRequest) -> Vec<u8> {
    use base64::Engine;
    let text = event.body.as_deref().unwrap_or_default();
    if event.is_base64_encoded {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap_or_else(|_| text.as_bytes().to_vec())
    } else {
        text.as_bytes().to_vec()
    }
}

/// What invokes the function: a WebSocket route, or a batch of typing's expiry checks.
#[derive(Debug)]
pub enum WsEvent {
    Route(Box<ApiGatewayWebsocketProxyRequest>),
    ExpiryChecks(SqsEvent),
}

impl<'de> serde::Deserialize<'de> for WsEvent {
    /// An SQS event has `Records`; a route's event never has.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = serde_json::Value::deserialize(d)?;
        if v.get("Records").is_some() {
            serde_json::from_value(v)
                .map(WsEvent::ExpiryChecks)
                .map_err(D::Error::custom)
        } else {
            serde_json::from_value(v)
                .map(|r| WsEvent::Route(Box::new(r)))
                .map_err(D::Error::custom)
        }
    }
}

/// The answer to a [`WsEvent`] of either kind.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum WsResponse {
    Route(ApiGatewayProxyResponse),
    ExpiryChecks(SqsBatchResponse),
}

impl WsConnection {
    /// Typing's due expiry checks (typing.rs, `Typing::expiry_due`), at once. A check that failed
    /// is reported and comes again after the queue's visibility timeout (its push is then late but
    /// right: it sends the set as it is then); a malformed one is dropped.
    pub async fn expiry_checks(&self, event: SqsEvent) -> SqsBatchResponse {
        let checks = event.records.into_iter().map(|record| async move {
            let check: Option<ExpiryCheck> = record
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str(b).ok());
            let Some(check) = check else {
                tracing::error!(id = ?record.message_id, "malformed typing expiry check");
                return None;
            };
            match self.typing.expiry_due(&check).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(conversation = %check.conversation_id, error = %e, "typing expiry check failed; retried");
                    let mut failure = BatchItemFailure::default();
                    failure.item_identifier = record.message_id.unwrap_or_default();
                    Some(failure)
                }
            }
        });
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = futures::future::join_all(checks)
            .await
            .into_iter()
            .flatten()
            .collect();
        response
    }

    async fn invoked(&self, event: WsEvent) -> WsResponse {
        match event {
            WsEvent::Route(route) => WsResponse::Route(self.handle(*route).await),
            WsEvent::ExpiryChecks(checks) => {
                WsResponse::ExpiryChecks(self.expiry_checks(checks).await)
            }
        }
    }
}

impl EventHandler for WsConnection {
    type Event = WsEvent;
    type Response = WsResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        let verifier = TokenVerifier::from_config(&config.auth).await?;
        let connections = config.connection_store(sdk);
        let expiry = config.typing_queue_url.clone().map(|url| ExpiryQueue {
            sqs: config.sqs_client(sdk),
            url,
        });
        let typing = Typing::new(
            config.chat_store(sdk),
            connections.clone(),
            config.management_client(sdk),
        )
        .with_expiry(expiry);
        Ok(WsConnection::new(connections, verifier, typing)
            .with_suspensions(config.chat_store(sdk)))
    }

    fn handle(&self, event: Self::Event) -> impl Future<Output = Self::Response> + Send {
        self.invoked(event)
    }
}

/// The `?token=` of a handshake. Given twice, it names no one (as two `Authorization` headers
/// on REST): API Gateway's single-value map keeps the last, a proxy might read the first.
fn handshake_token(event: &ApiGatewayWebsocketProxyRequest) -> Result<&str, ChatError> {
    let multi = event.multi_value_query_string_parameters.all("token");
    let tokens = multi.or_else(|| event.query_string_parameters.all("token"));
    match tokens.as_deref() {
        Some([token]) => Ok(token),
        Some([_, _, ..]) => Err(ChatError::Unauthorized(
            "more than one ?token= in the connect URL".into(),
        )),
        _ => Err(ChatError::Unauthorized("missing ?token=".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lambda hands the function either kind of event as JSON: an SQS batch (it has `Records`)
    /// is typing's expiry checks, anything else a WebSocket route's event.
    /// One `?token=` names the caller; two name no one (found by probing: the last one was
    /// taken, so `?token=garbage&token=<valid>` opened).
    #[test]
    fn one_handshake_token_names_the_caller_and_two_name_no_one() {
        let event = |single: serde_json::Value, multi: serde_json::Value| {
            let mut e = serde_json::json!({"requestContext": {"routeKey": "$connect",
                "eventType": "CONNECT", "connectionId": "c1", "connectedAt": 1,
                "requestTimeEpoch": 2, "requestTime": "06/Dec/2026:12:00:00 +0000",
                "requestId": "r", "extendedRequestId": "r", "stage": "v1", "apiId": "a",
                "domainName": "d", "identity": {"sourceIp": "203.0.113.1"}}});
            e["queryStringParameters"] = single;
            e["multiValueQueryStringParameters"] = multi;
            serde_json::from_value::<ApiGatewayWebsocketProxyRequest>(e).unwrap()
        };
        let one = event(
            serde_json::json!({"token": "t"}),
            serde_json::json!({"token": ["t"]}),
        );
        assert_eq!(handshake_token(&one).unwrap(), "t");
        let single_only = event(serde_json::json!({"token": "t"}), serde_json::Value::Null);
        assert_eq!(handshake_token(&single_only).unwrap(), "t");
        let two = event(
            serde_json::json!({"token": "b"}),
            serde_json::json!({"token": ["a", "b"]}),
        );
        let none = event(serde_json::Value::Null, serde_json::Value::Null);
        for e in [two, none] {
            assert!(matches!(
                handshake_token(&e),
                Err(ChatError::Unauthorized(_))
            ));
        }
    }

    #[test]
    fn an_event_is_told_apart_by_its_records() {
        let sqs = serde_json::json!({"Records": [{"messageId": "m1", "eventSource": "aws:sqs",
            "body": "{\"conversationId\":\"d-00000000000000000000000000000001\",\"connection\":\"c1\",\"startedAt\":1}"}]});
        match serde_json::from_value::<WsEvent>(sqs).unwrap() {
            WsEvent::ExpiryChecks(e) => assert_eq!(e.records[0].message_id.as_deref(), Some("m1")),
            other => panic!("{other:?}"),
        }
        // As API Gateway sends a route (the local gateway's event, infra/local-gateway).
        let route = serde_json::json!({"requestContext": {"routeKey": "typing",
            "eventType": "MESSAGE", "messageDirection": "IN", "connectionId": "c1",
            "connectedAt": 1, "requestTimeEpoch": 2, "requestTime": "06/Dec/2026:12:00:00 +0000",
            "requestId": "r", "extendedRequestId": "r", "stage": "v1", "apiId": "a",
            "domainName": "d", "identity": {"sourceIp": "203.0.113.1"}},
            "body": "{}", "isBase64Encoded": false});
        match serde_json::from_value::<WsEvent>(route).unwrap() {
            WsEvent::Route(r) => assert_eq!(r.request_context.route_key.as_deref(), Some("typing")),
            other => panic!("{other:?}"),
        }
        let answer = serde_json::to_value(WsResponse::ExpiryChecks(SqsBatchResponse::default()));
        assert_eq!(
            answer.unwrap(),
            serde_json::json!({"batchItemFailures": []})
        );
    }
}
