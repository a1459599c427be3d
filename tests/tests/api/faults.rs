//! DynamoDB's faults where a client meets them (the strictness layer injects them, on the
//! conversation's partition only, so the other tests of this binary are untouched), and what each
//! answer promises (docs/api.md §2): a 429 changed nothing; a 503 is an unknown outcome, settled by
//! the retry with the same `clientMsgId`; never a bare 5xx. (A commit whose answer is lost:
//! `hot.rs`, `a_commit_whose_answer_was_lost_is_settled_with_its_token`.)

use chat_tests::{assert_sent, member_state, new_uuid, server, TestApp};
use serde_json::json;

/// Whether this binary's DynamoDB has the layer in front (it has unless `CHAT_STRICT=off`).
fn layered() -> bool {
    let on = server::dynamodb_partitions().is_some();
    if !on {
        eprintln!("skipped: DynamoDB faults need the strictness layer (on unless CHAT_STRICT=off)");
    }
    on
}

/// A new app and a direct conversation of two new users (`TestApp::new_direct`), if the layer
/// is there to inject faults.
async fn direct_if_layered() -> Option<(TestApp, String, String, String)> {
    if !layered() {
        return None;
    }
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    Some((t, a, b, c))
}

/// `count` faults of `kind` for `op` on the chat table's partition `pk`.
fn faults(op: &str, pk: &str, kind: &str, count: u32) {
    server::dynamodb_faults(&json!({"op": op, "table": "ChatTable",
        "key": pk, "kind": kind, "count": count}));
}

/// `op` on partition `pk` applied with its answer lost, then refused `count` times with
/// `refusal` (the SDK's retries of it).
fn landed_unanswered_then(op: &str, pk: &str, refusal: &str, count: u32) {
    server::dynamodb_faults(&json!([
        {"op": op, "table": "ChatTable", "key": pk, "kind": "answerLost", "count": 1},
        {"op": op, "table": "ChatTable", "key": pk, "kind": refusal, "count": count},
    ]));
}

async fn seqs(t: &TestApp, c: &str, user: &str) -> Vec<u64> {
    let page = t
        .get(&format!("/conversations/{c}/messages?limit=100"), user)
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    chat_tests::seqs(&page.body)
}

#[tokio::test]
async fn a_database_failing_a_send_answers_503_and_its_retry_sends_it_once() {
    let Some((t, a, b, c)) = direct_if_layered().await else {
        return;
    };
    // Past the SDK's 3 attempts.
    faults(
        "TransactWriteItems",
        &format!("C#{c}"),
        "InternalServerError",
        3,
    );
    let body = json!({"clientMsgId": new_uuid(), "body": "hello"});
    let path = format!("/conversations/{c}/messages");
    let r = t.post(&path, &a, body.clone()).await;
    assert_eq!((r.status, r.code()), (503, "unavailable"), "{r:?}");
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    let retry = t.post(&path, &a, body).await;
    assert_sent(&retry, 201, 1);
    assert_eq!(seqs(&t, &c, &b).await, [1], "sent once");
}

#[tokio::test]
async fn a_throttled_read_receipt_is_429_and_moves_nothing() {
    let Some((t, a, b, c)) = direct_if_layered().await else {
        return;
    };
    assert_eq!(t.send(&c, &a, "one").await.status, 201);
    // Past the SDK's 3 attempts, on the member partition a receipt writes (a direct
    // conversation's log partition).
    faults(
        "UpdateItem",
        &format!("C#{c}"),
        "ProvisionedThroughputExceededException",
        3,
    );
    let read = format!("/conversations/{c}/read");
    let r = t.post(&read, &b, json!({"seq": 1})).await;
    assert_eq!((r.status, r.code()), (429, "throttled"), "{r:?}");
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    let states = t.get(&format!("/conversations/{c}/reads"), &a).await;
    let mine = &member_state(&states.body, &b)["lastReadSeq"];
    assert_eq!(mine, &json!(0), "nothing moved: {states:?}");
    let again = t.post(&read, &b, json!({"seq": 1})).await;
    assert_eq!((again.status, &again.body["advanced"]), (200, &json!(true)));
}

/// A write whose first attempt got no answer (it landed) and whose retries were throttled is
/// `503`, not `429` "nothing happened" (found by probing: blocks, bans, edits that landed and
/// were pushed were answered 429); its retry learns the outcome.
#[tokio::test]
async fn a_write_that_landed_unanswered_then_was_throttled_is_503_not_429() {
    let Some((t, a, b, c)) = direct_if_layered().await else {
        return;
    };
    assert_eq!(t.send(&c, &a, "one").await.status, 201);
    let throttle = "ProvisionedThroughputExceededException";
    landed_unanswered_then("UpdateItem", &format!("C#{c}"), throttle, 40);
    let read = format!("/conversations/{c}/read");
    let r = t.post(&read, &b, json!({"seq": 1})).await;
    assert_eq!((r.status, r.code()), (503, "unavailable"), "{r:?}");
    let states = t.get(&format!("/conversations/{c}/reads"), &a).await;
    let mine = &member_state(&states.body, &b)["lastReadSeq"];
    assert_eq!(mine, &json!(1), "the first attempt landed: {states:?}");
    server::clear_dynamodb_faults();
    let again = t.post(&read, &b, json!({"seq": 1})).await;
    assert_eq!((again.status, &again.body["lastReadSeq"]), (200, &json!(1)));
}

/// An edit whose transaction landed unanswered and whose retries were throttled is settled
/// with its token: `200`, one change (found by probing: `429`, its change made and pushed).
#[tokio::test]
async fn an_edit_that_landed_unanswered_then_was_throttled_is_settled_not_429() {
    if !layered() {
        return;
    }
    let t = TestApp::new().await;
    let owner = chat_tests::unique("o");
    let member = format!("{owner}-m");
    let g = t.group(&owner, std::slice::from_ref(&member)).await;
    assert_eq!(t.send(&g, &owner, "one").await.status, 201);
    landed_unanswered_then(
        "TransactWriteItems",
        &format!("H#{g}"),
        "ThrottlingException",
        2,
    );
    let r = t.edit(&g, 1, &owner, &new_uuid(), "edited").await;
    assert_eq!(
        (r.status, &r.body["body"]),
        (200, &json!("edited")),
        "{r:?}"
    );
    let changes = t.get(&format!("/conversations/{g}/changes"), &member).await;
    assert_eq!(
        changes.body["lastChange"],
        json!(1),
        "one change: {changes:?}"
    );
}

#[tokio::test]
async fn a_history_read_the_database_fails_is_503_not_500() {
    let Some((t, a, _, c)) = direct_if_layered().await else {
        return;
    };
    faults("Query", &format!("C#{c}"), "InternalServerError", 3);
    let r = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!((r.status, r.code()), (503, "unavailable"), "{r:?}");
    assert_eq!(seqs(&t, &c, &a).await, Vec::<u64>::new());
}

/// A DynamoDB call that does not answer in time (here: 4 s late) does not hold the request past
/// its deadline and settle time (0.5 s + 2 s here): it is answered 503, and the retry with the
/// same `clientMsgId` settles what the slow call did.
#[tokio::test]
async fn a_call_that_hangs_does_not_hold_the_request_past_its_deadline() {
    if !layered() {
        return;
    }
    let t = TestApp::custom(std::time::Duration::from_millis(500), None).await;
    let (a, b, c) = t.new_direct().await;
    server::dynamodb_faults(&json!({"op": "GetItem", "table": "ChatTable",
        "key": format!("C#{c}"), "kind": "slow", "delayMs": 4000, "count": 1}));
    let body = json!({"clientMsgId": new_uuid(), "body": "late"});
    let path = format!("/conversations/{c}/messages");
    let started = std::time::Instant::now();
    let r = t.post(&path, &a, body.clone()).await;
    let took = started.elapsed();
    assert_eq!((r.status, r.code()), (503, "unavailable"), "{r:?}");
    assert!(took < std::time::Duration::from_millis(3500), "{took:?}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let retry = t.post(&path, &a, body).await;
    assert_sent(&retry, 201, 1);
    // Read with the usual budget: on a loaded machine a read may need more than 0.5 s.
    assert_eq!(seqs(&TestApp::new().await, &c, &b).await, [1]);
}

#[tokio::test]
async fn a_send_whose_first_read_gets_no_answer_is_429_and_stores_nothing() {
    let Some((t, a, b, c)) = direct_if_layered().await else {
        return;
    };
    // Past the SDK's 3 attempts, the send's read of the conversation item: nothing written yet.
    faults("GetItem", &format!("C#{c}"), "InternalServerError", 3);
    let body = json!({"clientMsgId": new_uuid(), "body": "hello"});
    let path = format!("/conversations/{c}/messages");
    let r = t.post(&path, &a, body.clone()).await;
    assert_eq!((r.status, r.code()), (429, "throttled"), "{r:?}");
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(seqs(&t, &c, &b).await, Vec::<u64>::new(), "nothing stored");
    let retry = t.post(&path, &a, body).await;
    assert_sent(&retry, 201, 1);
}
