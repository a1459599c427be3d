//! A user who is not a member gets 404 for everything about a conversation and sees nothing of it.

use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_dynamodb::config::SharedInterceptor;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use chat_store::retry::Timeouts;
use chat_tests::{assert_sent, new_uuid, unique, TestApp, TransactionAnswers, WRITES};
use serde_json::json;

/// A group of two new users with one message, and a new user who is not in it: (a, b, stranger,
/// group).
async fn a_group_with_a_secret(t: &TestApp) -> (String, String, String, String) {
    let (a, b, g) = t.new_group().await;
    assert_eq!(t.send(&g, &a, "secret").await.status, 201);
    (a, b, unique("s"), g)
}

#[tokio::test]
async fn non_member_gets_not_found_everywhere() {
    let t = TestApp::new().await;
    let (a, b, stranger, g) = a_group_with_a_secret(&t).await;
    let unknown = "g-0123456789abcdef0123456789abcdef";
    for c in [g.as_str(), unknown, "nonsense"] {
        let requests: Vec<(&str, String, Option<String>)> = vec![
            ("GET", format!("/conversations/{c}"), None),
            (
                "POST",
                format!("/conversations/{c}/members"),
                Some(json!({"userIds": [stranger]}).to_string()),
            ),
            ("DELETE", format!("/conversations/{c}/members/{b}"), None),
            (
                "DELETE",
                format!("/conversations/{c}/members/{stranger}"),
                None,
            ),
            (
                "POST",
                format!("/conversations/{c}/messages"),
                Some(json!({"clientMsgId": new_uuid(), "body": "x"}).to_string()),
            ),
            ("GET", format!("/conversations/{c}/messages"), None),
            (
                "GET",
                format!("/conversations/{c}/messages?afterSeq=0"),
                None,
            ),
            (
                "POST",
                format!("/conversations/{c}/read"),
                Some(json!({"seq": 1}).to_string()),
            ),
            ("GET", format!("/conversations/{c}/reads"), None),
        ];
        for (method, path, body) in requests {
            let r = t
                .call(method, &path, Some(&stranger), body.as_deref())
                .await;
            assert_eq!((r.status, r.code()), (404, "not_found"), "{method} {path}");
            assert!(!r.body.to_string().contains("secret"));
        }
    }
    let inbox = t.get("/inbox", &stranger).await;
    assert_eq!(inbox.body["conversations"], json!([]));
    // Nothing changed for the members.
    let got = t.get(&format!("/conversations/{g}"), &a).await;
    assert_eq!(
        (
            got.body["memberCount"].as_u64(),
            got.body["lastSeq"].as_u64()
        ),
        (Some(2), Some(1))
    );
    let reads = t.get(&format!("/conversations/{g}/reads"), &a).await;
    assert_eq!(reads.body["members"].as_array().unwrap().len(), 2);
}

/// Calls that write.
fn writes(calls: &[String]) -> Vec<&String> {
    calls
        .iter()
        .filter(|c| WRITES.contains(&c.as_str()))
        .collect()
}

#[tokio::test]
async fn a_non_member_cannot_join_a_busy_conversations_queue() {
    let t = TestApp::new().await;
    let (_, b, stranger, g) = a_group_with_a_secret(&t).await;
    t.mark_busy(&g).await;
    t.calls.take();
    // The first send reads the conversation (busy: queue up); the next one knows it is busy
    // and queues at once. Neither gets further than the membership check (a GetItem; the call
    // counts themselves may vary with retries of throttled reads).
    for _ in 0..2 {
        let body = json!({"clientMsgId": new_uuid(), "body": "😀".repeat(4_000)});
        let r = t
            .post(&format!("/conversations/{g}/messages"), &stranger, body)
            .await;
        assert_eq!((r.status, r.code()), (404, "not_found"));
        let calls = t.calls.take();
        assert!(writes(&calls).is_empty(), "nothing written: {calls:?}");
        assert!(
            calls.iter().all(|c| c == "GetItem"),
            "no queue read: {calls:?}"
        );
    }
    // Members still queue and commit.
    let r = t.send(&g, &b, "queued").await;
    assert_sent(&r, 201, 2);
}

/// Answers the first TransactWriteItems with a `TransactionConflict` cancellation, as DynamoDB
/// does while another transaction holds one of its items.
fn first_transaction_conflicts() -> SharedInterceptor {
    let first = AtomicBool::new(true);
    TransactionAnswers::through(move |answer| {
        if first.swap(false, Ordering::SeqCst) {
            let body = json!({
                "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                "message": "Transaction cancelled, please refer cancellation reasons for specific \
                            reasons [TransactionConflict, None, None, None]",
                "CancellationReasons": [
                    {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"},
                    {"Code": "None"}, {"Code": "None"}, {"Code": "None"}
                ]
            });
            *answer = HttpResponse::new(
                StatusCode::try_from(400).unwrap(),
                SdkBody::from(body.to_string()),
            );
        }
        Ok(())
    })
}

#[tokio::test]
async fn a_non_member_losing_a_race_marks_nothing_busy() {
    let setup = TestApp::new().await;
    let (_, _, stranger, g) = a_group_with_a_secret(&setup).await;
    let t = TestApp::custom(
        Timeouts::LOCAL.request_budget,
        Some(first_transaction_conflicts()),
    )
    .await;
    let body = json!({"clientMsgId": new_uuid(), "body": "x"});
    let r = t
        .post(&format!("/conversations/{g}/messages"), &stranger, body)
        .await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    let calls = t.calls.take();
    assert_eq!(
        writes(&calls),
        ["TransactWriteItems"],
        "only the send alone, which lost a race; then membership is read before anything else: \
         {calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c == "Query"),
        "no queue read: {calls:?}"
    );
    let c = setup.conversation_item(&g, "C").await.unwrap();
    assert!(!c.contains_key("busyUntil"), "not marked busy: {c:?}");
}

#[tokio::test]
async fn a_non_members_history_reads_no_message() {
    let t = TestApp::new().await;
    let (_, b, stranger, g) = a_group_with_a_secret(&t).await;
    t.calls.take();
    let r = t
        .get(&format!("/conversations/{g}/messages?limit=100"), &stranger)
        .await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    let calls = t.calls.take();
    assert!(
        !calls.iter().any(|c| c == "Query"),
        "no Query of messages: {calls:?}"
    );
    let r = t.get(&format!("/conversations/{g}/messages"), &b).await;
    assert_eq!(r.body["messages"][0]["body"], "secret");
}

#[tokio::test]
async fn a_removed_members_replay_is_not_found() {
    let t = TestApp::new().await;
    let (a, b, g) = t.new_group().await;
    let sent = json!({"clientMsgId": new_uuid(), "body": "before leaving"});
    let path = format!("/conversations/{g}/messages");
    assert_eq!(t.post(&path, &b, sent.clone()).await.status, 201);
    let removed = t.remove_member(&g, &a, &b).await;
    assert_eq!(removed.status, 204);
    let r = t.post(&path, &b, sent.clone()).await;
    assert_eq!((r.status, r.code()), (404, "not_found"), "alone: {r:?}");
    t.mark_busy(&g).await;
    let r = t.post(&path, &b, sent).await;
    assert_eq!((r.status, r.code()), (404, "not_found"), "queued: {r:?}");
}

#[tokio::test]
async fn a_non_member_learns_nothing_from_a_used_client_msg_id() {
    let t = TestApp::new().await;
    let (a, b, g) = t.new_group().await;
    let stranger = unique("s");
    let id = new_uuid();
    let path = format!("/conversations/{g}/messages");
    let sent = t
        .post(&path, &a, json!({"clientMsgId": id, "body": "mine"}))
        .await;
    assert_eq!(sent.status, 201);
    for body in ["mine", "other"] {
        let r = t
            .post(&path, &stranger, json!({"clientMsgId": id, "body": body}))
            .await;
        assert_eq!((r.status, r.code()), (404, "not_found"), "{body}: {r:?}");
    }
    // A member reusing it is told (it may know the conversation).
    let r = t
        .post(&path, &b, json!({"clientMsgId": id, "body": "mine"}))
        .await;
    assert_eq!((r.status, r.code()), (409, "conflict"));
}
