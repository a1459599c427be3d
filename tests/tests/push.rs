//! Push end to end (docs/api.md §15, docs/event-pipeline.md): REST handlers write, the local gateway's pollers run the real
//! relay and fanout, and WebSocket clients of the local gateway receive the events.

use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_sdk_apigatewaymanagement::operation::post_to_connection::PostToConnectionError;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use chat_http::auth::mint_hs256;
use chat_tests::push::{
    bounded, chat_config, connected_direct, connection_ids, connection_store, first_seqs, gateway,
    gateway_config, has, message, now_unix, read_record, register_a_minute_ago, until_unregistered,
    WsClient,
};
use chat_tests::{token, unique, TestApp, TEST_SECRET};
use local_gateway::Gateway;
use serde_json::json;

#[path = "push/typing.rs"]
mod typing;

/// Time for one event to travel stream → relay → Kinesis → fanout → client (typically < 1 s).
const EVENT: Duration = Duration::from_secs(10);
/// How long to listen for an event that must not come, after the events that did came.
const QUIET: Duration = Duration::from_millis(400);

#[tokio::test]
async fn members_receive_message_and_read_events_and_outsiders_nothing() {
    bounded(60, async {
        let (t, a, b, conv, mut wa) = connected_direct().await;
        let outsider = unique("c");
        let mut wb = WsClient::connect(&b).await;
        let mut wc = WsClient::connect(&outsider).await;
        let other = t.direct(&outsider, &unique("d")).await;

        let started = Instant::now();
        let sent = t.send(&conv, &b, "hello <b>\"☃\"</b>\n日本語").await;
        assert_eq!(sent.status, 201, "{sent:?}");
        let events = wa.until_message(EVENT, &conv, 1).await;
        println!(
            "message.new reached the member after {:?}",
            started.elapsed()
        );
        let message = message(&events, &conv, 1);
        assert_eq!(
            message,
            &json!({
                "type": "message.new", "conversationId": conv, "seq": 1, "senderId": b,
                "clientMsgId": sent.body["clientMsgId"], "body": "hello <b>\"☃\"</b>\n日本語",
                "createdAt": sent.body["createdAt"], "version": 1,
            }),
            "the full message, as the REST response has it"
        );
        let sender_events = wb.until_message(EVENT, &conv, 1).await;
        assert!(
            sender_events.contains(message),
            "the sender's connection too"
        );

        let read = t.mark_read(&conv, &a, 1).await;
        assert_eq!(
            (read.status, read.body["advanced"].clone()),
            (200, json!(true))
        );
        let expected =
            json!({"type": "read.updated", "conversationId": conv, "userId": a, "lastReadSeq": 1});
        let events = wa.until(EVENT, |e| e.contains(&expected)).await;
        assert!(events.iter().all(|e| e["conversationId"] == conv.as_str()));
        wb.until(EVENT, |e| e.contains(&expected)).await;

        // The outsider's own conversation reaches it, the other one never does.
        t.send(&other, &outsider, "mine").await;
        let seen = wc
            .until_quiet(EVENT, QUIET, |e| has(e, "message.new", &other, Some(1)))
            .await;
        assert!(
            seen.iter().all(|e| e["conversationId"] == other.as_str()),
            "an outsider got events of a conversation it is not in: {seen:#?}"
        );
    })
    .await
}

/// The conversation item carries only a 200-character preview, so the relay reads a longer body
/// from the table (its Query, which template.yaml must grant: infra/test_iam.py).
/// A send or read naming its connection (`X-Connection-Id`, from the `hello` frame) is not pushed
/// to that connection, which has the answer; the sender's other connections and the peer get
/// it; a request naming someone else's connection changes nothing for them; a bad id is a 400.
#[tokio::test]
async fn a_request_naming_its_connection_is_not_echoed_to_it() {
    bounded(90, async {
        let (t, a, b, conv, mut wa) = connected_direct().await;
        let (mut wa2, mut wb) = (WsClient::connect(&a).await, WsClient::connect(&b).await);
        let (from_a, from_b) = (wa.hello().await, wb.hello().await);
        let store = connection_store().await;
        assert!(connection_ids(&store, &a).await.contains(&from_a), "its own id");
        let path = format!("/conversations/{conv}/messages");
        let send = |body: &str| json!({"clientMsgId": chat_tests::new_uuid(), "body": body});

        // Message 1 from a's first connection: the peer and a's second connection get it.
        let sent = t.post_from(&path, &a, send("one"), &from_a).await;
        assert_eq!(sent.status, 201, "{sent:?}");
        wb.until_message(EVENT, &conv, 1).await;
        wa2.until_message(EVENT, &conv, 1).await;
        // Message 2 names no connection: the first connection gets 2, and never got 1 (a
        // conversation's events come in order).
        assert_eq!(t.send(&conv, &a, "two").await.status, 201);
        let got = wa.until_message(EVENT, &conv, 2).await;
        assert!(!has(&got, "message.new", &conv, Some(1)), "echoed: {got:#?}");

        // The same for a read receipt: b reads 1 from its connection, then 2 from none.
        let read = format!("/conversations/{conv}/read");
        let receipt = |seq: u64| {
            json!({"type": "read.updated", "conversationId": conv, "userId": b, "lastReadSeq": seq})
        };
        assert_eq!(t.post_from(&read, &b, json!({"seq": 1}), &from_b).await.status, 200);
        wa.until(EVENT, |e| e.contains(&receipt(1))).await;
        assert_eq!(t.mark_read(&conv, &b, 2).await.status, 200);
        let got = wb.until(EVENT, |e| e.contains(&receipt(2))).await;
        assert!(!got.contains(&receipt(1)), "echoed: {got:#?}");

        // b names a's connection: only its own connections count, so a still gets it.
        let sent = t.post_from(&path, &b, send("three"), &from_a).await;
        assert_eq!(sent.status, 201, "{sent:?}");
        let got = wa.until_message(EVENT, &conv, 3).await;
        assert!(got.iter().all(|e| e.get("origin").is_none()), "no origin in a frame");

        // A malformed id: 400, nothing stored, nothing moved.
        for bad in ["", "a b", &"x".repeat(129)] {
            let r = t.post_from(&path, &a, send("four"), bad).await;
            assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("invalid_request")), "{bad:?}: {r:?}");
            let r = t.post_from(&read, &a, json!({"seq": 3}), bad).await;
            assert_eq!(r.status, 400, "{bad:?}: {r:?}");
        }
        let states = t.get(&format!("/conversations/{conv}/reads"), &a).await;
        assert_eq!(states.body["lastSeq"], 3);
    })
    .await;
}

#[tokio::test]
async fn a_body_longer_than_the_preview_arrives_whole() {
    bounded(60, async {
        let (t, _, b, conv, mut wa) = connected_direct().await;
        let body = "ä".repeat(150) + &"z".repeat(3_000);
        let sent = t.send(&conv, &b, &body).await;
        assert_eq!(sent.status, 201, "{sent:?}");
        let events = wa.until_message(EVENT, &conv, 1).await;
        assert_eq!(
            message(&events, &conv, 1)["body"],
            json!(body),
            "the whole body, not the preview"
        );
    })
    .await
}

/// A message with attachments is pushed with them, each with a fresh URL (and its thumbnail's)
/// that serves the bytes (SPEC §14: "wherever it appears (history, push, changes)"; pushed light
/// before), and so is a change of it. The conversation item's preview has no attachments: the
/// relay reads the message.
#[tokio::test]
async fn a_message_with_attachments_is_pushed_with_their_urls() {
    bounded(60, async {
        let (t, _, b, conv, mut wa) = connected_direct().await;
        let bytes = b"\x89PNG not really an image".to_vec();
        let body = json!({"fileName": "a.png", "contentType": "image/png", "size": bytes.len()});
        let created = t
            .post(&format!("/conversations/{conv}/attachments"), &b, body)
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        let id = created.body["attachmentId"].as_str().unwrap().to_owned();
        assert_eq!(
            chat_tests::upload_with(&created.body["upload"], bytes.clone(), &[]).await,
            200
        );
        // As if the thumbnailer had made one: the push signs its URL too.
        let cid = chat_domain::ConversationId::parse(&conv).unwrap();
        assert!(t.app.store.record_thumbnail(&cid, &id, 1, 1).await.unwrap());
        let send = json!({"clientMsgId": chat_tests::new_uuid(), "body": "look",
                          "attachments": [id]});
        let sent = t
            .post(&format!("/conversations/{conv}/messages"), &b, send)
            .await;
        assert_eq!(sent.status, 201, "{sent:?}");
        let events = wa.until_message(EVENT, &conv, 1).await;
        let pushed = message(&events, &conv, 1);
        assert_eq!(pushed["body"], "look", "{pushed}");
        let a = &pushed["attachments"][0];
        assert_eq!(
            (&a["attachmentId"], &a["fileName"], &a["size"], &a["width"]),
            (&json!(id), &json!("a.png"), &json!(bytes.len()), &json!(1)),
            "{pushed}"
        );
        assert!(
            a["thumbnailUrl"].is_string() && a["urlExpiresAt"].is_string(),
            "{a}"
        );
        let (status, _, got) =
            chat_tests::raw_http("GET", a["url"].as_str().unwrap(), &[], Vec::new()).await;
        assert_eq!(
            (status, got),
            (200, bytes),
            "the pushed URL serves the file"
        );
        let r = t.react(&conv, 1, &b, "party", true).await;
        assert_eq!(r.status, 200, "{r:?}");
        let events = wa
            .until(EVENT, |e| e.iter().any(|e| e["type"] == "reaction.added"))
            .await;
        let change = events
            .iter()
            .find(|e| e["type"] == "reaction.added")
            .unwrap();
        assert!(
            change["message"]["attachments"][0]["url"].is_string(),
            "{change}"
        );
    })
    .await
}

#[tokio::test]
async fn forty_quick_messages_all_arrive_in_seq_order() {
    bounded(90, async {
        let (t, _, b, conv, mut wa) = connected_direct().await;
        for i in 1..=40 {
            let r = t.send(&conv, &b, &format!("m{i}")).await;
            assert_eq!((r.status, r.body["seq"].clone()), (201, json!(i)), "{r:?}");
        }
        let events = wa
            .until(Duration::from_secs(60), |e| {
                first_seqs(e, &conv).len() == 40
            })
            .await;
        assert_eq!(
            first_seqs(&events, &conv),
            (1..=40).collect::<Vec<u64>>(),
            "every seq, first seen in order"
        );
        for e in events.iter().filter(|e| e["type"] == "message.new") {
            assert_eq!(e["body"], format!("m{}", e["seq"]), "{e}");
        }
    })
    .await
}

#[tokio::test]
async fn a_group_over_200_members_gets_the_light_message() {
    bounded(120, async {
        let t = TestApp::new().await;
        let owner = unique("owner");
        let first: Vec<String> = (0..199).map(|i| unique(&format!("m{i}"))).collect();
        let more: Vec<String> = (0..50).map(|i| unique(&format!("n{i}"))).collect();
        let conv = t.group(&owner, &first).await;
        let mut member = WsClient::connect(&first[7]).await;

        let added = t.add_members(&conv, &owner, json!(more)).await;
        assert_eq!(
            (added.status, added.body["memberCount"].clone()),
            (200, json!(250))
        );
        let sent = t.send(&conv, &owner, "for 250 people").await;
        assert_eq!(sent.status, 201, "{sent:?}");

        let events = member.until_message(EVENT, &conv, 1).await;
        assert_eq!(
            message(&events, &conv, 1),
            &json!({"type": "message.new", "conversationId": conv, "seq": 1}),
            "only the light form above 200 members"
        );
        // 50 new members are added in two batches (49 per transaction, each new member with its
        // inbox entry), one event each, in order.
        let batches: Vec<Vec<serde_json::Value>> = events
            .iter()
            .filter(|e| e["type"] == "member.added")
            .map(|e| e["userIds"].as_array().unwrap().clone())
            .collect();
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [49, 1],
            "{events:#?}"
        );
        assert_eq!(
            batches.concat(),
            more.iter().map(|u| json!(u)).collect::<Vec<_>>()
        );
        // A change, too, comes light: the client fetches it with afterChange.
        let r = t.react(&conv, 1, &first[3], "party", true).await;
        assert_eq!(r.status, 200, "{r:?}");
        let events = member
            .until(EVENT, |e| e.iter().any(|e| e["type"] == "reaction.added"))
            .await;
        let change = events.iter().find(|e| e["type"] == "reaction.added");
        assert_eq!(
            change,
            Some(
                &json!({"type": "reaction.added", "conversationId": conv, "changeSeq": 1, "seq": 1})
            ),
            "{events:#?}"
        );
    })
    .await
}

#[tokio::test]
async fn membership_changes_reach_the_fanout_at_once() {
    // The fanout keeps member lists by membersVersion: a removal or an addition must show in the
    // very next event.
    bounded(60, async {
        let t = TestApp::new().await;
        let (owner, stays, leaves, joins) = (unique("o"), unique("s"), unique("l"), unique("j"));
        let conv = t.group(&owner, &[&stays, &leaves]).await;
        let (mut ws, mut wl, mut wj) = (
            WsClient::connect(&stays).await,
            WsClient::connect(&leaves).await,
            WsClient::connect(&joins).await,
        );
        t.send(&conv, &owner, "one").await;
        wl.until_message(EVENT, &conv, 1).await;
        let removed = t.remove_member(&conv, &owner, &leaves).await;
        assert_eq!(removed.status, 204, "{removed:?}");
        let added = t.add_members(&conv, &owner, json!([joins])).await;
        assert_eq!(added.status, 200, "{added:?}");
        t.send(&conv, &owner, "two").await;
        ws.until_message(EVENT, &conv, 2).await;
        wj.until_message(EVENT, &conv, 2).await;
        let late = wl.drain(QUIET).await;
        assert!(
            !has(&late, "message.new", &conv, Some(2)),
            "a removed member got a message: {late:#?}"
        );
    })
    .await
}

#[tokio::test]
async fn a_stale_connection_is_removed_after_410() {
    bounded(60, async {
        let store = connection_store().await;
        let (t, a, b, conv, mut live) = connected_direct().await;
        let stale = format!("{}=", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        register_a_minute_ago(&store, &a, &stale).await;
        assert_eq!(connection_ids(&store, &a).await.len(), 2);

        t.send(&conv, &b, "hi").await;
        live.until_message(EVENT, &conv, 1).await;
        let deadline = Instant::now() + EVENT;
        loop {
            let ids = connection_ids(&store, &a).await;
            if !ids.contains(&stale) {
                assert_eq!(ids.len(), 1, "the live connection stays");
                break;
            }
            assert!(Instant::now() < deadline, "stale connection still recorded");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test]
async fn the_relay_reports_exactly_the_undecodable_record() {
    bounded(30, async {
        let mut config = chat_config().for_function("relay");
        config.kinesis_endpoint = Some(chat_tests::server::kinesis_endpoint());
        let sdk = config.sdk_config().await;
        let relay = relay::Relay::new(
            config.kinesis_client(&sdk),
            config.event_stream.clone(),
            config.chat_store(&sdk),
        );
        // An id no fanout finds a conversation for.
        let conv = format!("g-{}", uuid::Uuid::new_v4().simple());
        let mut broken = read_record("2000000000000000000002", &conv, "u2", 0, 1);
        broken["dynamodb"]["NewImage"]
            .as_object_mut()
            .unwrap()
            .remove("conversationId");
        let records = vec![
            read_record("2000000000000000000001", &conv, "u1", 0, 1),
            broken,
            read_record("2000000000000000000003", &conv, "u3", 0, 1),
        ];
        let event: DynamoDbEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
        let response = serde_json::to_value(relay.handle(event).await).unwrap();
        assert_eq!(
            response,
            json!({"batchItemFailures": [{"itemIdentifier": "2000000000000000000002"}]})
        );

        // Redelivered from there (as the gateway's mapping does) without the bad record's fault.
        let retried: DynamoDbEvent = serde_json::from_value(json!({
            "Records": [read_record("2000000000000000000002", &conv, "u2", 0, 1), records[2]]
        }))
        .unwrap();
        let response = serde_json::to_value(relay.handle(retried).await).unwrap();
        assert_eq!(response, json!({"batchItemFailures": []}));
    })
    .await
}

#[tokio::test]
async fn a_failing_push_is_retried_in_the_invocation_and_the_client_gets_every_event_in_order() {
    bounded(90, async {
        let store = connection_store().await;
        let gw = gateway();
        let (t, a, b, conv, mut wa) = connected_direct().await;
        let ids = connection_ids(&store, &a).await;
        assert_eq!(ids.len(), 1);
        // Two failures, fewer than the invocation's attempts: the third gets through (the SDK's
        // own retries are off).
        gw.inject_post_failures(&ids[0], 500, 2);
        let (redeliveries, retries) = (
            gw.stats().fanout.redeliveries(),
            gw.fanout_stats().retries(),
        );

        for i in 1..=5 {
            assert_eq!(t.send(&conv, &b, &format!("m{i}")).await.status, 201);
        }
        let events = wa
            .until_quiet(Duration::from_secs(60), QUIET, |e| {
                first_seqs(e, &conv).len() == 5
            })
            .await;
        assert_eq!(first_seqs(&events, &conv), vec![1, 2, 3, 4, 5]);
        let seqs: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "message.new")
            .collect();
        assert_eq!(seqs.len(), 5, "each exactly once: {events:#?}");
        assert_eq!(
            gw.pending_post_failures(&ids[0]),
            0,
            "the failures were served"
        );
        assert!(
            gw.fanout_stats().retries() >= retries + 2,
            "retried by the fanout"
        );
        assert_eq!(
            gw.stats().fanout.redeliveries(),
            redeliveries,
            "no Kinesis redelivery for a connection's failure"
        );
        assert_eq!(gw.stats().fanout.given_up(), 0);
        assert_eq!(connection_ids(&store, &a).await, ids, "a 500 is not a 410");
    })
    .await
}

// A connection still failing after the invocation's retries makes its record be delivered
// again: tests/tests/push_faults.rs (its own gateway, since those redeliveries would show in the
// counters the tests here check).

#[tokio::test]
async fn a_410_right_after_connect_keeps_the_connection() {
    bounded(60, async {
        let store = connection_store().await;
        let gw = gateway();
        let (t, a, b, conv, mut live) = connected_direct().await;
        let user = chat_domain::UserId::parse(&a).unwrap();
        let ids = connection_ids(&store, &a).await;
        // A record registered just now that API Gateway does not know (yet), like one whose
        // handshake is still completing.
        let young = format!("{}=", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        store
            .register(&user, &young, now_unix() * 1000)
            .await
            .unwrap();
        // The live connection answers 410 once, as API Gateway does before the handshake ends.
        gw.inject_post_failures(&ids[0], 410, 1);
        let kept = gw.fanout_stats().kept_in_grace();

        t.send(&conv, &b, "during the handshake").await;
        // Both connections answer 410 within the grace: records kept. (A gone socket takes no
        // more frames, so the rest of that batch is skipped for them.)
        let deadline = Instant::now() + EVENT;
        while gw.pending_post_failures(&ids[0]) > 0 || gw.fanout_stats().kept_in_grace() < kept + 2
        {
            assert!(Instant::now() < deadline, "the 410s were not handled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t.send(&conv, &b, "after it").await;
        let events = live.until_message(EVENT, &conv, 2).await;
        assert_eq!(
            first_seqs(&events, &conv),
            vec![2],
            "the 410 cost one push, no more"
        );
        let mut now = connection_ids(&store, &a).await;
        now.sort();
        let mut expected = vec![ids[0].clone(), young];
        expected.sort();
        assert_eq!(now, expected, "neither record was deleted");
    })
    .await
}

#[tokio::test]
async fn presence_is_pruned_and_bounded_on_registration() {
    bounded(60, async {
        use chat_store::connections::{CONNECTION_TTL_SECS, MAX_CONNECTIONS_PER_USER};
        let store = connection_store().await;
        let user = chat_domain::UserId::parse(&unique("p")).unwrap();
        let now = now_unix();
        // Connections of an earlier day, whose $disconnect was lost: expired.
        for i in 0..5 {
            store
                .register(
                    &user,
                    &format!("old{i}="),
                    (now - CONNECTION_TTL_SECS - 100 + i) * 1000,
                )
                .await
                .unwrap();
        }
        assert_eq!(store.presence(&user).await.unwrap().len(), 5);
        // One new registration prunes them all.
        store.register(&user, "new0=", now * 1000).await.unwrap();
        let ids: Vec<String> = store
            .presence(&user)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(ids, ["new0="]);

        // The bound: the oldest go first, the newest stay, also when they all open within one
        // second (registrations 10 ms apart; ids sort in the reverse order of their age).
        let total = MAX_CONNECTIONS_PER_USER + 3;
        let id = |i: usize| format!("new{}=", char::from(b'z' - i as u8));
        for i in 1..total {
            store
                .register(&user, &id(i), now * 1000 + 10 * i as i64)
                .await
                .unwrap();
        }
        let mut entries = store.presence(&user).await.unwrap();
        entries.sort_by_key(|e| e.1);
        let ids: Vec<String> = entries.into_iter().map(|e| e.0).collect();
        let expected: Vec<String> = (total - MAX_CONNECTIONS_PER_USER..total).map(id).collect();
        assert_eq!(ids, expected);

        // Concurrent registrations of one user race on the same item: still at most the bound,
        // and every one of them answered.
        let other = chat_domain::UserId::parse(&unique("q")).unwrap();
        let registrations = (0..2 * MAX_CONNECTIONS_PER_USER).map(|i| {
            let (store, other) = (store.clone(), other.clone());
            tokio::spawn(async move { store.register(&other, &format!("c{i}="), now * 1000).await })
        });
        for r in futures::future::join_all(registrations).await {
            r.unwrap().unwrap();
        }
        assert_eq!(
            store.presence(&other).await.unwrap().len(),
            MAX_CONNECTIONS_PER_USER
        );
    })
    .await
}

#[tokio::test]
async fn connections_without_a_valid_token_are_refused_with_401() {
    bounded(30, async {
        let url = &gateway().ws_url;
        let user = unique("a");
        let cases = [
            ("no token", url.clone()),
            ("empty token", format!("{url}?token=")),
            ("malformed", format!("{url}?token=abc")),
            (
                "bad signature",
                format!(
                    "{url}?token={}",
                    mint_hs256(&user, now_unix() + 600, b"other")
                ),
            ),
            (
                "expired",
                format!(
                    "{url}?token={}",
                    mint_hs256(&user, now_unix() - 5, TEST_SECRET.as_bytes())
                ),
            ),
        ];
        for (case, url) in cases {
            assert_eq!(WsClient::connect_url(&url).await.err(), Some(401), "{case}");
        }
        assert!(connection_ids(&connection_store().await, &user)
            .await
            .is_empty());
        let ok = WsClient::connect_url(&format!("{url}?token={}", token(&user))).await;
        assert!(ok.is_ok(), "a valid token connects");
    })
    .await
}

#[tokio::test]
async fn the_management_api_answers_like_api_gateway() {
    bounded(30, async {
        let gw = gateway();
        let store = connection_store().await;
        let mut config = chat_config();
        config.ws_management_endpoint = Some(gw.management_url.clone());
        let sdk = config.sdk_config().await;
        let management = config.management_client(&sdk).unwrap();

        // Unknown connection: 410, surfaced by the SDK as GoneException (what the fanout matches).
        let err = management
            .post_to_connection()
            .connection_id("unknownConn=")
            .data(Blob::new("x"))
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.as_service_error(),
                Some(PostToConnectionError::GoneException(_))
            ),
            "{err:?}"
        );

        let user = unique("a");
        let mut client = WsClient::connect(&user).await;
        let id = connection_ids(&store, &user).await.pop().unwrap();
        assert!(id.ends_with('=') && id.len() == 13, "{id}");

        let info = management
            .get_connection()
            .connection_id(&id)
            .send()
            .await
            .unwrap();
        let connected = info.connected_at().unwrap().secs();
        assert!((connected - now_unix()).abs() < 60, "{info:?}");
        let identity = info.identity().unwrap();
        assert_eq!(identity.source_ip(), Some("127.0.0.1"));

        management
            .post_to_connection()
            .connection_id(&id)
            .data(Blob::new(r#"{"hello":"☃"}"#))
            .send()
            .await
            .unwrap();
        assert_eq!(
            client.next_text(EVENT).await.as_deref(),
            Some(r#"{"hello":"☃"}"#)
        );
        // The same without the stage prefix, and a client frame is answered with nothing.
        client.send_text("ping").await;
        let bare = gw.management_url.rsplit_once('/').unwrap().0;
        config.ws_management_endpoint = Some(bare.to_owned());
        let bare_client = config.management_client(&sdk).unwrap();
        bare_client
            .post_to_connection()
            .connection_id(&id)
            .data(Blob::new("two"))
            .send()
            .await
            .unwrap();
        assert_eq!(client.next_text(EVENT).await.as_deref(), Some("two"));

        management
            .delete_connection()
            .connection_id(&id)
            .send()
            .await
            .unwrap();
        assert!(
            client.closed_within(EVENT).await,
            "DELETE closes the socket"
        );
        let err = management
            .post_to_connection()
            .connection_id(&id)
            .data(Blob::new("x"))
            .send()
            .await
            .unwrap_err();
        assert!(matches!(
            err.as_service_error(),
            Some(PostToConnectionError::GoneException(_))
        ));
        // Its $disconnect removed the connection record.
        until_unregistered(&store, &user, EVENT).await;
    })
    .await
}

#[tokio::test]
async fn a_client_closing_is_unregistered_by_disconnect() {
    bounded(30, async {
        let store = connection_store().await;
        let user = unique("a");
        let client = WsClient::connect(&user).await;
        assert_eq!(connection_ids(&store, &user).await.len(), 1);
        client.close().await;
        until_unregistered(&store, &user, EVENT).await;
    })
    .await
}

#[tokio::test]
async fn shutdown_closes_connections_and_unregisters_them() {
    bounded(30, async {
        let store = connection_store().await;
        let mut config = gateway_config();
        config.pipeline = None;
        let gw = Gateway::start(config).await.unwrap();
        let user = unique("a");
        let url = format!("{}?token={}", gw.ws_url, token(&user));
        let mut client = WsClient::connect_url(&url).await.unwrap();
        assert_eq!(connection_ids(&store, &user).await.len(), 1);
        gw.shutdown().await;
        assert!(client.closed_within(EVENT).await);
        assert!(connection_ids(&store, &user).await.is_empty());
        assert!(
            tokio_tungstenite::connect_async(&url).await.is_err(),
            "the port is closed"
        );
    })
    .await
}

/// The local stack runs the inbox indexer from the stream too (template.yaml:
/// InboxIndexEventSource): with real lag, a conversation moves to the top of the index walk
/// shortly after its message, while every page is exact from the start.
#[tokio::test]
async fn the_inbox_index_follows_the_stream() {
    bounded(60, async {
        let t = TestApp::new().await;
        let gw = chat_tests::push::gateway();
        let (me, p1, p2) = (unique("me"), unique("p1"), unique("p2"));
        let older = t.direct(&me, &p1).await;
        let newer = t.direct(&me, &p2).await;
        let invocations = gw.stats().inbox_index.invocations();
        let sent = t.send(&older, &p1, "move me up").await;
        assert_eq!(sent.status, 201);
        let entry = &t.get("/inbox", &me).await.body["conversations"][0];
        assert_eq!(
            (&entry["conversationId"], &entry["unreadCount"]),
            (&json!(older), &json!(1))
        );
        let started = Instant::now();
        loop {
            let first = t.get("/inbox?limit=1", &me).await;
            if first.body["conversations"][0]["conversationId"] == older.as_str() {
                break;
            }
            assert_eq!(
                first.body["conversations"][0]["conversationId"],
                newer.as_str()
            );
            assert!(started.elapsed() < EVENT, "the index never moved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("the inbox index moved after {:?}", started.elapsed());
        assert!(gw.stats().inbox_index.invocations() > invocations);
        assert_eq!(gw.stats().inbox_index.given_up(), 0);
    })
    .await
}

/// Changes (docs/api.md §15.2): each one pushed once, in changeSeq order, with the message as it is
/// now; a reaction that changes nothing pushes nothing.
#[tokio::test]
async fn edits_reactions_and_deletions_reach_the_members_in_change_order() {
    bounded(60, async {
        let (t, a, b, conv, mut wa) = connected_direct().await;
        t.send(&conv, &a, "helo").await;
        wa.until_message(EVENT, &conv, 1).await;
        let is_change = |e: &serde_json::Value| e.get("changeSeq").is_some();
        let mut events = Vec::new();
        let edited = t.edit(&conv, 1, &a, &chat_tests::new_uuid(), "hello").await;
        assert_eq!(edited.status, 200, "{edited:?}");
        // Each change is pushed before the next is made: the deletion below must not overtake the
        // pushes of the changes before it (their content would then be withheld, §8.4).
        events.extend(wa.until(EVENT, |e| e.iter().any(is_change)).await);
        assert_eq!(
            t.react(&conv, 1, &b, "%F0%9F%91%8D", true).await.status,
            200
        );
        assert_eq!(
            t.react(&conv, 1, &b, "%F0%9F%91%8D", true).await.status,
            200
        );
        events.extend(wa.until(EVENT, |e| e.iter().any(is_change)).await);
        let deleted = t
            .delete_message(&conv, 1, &a, &chat_tests::new_uuid())
            .await;
        assert_eq!(deleted.status, 200, "{deleted:?}");
        events.extend(wa.until(EVENT, |e| e.iter().any(is_change)).await);
        let changes: Vec<&serde_json::Value> = events.iter().filter(|e| is_change(e)).collect();
        let later = wa.drain(QUIET).await;
        assert!(
            !later.iter().any(is_change),
            "the repeated reaction pushed something: {later:#?}"
        );
        let kinds: Vec<(&str, u64)> = changes
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap(),
                    e["changeSeq"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("message.edited", 1),
                ("reaction.added", 2),
                ("message.deleted", 3)
            ],
            "{events:#?}"
        );
        assert_eq!(changes[0]["userId"], a.as_str());
        assert_eq!(changes[1]["reaction"], "👍");
        // The message as it is when relayed: never older content after a deletion.
        for change in &changes {
            let m = &change["message"];
            assert!(m["body"] == "hello" || m["deleted"] == true, "{change}");
        }
        assert_eq!(changes[2]["message"], deleted.body);
    })
    .await
}

/// Issue 19: a deletion's content is gone from events already queued. An event relayed with the
/// content before the deletion (here: a Kinesis record written then, handed to a fanout of our
/// own afterwards) is pushed in its light form once the message is deleted.
#[tokio::test]
async fn an_event_queued_before_a_deletion_is_pushed_without_the_content() {
    use chat_domain::events::Event;
    bounded(60, async {
        let (t, a, _b, conv, mut wa) = connected_direct().await;
        let sent = t.send(&conv, &a, "regrettable").await;
        let original: chat_domain::model::Message = serde_json::from_value(sent.body).unwrap();
        wa.until_message(EVENT, &conv, 1).await;
        let deleted = t
            .delete_message(&conv, 1, &a, &chat_tests::new_uuid())
            .await;
        assert_eq!(deleted.status, 200, "{deleted:?}");
        wa.until(EVENT, |e| e.iter().any(|e| e["type"] == "message.deleted"))
            .await;

        push_queued(&conv, vec![Event::message_new(&original)]).await;
        let pushed = wa.until_message(EVENT, &conv, 1).await;
        assert_eq!(
            message(&pushed, &conv, 1),
            &json!({"type": "message.new", "conversationId": conv, "seq": 1}),
            "the queued event came without its content: {pushed:#?}"
        );
    })
    .await
}

/// Issue 28: content of any number of deletions is withheld from events queued before them,
/// not only of the last ones the conversation lists: 50 deletions while their events wait.
#[tokio::test]
async fn content_deleted_by_any_number_of_deletions_is_withheld_from_queued_events() {
    use chat_domain::events::Event;
    bounded(120, async {
        let (t, a, _b, conv, mut wa) = connected_direct().await;
        let mut queued = Vec::new();
        for i in 1..=51 {
            let sent = t.send(&conv, &a, &format!("secret {i}")).await;
            let m: chat_domain::model::Message = serde_json::from_value(sent.body).unwrap();
            queued.push(Event::message_new(&m));
        }
        wa.until_message(EVENT, &conv, 51).await;
        for seq in 1..=50 {
            let deleted = t
                .delete_message(&conv, seq, &a, &chat_tests::new_uuid())
                .await;
            assert_eq!(deleted.status, 200, "{deleted:?}");
        }
        let deletions = |e: &[serde_json::Value]| {
            e.iter().filter(|e| e["type"] == "message.deleted").count() == 50
        };
        wa.until(EVENT, deletions).await;

        push_queued(&conv, queued).await;
        let pushed = wa.until_message(EVENT, &conv, 51).await;
        for seq in 1..=50 {
            assert_eq!(
                message(&pushed, &conv, seq),
                &json!({"type": "message.new", "conversationId": conv, "seq": seq}),
                "the content of deleted seq {seq} was pushed: {pushed:#?}"
            );
        }
        assert_eq!(message(&pushed, &conv, 51)["body"], "secret 51");
    })
    .await
}

/// The fanout reads a conversation for each batch to know its members and the content it must
/// withhold; a direct conversation's members never change and a receipt has no content, so a
/// receipt to a direct conversation whose members the instance holds reads nothing of it
/// (issue 33: 1 read unit less per receipt). Its push arrives as ever; a message still reads.
#[tokio::test]
async fn a_receipt_in_a_direct_conversation_reads_nothing_of_it() {
    use chat_domain::events::Event;
    bounded(60, async {
        let (t, a, b, conv, mut wa) = connected_direct().await;
        let fanout = fanout_of(t.store_of_function("fanout")).await;
        let sent = t.send(&conv, &a, "hi").await;
        let original: chat_domain::model::Message = serde_json::from_value(sent.body).unwrap();
        wa.until_message(EVENT, &conv, 1).await;
        t.calls.take();
        push_queued_to(&fanout, &conv, vec![Event::message_new(&original)]).await;
        let first = t.calls.take();
        assert!(
            first.iter().any(|c| c == "GetItem") && first.iter().any(|c| c == "Query"),
            "a new instance reads the conversation and its members: {first:?}"
        );
        push_queued_to(&fanout, &conv, vec![Event::message_new(&original)]).await;
        assert_eq!(t.calls.take(), ["GetItem"], "a message: its deleted seqs");

        let read = Event::ReadUpdated {
            conversation_id: chat_domain::ConversationId::parse(&conv).unwrap(),
            user_id: chat_domain::UserId::parse(&b).unwrap(),
            last_read_seq: 1,
            origin: None,
        };
        push_queued_to(&fanout, &conv, vec![read]).await;
        assert_eq!(t.calls.take(), Vec::<String>::new(), "a receipt: nothing");
        let expected =
            json!({"type": "read.updated", "conversationId": conv, "userId": b, "lastReadSeq": 1});
        wa.until(EVENT, |e| e.contains(&expected)).await;
    })
    .await
}

/// Hands `events` of `conv` to a fanout of our own, as one Kinesis record written before now
/// (an event that waited in the pipeline).
async fn push_queued(conv: &str, events: Vec<chat_domain::events::Event>) {
    let config = chat_config().for_function("fanout");
    let sdk = config.sdk_config().await;
    let fanout = fanout_of(config.chat_store(&sdk)).await;
    push_queued_to(&fanout, conv, events).await;
}

/// A fanout over `chat`, pushing through the local gateway's Management API.
async fn fanout_of(chat: chat_store::ChatStore) -> fanout::Fanout {
    let config = chat_config().for_function("fanout");
    let sdk = config.sdk_config().await;
    fanout::Fanout::new(
        chat,
        connection_store().await,
        aws_sdk_apigatewaymanagement::Client::from_conf(
            aws_sdk_apigatewaymanagement::config::Builder::from(&sdk)
                .endpoint_url(&gateway().management_url)
                .build(),
        ),
    )
}

/// `push_queued` through `fanout`.
async fn push_queued_to(
    fanout: &fanout::Fanout,
    conv: &str,
    events: Vec<chat_domain::events::Event>,
) {
    use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
    let batch = chat_domain::events::EventBatch {
        conversation_id: chat_domain::ConversationId::parse(conv).unwrap(),
        events,
    };
    let mut record = KinesisEventRecord::default();
    record.event_id = Some("shardId-000000000000:1".into());
    record.kinesis.sequence_number = "1".into();
    record.kinesis.partition_key = conv.to_owned();
    record.kinesis.data.0 = serde_json::to_vec(&batch).unwrap();
    let mut event = KinesisEvent::default();
    event.records = vec![record];
    let answer = fanout.handle(event).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
}

/// A suspension made by another instance (its item written directly here), while this one
/// still knows the user as not suspended (a connection a moment before): a new connection is
/// refused, never left open (found by probing: for 10 s connections were accepted, and never
/// closed).
#[tokio::test]
async fn a_connection_after_a_suspension_elsewhere_is_refused() {
    bounded(30, async {
        let t = TestApp::new().await;
        let a = unique("a");
        let before = WsClient::connect(&a).await;
        t.suspend_elsewhere(&a).await;
        let url = format!("{}?token={}", gateway().ws_url, token(&a));
        assert_eq!(WsClient::connect_url(&url).await.err(), Some(403));
        drop(before);
    })
    .await
}

/// A suspended user's handshake, refused while this instance still knows the user as not
/// suspended, leaves its presence as it was: `lastActiveAt` stays the close of its last real
/// connection (found by probing: the refused handshake's registration, undone, moved it).
#[tokio::test]
async fn a_refused_handshake_leaves_presence_as_it_was() {
    bounded(30, async {
        let t = TestApp::new().await;
        let store = connection_store().await;
        let (a, b) = (unique("a"), unique("b"));
        WsClient::connect(&a).await.close().await;
        until_unregistered(&store, &a, Duration::from_secs(5)).await;
        let last_active = |r: chat_tests::Resp| {
            assert_eq!(r.status, 200, "{r:?}");
            r.body["presence"][0]["lastActiveAt"].clone()
        };
        let closed = last_active(t.post("/presence", &b, json!({ "userIds": [&a] })).await);
        assert!(closed.is_string(), "{closed}");
        // Past the close's second, then suspended elsewhere (the item written directly here).
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        t.suspend_elsewhere(&a).await;
        let url = format!("{}?token={}", gateway().ws_url, token(&a));
        assert_eq!(WsClient::connect_url(&url).await.err(), Some(403));
        let now = last_active(t.post("/presence", &b, json!({ "userIds": [&a] })).await);
        assert_eq!(now, closed, "the refused handshake is no connection");
    })
    .await
}

/// A registration its handshake undid (a suspension made between its two reads) leaves no
/// `lastActiveAt`: the connection never opened (found by probing: a user who never connected
/// showed one after handshakes raced its suspension).
#[tokio::test]
async fn a_registration_its_handshake_undid_leaves_no_last_active_time() {
    let t = TestApp::new().await;
    let store = connection_store().await;
    let (a, b) = (unique("a"), unique("b"));
    let user = chat_domain::UserId::parse(&a).unwrap();
    let now = chat_domain::time::unix_seconds(chat_domain::time::now());
    let connection = format!("c-{}", unique("x"));
    store.register(&user, &connection, now).await.unwrap();
    store.unregister_refused(&connection).await.unwrap();
    let r = t.post("/presence", &b, json!({ "userIds": [&a] })).await;
    assert_eq!(
        r.body["presence"][0],
        json!({"userId": a, "online": false, "lastActiveAt": null}),
        "{r:?}"
    );
}

/// A moderator's suspension closes the user's open WebSocket connections, through the
/// Management API's DeleteConnection (the local gateway's stand-in), and `$disconnect`
/// unregisters them (docs/api.md §30).
#[tokio::test]
async fn a_suspension_closes_the_users_connections() {
    bounded(30, async {
        let (t, a, b, _c, mut wa) = connected_direct().await;
        let mut wb = WsClient::connect(&b).await;
        let t = chat_tests::push::with_management(t).await;
        let moderator = chat_tests::token_with(&unique("mod"), json!({"scope": "chat:moderator"}));
        let path = format!("/moderation/suspensions/{a}");
        let r = t
            .call_with_token("PUT", &path, moderator.clone(), None)
            .await;
        assert_eq!(r.status, 204, "{r:?}");
        assert!(
            wa.closed_within(Duration::from_secs(5)).await,
            "a's socket closed"
        );
        until_unregistered(&connection_store().await, &a, Duration::from_secs(5)).await;
        // Others stay connected; a's new connection is refused until the suspension is lifted.
        assert!(!wb.closed_within(Duration::from_millis(300)).await);
        let url = format!("{}?token={}", gateway().ws_url, token(&a));
        assert_eq!(WsClient::connect_url(&url).await.err(), Some(403));
        let r = t.call_with_token("DELETE", &path, moderator, None).await;
        assert_eq!(r.status, 204, "{r:?}");
        assert!(WsClient::connect_url(&url).await.is_ok());
    })
    .await
}
