//! Typing frames (docs/api.md §37): through the local gateway's `typing` route to the other
//! online members, with the server's expiry and throttles.

use std::time::Duration;

use chat_domain::typing::{
    typing_now, LastPush, TypingEntry, FRAME_INTERVAL_MS, PRUNE_INACTIVE_AT,
};
use chat_domain::{ConversationId, UserId};
use chat_tests::push::{bounded, chat_config, connection_ids, connection_store, gateway, WsClient};
use chat_tests::{unique, TestApp};
use serde_json::{json, Value};

/// A frame is due within 1 s of a change; this leaves room for a loaded machine.
const FRAME: Duration = Duration::from_secs(3);

fn typing(conversation: &str, state: &str) -> String {
    json!({"action": "typing", "conversationId": conversation, "state": state}).to_string()
}

/// A group of `n` new users (the first the owner), each connected: (conversation, ids, clients).
async fn group_online(t: &TestApp, n: usize) -> (String, Vec<String>, Vec<WsClient>) {
    let users: Vec<String> = (0..n).map(|i| unique(&format!("t{i}"))).collect();
    let conv = t.group(&users[0], &users[1..]).await;
    let mut clients = Vec::new();
    for u in &users {
        clients.push(WsClient::connect(u).await);
    }
    (conv, users, clients)
}

/// The next typing frame of `conversation` within `within`.
async fn next_typing(client: &mut WsClient, conversation: &str, within: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let e = client.next_event(left).await?;
        if e["type"] == "typing" && e["conversationId"] == conversation {
            return Some(e);
        }
    }
}

/// Typing frames until one shows `ids`; panics with what came when `within` runs out.
async fn until_typing(client: &mut WsClient, conversation: &str, ids: &[&str]) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match next_typing(client, conversation, left).await {
            Some(e) if e["typing"] == json!(ids) => return e,
            Some(e) => seen.push(e),
            None => panic!("no typing frame with {ids:?}; got {seen:#?}"),
        }
    }
}

#[tokio::test]
async fn a_start_reaches_the_other_members_and_a_stop_ends_it() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 3).await;
        let outsider = unique("outsider");
        let mut out = WsClient::connect(&outsider).await;
        c[0].send_text(&typing(&conv, "start")).await;
        for member in [1, 2] {
            let e = next_typing(&mut c[member], &conv, FRAME)
                .await
                .expect("frame");
            assert_eq!(
                e,
                json!({"type": "typing", "conversationId": conv, "typing": [users[0]], "count": 1})
            );
        }
        // Stopped within the frame interval: the stop goes out when the second is over.
        c[0].send_text(&typing(&conv, "stop")).await;
        let e = next_typing(&mut c[1], &conv, FRAME)
            .await
            .expect("stop frame");
        assert_eq!(
            (e["typing"].clone(), e["count"].clone()),
            (json!([]), json!(0))
        );
        // The typist is not sent their own typing; outsiders get nothing.
        assert_eq!(
            next_typing(&mut c[0], &conv, Duration::from_millis(500)).await,
            None
        );
        assert!(out.drain(Duration::from_millis(200)).await.is_empty());
        // Never in history, never unread.
        let h = t
            .get(&format!("/conversations/{conv}/messages"), &users[1])
            .await;
        assert_eq!(h.body["messages"], json!([]), "{h:?}");
        let inbox = t.get("/inbox", &users[1]).await;
        let entry = inbox.body["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["conversationId"] == conv)
            .cloned()
            .unwrap();
        assert_eq!(entry["unreadCount"], 0, "{entry}");
    })
    .await
}

/// SPEC §16: at most one frame a second per recipient. In a direct conversation each change is
/// news to one member (the other's own typing is left out of what they are sent), so each
/// member's frames have their own throttle: b's start, 200 ms after a's went out to b, goes out
/// to a at once (found by probing: with one throttle per conversation it waited for a's second,
/// reaching a 1.1 s after b started).
#[tokio::test]
async fn in_a_direct_conversation_each_members_frames_are_throttled_alone() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (a, b, conv) = t.new_direct().await;
        let (mut ca, mut cb) = (WsClient::connect(&a).await, WsClient::connect(&b).await);
        ca.send_text(&typing(&conv, "start")).await;
        until_typing(&mut cb, &conv, &[&a]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        cb.send_text(&typing(&conv, "start")).await;
        until_typing(&mut ca, &conv, &[&b]).await;
        // Two claims, one per recipient, less than the frame interval apart: no shared second.
        let id = ConversationId::parse(&conv).unwrap();
        let state = connection_store().await.typing_state(&id).await.unwrap();
        let claimed = |user: &str| {
            let user = UserId::parse(user).unwrap();
            state.last_for(Some(&user)).claimed_ms.expect("a claim")
        };
        let gap = (claimed(&a) - claimed(&b)).abs();
        assert!(gap < FRAME_INTERVAL_MS, "claims {gap} ms apart");
        assert_eq!(
            state.last,
            LastPush::default(),
            "no conversation-wide claim"
        );
        // Each still gets at most one a second: a's stop, at once after, waits for b's second.
        ca.send_text(&typing(&conv, "stop")).await;
        let e = next_typing(&mut cb, &conv, FRAME)
            .await
            .expect("stop frame");
        assert_eq!(e["count"], 0);
    })
    .await
}

#[tokio::test]
async fn a_typist_expires_six_seconds_after_the_last_start_and_early_starts_are_ignored() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 4).await;
        c[0].send_text(&typing(&conv, "start")).await;
        until_typing(&mut c[3], &conv, &[&users[0]]).await;
        // 1 s later: within 2 s of the accepted start, so ignored (it would extend to 7 s).
        tokio::time::sleep(Duration::from_secs(1)).await;
        c[0].send_text(&typing(&conv, "start")).await;
        // At 6.4 s another member starts: the first has expired on the server by then.
        tokio::time::sleep(Duration::from_millis(5_400)).await;
        c[1].send_text(&typing(&conv, "start")).await;
        // (The first's expiry may have been pushed on its own just before: an empty set.)
        let e = until_typing(&mut c[3], &conv, &[&users[1]]).await;
        assert_eq!(e["count"], 1, "{e}");
        // A start 2 s after the last accepted one refreshes: user 1 is still typing at 7 s.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        c[1].send_text(&typing(&conv, "start")).await;
        tokio::time::sleep(Duration::from_millis(5_000)).await;
        c[2].send_text(&typing(&conv, "start")).await;
        until_typing(&mut c[3], &conv, &[&users[1], &users[2]]).await;
    })
    .await
}

/// The server owns expiry (SPEC §16): a typist who goes quiet without `stop` is pushed as stopped
/// within a second of its last start's expiry, by that start's check (seen failing before the
/// checks: no frame came); the check of a start refreshed since pushes nothing.
#[tokio::test]
async fn a_typist_who_goes_quiet_is_pushed_as_stopped_when_the_last_start_expires() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 3).await;
        c[0].send_text(&typing(&conv, "start")).await;
        until_typing(&mut c[1], &conv, &[&users[0]]).await;
        let shown = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        c[0].send_text(&typing(&conv, "start")).await;
        let refreshed = shown.elapsed();
        let mut seen = Vec::new();
        let stopped = loop {
            let left = Duration::from_secs(15).saturating_sub(shown.elapsed());
            match next_typing(&mut c[1], &conv, left).await {
                Some(e) if e["count"] == 0 => break shown.elapsed(),
                Some(e) => seen.push(e),
                None => panic!("no frame without the typist; got {seen:#?}"),
            }
        };
        assert_eq!(
            seen.iter()
                .filter(|e| e["typing"] != json!([users[0]]))
                .count(),
            0,
            "{seen:#?}"
        );
        // Not at the first start's expiry (~6 s): at the refresh's, plus the push's second.
        let expiry = refreshed + Duration::from_millis(6_000);
        assert!(
            stopped + Duration::from_millis(300) >= expiry && stopped <= expiry + FRAME,
            "pushed as stopped {stopped:?} after being shown, its last start expiring at {expiry:?}"
        );
        let e = until_typing(&mut c[2], &conv, &[]).await;
        assert_eq!(e["count"], 0, "{e}");
    })
    .await
}

#[tokio::test]
async fn a_closed_connection_stops_typing_and_non_members_are_ignored() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 2).await;
        let outsider = unique("outsider");
        let mut out = WsClient::connect(&outsider).await;
        out.send_text(&typing(&conv, "start")).await;
        assert_eq!(
            next_typing(&mut c[1], &conv, Duration::from_millis(1_500)).await,
            None
        );
        let c0 = c.remove(0);
        let mut c1 = c.remove(0);
        let mut c0 = c0;
        c0.send_text(&typing(&conv, "start")).await;
        until_typing(&mut c1, &conv, &[&users[0]]).await;
        c0.close().await;
        let e = until_typing(&mut c1, &conv, &[]).await;
        assert_eq!(e["count"], 0);
    })
    .await
}

/// A user its direct peer blocks types to nobody: its `start` is ignored (found by probing: the
/// blocker was shown it typing); unblocked, it is shown again.
#[tokio::test]
async fn a_blocked_user_is_not_shown_typing_to_the_blocker() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (a, b, conv) = t.new_direct().await;
        let (mut ca, mut cb) = (WsClient::connect(&a).await, WsClient::connect(&b).await);
        let blocks = format!("/me/blocks/{b}");
        assert_eq!(t.call("PUT", &blocks, Some(&a), None).await.status, 204);
        cb.send_text(&typing(&conv, "start")).await;
        assert_eq!(
            next_typing(&mut ca, &conv, Duration::from_millis(1_500)).await,
            None
        );
        // The blocker still types to the blocked user.
        ca.send_text(&typing(&conv, "start")).await;
        until_typing(&mut cb, &conv, &[&a]).await;
        assert_eq!(t.call("DELETE", &blocks, Some(&a), None).await.status, 204);
        cb.send_text(&typing(&conv, "start")).await;
        until_typing(&mut ca, &conv, &[&b]).await;
    })
    .await
}

/// A typist removed from the group is not shown typing to the others, though its start has not
/// expired yet (found by probing: the next frame still listed it).
#[tokio::test]
async fn a_removed_member_is_not_shown_typing() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 3).await;
        c[1].send_text(&typing(&conv, "start")).await;
        until_typing(&mut c[2], &conv, &[&users[1]]).await;
        assert_eq!(
            t.remove_member(&conv, &users[0], &users[1]).await.status,
            204
        );
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        c[0].send_text(&typing(&conv, "start")).await;
        let e = until_typing(&mut c[2], &conv, &[&users[0]]).await;
        assert_eq!(e["count"], 1, "{e}");
    })
    .await
}

/// A typist who leaves the group (removed, banned) is dropped from the others' set at once, not
/// when its start expires (found by probing: the others were told 4.5 s later, at the expiry).
#[tokio::test]
async fn a_typist_removed_or_banned_is_dropped_from_the_set_at_once() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 4).await;
        for (typist, how) in [(1, "remove"), (2, "ban")] {
            c[typist].send_text(&typing(&conv, "start")).await;
            until_typing(&mut c[3], &conv, &[&users[typist]]).await;
            let left = match how {
                "remove" => t.remove_member(&conv, &users[0], &users[typist]).await,
                _ => {
                    let path = format!("/conversations/{conv}/bans/{}", users[typist]);
                    t.call("POST", &path, Some(&users[0]), None).await
                }
            };
            assert!(left.status < 300, "{how}: {left:?}");
            // Well before the start's expiry (6 s): the frame after the removal itself.
            let e = next_typing(&mut c[3], &conv, Duration::from_secs(4)).await;
            let e = e.unwrap_or_else(|| panic!("{how}: no frame without the typist"));
            assert_eq!(
                (&e["typing"], &e["count"]),
                (&json!([]), &json!(0)),
                "{how}: {e}"
            );
        }
    })
    .await
}

#[tokio::test]
async fn bad_frames_are_answered_or_dropped_and_nobody_is_disconnected() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 2).await;
        c[0].send_text("not json").await;
        c[0].send_text(r#"{"action":"dance"}"#).await;
        c[0].send_text(&typing(&conv, "maybe")).await;
        let e = c[0].next_event(FRAME).await.expect("an error frame");
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["code"], "invalid_request");
        let huge = json!({"action": "typing", "conversationId": conv, "state": "start",
            "pad": "x".repeat(5_000)});
        c[0].send_text(&huge.to_string()).await;
        let e = c[0].next_event(FRAME).await.expect("an error frame");
        assert_eq!(e["error"]["code"], "payload_too_large", "{e}");
        // Both stay connected and typing still works.
        c[0].send_text(&typing(&conv, "start")).await;
        until_typing(&mut c[1], &conv, &[&users[0]]).await;
        assert!(!c[0].closed && !c[1].closed);
    })
    .await
}

fn now_ms() -> i64 {
    chat_domain::time::unix_millis(chat_domain::time::now()) as i64
}

/// The ws-connection function's typing handler, pushing through the shared gateway, driven
/// directly so that a test can say when each frame came.
async fn typing_handler() -> ws_connection::Typing {
    let config = chat_store::Config {
        ws_management_endpoint: Some(gateway().management_url.clone()),
        ..chat_config()
    }
    .for_function("ws-connection");
    let sdk = config.sdk_config().await;
    ws_connection::Typing::new(
        config.chat_store(&sdk),
        config.connection_store(&sdk),
        config.management_client(&sdk),
    )
}

/// The race of leaving the push to a later change (functions/ws-connection/src/typing.rs,
/// `publish`): a's start is stamped after b's, but a's is written, read and pushed before b's
/// lands (b's invocation was slow). b's writer must not leave the push to a's (whose set lacks
/// b): only a change stamped after b's write returned has read b's.
#[tokio::test]
async fn a_start_written_late_is_pushed_though_a_later_stamped_one_went_out_first() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (conv, users, mut c) = group_online(&t, 3).await;
        let typing = typing_handler().await;
        let store = connection_store().await;
        let a = connection_ids(&store, &users[0]).await.remove(0);
        let b = connection_ids(&store, &users[1]).await.remove(0);
        let start = self::typing(&conv, "start");
        let now = now_ms();
        typing
            .frame_at(&a, start.as_bytes(), now - 200)
            .await
            .unwrap();
        until_typing(&mut c[2], &conv, &[&users[0]]).await;
        typing
            .frame_at(&b, start.as_bytes(), now - 500)
            .await
            .unwrap();
        // b started first, so is listed first.
        let e = until_typing(&mut c[2], &conv, &[&users[1], &users[0]]).await;
        assert_eq!(e["count"], 2);
    })
    .await
}

/// One connection's typing item stays under 1 KB (1 write unit per start) with the longest user
/// id; a start within 2 s of the last accepted one is ignored, a stop in between or not (SPEC
/// §16: starts beyond one per 2 s); a claim is won once per last push seen; a prune
/// spares a connection that started again after the set was read (seen failing with an
/// unconditional delete).
#[tokio::test]
async fn typing_items_stay_small_and_their_races_are_conditional() {
    let store = connection_store().await;
    let conv = ConversationId::parse(&format!("g-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let long = UserId::parse(&format!("{:x<128}", unique("long"))).unwrap();
    let long_connection = format!("{:x<128}", unique("conn"));
    let now = now_ms();
    assert!(store
        .typing_start(&conv, &long_connection, &long, now)
        .await
        .unwrap());
    assert!(store
        .typing_stop(&conv, &long_connection, now + 500)
        .await
        .unwrap());
    assert!(!store
        .typing_start(&conv, &long_connection, &long, now + 1_999)
        .await
        .unwrap());
    assert!(!store
        .typing_stop(&conv, &long_connection, now + 2_200)
        .await
        .unwrap());
    assert!(store
        .typing_start(&conv, &long_connection, &long, now + 2_300)
        .await
        .unwrap());
    let t = TestApp::new().await;
    let item =
        t.db.get_item()
            .table_name(chat_tests::config().connections_table)
            .key(
                "pk",
                aws_sdk_dynamodb::types::AttributeValue::S(format!("Y#{conv}")),
            )
            .key(
                "sk",
                aws_sdk_dynamodb::types::AttributeValue::S(format!("T#{long_connection}")),
            )
            .send()
            .await
            .unwrap()
            .item
            .expect("the connection's typing item");
    let size = chat_tests::capacity::item_size(
        chat_tests::capacity::item_json(&item).as_object().unwrap(),
    );
    assert!(size < 1024, "{size} bytes");

    // The claim of a push: once per last push read.
    let never = LastPush::default();
    assert!(store
        .claim_typing_push(&conv, None, never, now, now + 150)
        .await
        .unwrap());
    assert!(!store
        .claim_typing_push(&conv, None, never, now + 1, now + 151)
        .await
        .unwrap());
    let state = store.typing_state(&conv).await.unwrap();
    let claimed = LastPush {
        claimed_ms: Some(now),
        read_ms: Some(now + 150),
    };
    assert_eq!(state.last, claimed);
    assert!(store
        .claim_typing_push(&conv, None, claimed, now + 1_100, now + 1_250)
        .await
        .unwrap());
    assert!(!store
        .claim_typing_push(&conv, None, claimed, now + 1_200, now + 1_350)
        .await
        .unwrap());

    // Expired entries, read; one connection starts again; the prune spares it.
    let user = UserId::parse(&unique("p")).unwrap();
    for i in 0..PRUNE_INACTIVE_AT {
        let connection = format!("c{i}");
        assert!(store
            .typing_start(&conv, &connection, &user, now - 10_000)
            .await
            .unwrap());
    }
    let read = store.typing_state(&conv).await.unwrap();
    let expired: Vec<&TypingEntry> = read
        .entries
        .iter()
        .filter(|e| !e.typing_at(now + 3_000))
        .collect();
    assert_eq!(expired.len(), PRUNE_INACTIVE_AT);
    assert!(store.typing_start(&conv, "c0", &user, now).await.unwrap());
    store.prune_typing(&conv, &expired).await.unwrap();
    let after = store.typing_state(&conv).await.unwrap();
    let mut left: Vec<&str> = after
        .entries
        .iter()
        .map(|e| e.connection.as_str())
        .collect();
    left.sort();
    assert_eq!(left, vec!["c0", long_connection.as_str()]);
    assert_eq!(typing_now(&after.entries, now + 3_000), vec![user, long]);
}

/// `presence` for these users, as `caller` asks.
async fn presence(t: &TestApp, caller: &str, users: &[&str]) -> Vec<Value> {
    let r = t
        .post("/presence", caller, json!({ "userIds": users }))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body["presence"].as_array().unwrap().clone()
}

#[tokio::test]
async fn presence_follows_connections_and_visibility() {
    bounded(60, async {
        let t = TestApp::new().await;
        let store = chat_tests::push::connection_store().await;
        let (a, b, never) = (unique("a"), unique("b"), unique("never"));
        let wa = WsClient::connect(&a).await;
        let p = presence(&t, &b, &[&a, &never]).await;
        assert_eq!(
            p,
            vec![
                json!({"userId": a, "online": true, "lastActiveAt": null}),
                json!({"userId": never, "online": false, "lastActiveAt": null}),
            ]
        );
        let before = chat_domain::time::now_rfc3339();
        wa.close().await;
        chat_tests::push::until_unregistered(&store, &a, Duration::from_secs(5)).await;
        let p = presence(&t, &b, &[&a]).await;
        assert_eq!(p[0]["online"], false);
        let at = p[0]["lastActiveAt"].as_str().expect("lastActiveAt");
        assert!(at[..19] >= before[..19], "{at} after {before}");

        // Hidden: offline without lastActiveAt, even while connected.
        let r = t
            .call(
                "PUT",
                "/me/presence",
                Some(&a),
                Some(r#"{"visible":false}"#),
            )
            .await;
        assert_eq!(
            (r.status, r.body.clone()),
            (200, json!({"visible": false})),
            "{r:?}"
        );
        let _wa = WsClient::connect(&a).await;
        let p = presence(&t, &b, &[&a]).await;
        assert_eq!(
            p[0],
            json!({"userId": a, "online": false, "lastActiveAt": null})
        );
        let r = t
            .call("PUT", "/me/presence", Some(&a), Some(r#"{"visible":true}"#))
            .await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(presence(&t, &b, &[&a]).await[0]["online"], true);
    })
    .await
}

/// Visible again, a user shows no trace of its hidden sessions: `lastActiveAt` is at most when
/// it hid (found by probing: it showed when the last connection made while hidden closed).
#[tokio::test]
async fn visible_again_a_user_shows_when_it_hid_not_what_it_did_hidden() {
    bounded(60, async {
        let t = TestApp::new().await;
        let store = chat_tests::push::connection_store().await;
        let (a, b) = (unique("a"), unique("b"));
        let visible = |on: bool| {
            let body = format!(r#"{{"visible":{on}}}"#);
            let (t, a) = (&t, a.clone());
            async move {
                let r = t.call("PUT", "/me/presence", Some(&a), Some(&body)).await;
                assert_eq!(r.status, 200, "{r:?}");
            }
        };
        visible(false).await;
        let hid = chat_domain::time::now_rfc3339();
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        // Hiding again keeps when it first hid.
        visible(false).await;
        let wa = WsClient::connect(&a).await;
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        wa.close().await;
        chat_tests::push::until_unregistered(&store, &a, Duration::from_secs(5)).await;
        visible(true).await;
        let p = presence(&t, &b, &[&a]).await;
        assert_eq!(p[0]["online"], false);
        let at = p[0]["lastActiveAt"].as_str().expect("lastActiveAt");
        assert!(at <= hid.as_str(), "{at} shown, hid at {hid}");
        // A session after it shows as ever.
        let wa = WsClient::connect(&a).await;
        wa.close().await;
        chat_tests::push::until_unregistered(&store, &a, Duration::from_secs(5)).await;
        let p = presence(&t, &b, &[&a]).await;
        assert!(
            p[0]["lastActiveAt"].as_str().unwrap() > hid.as_str(),
            "{p:?}"
        );
    })
    .await
}

#[tokio::test]
async fn presence_refuses_bad_requests() {
    let t = TestApp::new().await;
    let caller = unique("c");
    let ids: Vec<String> = (0..101).map(|i| format!("u{i}")).collect();
    for body in [
        json!({ "userIds": ids }),
        json!({ "userIds": ["bad id!"] }),
        json!({ "userIds": [] }),
        json!({}),
    ] {
        let r = t.post("/presence", &caller, body.clone()).await;
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid_request"),
            "{body} {r:?}"
        );
    }
    let r = t
        .post("/presence", &caller, json!({ "userIds": &ids[..100] }))
        .await;
    assert_eq!(
        r.body["presence"].as_array().map(Vec::len),
        Some(100),
        "{r:?}"
    );
    let r = t
        .call(
            "PUT",
            "/me/presence",
            Some(&caller),
            Some(r#"{"visible":"no"}"#),
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
}

#[tokio::test]
async fn presence_is_pushed_to_online_direct_peers_at_most_once_per_ten_seconds() {
    bounded(60, async {
        let t = TestApp::new().await;
        let (a, b, outsider, group_peer) = (unique("a"), unique("b"), unique("o"), unique("g"));
        t.direct(&a, &b).await;
        t.group(&a, &[&group_peer]).await;
        let mut wb = WsClient::connect(&b).await;
        let mut wo = WsClient::connect(&outsider).await;
        let mut wg = WsClient::connect(&group_peer).await;
        let presence_of = |events: &[Value], online: bool| {
            events.iter().any(|e| {
                e["type"] == "presence" && e["userId"] == a.as_str() && e["online"] == online
            })
        };
        let wa = WsClient::connect(&a).await;
        let events = wb.until(FRAME, |e| presence_of(e, true)).await;
        let online_at = std::time::Instant::now();
        assert!(events.contains(
            &json!({"type": "presence", "userId": a, "online": true, "lastActiveAt": null})
        ));
        // Offline at once after: held back until 10 s after the first push, then sent.
        wa.close().await;
        let events = wb
            .until(Duration::from_secs(15), |e| presence_of(e, false))
            .await;
        assert!(
            online_at.elapsed() >= Duration::from_millis(9_000),
            "{:?}",
            online_at.elapsed()
        );
        let offline = events.iter().find(|e| e["type"] == "presence").unwrap();
        assert!(offline["lastActiveAt"].is_string(), "{offline}");
        // Only direct peers hear of it.
        for other in [&mut wo, &mut wg] {
            let got = other.drain(Duration::from_millis(200)).await;
            assert!(!got.iter().any(|e| e["type"] == "presence"), "{got:#?}");
        }
    })
    .await
}

/// `PUT /me/presence` tells the online direct peers as a connection change does (SPEC §16): a
/// hidden user who connects stays offline to them; turning visible pushes `online` at once,
/// turning invisible again pushes `offline` (no `lastActiveAt`) once the 10 s are over.
#[tokio::test]
async fn visibility_changes_are_pushed_to_online_direct_peers() {
    bounded(60, async {
        let t = chat_tests::push::with_management(TestApp::new().await).await;
        let (a, b) = (unique("a"), unique("b"));
        t.direct(&a, &b).await;
        let visible = |v: bool| {
            let body = json!({ "visible": v }).to_string();
            let t = &t;
            let a = &a;
            async move {
                let r = t.call("PUT", "/me/presence", Some(a), Some(&body)).await;
                assert_eq!(r.status, 200, "{r:?}");
            }
        };
        let presence_of = |events: &[Value], online: bool| {
            events.iter().any(|e| {
                e["type"] == "presence" && e["userId"] == a.as_str() && e["online"] == online
            })
        };
        let mut wb = WsClient::connect(&b).await;
        visible(false).await;
        let _wa = WsClient::connect(&a).await;
        let got = wb.drain(Duration::from_millis(500)).await;
        assert!(!got.iter().any(|e| e["type"] == "presence"), "{got:#?}");

        visible(true).await;
        let events = wb.until(FRAME, |e| presence_of(e, true)).await;
        let online_at = std::time::Instant::now();
        assert!(events.contains(
            &json!({"type": "presence", "userId": a, "online": true, "lastActiveAt": null})
        ));
        visible(false).await;
        let events = wb
            .until(Duration::from_secs(15), |e| presence_of(e, false))
            .await;
        assert!(online_at.elapsed() >= Duration::from_millis(9_000));
        assert!(events.contains(
            &json!({"type": "presence", "userId": a, "online": false, "lastActiveAt": null})
        ));
    })
    .await
}
