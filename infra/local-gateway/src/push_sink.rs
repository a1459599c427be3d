//! The local push sink (docs/api.md §33): stands in for APNs/FCM behind SNS. The notifier POSTs
//! each notification to `/notifications`; `GET /notifications?token=<token>` lists what was sent
//! to a device token, oldest first, as `{"notifications":[{"platform","token","title","body",
//! "badge","data","sentAt"}]}`. Kept in memory while the stack runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::http::{json_response, response, serve};
use crate::shutdown::Shutdown;

/// What the sink received, by token.
#[derive(Debug, Clone, Default)]
pub struct PushSink(Arc<Mutex<HashMap<String, Vec<Value>>>>);

impl PushSink {
    /// The notifications sent to `token`, oldest first.
    pub fn sent_to(&self, token: &str) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .get(token)
            .cloned()
            .unwrap_or_default()
    }

    fn record(&self, n: Value) -> bool {
        let Some(token) = n["token"].as_str().map(str::to_owned) else {
            return false;
        };
        self.0.lock().unwrap().entry(token).or_default().push(n);
        true
    }

    /// Serves the sink on `listener` for as long as the process runs (the tests' own sink).
    pub fn spawn(&self, listener: TcpListener) {
        let (trigger, shutdown) = Shutdown::new();
        // Never fired: the sink lives as long as the test binary.
        std::mem::forget(trigger);
        self.serve(listener, shutdown);
    }

    /// Serves the sink on `listener` until `shutdown`.
    pub(crate) fn serve(&self, listener: TcpListener, shutdown: Shutdown) {
        let sink = self.clone();
        serve(listener, shutdown, move |req, _peer| {
            let sink = sink.clone();
            async move {
                let (method, path) = (req.method().clone(), req.uri().path().to_owned());
                let query = req.uri().query().unwrap_or_default().to_owned();
                match (method, path.as_str()) {
                    (Method::GET, "/notifications") => {
                        let token = query
                            .split('&')
                            .find_map(|p| p.strip_prefix("token="))
                            .and_then(chat_http::routes::percent_decode)
                            .unwrap_or_default();
                        let sent = json!({ "notifications": sink.sent_to(&token) });
                        json_response(StatusCode::OK, &sent)
                    }
                    (Method::POST, "/notifications") => {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let n: Option<Value> =
                            body.ok().and_then(|b| serde_json::from_slice(&b).ok());
                        if n.is_some_and(|n| sink.record(n)) {
                            response(StatusCode::NO_CONTENT, "")
                        } else {
                            response(StatusCode::BAD_REQUEST, "a notification with a token")
                        }
                    }
                    _ => response(StatusCode::NOT_FOUND, "GET /notifications?token=<token>"),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::Request;
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::TokioExecutor;

    /// What a client of `GET /notifications` reads: JSON, said so in `Content-Type` (found by
    /// probing: the sink answered without it), with what was sent to that token only.
    #[tokio::test]
    async fn the_sink_lists_a_tokens_notifications_as_json() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sink = PushSink::default();
        sink.spawn(listener);
        let client: Client<_, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        for token in ["a b", "other"] {
            let sent = json!({"platform": "fcm", "token": token, "title": "t", "badge": 1});
            let post = Request::post(format!("{url}/notifications"))
                .body(Full::new(Bytes::from(sent.to_string())))
                .unwrap();
            let answer = client.request(post).await.unwrap();
            assert_eq!(answer.status(), StatusCode::NO_CONTENT);
        }
        let get = Request::get(format!("{url}/notifications?token=a%20b"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let answer = client.request(get).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(
            answer.headers()[hyper::header::CONTENT_TYPE],
            "application/json"
        );
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let listed: Value = serde_json::from_slice(&body).unwrap();
        let tokens: Vec<&str> = listed["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["token"].as_str())
            .collect();
        assert_eq!(tokens, ["a b"]);
    }
}
