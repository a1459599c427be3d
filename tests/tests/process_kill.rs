//! The `send-message` function as a real OS process (the binary Lambda runs, polling a Runtime
//! API of the test's own: `chat_tests::function_process`), killed with SIGKILL at the two points
//! of issue 20 where a request's work and its answer part: after its commit and before its
//! answer; after joining the queue and before a commit. The strictness layer holds the process
//! exactly there (`answerSlow`: the write happens, its answer is late), the test sees the write
//! land and kills the process. Then, under each of them:
//!
//! - the client's retry (same `clientMsgId`) gets the message exactly once, at one seq;
//! - history is 1..N, without gaps or duplicates; watermarks never go back;
//! - nothing appears later that nobody was told of: a send killed before any commit is committed
//!   once or not at all, never after its queued item's lifetime;
//! - a retry that cannot finish while the killed request's queued send may still be committed
//!   answers `503 unavailable` (outcome unknown), never `429` (which promises nothing happens);
//! - no answer is a bare 5xx.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use chat_tests::function_process::{FunctionProcess, Outcome};
use chat_tests::{new_uuid, server, unique, Resp, TestApp};
use serde_json::{json, Value};

/// One test at a time: each runs processes and holds calls for seconds, on 2 cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SEND: &str = "send-message";
/// How long the layer holds the answer that the process is killed waiting for.
const HELD: u64 = 120_000;

/// A test's start: its turn, its app, a process of the function with `env` (started first: its
/// binary's build may wait for other builds), two users. None without the strictness layer
/// (`CHAT_STRICT=off`), which holds the process where it is killed.
async fn set_up(
    env: &[(&str, String)],
) -> Option<(
    tokio::sync::MutexGuard<'static, ()>,
    TestApp,
    FunctionProcess,
    String,
    String,
)> {
    let turn = ONE_AT_A_TIME.lock().await;
    if server::dynamodb_partitions().is_none() {
        eprintln!("skipped: killing at a point needs the strictness layer (CHAT_STRICT=off)");
        return None;
    }
    let t = TestApp::new().await;
    let process = FunctionProcess::start(SEND, env).await;
    Some((turn, t, process, unique("a"), unique("b")))
}

/// The next `op` on the conversation's partition is applied, then its answer held.
fn hold_answer_of(op: &str, conversation: &str) {
    server::dynamodb_faults(&json!({"op": op, "table": "ChatTable",
        "key": format!("C#{conversation}"), "kind": "answerSlow", "delayMs": HELD}));
}

/// Waits until the item `sk` exists (the held write has landed); None after 30 s.
async fn landed(
    t: &TestApp,
    conversation: &str,
    sk: &str,
) -> Option<HashMap<String, AttributeValue>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(found) = t.conversation_item(conversation, sk).await {
            return Some(found);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Every message of the conversation, in order.
async fn all_messages(t: &TestApp, conversation: &str, user: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let path = format!(
            "/conversations/{conversation}/messages?afterSeq={}&limit=100",
            out.len()
        );
        let page = t.get(&path, user).await;
        assert_eq!(page.status, 200, "{page:?}");
        out.extend(page.body["messages"].as_array().unwrap().iter().cloned());
        if page.body["hasMore"] != json!(true) {
            return out;
        }
    }
}

/// History is exactly 1..N, each of `sent` (clientMsgId → seq) once at its seq, nothing else;
/// every member's watermark is within 0..=N and at least its own newest message.
async fn exactly(t: &TestApp, conversation: &str, user: &str, sent: &[(&str, u64)]) {
    let all = all_messages(t, conversation, user).await;
    let seqs: Vec<u64> = all.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    let n = sent.len() as u64;
    assert_eq!(seqs, (1..=n).collect::<Vec<_>>(), "1..N: {all:?}");
    for (id, seq) in sent {
        let found: Vec<u64> = all
            .iter()
            .filter(|m| m["clientMsgId"] == *id)
            .map(|m| m["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(found, [*seq], "{id} once, at {seq}: {all:?}");
    }
    let reads = t
        .get(&format!("/conversations/{conversation}/reads"), user)
        .await;
    assert_eq!(reads.body["lastSeq"], n, "{reads:?}");
    for m in reads.body["members"].as_array().unwrap() {
        let watermark = m["lastReadSeq"].as_u64().unwrap();
        let newest_own = all
            .iter()
            .filter(|x| x["senderId"] == m["userId"])
            .filter_map(|x| x["seq"].as_u64())
            .max()
            .unwrap_or(0);
        assert!(
            (newest_own..=n).contains(&watermark),
            "{m} with lastSeq {n}"
        );
    }
}

/// A 5xx is never bare: always the API's shape, `unavailable`, with `Retry-After`.
fn not_bare(r: &Resp) {
    if r.status >= 500 {
        assert_eq!(r.code(), "unavailable", "{r:?}");
        assert!(r.headers.contains_key("retry-after"), "{r:?}");
    }
}

fn send_body(id: &str, body: &str) -> String {
    json!({"clientMsgId": id, "body": body}).to_string()
}

/// The client's retry of `id` through a new process (another instance): answered `status`, with
/// the message at `seq`; nothing of the conversation is left queued.
async fn retry_through_a_process(
    t: &TestApp,
    conversation: &str,
    user: &str,
    (id, body): (&str, &str),
    (status, seq): (u16, u64),
) {
    let process = FunctionProcess::start(SEND, &[]).await;
    let path = format!("/conversations/{conversation}/messages");
    let (event, _) = t.event("POST", &path, Some(user), Some(&send_body(id, body)));
    let Outcome::Answered(r) = process.call(event, Duration::from_secs(60)).await else {
        panic!("no answer; its output:\n{}", process.logs())
    };
    not_bare(&r);
    assert_eq!(
        (
            r.status,
            &r.body["seq"],
            &r.body["clientMsgId"],
            &r.body["body"]
        ),
        (status, &json!(seq), &json!(id), &json!(body)),
        "{r:?}"
    );
    let queued = t.queued_sends(conversation).await;
    assert!(queued.is_empty(), "left queued: {queued:?}");
}

/// A group of `a` and `b` made busy, `a`'s send handed to `process`, which is killed once its
/// queued send `P#` is written (the layer holds its answer): the conversation, the send's id and
/// its queued item.
async fn queue_and_kill(
    process: FunctionProcess,
    t: &TestApp,
    a: &str,
    b: &str,
    body: &str,
) -> (String, String, HashMap<String, AttributeValue>) {
    let c = t.group(a, &[b]).await;
    t.mark_busy(&c).await;
    hold_answer_of("PutItem", &c);
    let id = new_uuid();
    let queued = kill_once_written(process, t, &c, a, &id, body, &format!("P#{id}")).await;
    server::clear_dynamodb_faults();
    (c, id, queued)
}

/// Hands `user`'s send to `process`, waits until `sk` of the conversation is written (the point
/// the layer holds the process at), checks it has not answered, and kills it.
async fn kill_once_written(
    mut process: FunctionProcess,
    t: &TestApp,
    conversation: &str,
    user: &str,
    id: &str,
    body: &str,
    sk: &str,
) -> HashMap<String, AttributeValue> {
    let path = format!("/conversations/{conversation}/messages");
    let (event, _) = t.event("POST", &path, Some(user), Some(&send_body(id, body)));
    let mut invocation = process.invoke(event);
    let Some(written) = landed(t, conversation, sk).await else {
        panic!(
            "{sk} never written; the process's output:\n{}",
            process.logs()
        )
    };
    assert!(
        !invocation.answered() && process.running(),
        "held before its answer; its output:\n{}",
        process.logs()
    );
    process.kill();
    let outcome = invocation.outcome(Duration::from_secs(5)).await;
    assert!(
        matches!(outcome, Some(Outcome::NoAnswer)),
        "killed unanswered: {outcome:?}"
    );
    written
}

/// Killed after its commit (a send alone), before its answer: the retry through another
/// instance gets the committed message (`200`, its seq), and nothing is there twice.
#[tokio::test]
async fn killed_after_its_commit_the_retry_gets_the_message_once() {
    let Some((_one, t, process, a, b)) = set_up(&[]).await else {
        return;
    };
    let c = t.direct(&a, &b).await;
    let first = t.send(&c, &b, "before").await;
    assert_eq!(first.status, 201, "{first:?}");
    let id = new_uuid();
    hold_answer_of("TransactWriteItems", &c);
    let body = "committed, then killed";
    kill_once_written(process, &t, &c, &a, &id, body, &format!("X#{id}")).await;
    server::clear_dynamodb_faults();

    retry_through_a_process(&t, &c, &a, (&id, body), (200, 2)).await;
    let next = t.send(&c, &b, "after").await;
    assert_eq!(
        (next.status, &next.body["seq"]),
        (201, &json!(3)),
        "{next:?}"
    );
    let ids = [
        first.body["clientMsgId"].as_str().unwrap(),
        next.body["clientMsgId"].as_str().unwrap(),
    ];
    exactly(&t, &c, &b, &[(ids[0], 1), (&id, 2), (ids[1], 3)]).await;
}

/// Killed after a group commit it made (taking over from a stalled request), before its answer:
/// the other request in that commit is still answered, once, at its seq (from the commit's
/// record), and the killed one's retry gets its message once.
#[tokio::test]
async fn killed_after_a_group_commit_every_send_in_it_is_answered_once() {
    let Some((_one, t, process, a, b)) = set_up(&[]).await else {
        return;
    };
    let t = std::sync::Arc::new(t);
    let c = t.group(&a, &[&b]).await;
    t.mark_busy(&c).await;
    // b queues first, and its look at the queue is held for 5 s: stalled at the head of the
    // queue, so that the process, queued behind it, takes over and commits both.
    server::dynamodb_faults(&json!({"op": "Query", "table": "ChatTable",
        "key": format!("C#{c}"), "kind": "slow", "delayMs": 5000}));
    let id_b = new_uuid();
    let stalled = tokio::spawn({
        let (t, c, b, id_b) = (t.clone(), c.clone(), b.clone(), id_b.clone());
        async move {
            let body = json!({"clientMsgId": id_b, "body": "stalled at the head"});
            t.post(&format!("/conversations/{c}/messages"), &b, body)
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server::pending_dynamodb_faults().is_empty() {
        assert!(Instant::now() < deadline, "b never looked at the queue");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hold_answer_of("TransactWriteItems", &c);
    let id_a = new_uuid();
    let body = "took over, committed, killed";
    kill_once_written(process, &t, &c, &a, &id_a, body, &format!("X#{id_a}")).await;
    server::clear_dynamodb_faults();
    let committed_b = t.conversation_item(&c, &format!("X#{id_b}")).await;
    assert!(
        committed_b.is_some(),
        "the killed process committed b's send too"
    );

    let answered_b = stalled.await.unwrap();
    not_bare(&answered_b);
    assert_eq!(
        (answered_b.status, &answered_b.body["seq"]),
        (201, &json!(1)),
        "{answered_b:?}"
    );
    retry_through_a_process(&t, &c, &a, (&id_a, body), (200, 2)).await;
    exactly(&t, &c, &a, &[(&id_b, 1), (&id_a, 2)]).await;
}

/// Killed after joining the queue, before any commit, its queued send still within its
/// lifetime: a retry that cannot finish answers 503 (the killed send may still be committed),
/// not 429; a later commit does commit it, once, and the retry then gets it at that seq.
#[tokio::test]
async fn killed_after_joining_the_queue_it_is_committed_once() {
    let Some((_one, t, process, a, b)) = set_up(&[]).await else {
        return;
    };
    let body = "queued, then killed";
    let (c, id, _) = queue_and_kill(process, &t, &a, &b, body).await;

    // A retry with a short budget whose looks at the queue are all throttled.
    let short = TestApp::custom(Duration::from_millis(700), None).await;
    server::dynamodb_faults(&json!({"op": "Query", "table": "ChatTable",
        "key": format!("C#{c}"), "kind": "ThrottlingException", "count": 100_000}));
    let path = format!("/conversations/{c}/messages");
    let cut_short = short
        .post(&path, &a, json!({"clientMsgId": id, "body": body}))
        .await;
    server::clear_dynamodb_faults();
    not_bare(&cut_short);
    assert_eq!(
        (cut_short.status, cut_short.code()),
        (503, "unavailable"),
        "the killed send may still be committed: {cut_short:?}"
    );

    // The next commit takes it (it is the oldest), then b's.
    let next = t.send(&c, &b, "behind it").await;
    assert_eq!(
        (next.status, &next.body["seq"]),
        (201, &json!(2)),
        "{next:?}"
    );
    retry_through_a_process(&t, &c, &a, (&id, body), (200, 1)).await;
    let next_id = next.body["clientMsgId"].as_str().unwrap();
    exactly(&t, &c, &b, &[(&id, 1), (next_id, 2)]).await;
}

/// Killed after joining the queue, before any commit, and nobody retries within its request's
/// lifetime: no commit takes it afterwards (no ghost, however many commits come), and the
/// client's late retry sends it then, once.
#[tokio::test]
async fn killed_after_joining_the_queue_nothing_of_it_appears_after_its_lifetime() {
    // A short request budget: its queued send's lifetime.
    let budget = [("CHAT_REQUEST_BUDGET_MS", "1500".to_owned())];
    let Some((_one, t, process, a, b)) = set_up(&budget).await else {
        return;
    };
    let body = "queued, killed, forgotten";
    let (c, id, pending) = queue_and_kill(process, &t, &a, &b, body).await;
    let expires_at: u64 = pending["expiresAt"].as_n().unwrap().parse().unwrap();
    let now = chat_domain::time::unix_millis(chat_domain::time::now());
    tokio::time::sleep(Duration::from_millis(expires_at.saturating_sub(now) + 300)).await;

    let mut later = Vec::new();
    for i in 0..2 {
        let r = t.send(&c, &b, &format!("later #{i}")).await;
        assert_eq!(
            (r.status, &r.body["seq"]),
            (201, &json!(i + 1)),
            "the killed send is not committed: {r:?}"
        );
        later.push(r.body["clientMsgId"].as_str().unwrap().to_owned());
    }
    assert!(
        t.queued_sends(&c).await.is_empty(),
        "the dead queued send was removed"
    );
    exactly(&t, &c, &b, &[(&later[0], 1), (&later[1], 2)]).await;

    // Sent now, once.
    retry_through_a_process(&t, &c, &a, (&id, body), (201, 3)).await;
    exactly(&t, &c, &b, &[(&later[0], 1), (&later[1], 2), (&id, 3)]).await;
}
