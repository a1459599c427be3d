//! Identity: local HS256 tokens, and the HTTP API JWT authorizer's claims when deployed.

use chat_http::auth::{mint_hs256, Authenticator};
use chat_tests::{unique, Function, TestApp, TEST_SECRET};
use serde_json::json;

fn with_header(
    t: &TestApp,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: Option<&str>,
) -> (serde_json::Value, Option<Function>) {
    let (mut event, f) = t.event(method, path, None, body);
    if let Some(a) = authorization {
        event["headers"]["authorization"] = json!(a);
    }
    (event, f)
}

#[tokio::test]
async fn requests_without_a_valid_token_are_unauthorized() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let now = chat_domain::time::unix_seconds(chat_domain::time::now());
    let bad_headers = [
        None,
        Some("".to_owned()),
        Some("Bearer".to_owned()),
        Some("Basic dTE6cHc=".to_owned()),
        Some("Bearer not-a-jwt".to_owned()),
        Some(format!(
            "Bearer {}",
            mint_hs256(&a, now + 600, b"wrong-secret")
        )),
        Some(format!(
            "Bearer {}",
            mint_hs256(&a, now - 1, TEST_SECRET.as_bytes())
        )),
        Some(format!(
            "Bearer {}",
            mint_hs256("bad user id", now + 600, TEST_SECRET.as_bytes())
        )),
    ];
    let routes = [
        (
            "POST",
            "/conversations".to_owned(),
            Some(json!({"type": "direct", "peerId": b}).to_string()),
        ),
        ("GET", format!("/conversations/{c}"), None),
        (
            "POST",
            format!("/conversations/{c}/messages"),
            Some(json!({"clientMsgId": chat_tests::new_uuid(), "body": "x"}).to_string()),
        ),
        ("GET", format!("/conversations/{c}/messages"), None),
        (
            "POST",
            format!("/conversations/{c}/read"),
            Some(json!({"seq": 1}).to_string()),
        ),
        ("GET", format!("/conversations/{c}/reads"), None),
        ("GET", "/inbox".to_owned(), None),
        (
            "POST",
            format!("/conversations/{c}/members"),
            Some(json!({"userIds": ["z"]}).to_string()),
        ),
        ("DELETE", format!("/conversations/{c}/members/{b}"), None),
    ];
    for h in &bad_headers {
        for (m, p, body) in &routes {
            let (event, f) = with_header(&t, m, p, h.as_deref(), body.as_deref());
            let r = t.invoke(event, f).await;
            assert_eq!(
                (r.status, r.code()),
                (401, "unauthorized"),
                "{m} {p} with {h:?}"
            );
        }
    }
    // Nothing happened.
    let h = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(h.body["lastSeq"], 0);
    let got = t.get(&format!("/conversations/{c}"), &a).await;
    assert_eq!(got.body["memberCount"], 2);
}

#[tokio::test]
async fn deployed_mode_takes_the_user_from_the_jwt_authorizer_only() {
    let t = TestApp::with_auth(Authenticator::ApiGateway).await;
    let (user, peer) = (unique("sub"), unique("peer"));
    let recorded = std::fs::read_to_string(
        chat_tests::server::workspace_root().join("tests/fixtures/apigw-v2-jwt-authorizer.json"),
    )
    .unwrap()
    .replace("SUB_PLACEHOLDER", &user)
    .replace("PEER_PLACEHOLDER", &peer);
    let event: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let r = t.invoke(event.clone(), Some(Function::Conversations)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let mut members = vec![user.clone(), peer.clone()];
    members.sort();
    assert_eq!(
        r.body["memberIds"],
        json!(members),
        "the user is the token's sub, not x-user-id"
    );

    // Without authorizer claims nothing else is trusted: not a valid local token, not a header.
    let mut no_claims = event.clone();
    no_claims["requestContext"]["authorizer"] = serde_json::Value::Null;
    no_claims["headers"]["authorization"] = json!(format!("Bearer {}", chat_tests::token(&user)));
    let r = t.invoke(no_claims, Some(Function::Conversations)).await;
    assert_eq!((r.status, r.code()), (401, "unauthorized"));
    let mut bad_sub = event;
    bad_sub["requestContext"]["authorizer"]["jwt"]["claims"]["sub"] = json!("not a valid id");
    let r = t.invoke(bad_sub, Some(Function::Conversations)).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn local_mode_ignores_authorizer_claims() {
    let t = TestApp::new().await;
    let recorded = std::fs::read_to_string(
        chat_tests::server::workspace_root().join("tests/fixtures/apigw-v2-jwt-authorizer.json"),
    )
    .unwrap()
    .replace("SUB_PLACEHOLDER", "claimed")
    .replace("PEER_PLACEHOLDER", "peer");
    let event: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    // The fixture's bearer token is not signed with the local secret.
    let r = t.invoke(event, Some(Function::Conversations)).await;
    assert_eq!(r.status, 401);
}

/// Deployed, a moderator is whoever the JWT authorizer's claims say is one: the scope
/// `chat:moderator` among the token's scopes, or the group `moderators` (API Gateway passes a list
/// claim as `[a b]`); docs/api.md §30.
#[tokio::test]
async fn deployed_mode_takes_moderators_from_the_authorizer_claims() {
    let t = TestApp::with_auth(Authenticator::ApiGateway).await;
    let recorded = std::fs::read_to_string(
        chat_tests::server::workspace_root().join("tests/fixtures/apigw-v2-jwt-authorizer.json"),
    )
    .unwrap()
    .replace("SUB_PLACEHOLDER", &unique("sub"))
    .replace("PEER_PLACEHOLDER", &unique("peer"));
    let mut event: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    event["routeKey"] = json!("GET /moderation/reports");
    event["rawPath"] = json!("/moderation/reports");
    event["body"] = serde_json::Value::Null;
    event["requestContext"]["routeKey"] = json!("GET /moderation/reports");
    event["requestContext"]["http"]["method"] = json!("GET");
    event["requestContext"]["http"]["path"] = json!("/moderation/reports");
    let claims = "/requestContext/authorizer/jwt/claims";
    let with = |name: &str, value: &str| {
        let mut e = event.clone();
        e.pointer_mut(claims).unwrap()[name] = json!(value);
        e
    };
    for (name, value, status) in [
        ("scope", "aws.cognito.signin.user.admin", 403),
        ("scope", "aws.cognito.signin.user.admin chat:moderator", 200),
        ("cognito:groups", "[admins moderators]", 200),
        ("cognito:groups", "[admins]", 403),
    ] {
        let r = t
            .invoke(with(name, value), Some(Function::Conversations))
            .await;
        assert_eq!(r.status, status, "{name}={value}: {r:?}");
    }
}
