//! Delivery through Amazon SNS mobile push (docs/api.md §33), on moto's SNS: the notifier's
//! window job (`Notifier::window_due`) with `Pusher::Sns`, as deployed. A device's first
//! notification makes its platform endpoint, later ones reuse it; an endpoint SNS disables removes
//! its device, and the token registered again gets its endpoint enabled again.

use chat_store::push::WindowReport;
use chat_tests::notify::{sns_endpoints_of, SnsNotifier};
use chat_tests::{unique, TestApp};
use serde_json::{json, Value};

async fn register(t: &TestApp, user: &str, device: &str, platform: &str, token: &str) {
    let r = t
        .call(
            "PUT",
            &format!("/devices/{device}"),
            Some(user),
            Some(&json!({"platform": platform, "token": token}).to_string()),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// The one endpoint moto holds for `token`, and its messages (in no order), each parsed as the
/// per-platform JSON it was published as.
fn endpoint_of(token: &str) -> (Value, Vec<Value>) {
    let endpoints = sns_endpoints_of(token);
    assert_eq!(endpoints.len(), 1, "one endpoint per token: {endpoints:?}");
    let endpoint = endpoints.into_iter().next().unwrap();
    let messages = endpoint["messages"]
        .as_object()
        .map(|m| {
            m.values()
                .map(|v| serde_json::from_str(v.as_str().unwrap()).unwrap())
                .collect()
        })
        .unwrap_or_default();
    (endpoint, messages)
}

/// The platform's payload of a published message (`MessageStructure=json`: a JSON string per
/// platform key).
fn payload(message: &Value, key: &str) -> Value {
    serde_json::from_str(
        message[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: {message}")),
    )
    .unwrap()
}

fn sorted(mut values: Vec<Value>) -> Vec<Value> {
    values.sort_by_key(Value::to_string);
    values
}

fn sent(n: usize) -> WindowReport {
    WindowReport {
        members_notified: 1,
        sent: n,
        devices_removed: 0,
    }
}

#[tokio::test]
async fn the_first_notification_makes_an_endpoint_and_later_ones_reuse_it() {
    let t = TestApp::new().await;
    // No other test's indexer opens these conversations' windows meanwhile.
    let _hold = chat_tests::indexer::hold().await;
    let sns = SnsNotifier::new(&t).await;
    let (a, b, c) = t.new_direct().await;
    let (apns, fcm) = (unique("apns"), unique("fcm"));
    register(&t, &b, "iphone", "apns", &apns).await;
    register(&t, &b, "pixel", "fcm", &fcm).await;
    t.send(&c, &a, "Lunch at 1?").await;
    assert_eq!(sns.notify(&c, 1).await, sent(2));
    let mut actions = sns.actions.take();
    actions.sort();
    assert_eq!(
        actions,
        [
            "CreatePlatformEndpoint",
            "CreatePlatformEndpoint",
            "Publish",
            "Publish"
        ],
        "an endpoint per device, then its push"
    );

    let (endpoint, messages) = endpoint_of(&apns);
    assert!(endpoint["arn"]
        .as_str()
        .unwrap()
        .contains(":endpoint/APNS/"));
    assert_eq!(endpoint["attributes"]["Enabled"], json!(true));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["default"], json!("Lunch at 1?"));
    assert_eq!(
        payload(&messages[0], "APNS"),
        json!({"aps": {"alert": {"title": a, "body": "Lunch at 1?"}, "badge": 1, "sound": "default"},
               "conversationId": c, "seq": 1})
    );
    let (endpoint, messages) = endpoint_of(&fcm);
    assert!(endpoint["arn"].as_str().unwrap().contains(":endpoint/GCM/"));
    assert_eq!(
        payload(&messages[0], "GCM"),
        json!({"notification": {"title": a, "body": "Lunch at 1?"},
               "data": {"conversationId": c, "seq": "1", "badge": "1"}})
    );

    // The next window: the stored endpoints, no new one.
    t.send(&c, &a, "Or 2?").await;
    assert_eq!(sns.notify(&c, 2).await, sent(2));
    assert_eq!(sns.actions.take(), ["Publish", "Publish"]);
    let (_, messages) = endpoint_of(&apns);
    let alerts: Vec<Value> = messages
        .iter()
        .map(|m| payload(m, "APNS")["aps"]["alert"]["body"].clone())
        .collect();
    assert_eq!(sorted(alerts), [json!("Lunch at 1?"), json!("Or 2?")]);
    assert_eq!(endpoint_of(&fcm).1.len(), 2);
}

#[tokio::test]
async fn a_disabled_endpoint_removes_its_device_and_the_token_registered_again_enables_it() {
    let t = TestApp::new().await;
    let _hold = chat_tests::indexer::hold().await;
    let sns = SnsNotifier::new(&t).await;
    let (a, b, c) = t.new_direct().await;
    let token = unique("fcm");
    register(&t, &b, "pixel", "fcm", &token).await;
    t.send(&c, &a, "one").await;
    assert_eq!(sns.notify(&c, 1).await, sent(1));
    let (endpoint, _) = endpoint_of(&token);
    let arn = endpoint["arn"].as_str().unwrap().to_owned();

    // SNS disables the endpoint (the app was uninstalled, FCM reported the token invalid).
    sns.own
        .set_endpoint_attributes()
        .endpoint_arn(&arn)
        .attributes("Enabled", "false")
        .send()
        .await
        .expect("SetEndpointAttributes");
    sns.actions.take();
    t.send(&c, &a, "two").await;
    assert_eq!(
        sns.notify(&c, 2).await,
        WindowReport {
            members_notified: 1,
            sent: 0,
            devices_removed: 1
        }
    );
    assert_eq!(sns.actions.take(), ["Publish"]);
    let devices = t.get("/devices", &b).await;
    assert_eq!(
        (devices.status, &devices.body),
        (200, &json!({"devices": []})),
        "the device is gone"
    );

    // The app registers the same token again: its endpoint is enabled again and used.
    register(&t, &b, "pixel", "fcm", &token).await;
    t.send(&c, &a, "three").await;
    assert_eq!(sns.notify(&c, 3).await, sent(1));
    assert_eq!(
        sns.actions.take(),
        ["CreatePlatformEndpoint", "SetEndpointAttributes", "Publish"]
    );
    let (endpoint, messages) = endpoint_of(&token);
    assert_eq!(endpoint["arn"], json!(arn), "the same endpoint");
    assert_eq!(endpoint["attributes"]["Enabled"], json!(true));
    let bodies: Vec<Value> = messages.iter().map(|m| m["default"].clone()).collect();
    assert_eq!(sorted(bodies), [json!("one"), json!("three")]);
    // Stored on the device again: the next window publishes at once.
    t.send(&c, &a, "four").await;
    assert_eq!(sns.notify(&c, 4).await, sent(1));
    assert_eq!(sns.actions.take(), ["Publish"]);
}

/// A message that reaches the indexer just after a window's job closed its window, yet was
/// committed before that job read the conversation, is counted by that job and opens the next
/// window: it is told of once (found by probing: twice, "2 new messages: …" and then again alone).
#[tokio::test]
async fn a_message_counted_by_a_window_is_not_told_of_again_by_the_window_it_opens() {
    let t = TestApp::new().await;
    let _hold = chat_tests::indexer::hold().await;
    let sns = SnsNotifier::new(&t).await;
    let (a, b, c) = t.new_direct().await;
    let token = unique("fcm");
    register(&t, &b, "pixel", "fcm", &token).await;
    t.send(&c, &a, "one").await;
    t.send(&c, &a, "two").await;
    // The window opened by 1 counts 1 and 2; 2 opened the next one.
    assert_eq!(sns.notify(&c, 1).await, sent(1));
    assert_eq!(sns.notify(&c, 2).await, WindowReport::default());
    // A message after what was counted is told of as usual.
    t.send(&c, &a, "three").await;
    assert_eq!(sns.notify(&c, 3).await, sent(1));
    let bodies: Vec<Value> = endpoint_of(&token)
        .1
        .iter()
        .map(|m| payload(m, "GCM")["notification"]["body"].clone())
        .collect();
    assert_eq!(
        sorted(bodies),
        [json!("2 new messages: two"), json!("three")]
    );
}
