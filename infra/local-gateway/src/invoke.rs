//! A stand-in for the Lambda Invoke API (`POST /2015-03-31/functions/{name}/invocations`) on the
//! Management API's port, for the stream consumers: `relay` (or `RelayFunction`) and `fanout` (or
//! `FanoutFunction`), run in-process like the pipeline runs them. It lets the same tools work
//! locally and deployed, e.g. `infra/replay_failures.py`, which invokes the relay with the records
//! a failure-queue message names.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::handlers::Handlers;
use crate::http::{response, Body};

/// Lambda's limit for a synchronous invocation's payload.
const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;

/// The function named by an Invoke path, if it is one.
fn function_of(path: &str) -> Option<&str> {
    path.strip_prefix("/2015-03-31/functions/")?
        .strip_suffix("/invocations")
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// Answers an Invoke request; None when `req` is not one (the Management API handles it).
pub(crate) async fn handle(
    req: Request<Incoming>,
    handlers: &Handlers,
) -> Result<Response<Body>, Request<Incoming>> {
    let Some(function) = function_of(req.uri().path()).map(str::to_owned) else {
        return Err(req);
    };
    if req.method() != Method::POST {
        return Ok(error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowedException",
            "use POST",
        ));
    }
    let payload: Value = match Limited::new(req.into_body(), MAX_PAYLOAD_BYTES)
        .collect()
        .await
    {
        Ok(body) => match serde_json::from_slice(&body.to_bytes()) {
            Ok(v) => v,
            Err(e) => {
                return Ok(error(
                    StatusCode::BAD_REQUEST,
                    "InvalidRequestContentException",
                    &e.to_string(),
                ))
            }
        },
        Err(_) => {
            return Ok(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestTooLargeException",
                "payload too large",
            ))
        }
    };
    let records = payload["Records"].as_array().cloned().unwrap_or_default();
    let result = match function.as_str() {
        "relay" | "RelayFunction" => handlers.relay(records).await,
        "fanout" | "FanoutFunction" => handlers.fanout(records).await,
        other => {
            return Ok(error(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                &format!("Function not found: {other}"),
            ))
        }
    };
    let (body, failed) = match result {
        Ok(v) => (v, false),
        Err(e) => (
            json!({"errorMessage": e.to_string(), "errorType": "Unhandled"}),
            true,
        ),
    };
    let mut r = response(StatusCode::OK, Bytes::from(body.to_string()));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        "X-Amz-Executed-Version",
        HeaderValue::from_static("$LATEST"),
    );
    if failed {
        h.insert(
            "X-Amz-Function-Error",
            HeaderValue::from_static("Unhandled"),
        );
    }
    Ok(r)
}

fn error(status: StatusCode, kind: &'static str, message: &str) -> Response<Body> {
    let mut r = response(
        status,
        Bytes::from(json!({"Type": "User", "Message": message}).to_string()),
    );
    r.headers_mut()
        .insert("x-amzn-ErrorType", HeaderValue::from_static(kind));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::function_of;

    #[test]
    fn invoke_paths() {
        assert_eq!(
            function_of("/2015-03-31/functions/relay/invocations"),
            Some("relay")
        );
        assert_eq!(function_of("/2015-03-31/functions//invocations"), None);
        assert_eq!(function_of("/2015-03-31/functions/a/b/invocations"), None);
        assert_eq!(function_of("/@connections/x"), None);
    }
}
