//! WebSocket `$connect` / `$disconnect` / `$default`.
//!
//! `$connect` carries the user's token in `?token=` (browsers cannot set headers on a WebSocket):
//! it is verified here, and a connection without a valid token is refused (401). The connection is
//! then recorded for the fanout, with a TTL matching API Gateway's 2-hour limit.

use aws_lambda_events::event::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use chat_domain::ChatError;
use chat_http::auth::TokenVerifier;
use chat_lambda::{Error, EventHandler, SdkConfig};
use chat_store::{Config, ConnectionStore};
use std::future::Future;

#[derive(Clone, Debug)]
pub struct WsConnection {
    connections: ConnectionStore,
    verifier: TokenVerifier,
}

fn status(code: i64) -> ApiGatewayProxyResponse {
    let mut r = ApiGatewayProxyResponse::default();
    r.status_code = code;
    r
}

impl WsConnection {
    pub fn new(connections: ConnectionStore, verifier: TokenVerifier) -> Self {
        WsConnection {
            connections,
            verifier,
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
            "$disconnect" | "DISCONNECT" => {
                let now = chat_domain::time::unix_seconds(chat_domain::time::now());
                self.connections
                    .unregister(&connection, now)
                    .await
                    .map(|_| ())
            }
            // Clients have nothing to say over the socket; a ping keeps it open.
            _ => Ok(()),
        };
        match result {
            Ok(()) => status(200),
            Err(e) => {
                if !matches!(e, ChatError::Unauthorized(_)) {
                    tracing::error!(connection, error = %e, detail = ?e, "websocket route failed");
                }
                status(e.status().into())
            }
        }
    }

    async fn connect(
        &self,
        event: &ApiGatewayWebsocketProxyRequest,
        connection: &str,
    ) -> Result<(), ChatError> {
        let token = event
            .query_string_parameters
            .first("token")
            .ok_or_else(|| ChatError::Unauthorized("missing ?token=".into()))?;
        let now = chat_domain::time::unix_seconds(chat_domain::time::now());
        let user = self.verifier.verify(token, now).await?;
        self.connections.register(&user, connection, now).await
    }
}

impl EventHandler for WsConnection {
    type Event = ApiGatewayWebsocketProxyRequest;
    type Response = ApiGatewayProxyResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        let verifier = TokenVerifier::from_config(&config.auth).await?;
        Ok(WsConnection::new(config.connection_store(sdk), verifier))
    }

    fn handle(&self, event: Self::Event) -> impl Future<Output = Self::Response> + Send {
        WsConnection::handle(self, event)
    }
}
