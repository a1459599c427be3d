//! One request at a time, per operation: latency and DynamoDB round trips (in process only).

use std::time::Instant;

use serde_json::json;

use super::{call_as, percentile, write_units, Request, Table};
use chat_tests::{new_uuid, unique, TestApp};

pub fn table() -> Table {
    Table::new(vec![
        "operation",
        "requests",
        "p50 ms",
        "p99 ms",
        "DynamoDB calls/request",
        "write units/request",
        "errors",
    ])
}

async fn measure(
    t: &TestApp,
    table: &mut Table,
    name: &str,
    n: usize,
    request: impl Fn(usize) -> Request,
) {
    t.calls.take_calls();
    let mut latencies = vec![];
    let mut errors = 0;
    for i in 0..n {
        let (method, path, user, body) = request(i);
        let started = Instant::now();
        let r = call_as(t, method, &path, &user, body.as_ref()).await;
        latencies.push(started.elapsed());
        errors += usize::from(r.status >= 400);
    }
    let calls = t.calls.take_calls();
    // Failed conditional writes and cancelled transactions are billed too.
    let (_, units) = write_units(t, &calls).await;
    table.rows.push(vec![
        name.to_owned(),
        n.to_string(),
        format!("{:.1}", percentile(&latencies, 0.5)),
        format!("{:.1}", percentile(&latencies, 0.99)),
        format!("{:.2}", calls.len() as f64 / n as f64),
        format!("{:.1}", units as f64 / n as f64),
        errors.to_string(),
    ]);
}

pub async fn run(t: &TestApp, n: usize) -> Table {
    let mut table = table();
    let (a, b) = (unique("a"), unique("b"));
    let c = t.direct(&a, &b).await;
    measure(t, &mut table, "sendMessage (1:1, alone)", n, |i| {
        let body = json!({"clientMsgId": new_uuid(), "body": format!("hello {i}")});
        (
            "POST",
            format!("/conversations/{c}/messages"),
            a.clone(),
            Some(body),
        )
    })
    .await;
    let id = new_uuid();
    t.post(
        &format!("/conversations/{c}/messages"),
        &a,
        json!({"clientMsgId": id, "body": "again"}),
    )
    .await;
    measure(
        t,
        &mut table,
        "sendMessage replay (same clientMsgId)",
        n,
        |_| {
            let body = json!({"clientMsgId": id, "body": "again"});
            (
                "POST",
                format!("/conversations/{c}/messages"),
                a.clone(),
                Some(body),
            )
        },
    )
    .await;
    measure(t, &mut table, "markRead (advancing)", n.min(60), |i| {
        (
            "POST",
            format!("/conversations/{c}/read"),
            b.clone(),
            Some(json!({"seq": i + 1})),
        )
    })
    .await;
    measure(t, &mut table, "markRead (not advancing)", n, |_| {
        (
            "POST",
            format!("/conversations/{c}/read"),
            b.clone(),
            Some(json!({"seq": 1})),
        )
    })
    .await;
    measure(t, &mut table, "history (page of 50)", n, |_| {
        (
            "GET",
            format!("/conversations/{c}/messages"),
            b.clone(),
            None,
        )
    })
    .await;
    measure(t, &mut table, "readStates (1:1)", n, |_| {
        ("GET", format!("/conversations/{c}/reads"), b.clone(), None)
    })
    .await;
    measure(t, &mut table, "getConversation (1:1)", n, |_| {
        ("GET", format!("/conversations/{c}"), b.clone(), None)
    })
    .await;
    table
}
