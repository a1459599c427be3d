//! Benchmark of the REST operations against the DynamoDB-API server the tests use (our emulator,
//! or `DYNAMODB_ENDPOINT`): latency, throughput and DynamoDB round trips per operation.
//!
//!     cargo run -p chat-tests --bin bench [-- <messages per scenario>]
//!
//! Against the emulator the absolute numbers measure moto (one request at a time, ~4 ms each), not
//! DynamoDB; the round-trip counts and the behaviour under contention are what carry over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chat_tests::{new_uuid, unique, TestApp};
use serde_json::json;

struct Row {
    name: String,
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    calls: usize,
    errors: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn print(rows: &[Row]) {
    println!("| scenario | ops | ops/s | p50 ms | p99 ms | DynamoDB calls/op | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let mut l = r.latencies.clone();
        l.sort();
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.2} | {} |",
            r.name,
            r.ops,
            r.ops as f64 / r.elapsed.as_secs_f64(),
            percentile(&l, 0.5),
            percentile(&l, 0.99),
            r.calls as f64 / r.ops as f64,
            r.errors
        );
    }
}

/// `senders` concurrent users each send `per_sender` messages to one conversation.
async fn sends(t: &Arc<TestApp>, senders: usize, per_sender: usize) -> Row {
    let owner = unique("bench");
    let members: Vec<String> = (1..senders).map(|i| format!("{owner}-{i}")).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    let c = t.group(&owner, &refs).await;
    let all: Vec<String> = std::iter::once(owner).chain(members).collect();
    t.calls.take();
    let start = Instant::now();
    let tasks = all.into_iter().map(|user| {
        let (t, c) = (t.clone(), c.clone());
        tokio::spawn(async move {
            let mut out = vec![];
            for i in 0..per_sender {
                let s = Instant::now();
                let r = t.send(&c, &user, &format!("message {i} from {user}")).await;
                out.push((s.elapsed(), r.status));
            }
            out
        })
    });
    let results: Vec<(Duration, u16)> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    let calls = t.calls.take_calls();
    let mut by: std::collections::BTreeMap<String, (usize, Duration)> = Default::default();
    for c in &calls {
        let e = by.entry(c.name.clone()).or_default();
        e.0 += 1;
        e.1 += c.elapsed;
    }
    for (n, (k, d)) in &by {
        eprintln!(
            "  {senders:>2} senders: {n:<20} {k:>6} calls, mean {:.1} ms",
            d.as_secs_f64() * 1000.0 / *k as f64
        );
    }
    Row {
        name: format!("send, {senders} concurrent sender(s), one conversation"),
        ops: results.len(),
        elapsed: start.elapsed(),
        errors: results.iter().filter(|(_, s)| *s != 201).count(),
        latencies: results.into_iter().map(|(d, _)| d).collect(),
        calls: calls.len(),
    }
}

async fn sequential(
    t: &TestApp,
    name: &str,
    n: usize,
    op: impl Fn(usize) -> (String, String, Option<String>),
) -> Row {
    t.calls.take();
    let start = Instant::now();
    let mut latencies = vec![];
    let mut errors = 0;
    for i in 0..n {
        let (method, path, body) = op(i);
        let user = path.split('|').nth(1).unwrap_or_default().to_owned();
        let path = path.split('|').next().unwrap().to_owned();
        let s = Instant::now();
        let r = t.call(&method, &path, Some(&user), body.as_deref()).await;
        latencies.push(s.elapsed());
        errors += usize::from(r.status >= 400);
    }
    Row {
        name: name.into(),
        ops: n,
        elapsed: start.elapsed(),
        latencies,
        calls: t.calls.take().len(),
        errors,
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let t = Arc::new(TestApp::new().await);
    let mut rows = vec![];
    rows.push(sends(&t, 1, n).await);
    rows.push(sends(&t, 8, n / 8).await);
    rows.push(sends(&t, 16, n / 16).await);
    rows.push(sends(&t, 32, n / 32).await);
    if std::env::var("BENCH_ONLY_SENDS").is_ok() {
        print(&rows);
        return;
    }

    let (a, b) = (unique("a"), unique("b"));
    let c = t.direct(&a, &b).await;
    for i in 0..60 {
        t.send(&c, &a, &format!("history {i}")).await;
    }
    let id = new_uuid();
    t.post(
        &format!("/conversations/{c}/messages"),
        &a,
        json!({"clientMsgId": id, "body": "replayed"}),
    )
    .await;
    rows.push(
        sequential(&t, "send replay (same clientMsgId)", n, |_| {
            (
                "POST".into(),
                format!("/conversations/{c}/messages|{a}"),
                Some(json!({"clientMsgId": id, "body": "replayed"}).to_string()),
            )
        })
        .await,
    );
    rows.push(
        sequential(&t, "read receipt (advancing)", 60, |i| {
            (
                "POST".into(),
                format!("/conversations/{c}/read|{b}"),
                Some(json!({"seq": i + 1}).to_string()),
            )
        })
        .await,
    );
    rows.push(
        sequential(&t, "read receipt (not advancing)", n, |_| {
            (
                "POST".into(),
                format!("/conversations/{c}/read|{b}"),
                Some(json!({"seq": 1}).to_string()),
            )
        })
        .await,
    );
    rows.push(
        sequential(&t, "history page of 50", n, |_| {
            (
                "GET".into(),
                format!("/conversations/{c}/messages|{b}"),
                None,
            )
        })
        .await,
    );
    for i in 0..49 {
        t.direct(&b, &format!("{b}-peer{i}")).await;
    }
    rows.push(
        sequential(&t, "inbox page of 20 (50 conversations)", n, |_| {
            ("GET".into(), format!("/inbox|{b}"), None)
        })
        .await,
    );
    print(&rows);
}
