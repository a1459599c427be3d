//! Sending and history: gap-free seq, idempotency, bounds, paging.

use chat_tests::{at_once, new_uuid, unique, TestApp};
use serde_json::json;
use std::sync::Arc;

/// Asserts that `user` reads exactly `n` messages in `c`, the last at seq `n`.
async fn assert_holds(t: &TestApp, c: &str, user: &str, n: u64) {
    let h = t.get(&format!("/conversations/{c}/messages"), user).await;
    assert_eq!(h.body["lastSeq"], n, "{h:?}");
    assert_eq!(
        h.body["messages"].as_array().unwrap().len() as u64,
        n,
        "{h:?}"
    );
}

#[tokio::test]
async fn send_returns_message_and_replay_returns_the_same() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let id = new_uuid();
    let body = json!({"clientMsgId": id, "body": "hello"});
    let first = t
        .post(&format!("/conversations/{c}/messages"), &a, body.clone())
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body["seq"], 1);
    assert_eq!(first.body["conversationId"], c.as_str());
    assert_eq!(first.body["senderId"], a.as_str());
    assert_eq!(first.body["clientMsgId"], id.as_str());
    assert_eq!(first.body["body"], "hello");
    assert!(first.body["createdAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(first.headers["content-type"], "application/json");

    let replay = t
        .post(&format!("/conversations/{c}/messages"), &a, body)
        .await;
    assert_eq!(replay.status, 200);
    assert_eq!(
        replay.body, first.body,
        "a replay returns the identical message"
    );

    let other = t.send_with_id(&c, &a, &id, "changed").await;
    assert_eq!((other.status, other.code()), (409, "conflict"));
    // The peer reusing the id is a conflict too, and creates nothing.
    let peer = t.send_with_id(&c, &b, &id, "hello").await;
    assert_eq!((peer.status, peer.code()), (409, "conflict"));

    let next = t.send(&c, &b, "second").await;
    assert_eq!(next.body["seq"], 2, "nothing was created by the replays");
    assert_holds(&t, &c, &a, 2).await;
}

#[tokio::test]
async fn sending_marks_read_for_the_sender() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    t.send(&c, &a, "one").await;
    t.send(&c, &a, "two").await;
    let r = t.get(&format!("/conversations/{c}/reads"), &b).await;
    let members = r.body["members"].as_array().unwrap();
    let of = |u: &str| {
        members.iter().find(|m| m["userId"] == u).unwrap()["lastReadSeq"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(of(&a), 2);
    assert_eq!(of(&b), 0);
}

#[tokio::test]
async fn concurrent_senders_get_exactly_one_to_n() {
    let t = Arc::new(TestApp::new().await);
    let owner = unique("o");
    let members: Vec<String> = (0..7).map(|i| unique(&format!("m{i}"))).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    let c = t.group(&owner, &refs).await;
    let senders: Vec<String> = std::iter::once(owner.clone())
        .chain(members.clone())
        .collect();
    const PER_SENDER: usize = 3;
    let tasks = senders.iter().map(|s| {
        let (t, s, c) = (t.clone(), s.clone(), c.clone());
        tokio::spawn(async move {
            let mut seqs = vec![];
            for i in 0..PER_SENDER {
                // As a client does: a `429` (lost every race within the retry budget) is retried
                // with the same clientMsgId, so it can neither be lost nor be created twice.
                let body = json!({"clientMsgId": new_uuid(), "body": format!("{s} {i}")});
                let path = format!("/conversations/{c}/messages");
                let mut r = t.post(&path, &s, body.clone()).await;
                for _ in 0..5 {
                    if r.status != 429 {
                        break;
                    }
                    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    r = t.post(&path, &s, body.clone()).await;
                }
                assert_eq!(r.status, 201, "{r:?}");
                seqs.push(r.body["seq"].as_u64().unwrap());
            }
            seqs
        })
    });
    let mut all: Vec<u64> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    all.sort();
    let n = (senders.len() * PER_SENDER) as u64;
    assert_eq!(all, (1..=n).collect::<Vec<_>>(), "gap-free, no duplicates");
    let h = t
        .get(&format!("/conversations/{c}/messages?limit=100"), &owner)
        .await;
    let seqs: Vec<u64> = h.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "history holds every message once, in order"
    );
    assert_eq!(h.body["lastSeq"], n);
}

#[tokio::test]
async fn concurrent_replays_create_one_message() {
    let t = Arc::new(TestApp::new().await);
    let (a, b, c) = t.new_direct().await;
    t.send(&c, &b, "before").await;
    let body = json!({"clientMsgId": new_uuid(), "body": "once"});
    let tasks = (0..10).map(|_| {
        let (t, a, c, body) = (t.clone(), a.clone(), c.clone(), body.clone());
        async move {
            t.post(&format!("/conversations/{c}/messages"), &a, body)
                .await
        }
    });
    let results = at_once(tasks).await;
    assert!(results.iter().all(|r| r.body["seq"] == 2), "{results:?}");
    assert_eq!(results.iter().filter(|r| r.status == 201).count(), 1);
    assert_eq!(results.iter().filter(|r| r.status == 200).count(), 9);
    assert_holds(&t, &c, &a, 2).await;
}

/// Sends of one `clientMsgId` with two bodies at once: one body is stored, and every request
/// with that body gets it (one 201, the rest 200), every other one 409. Found by probing: a
/// request with the stored body could get 409 from a losing send of the other body that stood
/// queued.
#[tokio::test]
async fn racing_sends_of_one_id_with_two_bodies_answer_by_the_stored_one() {
    let t = Arc::new(TestApp::new().await);
    for _ in 0..5 {
        let (a, b, c) = t.new_direct().await;
        let id = new_uuid();
        let tasks = (0..10).map(|i| {
            let (t, c) = (t.clone(), c.clone());
            let sender = if i % 4 == 3 { b.clone() } else { a.clone() };
            let body = json!({"clientMsgId": id, "body": if i % 2 == 0 { "A" } else { "B" }});
            async move {
                let r = t
                    .post(
                        &format!("/conversations/{c}/messages"),
                        &sender,
                        body.clone(),
                    )
                    .await;
                (sender, body["body"].clone(), r)
            }
        });
        let results = at_once(tasks).await;
        let h = t.get(&format!("/conversations/{c}/messages"), &a).await;
        assert_eq!(h.body["lastSeq"], 1, "{results:?}");
        let stored = &h.body["messages"][0];
        for (sender, body, r) in &results {
            let same = *body == stored["body"] && sender.as_str() == stored["senderId"];
            let expected: &[u16] = if same { &[200, 201] } else { &[409] };
            assert!(
                expected.contains(&r.status),
                "{sender} {body}: {r:?}, stored {stored}"
            );
        }
        let created = results.iter().filter(|(_, _, r)| r.status == 201).count();
        assert_eq!(created, 1, "{results:?}");
    }
}

#[tokio::test]
async fn bodies_are_stored_byte_for_byte_within_bounds() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let samples = [
        "  leading and trailing  ".to_owned(),
        "quotes \" ' ` and \\ backslash".to_owned(),
        "emoji 😀👍🏽 and 日本語のテキスト".to_owned(),
        "line1\nline2\r\n\ttab".to_owned(),
        "<script>alert(1)</script>".to_owned(),
        "x".repeat(4000),
        "😀".repeat(4000),
    ];
    for s in &samples {
        let r = t.send(&c, &a, s).await;
        assert_eq!(r.status, 201, "{}", s.len());
        assert_eq!(r.body["body"].as_str().unwrap(), s);
    }
    let h = t
        .get(&format!("/conversations/{c}/messages?limit=100"), &b)
        .await;
    let bodies: Vec<&str> = h.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        samples.iter().map(String::as_str).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn bad_sends_get_4xx_and_change_nothing() {
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    t.send(&c, &a, "kept").await;
    let path = format!("/conversations/{c}/messages");
    let id = new_uuid();
    let cases: Vec<(String, u16, &str)> = vec![
        ("".into(), 400, "invalid_request"),
        ("{".into(), 400, "invalid_request"),
        ("[]".into(), 400, "invalid_request"),
        (json!({"body": "x"}).to_string(), 400, "invalid_request"),
        (
            json!({"clientMsgId": id}).to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"clientMsgId": "not-a-uuid", "body": "x"}).to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"clientMsgId": 42, "body": "x"}).to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"clientMsgId": id, "body": 42}).to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"clientMsgId": id, "body": ""}).to_string(),
            400,
            "invalid_request",
        ),
        (
            json!({"clientMsgId": id, "body": "x".repeat(4001)}).to_string(),
            413,
            "payload_too_large",
        ),
        (
            json!({"clientMsgId": id, "body": "x", "pad": "y".repeat(70_000)}).to_string(),
            413,
            "payload_too_large",
        ),
    ];
    // A request that has no use for a body is bounded all the same.
    let big = "y".repeat(70_000);
    for (method, route) in [
        ("GET", format!("{path}?limit=1")),
        ("DELETE", "/me/blocks/x".into()),
    ] {
        let r = t.call(method, &route, Some(&a), Some(&big)).await;
        assert_eq!(
            (r.status, r.code()),
            (413, "payload_too_large"),
            "{method} {route}"
        );
    }
    for (body, status, code) in cases {
        let r = t.call("POST", &path, Some(&a), Some(&body)).await;
        assert_eq!(
            (r.status, r.code()),
            (status, code),
            "{}",
            &body[..body.len().min(80)]
        );
        assert!(r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let h = t.get(&path, &a).await;
    assert_eq!(h.body["lastSeq"], 1);
    assert_eq!(h.body["messages"].as_array().unwrap().len(), 1);
    // The id rejected with an over-long body is still free.
    let ok = t
        .post(&path, &a, json!({"clientMsgId": id, "body": "fine"}))
        .await;
    assert_eq!((ok.status, ok.body["seq"].as_u64()), (201, Some(2)));
}

#[tokio::test]
async fn history_pages_in_both_directions() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    for i in 1..=12 {
        assert_eq!(
            t.send(&c, if i % 2 == 0 { &a } else { &b }, &format!("m{i}"))
                .await
                .body["seq"],
            i
        );
    }
    let page = |q: &str| {
        let (t, c, a) = (&t, &c, &a);
        let q = q.to_owned();
        async move {
            let r = t.get(&format!("/conversations/{c}/messages{q}"), a).await;
            assert_eq!(r.status, 200, "{q}: {r:?}");
            assert_eq!(r.body["lastSeq"], 12);
            (
                chat_tests::seqs(&r.body),
                r.body["hasMore"].as_bool().unwrap(),
            )
        }
    };
    // (query, the seqs of its page, hasMore)
    let cases: [(&str, Vec<u64>, bool); 10] = [
        ("", (1..=12).collect(), false),
        ("?limit=5", (8..=12).collect(), true),
        ("?beforeSeq=8&limit=5", (3..=7).collect(), true),
        ("?beforeSeq=3&limit=5", vec![1, 2], false),
        ("?beforeSeq=1", vec![], false),
        ("?afterSeq=0&limit=5", (1..=5).collect(), true),
        ("?afterSeq=5&limit=5", (6..=10).collect(), true),
        ("?afterSeq=10&limit=5", vec![11, 12], false),
        ("?afterSeq=12", vec![], false),
        ("?afterSeq=7&limit=5", (8..=12).collect(), false),
    ];
    for (query, seqs, has_more) in cases {
        assert_eq!(page(query).await, (seqs, has_more), "{query}");
    }
    assert_eq!(page("?limit=100").await.0.len(), 12);
    assert_eq!(page("?limit=1").await, (vec![12], true));

    for bad in [
        "?beforeSeq=3&afterSeq=1",
        "?beforeSeq=-1",
        "?afterSeq=abc",
        "?limit=0",
        "?limit=101",
        "?limit=x",
        "?afterSeq=1.5",
        "?afterSeq=1&afterSeq=2",
        "?limit=5&limit=5",
    ] {
        let r = t
            .get(&format!("/conversations/{c}/messages{bad}"), &a)
            .await;
        assert_eq!((r.status, r.code()), (400, "invalid_request"), "{bad}");
    }
}

/// A long answer goes out gzipped to a client that accepts it, through the real function
/// process and lambda_http's answer to API Gateway (base64, `isBase64Encoded`), and unpacks to
/// the same JSON; without `Accept-Encoding` it is plain (docs/api.md §1, "Compression").
#[tokio::test]
async fn a_long_answer_is_gzipped_for_a_client_that_accepts_it() {
    use chat_tests::function_process::{FunctionProcess, Outcome};
    use std::time::Duration;
    let t = TestApp::new().await;
    let process = FunctionProcess::start("history", &[]).await;
    let (a, _, c) = t.new_direct().await;
    for i in 0..12 {
        t.send(
            &c,
            &a,
            &format!("message {i}: {}", "long enough to matter ".repeat(4)),
        )
        .await;
    }
    let path = format!("/conversations/{c}/messages?limit=20");
    let answer = |gzip: bool| {
        let (mut event, _) = t.event("GET", &path, Some(&a), None);
        if gzip {
            event["headers"]["accept-encoding"] = json!("gzip, deflate, br");
        }
        let process = &process;
        async move {
            match process.call(event, Duration::from_secs(60)).await {
                Outcome::Answered(r) => r,
                other => panic!("{other:?}; its output:\n{}", process.logs()),
            }
        }
    };
    let plain = answer(false).await;
    let packed = answer(true).await;
    assert_eq!((plain.status, packed.status), (200, 200), "{plain:?}");
    assert_eq!(plain.headers.get("content-encoding"), None);
    assert_eq!(
        packed.headers.get("content-encoding").map(String::as_str),
        Some("gzip")
    );
    assert_eq!(
        packed.headers.get("vary").map(String::as_str),
        Some("accept-encoding")
    );
    assert_eq!(packed.body, plain.body);
    assert!(
        packed.wire_bytes * 3 < plain.wire_bytes,
        "{} of {} bytes",
        packed.wire_bytes,
        plain.wire_bytes
    );
    assert_eq!(packed.body["messages"].as_array().map(Vec::len), Some(12));
}
