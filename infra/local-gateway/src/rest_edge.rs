//! The local stand-in for what the deployed HTTP API does around the REST functions, in front of
//! `cargo lambda watch` (which runs the functions):
//!
//! * CORS as template.yaml configures it: preflights answered here, `Access-Control-Allow-Origin`
//!   and `Access-Control-Expose-Headers: retry-after` on answers to browsers;
//! * every error in the API's own shape (docs/api.md §2): paths and methods the API does not have
//!   get `404 not_found` (deployed: the catch-all route), and watch's own error bodies (which name
//!   the workspace's functions) never reach a client;
//! * a body that is not UTF-8 gets `400` (deployed, API Gateway hands it to the function base64
//!   encoded and the JSON parse refuses it; watch would answer `500` before any function runs).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::http::{response, Body};

/// API Gateway's payload limit; the functions refuse anything past 64 KiB themselves (413).
const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// The answer to an unknown path or method.
const NOT_FOUND: &str = "no such route";

#[derive(Clone)]
pub(crate) struct RestEdge {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl RestEdge {
    /// In front of `upstream` (`http://127.0.0.1:9010`, where `cargo lambda watch` listens).
    pub(crate) fn new(upstream: String) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        RestEdge {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
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
        let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "request body is too large",
                )
            }
        };
        if std::str::from_utf8(&body).is_err() {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "request body is not valid JSON: it is not UTF-8 text",
            );
        }
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut upstream = Request::builder()
            .method(parts.method.clone())
            .uri(format!("{}{path}", self.upstream));
        for (name, value) in &parts.headers {
            if name != header::HOST {
                upstream = upstream.header(name, value);
            }
        }
        let Ok(upstream) = upstream.body(Full::new(body)) else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "malformed request",
            );
        };
        let answer = match self.client.request(upstream).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "REST functions unreachable");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "internal",
                    "temporarily unavailable, retry later",
                );
            }
        };
        let (parts, body) = answer.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return error(StatusCode::BAD_GATEWAY, "internal", "internal error"),
        };
        if parts.status.is_client_error() || parts.status.is_server_error() {
            if let Some(replaced) = normalized_error(parts.status, &parts.headers, &body) {
                return replaced;
            }
        }
        let mut out = Response::new(Full::new(body));
        *out.status_mut() = parts.status;
        *out.headers_mut() = parts.headers;
        out
    }
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
        let foreign: Vec<_> = answer
            .headers()
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-") || *k == header::VARY)
            .cloned()
            .collect();
        for name in foreign {
            answer.headers_mut().remove(name);
        }
    }
    if origin {
        let h = answer.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
    }
    answer
}

/// template.yaml's CorsConfiguration.
fn preflight() -> Response<Body> {
    let mut r = response(StatusCode::NO_CONTENT, Bytes::new());
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET,POST,DELETE,OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization,content-type"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    r
}

/// An error answer that is not in the API's shape (watch's own 404 and 5xx pages) in that shape.
fn normalized_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Response<Body>> {
    let ours = serde_json::from_slice::<Value>(body)
        .ok()
        .is_some_and(|v| v["error"]["code"].is_string());
    if ours {
        return None;
    }
    let mut answer = if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED
    {
        error(StatusCode::NOT_FOUND, "not_found", NOT_FOUND)
    } else if status.is_server_error() {
        tracing::warn!(%status, body = %String::from_utf8_lossy(body), "REST function failed");
        error(status, "internal", "internal error")
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

    #[test]
    fn a_preflight_keeps_its_own_cors_headers_and_the_functions_lose_theirs() {
        let answer = with_cors(preflight(), true, false);
        let h = answer.headers();
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization,content-type"
        );
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_METHODS],
            "GET,POST,DELETE,OPTIONS"
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
    }

    #[test]
    fn foreign_error_pages_take_the_apis_shape() {
        let watch_404 =
            br#"{"detail":"Available functions: {\"inbox\"}","title":"Default function disabled"}"#;
        let r = normalized_error(StatusCode::NOT_FOUND, &HeaderMap::new(), watch_404).unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let r = normalized_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &HeaderMap::new(),
            b"boom",
        )
        .unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let ours = br#"{"error":{"code":"not_found","message":"conversation not found"}}"#;
        assert!(normalized_error(StatusCode::NOT_FOUND, &HeaderMap::new(), ours).is_none());
        assert!(normalized_error(StatusCode::CONFLICT, &HeaderMap::new(), b"{}").is_none());
    }
}
