//! Conversations and membership.

use chat_tests::{at_once, new_uuid, unique, TestApp};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn direct_conversation_is_one_per_pair() {
    let t = TestApp::new().await;
    let (a, b) = (unique("a"), unique("b"));
    let first = t.open_direct(&a, &b).await;
    assert_eq!(first.status, 201, "{first:?}");
    let c = &first.body;
    assert_eq!(c["type"], "direct");
    assert_eq!(c["memberCount"], 2);
    assert_eq!(c["lastSeq"], 0);
    assert!(c["lastMessageAt"].is_null());
    assert!(c["createdAt"].as_str().unwrap().ends_with('Z'));
    let mut ids = vec![a.clone(), b.clone()];
    ids.sort();
    assert_eq!(c["memberIds"], json!(ids));

    let again = t.open_direct(&b, &a).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["conversationId"], c["conversationId"]);

    let got = t
        .get(
            &format!("/conversations/{}", c["conversationId"].as_str().unwrap()),
            &b,
        )
        .await;
    assert_eq!((got.status, &got.body), (200, c));

    let me = t.open_direct(&a, &a).await;
    assert_eq!((me.status, me.code()), (400, "invalid_request"));
}

#[tokio::test]
async fn simultaneous_direct_creation_makes_one() {
    let t = Arc::new(TestApp::new().await);
    for _ in 0..3 {
        let (a, b) = (unique("a"), unique("b"));
        let tasks = (0..8).map(|i| {
            let (t, a, b) = (t.clone(), a.clone(), b.clone());
            async move {
                let (me, peer) = if i % 2 == 0 { (a, b) } else { (b, a) };
                t.post(
                    "/conversations",
                    &me,
                    json!({"type": "direct", "peerId": peer}),
                )
                .await
            }
        });
        let results = at_once(tasks).await;
        assert_eq!(
            results.iter().filter(|r| r.status == 201).count(),
            1,
            "{results:?}"
        );
        assert!(results.iter().all(|r| r.status == 201 || r.status == 200));
        let ids: std::collections::HashSet<_> = results
            .iter()
            .map(|r| r.body["conversationId"].clone())
            .collect();
        assert_eq!(ids.len(), 1);
        let inbox = t.get("/inbox", &a).await;
        assert_eq!(inbox.body["conversations"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn group_creation_and_idempotent_retry() {
    let t = TestApp::new().await;
    let (o, m1, m2) = (unique("o"), unique("m1"), unique("m2"));
    let request = json!({"type": "group", "title": "Team 🚀", "memberIds": [m1, m2, o, m1], "clientRequestId": new_uuid()});
    let first = t.post("/conversations", &o, request.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body["type"], "group");
    assert_eq!(first.body["title"], "Team 🚀");
    assert_eq!(first.body["memberCount"], 3);
    assert_eq!(first.body["memberIds"].as_array().unwrap().len(), 3);
    let again = t.post("/conversations", &o, request).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body);
    // Without a request id every creation is a new group.
    let create = || {
        t.post(
            "/conversations",
            &o,
            json!({"type": "group", "title": "T", "memberIds": [m1]}),
        )
    };
    let (a, b) = (create().await, create().await);
    assert_ne!(a.body["conversationId"], b.body["conversationId"]);

    for (body, status) in [
        (json!({"type": "group", "title": "", "memberIds": []}), 400),
        (
            json!({"type": "group", "title": "t".repeat(201), "memberIds": []}),
            400,
        ),
        (json!({"type": "group", "memberIds": []}), 400),
        (
            json!({"type": "group", "title": "T", "memberIds": ["bad id"]}),
            400,
        ),
        (
            json!({"type": "group", "title": "T", "memberIds": "u2"}),
            400,
        ),
        (
            json!({"type": "group", "title": "T", "clientRequestId": "nope"}),
            400,
        ),
        (json!({"type": "room", "title": "T"}), 400),
    ] {
        let r = t.post("/conversations", &o, body.clone()).await;
        assert_eq!((r.status, r.code()), (status, "invalid_request"), "{body}");
    }
    let ok = t
        .post(
            "/conversations",
            &o,
            json!({"type": "group", "title": "t".repeat(200), "memberIds": []}),
        )
        .await;
    assert_eq!(ok.status, 201);
}

#[tokio::test]
async fn members_bound_of_1000_on_create_and_add() {
    let t = TestApp::new().await;
    let o = unique("o");
    let prefix = unique("x");
    let members: Vec<String> = (0..999).map(|i| format!("{prefix}-{i}")).collect();
    let create = |members: Vec<String>| {
        t.post(
            "/conversations",
            &o,
            json!({"type": "group", "title": "Big", "memberIds": members}),
        )
    };
    let full = create(members).await;
    assert_eq!(full.status, 201, "{:?}", full.body["error"]);
    assert_eq!(full.body["memberCount"], 1000);
    assert_eq!(full.body["memberIds"].as_array().unwrap().len(), 1000);
    let c = full.body["conversationId"].as_str().unwrap().to_owned();
    let add = t.add_members(&c, &o, json!([unique("late")])).await;
    assert_eq!((add.status, add.code()), (409, "conflict"));

    let mut too_many: Vec<String> = (0..1000).map(|i| format!("{prefix}-{i}")).collect();
    too_many.push(unique("y"));
    let over = create(too_many).await;
    assert_eq!((over.status, over.code()), (409, "conflict"));
    let got = t.get(&format!("/conversations/{c}"), &o).await;
    assert_eq!(got.body["memberCount"], 1000);
}

#[tokio::test]
async fn adding_members_starts_them_at_last_seq() {
    let t = TestApp::new().await;
    let (o, m, n) = (unique("o"), unique("m"), unique("n"));
    let c = t.group(&o, &[&m]).await;
    for i in 0..3 {
        t.send(&c, &o, &format!("{i}")).await;
    }
    let r = t.add_members(&c, &m, json!([n, m])).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["memberCount"], 3);
    assert!(r.body["memberIds"].as_array().unwrap().contains(&json!(n)));
    let inbox = t.get("/inbox", &n).await;
    let entry = &inbox.body["conversations"][0];
    assert_eq!(
        (
            entry["lastSeq"].as_u64(),
            entry["lastReadSeq"].as_u64(),
            entry["unreadCount"].as_u64()
        ),
        (Some(3), Some(3), Some(0))
    );
    // Adding an existing member changes nothing.
    let same = t.add_members(&c, &o, json!([n])).await;
    assert_eq!((same.status, &same.body["memberCount"]), (200, &json!(3)));
    for bad in [
        json!({"userIds": []}),
        json!({}),
        json!({"userIds": ["no spaces"]}),
        json!({"userIds": 3}),
    ] {
        let r = t
            .post(&format!("/conversations/{c}/members"), &o, bad.clone())
            .await;
        assert_eq!((r.status, r.code()), (400, "invalid_request"), "{bad}");
    }
}

#[tokio::test]
async fn concurrent_adds_keep_member_count_exact() {
    let t = Arc::new(TestApp::new().await);
    let o = unique("o");
    let c = t.group(&o, &[] as &[&str]).await;
    let tasks = (0..8).map(|i| {
        let (t, o, c) = (t.clone(), o.clone(), c.clone());
        tokio::spawn(async move {
            let users: Vec<String> = (0..3).map(|j| format!("{c}-{i}-{j}")).collect();
            // Overlapping adds: everyone also adds a shared user.
            let mut all = users.clone();
            all.push(format!("{c}-shared"));
            t.post(
                &format!("/conversations/{c}/members"),
                &o,
                json!({"userIds": all}),
            )
            .await
        })
    });
    for r in futures::future::join_all(tasks).await {
        assert_eq!(r.unwrap().status, 200);
    }
    let got = t.get(&format!("/conversations/{c}"), &o).await;
    assert_eq!(got.body["memberCount"], 1 + 8 * 3 + 1);
    assert_eq!(
        got.body["memberIds"].as_array().unwrap().len(),
        1 + 8 * 3 + 1
    );
}

#[tokio::test]
async fn removing_members_follows_roles() {
    let t = TestApp::new().await;
    let (o, m, n) = (unique("o"), unique("m"), unique("n"));
    let c = t.group(&o, &[&m, &n]).await;
    let del = |by: String, who: String| {
        let (t, c) = (&t, c.clone());
        async move { t.remove_member(&c, &by, &who).await }
    };
    let r = del(m.clone(), n.clone()).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"));
    let r = del(m.clone(), m.clone()).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        t.get(&format!("/conversations/{c}"), &m).await.status,
        404,
        "a removed member sees nothing"
    );
    let r = del(o.clone(), n.clone()).await;
    assert_eq!(r.status, 204);
    let got = t.get(&format!("/conversations/{c}"), &o).await;
    assert_eq!(got.body["memberCount"], 1);
    assert_eq!(got.body["memberIds"], json!([o]));
    let r = del(o.clone(), n.clone()).await;
    assert_eq!((r.status, r.code()), (404, "not_found"));

    let (a, b, d) = t.new_direct().await;
    let r = t.remove_member(&d, &a, &b).await;
    assert_eq!((r.status, r.code()), (409, "conflict"));
    let r = t.add_members(&d, &a, json!([unique("c")])).await;
    assert_eq!((r.status, r.code()), (409, "conflict"));
}
