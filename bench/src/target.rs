//! What the bench drives: the real handlers in this process (against the emulator, with every
//! DynamoDB call recorded), or a running local stack's REST API over HTTP (`--api URL`: the
//! functions under `cargo lambda watch` with concurrent instances).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use chat_tests::TestApp;

use crate::call_as;

#[derive(Clone)]
pub enum Target {
    InProcess(Arc<TestApp>),
    Http {
        base: String,
        secret: String,
        client: Box<Client<HttpConnector, Full<Bytes>>>,
    },
}

impl Target {
    pub fn http(base: &str) -> Target {
        Target::Http {
            base: base.trim_end_matches('/').to_owned(),
            secret: std::env::var("CHAT_LOCAL_JWT_SECRET")
                .unwrap_or_else(|_| "local-dev-secret".into()),
            client: Box::new(
                Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(64)
                    .build(HttpConnector::new()),
            ),
        }
    }

    /// A token for `user` that this target accepts (REST and WebSocket).
    pub fn token(&self, user: &str) -> String {
        match self {
            Target::InProcess(_) => chat_tests::token(user),
            Target::Http { secret, .. } => {
                chat_http::auth::mint_hs256(user, 4_000_000_000, secret.as_bytes())
            }
        }
    }

    /// Creates a group of `owner` and `members` (201 or a panic); its id.
    pub async fn create_group(
        &self,
        owner: &str,
        title: &str,
        members: &[impl AsRef<str>],
    ) -> String {
        let members: Vec<&str> = members.iter().map(AsRef::as_ref).collect();
        let body = serde_json::json!({"type": "group", "title": title, "memberIds": members});
        let (status, created) = self.call("POST", "/conversations", owner, Some(body)).await;
        assert_eq!(status, 201, "{created}");
        created["conversationId"].as_str().unwrap().to_owned()
    }

    pub fn app(&self) -> Option<&Arc<TestApp>> {
        match self {
            Target::InProcess(t) => Some(t),
            Target::Http { .. } => None,
        }
    }

    /// `(status, JSON body)` of one request as `user`.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        user: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        match self {
            Target::InProcess(t) => {
                let r = call_as(t, method, path, user, body.as_ref()).await;
                (r.status, r.body)
            }
            Target::Http { base, client, .. } => {
                let token = self.token(user);
                let req = hyper::Request::builder()
                    .method(method)
                    .uri(format!("{base}{path}"))
                    .header("authorization", format!("Bearer {token}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(
                        body.map(|b| b.to_string()).unwrap_or_default(),
                    )))
                    .unwrap();
                match client.request(req).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let bytes = resp
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        (
                            status,
                            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                        )
                    }
                    Err(_) => (599, Value::Null),
                }
            }
        }
    }
}
