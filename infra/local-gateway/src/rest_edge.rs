//! The local stand-in for what the deployed HTTP API does around the REST functions, in front of
//! `cargo lambda watch` (which runs the functions):
//!
//! * CORS as template.yaml configures it: preflights answered here, `Access-Control-Allow-Origin`
//!   and `Access-Control-Expose-Headers: retry-after` on answers to browsers;
//! * every error in the API's own shape (docs/api.md §2): paths and methods the API does not have
//!   get `404 not_found` (deployed: the catch-all route), and watch's own error bodies (which name
//!   the workspace's functions) never reach a client;
//! * a body that is not UTF-8 gets `400` (deployed, API Gateway hands it to the function base64
//!   encoded and the JSON parse refuses it; watch would answer `500` before any function runs);
//! * at most as many requests of one route in flight as the function has instances (the rest
//!   wait here). Lambda gives every concurrent request an instance; `cargo lambda watch` 1.9.2
//!   queues the ones it has no instance for in a channel of 100 per function, and a request that
//!   finds that channel full waits for room while holding the lock every instance needs to take
//!   its next request: from then on no request to any function is ever answered. Measured: 240
//!   concurrent `GET /inbox` wedged a fresh stack for good; with this limit, 1,000 do not.
//!   A request keeps its slot until watch answers it, after its own deadline too (what it left in
//!   watch's queue is still there), or for `ABANDONED_FOR` deadlines at most.
//! * an answer within the request's time, as API Gateway's integration timeout bounds it: a
//!   request the functions have not answered `deadline` after it was read (an instance that watch
//!   stopped mid-request, to reload or otherwise, never answers it) gets `503 unavailable`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chat_http::routes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::http::{response, Body};

/// API Gateway's payload limit; the functions refuse anything past 64 KiB themselves (413).
const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// The answer to an unknown path or method.
const NOT_FOUND: &str = "no such route";

/// How many deadlines a request watch never answers holds its route's slot.
const ABANDONED_FOR: u32 = 3;

#[derive(Clone)]
pub(crate) struct RestEdge {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Requests in flight, per route (`route_key`).
    slots: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    per_route: usize,
    /// How long after its body was read a request is answered at the latest.
    deadline: Duration,
}

/// The bound for a request with the functions' time `request_budget` (their
/// `CHAT_REQUEST_BUDGET_MS`, read with the rest of their configuration): docs/data-model.md §4.6,
/// the request's time and 2 s to settle, less 100 ms for the edge's own way there and back
/// (measured by a client: 10–30 ms), so a client is answered within that bound whatever the
/// runner does.
pub(crate) fn deadline(request_budget: Duration) -> Duration {
    request_budget + Duration::from_millis(1_900)
}

impl RestEdge {
    /// In front of `upstream` (`http://127.0.0.1:9010`, where `cargo lambda watch` listens), with
    /// at most `per_route` requests of one route in flight there.
    pub(crate) fn new(upstream: String, per_route: usize, deadline: Duration) -> Self {
        let mut connector = HttpConnector::new();
        // Generous: while watch starts instances (a cargo run each) it can take seconds to accept
        // a connection on a busy machine, and a client is better served late than with a 503.
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        RestEdge {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(connector),
            slots: Arc::default(),
            per_route,
            deadline,
        }
    }

    /// The slots of the route `method path` belongs to. Several routes of one function (four
    /// under `conversations`) may fill up to four times the limit together: 128 in flight, 96
    /// queued in watch, still short of its 100.
    fn slots(&self, method: &Method, path: &str) -> Arc<Semaphore> {
        let key = route_key(method, path);
        let mut slots = self.slots.lock().unwrap();
        slots
            .entry(key)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_route)))
            .clone()
    }

    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let origin = req.headers().get(header::ORIGIN).cloned();
        if is_preflight(&req) {
            return with_cors(preflight(), origin.is_some(), false);
        }
        with_cors(self.forward(req).await, origin.is_some(), true)
    }

    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        if let Some(refused) = header_refusal(&parts.headers) {
            return refused;
        }
        let body = match request_body(body).await {
            Ok(body) => body,
            Err(refused) => return refused,
        };
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // `OPTIONS *` and other targets that are not a path name no route (the HTTP API: 404);
        // nor does an OPTIONS that is not a CORS preflight (those are answered above; found by
        // probing: the function runner answered it 200).
        if !path.starts_with('/') || parts.method == Method::OPTIONS {
            return error(StatusCode::NOT_FOUND, "not_found", NOT_FOUND);
        }
        let slots = self.slots(&parts.method, parts.uri.path());
        let (path, logged) = (path.to_owned(), path.to_owned());
        let (answer_to, answer) = tokio::sync::oneshot::channel();
        let edge = self.clone();
        // A slot is held until watch answers, after the client's deadline too: an invocation
        // whose client was answered 503 still sits in watch's queue until an instance runs it,
        // and released slots let that queue fill past 100 (found by probing: 240 sends at once
        // to a hot group, many past their deadline, wedged the stack for good). An invocation
        // watch never answers (an instance stopped mid-request by a reload) gives up its slot
        // after `ABANDONED_FOR` deadlines.
        tokio::spawn(async move {
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            if answer_to.is_closed() {
                return; // its deadline passed while it waited here: it never reaches watch
            }
            let settled = edge.deadline * ABANDONED_FOR;
            if let Ok(answered) =
                tokio::time::timeout(settled, edge.attempts(&parts, &path, &body)).await
            {
                let _ = answer_to.send(answered);
            }
        });
        match tokio::time::timeout(self.deadline, answer).await {
            Ok(Ok(answer)) => answer,
            _ => {
                tracing::warn!(
                    path = logged,
                    "the functions did not answer within the deadline"
                );
                unavailable()
            }
        }
    }

    /// The request sent upstream until it has an answer to give.
    async fn attempts(
        &self,
        parts: &hyper::http::request::Parts,
        path: &str,
        body: &Bytes,
    ) -> Response<Body> {
        // A read has no effect: when watch itself fails one (its own 5xx, no function's
        // answer: now and then under load), it is sent again, as a client would.
        let read = parts.method == Method::GET || parts.method == Method::HEAD;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (answer, answer_body) = match self.send_upstream(parts, path, body).await {
                Ok(answered) => answered,
                Err(failed) => return failed,
            };
            let status = answer.status;
            if status.is_server_error() && !in_api_shape(&answer_body) {
                tracing::warn!(%status, attempt, body = %String::from_utf8_lossy(&answer_body),
                    "the function runner failed the request");
                if read && attempt < RUNNER_ATTEMPTS {
                    continue;
                }
                // A write the runner failed may or may not have run: the outcome is unknown,
                // as after a timeout (docs/api.md §2), and every write here is safe to retry.
                return unavailable();
            }
            if status.is_client_error() {
                if let Some(replaced) = normalized_error(status, &answer.headers, &answer_body) {
                    return replaced;
                }
            }
            let mut out = Response::new(Full::new(answer_body));
            *out.status_mut() = status;
            *out.headers_mut() = answer.headers;
            return out;
        }
    }

    /// One attempt: the request as received (but for its Host) to the upstream, and its
    /// answer read whole; or the answer to give when that fails.
    async fn send_upstream(
        &self,
        parts: &hyper::http::request::Parts,
        path: &str,
        body: &Bytes,
    ) -> Result<(hyper::http::response::Parts, Bytes), Response<Body>> {
        let mut upstream = Request::builder()
            .method(parts.method.clone())
            .uri(format!("{}{path}", self.upstream));
        for (name, value) in &parts.headers {
            if name != header::HOST {
                upstream = upstream.header(name, value);
            }
        }
        let Ok(upstream) = upstream.body(Full::new(body.clone())) else {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "malformed request",
            ));
        };
        let answer = match self.client.request(upstream).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "REST functions unreachable");
                return Err(unavailable());
            }
        };
        let (answer, answer_body) = answer.into_parts();
        let Ok(answer_body) = answer_body.collect().await.map(|b| b.to_bytes()) else {
            return Err(unavailable());
        };
        Ok((answer, answer_body))
    }
}

/// The answer refusing a request whose header value is not visible ASCII text (the function
/// runner fails such a request with its own 500; a handler could not read it either): bad input,
/// a 400 naming the header; an `Authorization` header that is not is a malformed token, `401`
/// as the functions answer it (docs/api.md §3).
fn header_refusal(headers: &HeaderMap) -> Option<Response<Body>> {
    if headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.to_str().is_err())
    {
        return Some(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "malformed Authorization header",
        ));
    }
    let (name, _) = headers.iter().find(|(_, v)| v.to_str().is_err())?;
    Some(error(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        &format!("header `{name}` must be ASCII text"),
    ))
}

/// A request's body, read whole; or the answer refusing it (too large, malformed framing, not
/// UTF-8).
async fn request_body(body: Incoming) -> Result<Bytes, Response<Body>> {
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "request body is too large",
            ))
        }
        Err(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "malformed request body (its framing could not be read)",
            ))
        }
    };
    if std::str::from_utf8(&body).is_err() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "request body is not valid JSON: it is not UTF-8 text",
        ));
    }
    Ok(body)
}

/// Attempts of a read that the function runner itself fails.
const RUNNER_ATTEMPTS: u32 = 3;

/// `503 unavailable` with `Retry-After`: the functions did not answer (docs/api.md §2).
fn unavailable() -> Response<Body> {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "temporarily unavailable; the outcome is unknown: retry with the same request to learn it",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Whether an answer is in the API's error shape (a function's own answer).
fn in_api_shape(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .ok()
        .is_some_and(|v| v["error"]["code"].is_string())
}

/// The API route a request is for (`chat_http::routes`), as a bounded set of keys
/// whatever the path: `GET /conversations/{conversationId}/messages`; every other path or method
/// `other`.
fn route_key(method: &Method, path: &str) -> String {
    routes::find(method.as_str(), path).map_or_else(|| "other".into(), |(route, _)| route.key())
}

fn is_preflight(req: &Request<Incoming>) -> bool {
    req.method() == Method::OPTIONS
        && req.headers().contains_key(header::ORIGIN)
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// CORS is decided here, as by the HTTP API: whatever the functions' host said goes (from a
/// `forwarded` answer); a request with an `Origin` gets the allowed origin and exposed headers.
fn with_cors(mut answer: Response<Body>, origin: bool, forwarded: bool) -> Response<Body> {
    if forwarded {
        // The functions' own `Vary` says the answer is gzipped by `Accept-Encoding`: it stays.
        let gzipped = answer
            .headers()
            .get_all(header::VARY)
            .iter()
            .any(|v| v == "accept-encoding");
        let foreign: Vec<_> = answer
            .headers()
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-") || *k == header::VARY)
            .cloned()
            .collect();
        for name in foreign {
            answer.headers_mut().remove(name);
        }
        if gzipped {
            insert_all(answer.headers_mut(), [(header::VARY, "accept-encoding")]);
        }
    }
    if origin {
        let cors = [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (header::ACCESS_CONTROL_EXPOSE_HEADERS, "retry-after"),
        ];
        insert_all(answer.headers_mut(), cors);
    }
    answer
}

fn insert_all<const N: usize>(headers: &mut HeaderMap, values: [(HeaderName, &'static str); N]) {
    for (name, value) in values {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// template.yaml's CorsConfiguration.
fn preflight() -> Response<Body> {
    let mut r = response(StatusCode::NO_CONTENT, Bytes::new());
    let allowed = [
        (
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET,POST,PUT,PATCH,DELETE,OPTIONS",
        ),
        (
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "authorization,content-type,x-connection-id",
        ),
        (header::ACCESS_CONTROL_MAX_AGE, "600"),
    ];
    insert_all(r.headers_mut(), allowed);
    r
}

/// A 4xx not in the API's shape (watch's own 404 pages) in that shape.
fn normalized_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Response<Body>> {
    if in_api_shape(body) {
        return None;
    }
    let mut answer = if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED
    {
        error(StatusCode::NOT_FOUND, "not_found", NOT_FOUND)
    } else {
        return None;
    };
    if let Some(retry) = headers.get(header::RETRY_AFTER) {
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, retry.clone());
    }
    Some(answer)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let mut r = response(
        status,
        json!({"error": {"code": code, "message": message}}).to_string(),
    );
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestClient = Client<HttpConnector, Full<Bytes>>;

    /// An edge (`per_route` requests per route, `deadline`) in front of an upstream that answers
    /// with `upstream`: the edge's URL, a client, and the trigger that keeps both serving.
    async fn edge_before<F, Fut>(
        upstream: F,
        per_route: usize,
        deadline: Duration,
    ) -> (String, TestClient, crate::shutdown::Trigger)
    where
        F: Fn(Request<Incoming>, std::net::SocketAddr) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
    {
        let (trigger, shutdown) = crate::shutdown::Shutdown::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_url = format!("http://{}", listener.local_addr().unwrap());
        crate::http::serve(listener, shutdown.clone(), upstream);
        let edge = RestEdge::new(upstream_url, per_route, deadline);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let edge_url = format!("http://{}", listener.local_addr().unwrap());
        crate::http::serve(listener, shutdown, move |req, _| {
            let edge = edge.clone();
            async move { edge.handle(req).await }
        });
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        (edge_url, client, trigger)
    }

    #[test]
    fn requests_are_limited_per_route_with_a_bounded_set_of_keys() {
        let query = Method::from_bytes(b"QUERY").unwrap();
        let cases = [
            (Method::GET, "/inbox", "GET /inbox"),
            (
                Method::POST,
                "/conversations/g-1/messages",
                "POST /conversations/{conversationId}/messages",
            ),
            (
                Method::GET,
                "/conversations/g-2/messages",
                "GET /conversations/{conversationId}/messages",
            ),
            (
                Method::DELETE,
                "/conversations/g/members/u1",
                "DELETE /conversations/{conversationId}/members/{userId}",
            ),
            (
                Method::GET,
                "/conversations/x",
                "GET /conversations/{conversationId}",
            ),
            (Method::GET, "/conversations/x/members", "other"),
            // Whatever a client sends, the keys stay few.
            (Method::GET, "/conversations/x/y/z/w", "other"),
            (Method::GET, "/random-1234", "other"),
            (Method::PUT, "/inbox", "other"),
            (query, "/inbox", "other"),
        ];
        for (method, path, key) in cases {
            assert_eq!(route_key(&method, path), key, "{method} {path}");
        }
    }

    /// An upstream's answer in the making.
    type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>>;

    /// An upstream that answers each request after `takes`, and the most requests it held at
    /// once.
    fn counting_upstream(
        takes: Duration,
    ) -> (
        impl Fn(Request<Incoming>, std::net::SocketAddr) -> Answer + Clone + Send + Sync + 'static,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let m = most.clone();
        let upstream = move |_req, _| {
            let (n, m) = (now.clone(), m.clone());
            Box::pin(async move {
                m.fetch_max(n.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(takes).await;
                n.fetch_sub(1, Ordering::SeqCst);
                response(StatusCode::OK, "{}")
            })
                as std::pin::Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>>
        };
        (upstream, most)
    }

    /// `n` GETs of one route at once through the edge at `edge_url`.
    async fn burst(
        client: &TestClient,
        edge_url: &str,
        n: usize,
    ) -> Vec<Result<Response<Incoming>, hyper_util::client::legacy::Error>> {
        let calls = (0..n).map(|i| {
            let req = Request::get(format!("{edge_url}/conversations/c-{i}/messages"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            client.request(req)
        });
        futures::future::join_all(calls).await
    }

    /// 200 requests of one route at once, in front of an upstream that takes 20 ms each: at most
    /// `per_route` reach it together, and every request is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_per_route_requests_of_a_route_reach_the_functions_at_once() {
        use std::sync::atomic::Ordering;
        let (upstream, most) = counting_upstream(Duration::from_millis(20));
        let (edge_url, client, _trigger) = edge_before(upstream, 8, Duration::from_secs(22)).await;
        let answers = burst(&client, &edge_url, 200).await;
        assert!(answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|r| r.status() == StatusCode::OK)));
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= 8,
            "{most} requests of one route reached the functions at once"
        );
        assert!(most >= 2, "the requests did not overlap at all ({most})");
    }

    /// An OPTIONS that is not a CORS preflight names no route: `404 not_found` in the API's
    /// shape, never the function runner's answer; a preflight is answered by the edge.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_options_request_is_a_preflight_or_no_route() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let upstream = move |_req, _| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move { response(StatusCode::OK, "") }
        };
        let (edge_url, client, _trigger) = edge_before(upstream, 8, Duration::from_secs(22)).await;
        for path in ["/inbox", "/nope"] {
            let req = Request::builder()
                .method(Method::OPTIONS)
                .uri(format!("{edge_url}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let answer = client.request(req).await.unwrap();
            assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{path}");
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"]["code"], "not_found", "{path}");
        }
        let preflight = Request::builder()
            .method(Method::OPTIONS)
            .uri(format!("{edge_url}/inbox"))
            .header(header::ORIGIN, "http://app.test")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "GET")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let answer = client.request(preflight).await.unwrap();
        assert!(answer.status().is_success(), "{}", answer.status());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "none reached the functions"
        );
    }

    /// The function runner's own 5xx (watch's error page, no function's answer): a read is sent
    /// again; a write, whose outcome is unknown, is answered `503 unavailable` with Retry-After,
    /// never a bare 5xx. A function's own 5xx in the API's shape is passed on as it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_runners_own_failures_are_retried_for_reads_and_503_for_writes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let upstream = move |req: Request<Incoming>, _| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let ours = req.uri().path() == "/inbox";
            async move {
                if ours {
                    let body = r#"{"error":{"code":"unavailable","message":"x"}}"#;
                    return response(StatusCode::SERVICE_UNAVAILABLE, body);
                }
                // Every other call fails once in the runner, then succeeds.
                if n.is_multiple_of(2) {
                    let page = r#"{"type":"https://httpstatuses.com/500","status":500}"#;
                    return response(StatusCode::INTERNAL_SERVER_ERROR, page);
                }
                response(StatusCode::OK, "{}")
            }
        };
        let (edge_url, client, _trigger) = edge_before(upstream, 8, Duration::from_secs(22)).await;
        let send = |method: Method, path: &str| {
            let req = Request::builder()
                .method(method)
                .uri(format!("{edge_url}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            client.request(req)
        };
        let read = send(Method::GET, "/conversations/c/messages")
            .await
            .unwrap();
        assert_eq!(read.status(), StatusCode::OK, "the read was sent again");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let write = send(Method::POST, "/conversations/c/messages")
            .await
            .unwrap();
        assert_eq!(write.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(write.headers()[header::RETRY_AFTER], "1");
        let body = write.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains(r#""code":"unavailable""#));
        assert_eq!(calls.load(Ordering::SeqCst), 3, "a write is not sent again");
        let theirs = send(Method::GET, "/inbox").await.unwrap();
        assert_eq!(theirs.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "a function's own 503 is its answer"
        );
    }

    /// A function that never answers (an instance watch stopped mid-request): the request is
    /// answered `503 unavailable` with Retry-After at the deadline, and the instance it held is
    /// free again for the next one, which waited for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_the_functions_never_answer_is_answered_at_the_deadline() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let upstream = move |_req, _| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                response(StatusCode::OK, "{}")
            }
        };
        let deadline = Duration::from_millis(400);
        let (edge_url, client, _trigger) = edge_before(upstream, 1, deadline).await;
        let send = || {
            let req = Request::post(format!("{edge_url}/conversations/c/messages"))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            client.request(req)
        };
        let started = std::time::Instant::now();
        // The second comes while the first holds the route's only instance.
        let second = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            send().await
        };
        let (first, second) = tokio::join!(send(), second);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= deadline && elapsed < deadline * 3,
            "answered after {elapsed:?}"
        );
        for answer in [first.unwrap(), second.unwrap()] {
            assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(answer.headers()[header::RETRY_AFTER], "1");
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            assert!(String::from_utf8_lossy(&body).contains(r#""code":"unavailable""#));
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the first still holds the route's only slot: the second never reached watch"
        );
        // Past `ABANDONED_FOR` deadlines, the slot of the invocation never answered is free.
        tokio::time::sleep(deadline * ABANDONED_FOR).await;
        let started = std::time::Instant::now();
        let third = send().await.unwrap();
        assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() >= deadline);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the third reached it");
    }

    /// A request answered 503 at its deadline keeps its slot until the functions answer it, so
    /// that what reaches watch never outgrows what the slots allow.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_past_its_deadline_holds_its_slot_until_the_functions_answer() {
        use std::sync::atomic::Ordering;
        let (upstream, most) = counting_upstream(Duration::from_millis(300));
        let deadline = Duration::from_millis(100);
        let (edge_url, client, _trigger) = edge_before(upstream, 2, deadline).await;
        let answers = burst(&client, &edge_url, 12).await;
        assert!(answers.iter().all(|a| a
            .as_ref()
            .is_ok_and(|r| r.status() == StatusCode::SERVICE_UNAVAILABLE)));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let most = most.load(Ordering::SeqCst);
        assert_eq!(
            most, 2,
            "{most} requests of one route reached the functions at once"
        );
    }

    #[test]
    fn a_preflight_keeps_its_own_cors_headers_and_the_functions_lose_theirs() {
        let answer = with_cors(preflight(), true, false);
        let h = answer.headers();
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization,content-type,x-connection-id"
        );
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_METHODS],
            "GET,POST,PUT,PATCH,DELETE,OPTIONS"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        let mut from_functions = response(StatusCode::OK, Bytes::new());
        from_functions.headers_mut().insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("http://elsewhere"),
        );
        let answer = with_cors(from_functions, true, true);
        assert_eq!(answer.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert_eq!(
            answer.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS],
            "retry-after"
        );
        let without_origin = with_cors(response(StatusCode::OK, Bytes::new()), false, true);
        assert!(without_origin.headers().is_empty());
        // The functions' `Vary` of a gzipped answer stays; any other goes.
        for (varies, kept) in [
            (&["accept-encoding", "origin"][..], &["accept-encoding"][..]),
            (&["origin", "accept-encoding"], &["accept-encoding"]),
            (&["origin"], &[]),
        ] {
            let mut answer = response(StatusCode::OK, Bytes::new());
            for vary in varies {
                answer
                    .headers_mut()
                    .append(header::VARY, HeaderValue::from_static(vary));
            }
            let answer = with_cors(answer, true, true);
            let left: Vec<_> = answer.headers().get_all(header::VARY).iter().collect();
            assert_eq!(left, kept, "{varies:?}");
        }
    }

    #[test]
    fn a_header_that_is_not_ascii_text_is_a_400_naming_it() {
        let mut headers = HeaderMap::new();
        headers.insert("x-connection-id", HeaderValue::from_static("abc"));
        assert!(header_refusal(&headers).is_none());
        headers.insert("x-foo", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        let refused = header_refusal(&headers).unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let body = futures::executor::block_on(refused.into_body().collect()).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(body["error"]["message"].as_str().unwrap().contains("x-foo"));
        // A token that is not ASCII text is a malformed one, whatever else is wrong.
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer \xc3\xa9").unwrap(),
        );
        let refused = header_refusal(&headers).unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let body = futures::executor::block_on(refused.into_body().collect()).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }

    #[test]
    fn foreign_error_pages_take_the_apis_shape() {
        let watch_404 =
            br#"{"detail":"Available functions: {\"inbox\"}","title":"Default function disabled"}"#;
        let r = normalized_error(StatusCode::NOT_FOUND, &HeaderMap::new(), watch_404).unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let ours = br#"{"error":{"code":"not_found","message":"conversation not found"}}"#;
        assert!(normalized_error(StatusCode::NOT_FOUND, &HeaderMap::new(), ours).is_none());
        assert!(normalized_error(StatusCode::CONFLICT, &HeaderMap::new(), b"{}").is_none());
    }
}
