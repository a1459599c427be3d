//! DynamoDB calls per operation (the budget of the data model, docs/data-model.md).

use chat_tests::TestApp;
use serde_json::json;

#[tokio::test]
async fn operations_stay_within_their_round_trip_budget() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    // A user's first request also reads whether it is suspended, which the instance then knows
    // (docs/cost.md "Suspensions"): b's is made here, not in a step counted below.
    assert_eq!(t.get("/inbox", &b).await.status, 200);
    t.calls.take();

    let r = t.send(&c, &a, "hello").await;
    assert_eq!(r.status, 201);
    assert_eq!(t.calls.take(), ["GetItem", "TransactWriteItems"], "send");

    let id = r.body["clientMsgId"].as_str().unwrap();
    let replay = t.send_with_id(&c, &a, id, "hello").await;
    assert_eq!(replay.status, 200);
    assert_eq!(t.calls.take().len(), 2, "replay");

    // A read receipt never locks the conversation item: lastSeq is read, the member item alone
    // is written; a seq at or below a lastSeq the instance has read needs no read again.
    t.mark_read(&c, &b, 1).await;
    assert_eq!(t.calls.take(), ["GetItem", "UpdateItem"], "read");
    t.mark_read(&c, &b, 1).await;
    assert_eq!(
        t.calls.take(),
        ["UpdateItem"],
        "read of a known seq, not advancing"
    );
    t.mark_read(&c, &b, 99).await;
    assert_eq!(
        t.calls.take(),
        ["GetItem", "UpdateItem"],
        "read clamped to lastSeq"
    );

    t.get(&format!("/conversations/{c}/messages?limit=10"), &a)
        .await;
    let mut calls = t.calls.take();
    calls.sort();
    // The page's messages and their reaction counts, read at the same time.
    assert_eq!(calls, ["BatchGetItem", "Query", "Query"], "history");

    // The conversation item and its member partition, read at the same time: one round trip.
    t.get(&format!("/conversations/{c}/reads"), &a).await;
    let mut calls = t.calls.take();
    calls.sort();
    assert_eq!(calls, ["GetItem", "Query"], "read states");
    // With the change head (`lastChange`), at the same time.
    t.get(&format!("/conversations/{c}"), &a).await;
    let mut calls = t.calls.take();
    calls.sort();
    assert_eq!(calls, ["GetItem", "GetItem", "Query"], "get conversation");

    let g = t.group(&a, &[&b]).await;
    // Whether a member blocks the creator (docs/data-model.md §10.1), then the group.
    assert_eq!(
        t.calls.take(),
        ["BatchGetItem", "TransactWriteItems"],
        "create a small group"
    );
    // A group's members are spread over 4 partitions (docs/data-model.md §1): its conversation
    // item and the 4 Queries, all at once, are still one round trip.
    let shards = ["GetItem", "GetItem", "Query", "Query", "Query", "Query"];
    t.get(&format!("/conversations/{g}"), &a).await;
    let mut calls = t.calls.take();
    calls.sort();
    assert_eq!(calls, shards, "get a group");
    t.add_members(&g, &a, json!([format!("{a}-new")])).await;
    let mut calls = t.calls.take();
    calls[..6].sort();
    assert_eq!(calls[..6], shards, "add members: one round trip of reads");
    // The new members' bans and blocks of the caller, read after the conversation (§10.2).
    assert_eq!(
        calls[6..],
        ["BatchGetItem", "TransactWriteItems"],
        "add members"
    );
    t.remove_member(&g, &a, &b).await;
    assert_eq!(
        t.calls.take(),
        ["BatchGetItem", "TransactWriteItems"],
        "remove a member"
    );

    // The inbox reads the caller's index and its big groups at once, then, at once again, each
    // direct conversation of the page with 1 Query (its item, change head and members side by
    // side: 1 read unit) and the groups' items, memberships and change heads with BatchGetItem:
    // 2 round trips whatever the number of memberships (it used to be 1 + ⌈memberships/100⌉).
    // (No other test's indexing meanwhile: a move caught halfway would add the page's clean-up.)
    let sorted = |mut calls: Vec<String>| {
        calls.sort();
        calls
    };
    let held = chat_tests::indexer::hold().await;
    t.get("/inbox", &a).await;
    assert_eq!(
        sorted(t.calls.take()),
        ["BatchGetItem", "Query", "Query", "Query"],
        "inbox with 2 memberships: a group (BatchGetItem) and a direct conversation (Query)"
    );
    drop(held);
    for i in 0..101 {
        t.direct(&a, &format!("{a}-peer{i}")).await;
    }
    t.index().await;
    let held = chat_tests::indexer::hold().await;
    t.calls.take();
    let r = t.get("/inbox?limit=5", &a).await;
    assert_eq!(r.body["conversations"].as_array().unwrap().len(), 5);
    assert_eq!(
        t.calls.take(),
        ["Query"; 7],
        "inbox with 103 memberships, a page of 5 direct conversations: 2 + 5 Queries"
    );
    let r = t.get("/inbox?limit=100", &a).await;
    assert_eq!(r.body["conversations"].as_array().unwrap().len(), 100);
    assert_eq!(
        t.calls.take(),
        ["Query"; 102],
        "a page of the 100 newest, all direct conversations: 2 + 100 Queries, at once"
    );
    drop(held);
}

/// Message changes (docs/data-model.md §8): edit ≤ 3, reaction ≤ 3, a changes page ≤ 2 round
/// trips; here, uncontended, 2, 2 and 2.
#[tokio::test]
async fn changes_stay_within_their_round_trip_budget() {
    use super::changes::{chat, By};
    let (t, a, b, c) = chat(true, &[(By::A, "one"), (By::B, "two")]).await;
    t.calls.take();

    let edit = json!({"clientChangeId": chat_tests::new_uuid(), "body": "uno"}).to_string();
    let thumbs = format!("/conversations/{c}/messages/2/reactions/%F0%9F%91%8D");
    let write = ["BatchGetItem", "TransactWriteItems"];
    let steps = [
        (
            "PATCH",
            format!("/conversations/{c}/messages/1"),
            Some(edit.as_str()),
            &write[..],
            "edit",
        ),
        ("PUT", thumbs.clone(), None, &write[..], "reaction"),
        (
            "PUT",
            thumbs,
            None,
            &write[..1],
            "a reaction already there: no write",
        ),
    ];
    for (method, path, body, calls, what) in steps {
        let r = t.call(method, &path, Some(&a), body).await;
        assert_eq!(r.status, 200, "{what}: {r:?}");
        assert_eq!(t.calls.take(), calls, "{what}");
    }

    let r = t.get(&format!("/conversations/{c}/changes"), &b).await;
    assert_eq!(r.body["changes"].as_array().unwrap().len(), 2, "{r:?}");
    let calls = t.calls.take();
    let mut first = calls[..2].to_vec();
    first.sort();
    assert_eq!(
        first,
        ["BatchGetItem", "Query"],
        "changes: the log beside the membership"
    );
    assert_eq!(
        calls[2..],
        ["BatchGetItem"],
        "changes: the messages as they are now"
    );

    t.get(&format!("/conversations/{c}/messages/2/reactions"), &b)
        .await;
    assert_eq!(t.calls.take(), ["BatchGetItem", "Query"], "who reacted");
}
