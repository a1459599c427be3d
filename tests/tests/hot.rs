//! A hot conversation (docs/data-model.md §3 "Send", §4.1): sends that lose the race for the
//! conversation item queue (queued sends) and are committed together (group commit), with the
//! emulator's DynamoDB transaction conflicts on. The decisions alone are unit-tested in
//! `chat_domain::send`; these tests are the proof of their DynamoDB semantics.
//! This binary has its own emulator, so one test may change its settings (under `SETTINGS`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents, SharedInterceptor};
use aws_sdk_dynamodb::types::AttributeValue;
use chat_store::retry::Timeouts;
use chat_tests::{
    assert_sent, at_once, new_uuid, server, unique, Resp, TestApp, TransactionAnswers,
};
use serde_json::{json, Value};
use tokio::sync::RwLock;

/// Tests that change the emulator's settings hold it for writing; the others for reading.
static SETTINGS: RwLock<()> = RwLock::const_new(());

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn key(conversation: &str, sk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), s(&format!("C#{conversation}"))),
        ("sk".to_owned(), s(sk)),
    ])
}

/// Puts a queued send of a request that has ended (nobody but a take-over commits it), whose
/// lifetime ends at `expires_at` (unix ms; `in_a_minute()`: a crash just now).
async fn queue_ended_send(
    t: &TestApp,
    conversation: &str,
    id: &str,
    sender: &str,
    body: &str,
    enqueued_at: u64,
    expires_at: u64,
) {
    let mut item = key(conversation, &format!("P#{id}"));
    for (k, v) in [
        ("conversationId", conversation),
        ("clientMsgKey", id),
        ("clientMsgId", id),
        ("senderId", sender),
        ("body", body),
        ("fingerprint", "f"),
        ("requestId", "a request that has ended"),
    ] {
        item.insert(k.to_owned(), s(v));
    }
    item.insert(
        "enqueuedAt".to_owned(),
        AttributeValue::N(enqueued_at.to_string()),
    );
    item.insert(
        "expiresAt".to_owned(),
        AttributeValue::N(expires_at.to_string()),
    );
    t.db.put_item()
        .table_name("ChatTable")
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
}

/// A minute from now (unix ms): the lifetime of a queued send whose request ended just now.
fn in_a_minute() -> u64 {
    chat_domain::time::unix_millis(chat_domain::time::now()) + 60_000
}

/// The `clientMsgId`s still queued in the conversation.
async fn history(t: &TestApp, conversation: &str, user: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let r = t
            .get(
                &format!(
                    "/conversations/{conversation}/messages?afterSeq={}&limit=100",
                    out.len()
                ),
                user,
            )
            .await;
        assert_eq!(r.status, 200, "{r:?}");
        let page = r.body["messages"].as_array().unwrap().clone();
        let more = r.body["hasMore"].as_bool().unwrap();
        out.extend(page);
        if !more {
            return out;
        }
    }
}

/// Sends as a client does: a 429 or 503 is retried with the same `clientMsgId`.
async fn send_like_a_client(t: &TestApp, conversation: &str, user: &str, body: &str) -> Resp {
    let id = new_uuid();
    loop {
        let r = t.send_with_id(conversation, user, &id, body).await;
        if r.status != 429 && r.status != 503 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn concurrent_senders_are_committed_together_without_gaps() {
    let _shared = SETTINGS.read().await;
    let t = Arc::new(TestApp::new().await);
    let owner = unique("o");
    let members: Vec<String> = (0..15).map(|i| format!("{owner}-{i}")).collect();
    let c = t.group(&owner, &members).await;
    t.calls.take();
    let senders: Vec<String> = std::iter::once(owner.clone()).chain(members).collect();
    let tasks = senders.iter().cloned().map(|user| {
        let (t, c) = (t.clone(), c.clone());
        async move {
            let mut acked = vec![];
            for i in 0..4 {
                let r = send_like_a_client(&t, &c, &user, &format!("{user} #{i}")).await;
                assert_eq!(r.status, 201, "{r:?}");
                acked.push(r.body);
            }
            acked
        }
    });
    let acked: Vec<Value> = at_once(tasks).await.into_iter().flatten().collect();
    let calls = t.calls.take();
    assert!(
        calls.iter().any(|c| c == "PutItem"),
        "the contended sends queued up: {calls:?}"
    );

    let all = history(&t, &c, &owner).await;
    let seqs: Vec<u64> = all.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=64).collect::<Vec<_>>(), "exactly 1..N");
    let by_id: HashMap<&str, &Value> = all
        .iter()
        .map(|m| (m["clientMsgId"].as_str().unwrap(), m))
        .collect();
    for a in &acked {
        let stored = by_id[a["clientMsgId"].as_str().unwrap()];
        assert_eq!(
            stored["seq"], a["seq"],
            "every acknowledged send is at its seq"
        );
        assert_eq!(stored["body"], a["body"]);
        assert_eq!(stored["senderId"], a["senderId"]);
    }
    // createdAt never goes backwards within the conversation.
    let times: Vec<&str> = all
        .iter()
        .map(|m| m["createdAt"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Each sender's watermark moved with its newest message.
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    for m in &all {
        newest.insert(m["senderId"].as_str().unwrap(), m["seq"].as_u64().unwrap());
    }
    let reads = t.get(&format!("/conversations/{c}/reads"), &owner).await;
    for m in reads.body["members"].as_array().unwrap() {
        let user = m["userId"].as_str().unwrap();
        assert!(m["lastReadSeq"].as_u64().unwrap() >= newest[user], "{m}");
    }
    assert!(t.queued_sends(&c).await.is_empty(), "nothing left queued");

    // The last group commit's record (what queued sends learn their seq from) says what that
    // commit stored: the last seqs, each at its clientMsgId, at their time.
    let record = t
        .conversation_item(&c, "P!")
        .await
        .expect("a commit record");
    let n = |v: &AttributeValue| v.as_n().unwrap().parse::<u64>().unwrap();
    let sends = record["sends"].as_l().unwrap();
    assert!(!sends.is_empty());
    assert_eq!(n(&record["lastSeq"]), 64, "{record:?}");
    for (i, send) in sends.iter().enumerate() {
        let send = send.as_m().unwrap();
        let seq = 64 - (sends.len() - 1 - i) as u64;
        let stored = &all[seq as usize - 1];
        assert_eq!(n(&send["seq"]), seq, "{record:?}");
        assert_eq!(
            send["clientMsgKey"].as_s().unwrap(),
            stored["clientMsgId"].as_str().unwrap(),
            "{record:?}"
        );
        assert_eq!(
            record["createdAt"].as_s().unwrap(),
            stored["createdAt"].as_str().unwrap()
        );
    }
}

/// A 429 means nothing happened, then or later: a queued send whose request ends without its
/// message (here: its reads of the queue throttled until its deadline) withdraws its queued
/// send, so the next group commit does not commit it as a new message.
#[tokio::test]
async fn a_queued_send_answered_429_is_never_committed_later() {
    let _exclusive = SETTINGS.write().await;
    if server::dynamodb_partitions().is_none() {
        eprintln!("skipped: DynamoDB faults need the strictness layer (on unless CHAT_STRICT=off)");
        return;
    }
    let t = TestApp::custom(Duration::from_millis(700), None).await;
    let (a, b, c) = t.new_group().await;
    t.mark_busy(&c).await;
    server::dynamodb_faults(
        &json!({"op": "Query", "table": "ChatTable", "key": format!("C#{c}"),
                                    "kind": "ThrottlingException", "count": 100_000}),
    );
    let r = t.send(&c, &a, "answered 429").await;
    server::clear_dynamodb_faults();
    assert_eq!((r.status, r.code()), (429, "throttled"), "{r:?}");
    assert!(
        t.queued_sends(&c).await.is_empty(),
        "its queued send was withdrawn"
    );

    let next = t.send(&c, &b, "the next group commit").await;
    assert_sent(&next, 201, 1);
    let all = history(&t, &c, &a).await;
    let bodies: Vec<&str> = all.iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["the next group commit"], "no ghost of the 429");
}

/// A queued send whose request's lifetime is over (it crashed, or answered without it) is never
/// committed, however long it stayed: the commit's condition refuses it, and the commit removes it.
#[tokio::test]
async fn a_queued_send_past_its_requests_lifetime_is_never_committed() {
    let _shared = SETTINGS.read().await;
    let t = TestApp::new().await;
    let (a, b, c) = t.new_group().await;
    queue_ended_send(&t, &c, &new_uuid(), &b, "from weeks ago", 1, 1).await;
    t.mark_busy(&c).await;
    let r = t.send(&c, &a, "now").await;
    assert_sent(&r, 201, 1);
    let all = history(&t, &c, &a).await;
    assert_eq!(all.len(), 1, "only the live send: {all:?}");
    assert_eq!(all[0]["body"], "now");
    assert!(
        t.queued_sends(&c).await.is_empty(),
        "the dead one was removed"
    );
}

#[tokio::test]
async fn a_queued_send_of_a_removed_member_is_dropped() {
    let _shared = SETTINGS.read().await;
    let t = TestApp::new().await;
    let (owner, gone, stays) = (unique("o"), unique("gone"), unique("stays"));
    let c = t.group(&owner, &[&gone, &stays]).await;
    // A send of `gone` waiting in the queue (its request ended: nobody else will commit it).
    let live = in_a_minute();
    queue_ended_send(
        &t,
        &c,
        &new_uuid(),
        &gone,
        "sent just before leaving",
        1,
        live,
    )
    .await;
    let r = t.remove_member(&c, &owner, &gone).await;
    assert_eq!(r.status, 204);

    t.mark_busy(&c).await;
    let r = t.send(&c, &stays, "still here").await;
    assert_sent(&r, 201, 1);
    let all = history(&t, &c, &owner).await;
    assert_eq!(
        all.len(),
        1,
        "nothing of the removed member is stored: {all:?}"
    );
    assert_eq!(all[0]["senderId"], stays.as_str());
    assert!(
        t.queued_sends(&c).await.is_empty(),
        "its queued send was dropped"
    );
}

#[tokio::test]
async fn a_queued_send_past_the_first_megabyte_of_the_queue_finds_itself() {
    let _shared = SETTINGS.read().await;
    let t = TestApp::new().await;
    let (a, b, c) = t.new_group().await;
    // 70 queued sends of 16,000 bytes each (more than one 1 MB page of the queue), all sorting
    // before the send below and all queued after it (their requests have ended).
    let body = "😀".repeat(4000);
    for i in 0..70 {
        let id = format!("00000000-0000-4000-8000-{i:012}");
        queue_ended_send(&t, &c, &id, &b, &body, u64::MAX, in_a_minute()).await;
    }
    t.mark_busy(&c).await;
    let last = "ffffffff-ffff-4fff-bfff-ffffffffffff";
    let r = t.send_with_id(&c, &a, last, "last in sk order").await;
    assert_sent(&r, 201, 1);
}

#[tokio::test]
async fn replays_of_a_queued_send_create_one_message() {
    let _shared = SETTINGS.read().await;
    let t = Arc::new(TestApp::new().await);
    let (a, b, c) = t.new_group().await;
    t.send(&c, &b, "before").await;
    t.mark_busy(&c).await;
    let id = new_uuid();
    let results: Vec<Resp> = at_once((0..6).map(|_| {
        let (t, c, a, id) = (t.clone(), c.clone(), a.clone(), id.clone());
        async move { t.send_with_id(&c, &a, &id, "once").await }
    }))
    .await;
    let mut statuses: Vec<u16> = results.iter().map(|r| r.status).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 201], "{results:?}");
    assert!(results.iter().all(|r| r.body["seq"] == 2));
    assert_eq!(history(&t, &c, &a).await.len(), 2);
    // And after the commit: the original, again.
    let again = t.send_with_id(&c, &a, &id, "once").await;
    assert_sent(&again, 200, 2);
}

/// A client that timed out resends its message; in a busy conversation the resend is queued
/// unless its key is read first (found by probing: every send of a hot group sent three times at
/// once cost 20 times the writes of the sends alone: each late resend queued its send again, and
/// the commit that took it was cancelled for its key, with every other send of its batch).
#[tokio::test]
async fn a_resend_of_a_committed_send_in_a_busy_conversation_is_answered_from_its_key() {
    let _shared = SETTINGS.read().await;
    let t = Arc::new(TestApp::new().await);
    let (a, _b, c) = t.new_group().await;
    t.mark_busy(&c).await;
    let id = new_uuid();
    assert_sent(&t.send_with_id(&c, &a, &id, "once").await, 201, 1);
    t.calls.take();
    let again = t.send_with_id(&c, &a, &id, "once").await;
    assert_sent(&again, 200, 1);
    let calls = t.calls.take();
    assert!(
        !calls
            .iter()
            .any(|c| c == "PutItem" || c == "TransactWriteItems"),
        "the resend wrote: {calls:?}"
    );
    assert!(t.queued_sends(&c).await.is_empty(), "nothing queued");
    let other = t.send_with_id(&c, &a, &id, "another body").await;
    assert_eq!(other.status, 409, "{other:?}");
    assert_eq!(history(&t, &c, &a).await.len(), 1);
}

#[tokio::test]
async fn another_body_under_a_queued_clientmsgid_is_a_conflict() {
    let _shared = SETTINGS.read().await;
    let t = Arc::new(TestApp::new().await);
    let (a, _, c) = t.new_group().await;
    t.mark_busy(&c).await;
    let id = new_uuid();
    let results: Vec<Resp> = at_once(["first body", "second body"].map(|body| {
        let (t, c, a, id) = (t.clone(), c.clone(), a.clone(), id.clone());
        async move { t.send_with_id(&c, &a, &id, body).await }
    }))
    .await;
    let mut outcome: Vec<(u16, &str)> = results.iter().map(|r| (r.status, r.code())).collect();
    outcome.sort();
    assert_eq!(outcome, [(201, ""), (409, "conflict")], "{results:?}");
    let all = history(&t, &c, &a).await;
    assert_eq!(all.len(), 1);
    let winner = results.iter().find(|r| r.status == 201).unwrap();
    assert_eq!(all[0]["body"], winner.body["body"]);
}

/// A member is added while sends keep the conversation busy. Its read of the members is slowed
/// (the layer's `slow` fault on the member partition's Query), so commits land between that read
/// and its transaction every time: the lost attempt learns the conversation as it now is from the
/// cancellation and tries again at once, instead of reading again and losing to the next commit
/// until its deadline. The new member starts at a `lastSeq` the conversation had meanwhile.
#[tokio::test]
async fn members_are_added_while_sends_keep_the_conversation_busy() {
    let _exclusive = SETTINGS.write().await;
    if server::dynamodb_partitions().is_none() {
        eprintln!("skipped: DynamoDB faults need the strictness layer (on unless CHAT_STRICT=off)");
        return;
    }
    let t = Arc::new(TestApp::new().await);
    let owner = unique("o");
    let senders: Vec<String> = (0..8).map(|i| format!("{owner}-s{i}")).collect();
    let c = t.group(&owner, &senders).await;
    let adding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let tasks = senders.iter().cloned().map(|user| {
        let (t, c, adding) = (t.clone(), c.clone(), adding.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while adding.load(Ordering::SeqCst) {
                let r = send_like_a_client(&t, &c, &user, &format!("{user} #{sent}")).await;
                assert_eq!(r.status, 201, "{r:?}");
                sent += 1;
            }
        })
    });
    let senders = futures::future::join_all(tasks);
    let adds = async {
        let last_seq = || async {
            let r = t
                .get(&format!("/conversations/{c}/messages?limit=1"), &owner)
                .await;
            r.body["lastSeq"].as_u64().unwrap()
        };
        while last_seq().await < 5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let id = chat_domain::ConversationId::parse(&c).unwrap();
        for pk in chat_store::keys::members_pks(&id) {
            server::dynamodb_faults(&json!({"op": "Query", "table": "ChatTable",
                "key": pk, "kind": "slow", "delayMs": 300, "count": 100_000}));
        }
        let mut joined = vec![];
        for i in 0..3 {
            let joining = format!("{owner}-new{i}");
            let before = last_seq().await;
            let r = t.add_members(&c, &owner, json!([joining])).await;
            assert_eq!(r.status, 200, "added while busy: {r:?}");
            joined.push((joining, before, last_seq().await));
        }
        server::clear_dynamodb_faults();
        adding.store(false, Ordering::SeqCst);
        joined
    };
    let (joined, senders) = futures::join!(adds, senders);
    assert!(senders.into_iter().all(|r| r.is_ok()));
    let reads = t.get(&format!("/conversations/{c}/reads"), &owner).await;
    let watermark = |user: &str| {
        reads.body["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["userId"] == user)
            .expect("a new member")["lastReadSeq"]
            .as_u64()
            .unwrap()
    };
    for (user, before, after) in &joined {
        assert!(
            after > before,
            "sends were committed during the addition of {user}"
        );
        let at = watermark(user);
        assert!(
            (before..=after).contains(&&at),
            "{before} <= {at} <= {after}"
        );
    }
}

#[tokio::test]
async fn read_receipts_go_through_while_the_conversation_is_busy() {
    let _shared = SETTINGS.read().await;
    let t = Arc::new(TestApp::new().await);
    let owner = unique("o");
    let readers: Vec<String> = (0..6).map(|i| format!("{owner}-r{i}")).collect();
    let c = t.group(&owner, &readers).await;
    let sends = (0..8).map(|i| {
        let (t, c, owner) = (t.clone(), c.clone(), owner.clone());
        async move { send_like_a_client(&t, &c, &owner, &format!("{i}")).await }
    });
    let receipts = readers.iter().cloned().map(|r| {
        let (t, c) = (t.clone(), c.clone());
        async move {
            let mut statuses = vec![];
            for seq in 1..=8 {
                statuses.push(t.mark_read(&c, &r, seq).await.status);
            }
            statuses
        }
    });
    let (sent, read) = futures::join!(at_once(sends), at_once(receipts));
    assert!(sent.into_iter().all(|r| r.status == 201));
    for statuses in read {
        assert!(statuses.iter().all(|s| *s == 200), "never 429");
    }
    // Each reader's watermark is at most lastSeq and at least what it last asked for, clamped.
    let states = t.get(&format!("/conversations/{c}/reads"), &owner).await;
    let last_seq = states.body["lastSeq"].as_u64().unwrap();
    assert_eq!(last_seq, 8);
    for m in states.body["members"].as_array().unwrap() {
        assert!(m["lastReadSeq"].as_u64().unwrap() <= last_seq);
    }
}

#[tokio::test]
async fn a_send_that_cannot_commit_in_time_answers_429_and_leaves_nothing() {
    let _exclusive = SETTINGS.write().await;
    let t = Arc::new(TestApp::custom(Duration::from_millis(700), None).await);
    let (a, b, c) = t.new_group().await;
    // Every commit holds the conversation item for 3 s: the next send cannot get at it.
    let before = server::emulator_settings(&json!({"txWindowMs": 3000}));
    let first = {
        let (t, c, a) = (t.clone(), c.clone(), a.clone());
        tokio::spawn(async move { t.send(&c, &a, "holds the item").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let id = new_uuid();
    let late = t.send_with_id(&c, &b, &id, "too late").await;
    let took = started.elapsed();
    assert_eq!(first.await.unwrap().status, 201);
    server::emulator_settings(&before);
    assert_eq!((late.status, late.code()), (429, "throttled"), "{late:?}");
    assert_eq!(
        late.headers.get("retry-after").map(String::as_str),
        Some("1")
    );
    assert!(
        took < Duration::from_millis(2500),
        "answered near its deadline: {took:?}"
    );
    assert!(
        t.queued_sends(&c).await.is_empty(),
        "its queued send was withdrawn"
    );
    let all = history(&t, &c, &a).await;
    assert_eq!(all.len(), 1, "nothing of the late send is stored");
    // The client's retry goes through once the item is free.
    let retry = t.send_with_id(&c, &b, &id, "too late").await;
    assert_sent(&retry, 201, 2);
}

#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_settled_with_its_token() {
    let _shared = SETTINGS.read().await;
    let setup = TestApp::new().await;
    let (a, b, c) = setup.new_direct().await;
    // Loses the answer of the first `TransactWriteItems` after DynamoDB applied it.
    let first = AtomicBool::new(true);
    let lose = TransactionAnswers::through(move |answer| {
        if answer.status().is_success() && first.swap(false, Ordering::SeqCst) {
            return Err("the answer was lost on the way back".into());
        }
        Ok(())
    });
    let t = TestApp::custom(Timeouts::LOCAL.request_budget, Some(lose)).await;
    let r = t.send(&c, &a, "applied, answer lost").await;
    assert_sent(&r, 201, 1);
    let calls = t.calls.take();
    assert_eq!(
        calls.iter().filter(|c| *c == "TransactWriteItems").count(),
        2,
        "sent again with the same token: {calls:?}"
    );
    let next = t.send(&c, &b, "next").await;
    assert_eq!(next.body["seq"], 2, "no gap, no duplicate");
    assert_eq!(history(&t, &c, &a).await.len(), 2);
}

/// Shows the first conversation read one message behind (`lastSeq` 1 as 0), so that the send
/// built on it loses the race for the conversation item, deterministically.
#[derive(Debug)]
struct StaleFirstRead(AtomicUsize);

impl Intercept for StaleFirstRead {
    fn name(&self) -> &'static str {
        "StaleFirstRead"
    }

    fn modify_before_completion(
        &self,
        ctx: &mut aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextMut<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let Some(Ok(output)) = ctx.output_or_error_mut() else {
            return Ok(());
        };
        let Some(read) =
            output.downcast_mut::<aws_sdk_dynamodb::operation::get_item::GetItemOutput>()
        else {
            return Ok(());
        };
        let Some(item) = read.item.as_mut() else {
            return Ok(());
        };
        if item.get("lastSeq") == Some(&AttributeValue::N("1".into()))
            && self.0.fetch_sub(1, Ordering::SeqCst) == 1
        {
            item.insert("lastSeq".into(), AttributeValue::N("0".into()));
        }
        Ok(())
    }
}

/// The conversation item's `busyUntil` (unix ms), if any.
async fn busy_until(t: &TestApp, conversation: &str) -> Option<u64> {
    t.conversation_item(conversation, "C")
        .await?
        .get("busyUntil")?
        .as_n()
        .ok()?
        .parse()
        .ok()
}

#[tokio::test]
async fn the_first_send_to_lose_the_race_marks_the_conversation_busy() {
    let _shared = SETTINGS.read().await;
    let setup = TestApp::new().await;
    let (a, b, c) = setup.new_direct().await;
    assert_eq!(setup.send(&c, &b, "first").await.status, 201);
    assert_eq!(busy_until(&setup, &c).await, None, "alone: not busy");

    let stale = SharedInterceptor::new(StaleFirstRead(AtomicUsize::new(1)));
    let t = TestApp::custom(Timeouts::LOCAL.request_budget, Some(stale)).await;
    let r = t.send(&c, &a, "lost the race").await;
    assert_sent(&r, 201, 2);
    let calls = t.calls.take();
    assert!(
        calls.contains(&"UpdateItem".to_owned()) && calls.contains(&"PutItem".to_owned()),
        "marked busy, then queued: {calls:?}"
    );
    let now = chat_domain::time::unix_millis(chat_domain::time::now());
    let until = busy_until(&t, &c).await.expect("marked busy");
    assert!(until > now, "new sends queue for a while: {until} vs {now}");
    // Its own commit carried one send: it does not extend the mark (contention is over).
    assert!(until <= now + 5_000);
    let next = setup.send(&c, &b, "queued behind").await;
    assert_eq!(next.body["seq"], 3, "no gap");
    assert_eq!(history(&setup, &c, &a).await.len(), 3);
}
