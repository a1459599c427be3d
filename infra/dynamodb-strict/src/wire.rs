//! DynamoDB's JSON 1.0 error answers, shaped as the service sends them: `__type` with the
//! service namespace, `message` (`Message` for a cancelled transaction, as the SDKs parse it),
//! `x-amzn-RequestId` and `x-amz-crc32` headers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

pub type Resp = Response<Full<Bytes>>;

const NS: &str = "com.amazonaws.dynamodb.v20120810#";

pub const THROTTLED: &str = "Throughput exceeds the current capacity of your table or index. \
DynamoDB is automatically scaling your table or index so please try again shortly. If exceptions \
persist, check if you have a hot key: \
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html.";
pub const CONFLICT: &str = "Transaction is ongoing for the item";

pub fn json_response(status: StatusCode, body: &Value) -> Resp {
    let bytes = Bytes::from(body.to_string());
    static ID: AtomicU64 = AtomicU64::new(1);
    let id = ID.fetch_add(1, Ordering::Relaxed);
    Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amzn-requestid", format!("STRICT{id:020}"))
        .header("x-amz-crc32", crc32fast::hash(&bytes).to_string())
        .body(Full::new(bytes))
        .expect("static headers are valid")
}

fn error(status: StatusCode, ty: &str, message: &str) -> Resp {
    json_response(status, &json!({"__type": ty, "message": message}))
}

/// `ProvisionedThroughputExceededException` for a hot partition, with its throttling reason.
pub fn throughput_exceeded(table: &str, index: Option<&str>, write: bool) -> Resp {
    let (kind, arn) = match index {
        Some(ix) => ("Index", format!("{}/index/{ix}", table_arn(table))),
        None => ("Table", table_arn(table)),
    };
    let dir = if write { "Write" } else { "Read" };
    let body = json!({
        "__type": format!("{NS}ProvisionedThroughputExceededException"),
        "message": THROTTLED,
        "ThrottlingReasons": [{"reason": format!("{kind}{dir}KeyRangeThroughputExceeded"), "resource": arn}],
    });
    json_response(StatusCode::BAD_REQUEST, &body)
}

fn table_arn(table: &str) -> String {
    format!("arn:aws:dynamodb:ddblocal:000000000000:table/{table}")
}

pub fn transaction_conflict() -> Resp {
    error(
        StatusCode::BAD_REQUEST,
        &format!("{NS}TransactionConflictException"),
        CONFLICT,
    )
}

/// `TransactionCanceledException`: `reasons[i]` is the code of position i (`None` = no error).
pub fn transaction_canceled(reasons: &[&str]) -> Resp {
    let list: Vec<Value> = reasons
        .iter()
        .map(|code| match *code {
            "TransactionConflict" => json!({"Code": code, "Message": CONFLICT}),
            "ThrottlingError" => json!({"Code": code, "Message": THROTTLED}),
            _ => json!({"Code": code}),
        })
        .collect();
    let message = format!(
        "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
        reasons.join(", ")
    );
    let body = json!({"__type": format!("{NS}TransactionCanceledException"),
        "Message": message, "CancellationReasons": list});
    json_response(StatusCode::BAD_REQUEST, &body)
}

pub fn throttling_exception() -> Resp {
    error(
        StatusCode::BAD_REQUEST,
        "com.amazon.coral.availability#ThrottlingException",
        "Rate of requests exceeds the allowed throughput.",
    )
}

pub fn request_limit_exceeded() -> Resp {
    error(
        StatusCode::BAD_REQUEST,
        &format!("{NS}RequestLimitExceeded"),
        "Throughput exceeds the current throughput limit for your account. Please contact AWS \
         Support at https://aws.amazon.com/support request a limit increase",
    )
}

pub fn internal_server_error() -> Resp {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("{NS}InternalServerError"),
        "Internal server error",
    )
}
