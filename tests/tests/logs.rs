//! Logs as the Lambda runtime writes them with `AWS_LAMBDA_LOG_FORMAT=JSON`: every line a JSON
//! object, one per REST request with what an operator needs (route, status, latency, DynamoDB
//! calls, ids) and no message body, for every request with `CHAT_LOG_EVERY=1`, and by default for
//! every failed one and one in 20 of the rest. Its own test binary: it sets the process's
//! environment. The tests share the log capture and the sampling: they run one at a time.

use chat_domain::log_sampling::LogSampling;
use chat_tests::{LogCapture, TestApp};
use serde_json::Value;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn capture() -> LogCapture {
    static CAPTURE: std::sync::OnceLock<LogCapture> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            // Set before any thread reads the environment: the runtime's subscriber reads it once.
            std::env::set_var("AWS_LAMBDA_LOG_FORMAT", "JSON");
            std::env::set_var("AWS_LAMBDA_LOG_LEVEL", "info");
            let captured = LogCapture::default();
            chat_store::telemetry::init_with_writer(false, None, captured.clone());
            captured
        })
        .clone()
}

fn request_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|l| l["fields"]["message"] == "request")
        .collect()
}

#[tokio::test]
async fn ordinary_requests_are_sampled_and_failed_ones_always_logged() {
    let _one = ONE_AT_A_TIME.lock().await;
    let captured = capture();
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    chat_store::telemetry::set_log_sampling(LogSampling::DEFAULT);
    captured.take();
    for _ in 0..40 {
        assert_eq!(
            t.get(&format!("/conversations/{c}/messages"), &a)
                .await
                .status,
            200
        );
    }
    let stranger = chat_tests::unique("stranger");
    for _ in 0..3 {
        let refused = t
            .get(&format!("/conversations/{c}"), &stranger)
            .await
            .status;
        assert!((400..500).contains(&refused), "{refused}");
    }
    let text = String::from_utf8(captured.take()).unwrap();
    let lines = request_lines(&text);
    let ok = lines
        .iter()
        .filter(|l| l["fields"]["status"] == 200)
        .count();
    let failed = lines
        .iter()
        .filter(|l| l["fields"]["status"].as_u64().is_some_and(|s| s >= 400))
        .count();
    assert_eq!(
        (ok, failed),
        (2, 3),
        "one in 20 of the 40 reads, every refusal: {text}"
    );
}

#[tokio::test]
async fn json_logs_have_one_line_per_request_and_no_bodies() {
    let _one = ONE_AT_A_TIME.lock().await;
    let captured = capture();
    chat_store::telemetry::set_log_sampling(LogSampling {
        every: 1,
        ..LogSampling::DEFAULT
    });
    captured.take();

    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let secret = "a body no log may show";
    let r = t.send(&c, &a, secret).await;
    assert_eq!(r.status, 201);
    t.get(&format!("/conversations/{c}/messages"), &b).await;

    let text = String::from_utf8(captured.take()).unwrap();
    assert!(!text.contains(secret), "no message body in the logs");
    for l in text.lines() {
        serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
    }
    let requests = request_lines(&text);
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
