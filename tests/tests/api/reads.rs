//! Read state: the monotonic, clamped watermark.

use chat_tests::{at_once, member_state, unique, TestApp};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn watermark_moves_forward_only_and_clamps() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    for i in 0..5 {
        t.send(&c, &a, &format!("{i}")).await;
    }
    let read = |seq: serde_json::Value| t.mark_read(&c, &b, seq);
    // (asked, the watermark after, whether it advanced): forward only, clamped to lastSeq.
    for (seq, last_read, advanced, case) in [
        (3, 3, true, "forward"),
        (2, 3, false, "a late older request"),
        (3, 3, false, "the same again"),
        (120, 5, true, "clamped to lastSeq"),
        (121, 5, false, "past lastSeq again"),
        (0, 5, false, "zero"),
    ] {
        let r = read(json!(seq)).await;
        assert_eq!(
            (r.status, r.body),
            (
                200,
                json!({"conversationId": c, "lastReadSeq": last_read, "advanced": advanced})
            ),
            "{case}"
        );
    }

    for bad in [json!(-1), json!(1.5), json!("4"), json!(null)] {
        let r = read(bad.clone()).await;
        assert_eq!((r.status, r.code()), (400, "invalid_request"), "{bad}");
    }
    let states = t.get(&format!("/conversations/{c}/reads"), &a).await;
    assert_eq!(states.status, 200);
    assert_eq!(states.body["lastSeq"], 5);
    let mut members = states.body["members"].as_array().unwrap().clone();
    members.sort_by_key(|m| m["userId"].as_str().unwrap().to_owned());
    let mut expected = vec![
        json!({"userId": a, "lastReadSeq": 5}),
        json!({"userId": b, "lastReadSeq": 5}),
    ];
    expected.sort_by_key(|m| m["userId"].as_str().unwrap().to_owned());
    assert_eq!(members, expected);
}

#[tokio::test]
async fn empty_conversation_read_stays_at_zero() {
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    let r = t.mark_read(&c, &a, 10).await;
    assert_eq!(
        r.body,
        json!({"conversationId": c, "lastReadSeq": 0, "advanced": false})
    );
}

#[tokio::test]
async fn concurrent_out_of_order_reads_end_at_the_maximum() {
    let t = Arc::new(TestApp::new().await);
    let (a, b, c) = t.new_direct().await;
    for i in 0..20 {
        t.send(&c, &a, &format!("{i}")).await;
    }
    let mut seqs: Vec<u64> = (1..=20).collect();
    seqs.reverse();
    seqs.rotate_left(7);
    let tasks = seqs.into_iter().map(|s| {
        let (t, b, c) = (t.clone(), b.clone(), c.clone());
        async move { t.mark_read(&c, &b, s).await }
    });
    let results = at_once(tasks).await;
    assert!(results.iter().all(|r| r.status == 200));
    // Every answer is a watermark that existed, and the advancing ones are strictly increasing.
    let mut advanced: Vec<u64> = results
        .iter()
        .filter(|r| r.body["advanced"] == true)
        .map(|r| r.body["lastReadSeq"].as_u64().unwrap())
        .collect();
    let n = advanced.len();
    advanced.sort();
    advanced.dedup();
    assert_eq!(
        advanced.len(),
        n,
        "no two requests advanced to the same value"
    );
    let states = t.get(&format!("/conversations/{c}/reads"), &a).await;
    let b_state = member_state(&states.body, &b);
    assert_eq!(b_state["lastReadSeq"], 20);
}

#[tokio::test]
async fn contended_fallback_keeps_the_same_rules() {
    // The path mark_read takes when DynamoDB reports a transaction conflict (which the emulator
    // never does): called directly.
    let t = TestApp::new().await;
    let (a, b, stranger) = (unique("a"), unique("b"), unique("s"));
    let c = t.direct(&a, &b).await;
    for i in 0..3 {
        t.send(&c, &a, &format!("{i}")).await;
    }
    let bob = chat_domain::UserId::parse(&b).unwrap();
    let c = chat_domain::ConversationId::parse(&c).unwrap();
    let store = &t.app.store;
    let r = store.mark_read(&bob, &c, 2, None).await.unwrap();
    assert_eq!((r.last_read_seq, r.advanced), (2, true));
    let r = store.mark_read(&bob, &c, 1, None).await.unwrap();
    assert_eq!((r.last_read_seq, r.advanced), (2, false));
    let r = store.mark_read(&bob, &c, 99, None).await.unwrap();
    assert_eq!(
        (r.last_read_seq, r.advanced),
        (3, true),
        "clamped to lastSeq"
    );
    let s = chat_domain::UserId::parse(&stranger).unwrap();
    assert_eq!(
        store.mark_read(&s, &c, 1, None).await.unwrap_err(),
        chat_domain::ChatError::NotFound
    );
    assert_eq!(
        store
            .mark_read(
                &bob,
                &chat_domain::ConversationId::parse("g-0123456789abcdef0123456789abcdef").unwrap(),
                1,
                None
            )
            .await
            .unwrap_err(),
        chat_domain::ChatError::NotFound
    );
}

#[tokio::test]
async fn read_states_never_show_a_watermark_past_last_seq() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    t.send(&c, &a, "one").await;
    // What one non-snapshot Query can see while a's second send commits: a's member item
    // already at seq 2, the conversation item still at lastSeq 1.
    let a_id = chat_domain::UserId::parse(&a).unwrap();
    let c_id = chat_domain::ConversationId::parse(&c).unwrap();
    let key = chat_store::keys::member_key(&c_id, &a_id);
    t.db.update_item()
        .table_name(&t.table)
        .set_key(Some(key))
        .update_expression("SET lastReadSeq = :two")
        .expression_attribute_values(
            ":two",
            aws_sdk_dynamodb::types::AttributeValue::N("2".into()),
        )
        .send()
        .await
        .unwrap();
    let r = t.get(&format!("/conversations/{c}/reads"), &b).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["lastSeq"], 1);
    for m in r.body["members"].as_array().unwrap() {
        assert!(m["lastReadSeq"].as_u64().unwrap() <= 1, "{r:?}");
    }
}

/// A read whose every attempt got no answer until the request's time ran out answers `503`
/// (outcome unknown), never `429`: the first attempt landed (found by probing: a `429` whose
/// read had moved the watermark and was pushed). Its retry learns the watermark.
#[tokio::test]
async fn a_read_without_an_answer_is_503_and_its_retry_learns_the_watermark() {
    if chat_tests::server::dynamodb_partitions().is_none() {
        eprintln!("skipped: losing an answer needs the strictness layer (CHAT_STRICT=off)");
        return;
    }
    let t = TestApp::custom(std::time::Duration::from_secs(2), None).await;
    let (a, b, c) = t.new_direct().await;
    for i in 0..3 {
        assert_eq!(t.send(&c, &a, &format!("{i}")).await.status, 201);
    }
    chat_tests::server::dynamodb_faults(&json!({"op": "UpdateItem", "table": t.table,
        "key": format!("C#{c}"), "kind": "answerLost", "count": 1000}));
    let lost = t.mark_read(&c, &b, 2).await;
    chat_tests::server::clear_dynamodb_faults();
    assert_eq!((lost.status, lost.code()), (503, "unavailable"), "{lost:?}");
    let retry = t.mark_read(&c, &b, 2).await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.body["lastReadSeq"], json!(2), "{retry:?}");
}
