//! The inbox: order, unread counts, previews, paging.

use chat_tests::{unique, TestApp};
use serde_json::json;

#[tokio::test]
async fn inbox_orders_by_activity_with_unread_counts() {
    let t = TestApp::new().await;
    let (me, p1, p2, p3) = (unique("me"), unique("p1"), unique("p2"), unique("p3"));
    let d1 = t.direct(&me, &p1).await;
    let d2 = t.direct(&me, &p2).await;
    let g = t.group(&p3, &[&me, &p1]).await;
    t.send(&d1, &p1, "hi from p1").await;
    t.send(&g, &p3, "group hello").await;
    t.send(&g, &p1, &"長".repeat(300)).await;
    // d2 has no messages: it sorts by its creation time, older than the others' activity.
    let r = t.get("/inbox", &me).await;
    assert_eq!(r.status, 200);
    let list = r.body["conversations"].as_array().unwrap();
    let ids: Vec<&str> = list
        .iter()
        .map(|c| c["conversationId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![g.as_str(), d1.as_str(), d2.as_str()]);
    assert!(r.body["nextCursor"].is_null());

    let group = &list[0];
    assert_eq!(group["type"], "group");
    assert_eq!(group["title"], "Team");
    assert_eq!(group["memberCount"], 3);
    assert_eq!(
        (
            group["lastSeq"].as_u64(),
            group["lastReadSeq"].as_u64(),
            group["unreadCount"].as_u64()
        ),
        (Some(2), Some(0), Some(2))
    );
    assert_eq!(group["lastMessage"]["seq"], 2);
    assert_eq!(group["lastMessage"]["senderId"], p1.as_str());
    assert_eq!(
        group["lastMessage"]["body"]
            .as_str()
            .unwrap()
            .chars()
            .count(),
        200,
        "preview is the first 200 characters"
    );
    assert_eq!(group["lastMessageAt"], group["lastMessage"]["createdAt"]);
    assert!(group.get("peerId").is_none() || group["peerId"].is_null());

    let direct = &list[1];
    assert_eq!(direct["type"], "direct");
    assert_eq!(direct["peerId"], p1.as_str());
    assert_eq!(direct["unreadCount"], 1);
    assert_eq!(direct["lastMessage"]["body"], "hi from p1");
    let empty = &list[2];
    assert!(empty["lastMessage"].is_null());
    assert!(empty["lastMessageAt"].is_null());
    assert_eq!(empty["unreadCount"], 0);

    // Reading clears the count; sending moves a conversation to the top.
    t.post(&format!("/conversations/{g}/read"), &me, json!({"seq": 2}))
        .await;
    t.send(&d2, &p2, "now me").await;
    let r = t.get("/inbox", &me).await;
    let list = r.body["conversations"].as_array().unwrap();
    assert_eq!(list[0]["conversationId"], d2.as_str());
    let g_entry = list
        .iter()
        .find(|c| c["conversationId"] == g.as_str())
        .unwrap();
    assert_eq!(g_entry["unreadCount"], 0);
}

#[tokio::test]
async fn inbox_pages_with_a_cursor() {
    let t = TestApp::new().await;
    let me = unique("me");
    let mut expected = vec![];
    for i in 0..7 {
        let c = t.direct(&me, &unique(&format!("p{i}"))).await;
        t.send(&c, &me, &format!("{i}")).await;
        expected.push(c);
    }
    expected.reverse();
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("/inbox?limit=3&cursor={c}"),
            None => "/inbox?limit=3".to_owned(),
        };
        let r = t.get(&q, &me).await;
        assert_eq!(r.status, 200, "{r:?}");
        let page = r.body["conversations"].as_array().unwrap();
        assert!(page.len() <= 3);
        seen.extend(
            page.iter()
                .map(|c| c["conversationId"].as_str().unwrap().to_owned()),
        );
        match r.body["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    let r = t.get("/inbox", &me).await;
    assert_eq!(
        r.body["conversations"].as_array().unwrap().len(),
        7,
        "default limit is 20"
    );

    for bad in [
        "/inbox?limit=0",
        "/inbox?limit=101",
        "/inbox?cursor=%%%",
        "/inbox?cursor=bm90LWEtY3Vyc29y",
    ] {
        let r = t.get(bad, &me).await;
        assert_eq!((r.status, r.code()), (400, "invalid_request"), "{bad}");
    }
    let empty = t.get("/inbox", &unique("nobody")).await;
    assert_eq!(empty.body, json!({"conversations": [], "nextCursor": null}));
}
