//! `flood` (docs/api.md §24, the rate limits' goal): one user sends 1,000 messages within a second
//! while 8 other users each send as a person does (one message after another); then: exactly what
//! the send bucket allows is stored, every other send answered `429 rate_limited` with a whole
//! `Retry-After`, no 5xx, the flooded conversation's seq gap-free; and the others' p50 / p99 with
//! and without the flood. The real handlers in process with the default limits (10 a second, a
//! burst of 20; 50 requests a second), one shared bucket per user as on AWS.

use std::time::{Duration, Instant};

use chat_store::RateLimits;
use chat_tests::{new_uuid, seqs, TestApp};
use futures::future::join_all;
use serde_json::json;

use super::{percentile, Table};

const FLOOD: usize = 1_000;
const OTHERS: usize = 8;
const PER_OTHER: usize = 25;

/// The others' send latencies: each of `OTHERS` users sends `PER_OTHER` messages, one after the
/// other, in a conversation of its own.
async fn others(t: &TestApp) -> Vec<Duration> {
    let mut conversations = Vec::new();
    for _ in 0..OTHERS {
        let (a, _b, c) = t.new_direct().await;
        conversations.push((a, c));
    }
    let runs = conversations.iter().map(|(a, c)| async move {
        let mut took = Vec::with_capacity(PER_OTHER);
        for _ in 0..PER_OTHER {
            let started = Instant::now();
            let r = t.send(c, a, "hello").await;
            took.push(started.elapsed());
            assert_eq!(r.status, 201, "another user's send: {r:?}");
            // A person's pace: well under the limit.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        took
    });
    join_all(runs).await.into_iter().flatten().collect()
}

pub async fn run() -> Table {
    let limits = RateLimits::DEFAULT;
    let t = TestApp::with_rate_limits(limits).await;
    let alone = others(&t).await;

    let (a, _b, c) = t.new_direct().await;
    let path = format!("/conversations/{c}/messages");
    let started = Instant::now();
    // 1,000 sends spread over one second (one a millisecond), each its own request.
    let flood = (0..FLOOD).map(|i| {
        let (t, a, path) = (&t, &a, &path);
        async move {
            tokio::time::sleep(Duration::from_micros(1_000 * i as u64)).await;
            let body = json!({"clientMsgId": new_uuid(), "body": "flood"});
            t.post(path, a, body).await
        }
    });
    let flooded = async {
        let answers = join_all(flood).await;
        (answers, started.elapsed())
    };
    let ((answers, elapsed), during) = futures::join!(flooded, others(&t));

    let stored = answers.iter().filter(|r| r.status == 201).count();
    let limited = answers
        .iter()
        .filter(|r| r.status == 429 && r.code() == "rate_limited")
        .count();
    // DynamoDB's own throttle of the user's bucket item (a partition's write ceiling).
    let throttled = answers
        .iter()
        .filter(|r| r.status == 429 && r.code() == "throttled")
        .count();
    let with_retry_after = answers
        .iter()
        .filter(|r| r.status == 429)
        .filter(|r| {
            r.headers
                .get("retry-after")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|s| s >= 1)
        })
        .count();
    let server_errors = answers.iter().filter(|r| r.status >= 500).count();
    let history = t.get(&format!("{path}?limit=100"), &a).await;
    let kept = seqs(&history.body);
    let gap_free = kept == (1..=kept.len() as u64).collect::<Vec<_>>();
    // What the bucket allows over the flood's span: the burst, then `per_second` a second.
    let allowed =
        f64::from(limits.sends.burst) + f64::from(limits.sends.per_second) * elapsed.as_secs_f64();

    let mut table = Table::new(vec![
        "flood sends",
        "span s",
        "stored",
        "bucket allows (burst + rate × span)",
        "429 rate_limited",
        "429 throttled",
        "with Retry-After",
        "5xx",
        "seq gap-free",
        "others p50 / p99 ms, alone",
        "others p50 / p99 ms, during the flood",
    ]);
    table.rows.push(vec![
        FLOOD.to_string(),
        format!("{:.2}", elapsed.as_secs_f64()),
        stored.to_string(),
        format!("≤ {allowed:.0}"),
        limited.to_string(),
        throttled.to_string(),
        with_retry_after.to_string(),
        server_errors.to_string(),
        format!("{gap_free} ({} messages)", kept.len()),
        format!(
            "{:.1} / {:.1}",
            percentile(&alone, 0.5),
            percentile(&alone, 0.99)
        ),
        format!(
            "{:.1} / {:.1}",
            percentile(&during, 0.5),
            percentile(&during, 0.99)
        ),
    ]);
    let mut other: Vec<String> = answers
        .iter()
        .filter(|r| r.status != 201 && r.status != 429)
        .map(|r| format!("{} {}", r.status, r.code()))
        .collect();
    other.sort();
    other.dedup();
    assert_eq!(
        stored + limited + throttled,
        FLOOD,
        "stored or refused: {other:?}"
    );
    assert_eq!(server_errors, 0);
    assert_eq!(
        kept.len(),
        stored,
        "what was answered 201 is what history holds"
    );
    table
}
