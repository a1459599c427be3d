//! A user who is not a member gets 404 for everything about a conversation and sees nothing of it.

use chat_tests::{new_uuid, unique, TestApp};
use serde_json::json;

#[tokio::test]
async fn non_member_gets_not_found_everywhere() {
    let t = TestApp::new().await;
    let (a, b, stranger) = (unique("a"), unique("b"), unique("s"));
    let g = t.group(&a, &[&b]).await;
    t.send(&g, &a, "secret").await;
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
