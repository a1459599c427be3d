//! User ids as identity providers issue them (docs/api.md §3): Auth0-style subjects with `|`.

use chat_tests::{unique, TestApp};
use serde_json::json;

#[tokio::test]
async fn auth0_style_subjects_chat_like_anyone_else() {
    let t = TestApp::new().await;
    let (a, b) = (unique("google-oauth2|123"), unique("auth0|5f7c8ec7"));

    let opened = t.open_direct(&a, &b).await;
    assert_eq!(opened.status, 201, "{opened:?}");
    let c = opened.body["conversationId"].as_str().unwrap().to_owned();
    let mut members = vec![a.clone(), b.clone()];
    members.sort();
    assert_eq!(opened.body["memberIds"], json!(members));
    // The peer opening it lands on the same conversation.
    let again = t.open_direct(&b, &a).await;
    assert_eq!(
        (again.status, again.body["conversationId"].as_str()),
        (200, Some(c.as_str()))
    );

    let sent = t.send(&c, &a, "hello from Google").await;
    assert_eq!(sent.status, 201, "{sent:?}");
    assert_eq!(sent.body["senderId"], a.as_str());
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    assert_eq!(history.status, 200, "{history:?}");
    assert_eq!(history.body["messages"][0]["senderId"], a.as_str());

    let read = t.mark_read(&c, &b, 1).await;
    assert_eq!((read.status, &read.body["advanced"]), (200, &json!(true)));
    let reads = t.get(&format!("/conversations/{c}/reads"), &a).await;
    assert_eq!(reads.status, 200, "{reads:?}");
    let mut states: Vec<(String, u64)> = reads.body["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let user = m["userId"].as_str().unwrap().to_owned();
            (user, m["lastReadSeq"].as_u64().unwrap())
        })
        .collect();
    states.sort();
    let mut expected = vec![(a.clone(), 1), (b.clone(), 1)];
    expected.sort();
    assert_eq!(states, expected);

    t.index().await;
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let inbox = t.get("/inbox", me).await;
        assert_eq!(inbox.status, 200, "{inbox:?}");
        let entry = &inbox.body["conversations"][0];
        assert_eq!(entry["conversationId"], c.as_str(), "{inbox:?}");
        assert_eq!(entry["peerId"], peer.as_str());
        assert_eq!(entry["lastMessage"]["senderId"], a.as_str());
        assert_eq!(entry["unreadCount"], 0);
    }

    // In a path the id is percent-encoded (`|` is %7C).
    let g = t.group(&a, &[&b]).await;
    let path = format!("/conversations/{g}/members/{}", b.replace('|', "%7C"));
    let removed = t.call("DELETE", &path, Some(&a), None).await;
    assert_eq!(removed.status, 204, "{removed:?}");
    let after = t.send(&g, &b, "x").await;
    assert_eq!(after.status, 404, "removed: {after:?}");
}
