//! The Management API of the WebSocket API (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`):
//! `POST` (push one frame), `GET` (connection info) and `DELETE` (close) on
//! `/@connections/{connectionId}`, also under a `/{stage}` prefix. An unknown connection is
//! `410 GoneException`, which the SDK surfaces as `PostToConnectionError::GoneException`.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::http::{response, Body};
use crate::registry::{Registry, SendError};

/// API Gateway's limit for the data of one PostToConnection.
const MAX_POST_BYTES: usize = 128 * 1024;

pub(crate) async fn handle(req: Request<Incoming>, registry: &Registry) -> Response<Body> {
    let Some(id) = connection_id(req.uri().path()) else {
        return error(StatusCode::NOT_FOUND, "NotFoundException", "Not Found");
    };
    let method = req.method().clone();
    match method {
        Method::POST => {
            if let Some(status) = registry.take_failure(&id) {
                let status =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let kind = match status.as_u16() {
                    400 => "BadRequestException",
                    403 => "ForbiddenException",
                    410 => "GoneException",
                    413 => "PayloadTooLargeException",
                    429 => "LimitExceededException",
                    _ => "InternalServerErrorException",
                };
                return error(status, kind, "Injected failure");
            }
            let data = match Limited::new(req.into_body(), MAX_POST_BYTES)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(_) => {
                    return error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "PayloadTooLargeException",
                        "Message too long",
                    )
                }
            };
            match registry.send(&id, frame(data)) {
                Ok(()) => response(StatusCode::OK, Bytes::new()),
                // A client that let its queue fill was dropped (`Registry::send`): gone.
                Err(SendError::Gone | SendError::Full) => gone(),
            }
        }
        Method::GET => match registry.info(&id) {
            Some(info) => {
                let body = json!({
                    "connectedAt": chat_domain::time::rfc3339(info.connected_at),
                    "lastActiveAt": chat_domain::time::rfc3339(info.last_active_at),
                    "identity": {"sourceIp": info.source_ip, "userAgent": info.user_agent},
                });
                json_response(StatusCode::OK, body)
            }
            None => gone(),
        },
        Method::DELETE if registry.close(&id) => response(StatusCode::NO_CONTENT, Bytes::new()),
        Method::DELETE => gone(),
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowedException",
            "Method not allowed",
        ),
    }
}

/// `/@connections/{id}` or `/{stage}/@connections/{id}`, the id percent-decoded.
fn connection_id(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let encoded = match segments.as_slice() {
        ["@connections", id] | [_, "@connections", id] if !id.is_empty() => *id,
        _ => return None,
    };
    percent_encoding::percent_decode_str(encoded)
        .decode_utf8()
        .ok()
        .map(|id| id.into_owned())
}

/// Text frame for UTF-8 data (what the fanout sends), binary otherwise.
fn frame(data: Bytes) -> Message {
    match String::from_utf8(data.to_vec()) {
        Ok(text) => Message::text(text),
        Err(_) => Message::binary(data),
    }
}

fn gone() -> Response<Body> {
    error(StatusCode::GONE, "GoneException", "Gone")
}

/// An error the way API Gateway sends it: the error type in `x-amzn-ErrorType` (how the SDK's
/// restJson1 protocol finds it) and `{"message": ...}`.
fn error(status: StatusCode, kind: &'static str, message: &str) -> Response<Body> {
    let mut r = json_response(status, json!({ "message": message }));
    r.headers_mut()
        .insert("x-amzn-ErrorType", HeaderValue::from_static(kind));
    r
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut r = response(status, body.to_string());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::connection_id;

    #[test]
    fn paths() {
        assert_eq!(
            connection_id("/@connections/abc%3D").as_deref(),
            Some("abc=")
        );
        assert_eq!(
            connection_id("/local/@connections/a-b_c=").as_deref(),
            Some("a-b_c=")
        );
        assert_eq!(connection_id("/@connections/"), None);
        assert_eq!(connection_id("/a/b/@connections/x"), None);
        assert_eq!(connection_id("/local/connections/x"), None);
    }
}
