//! Logs as the Lambda runtime writes them with `AWS_LAMBDA_LOG_FORMAT=JSON`: every line a JSON
//! object, one per REST request with what an operator needs (route, status, latency, DynamoDB
//! calls, ids) and no message body. Its own test binary: it sets the process's environment.

use chat_tests::{LogCapture, TestApp};
use serde_json::Value;

#[tokio::test]
async fn json_logs_have_one_line_per_request_and_no_bodies() {
    // Set before any thread reads the environment: the runtime's subscriber reads it once.
    std::env::set_var("AWS_LAMBDA_LOG_FORMAT", "JSON");
    std::env::set_var("AWS_LAMBDA_LOG_LEVEL", "info");
    let captured = LogCapture::default();
    chat_store::telemetry::init_with_writer(false, None, captured.clone());

    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let secret = "a body no log may show";
    let r = t.send(&c, &a, secret).await;
    assert_eq!(r.status, 201);
    t.get(&format!("/conversations/{c}/messages"), &b).await;

    let text = String::from_utf8(captured.take()).unwrap();
    assert!(!text.contains(secret), "no message body in the logs");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let requests: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "request")
        .collect();
    assert!(requests.len() >= 3, "{text}");
    let send = requests
        .iter()
        .find(|l| l["fields"]["route"] == "POST /conversations/{conversationId}/messages")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(send["level"], "INFO");
    assert_eq!(send["fields"]["status"], 201);
    assert_eq!(send["fields"]["conversation"], c.as_str());
    assert_eq!(send["fields"]["dynamodb_calls"], 2);
    assert!(send["fields"]["latency_ms"].is_u64());
    assert!(send["fields"]["request_id"]
        .as_str()
        .is_some_and(|id| !id.is_empty()));
}
