//! Push under faults that are ours, not the client's (docs/event-pipeline.md, "Fanout"): a
//! Management API answering `403`, `429` or `500` past the fanout's retries, a fanout read that
//! fails. The push is not dropped: Lambda's mapping delivers its record again; the connection's
//! record stays; nobody else gets it twice.
//!
//! Its own test binary (emulator and gateway): these tests make the mapping deliver records again,
//! which tests/tests/push.rs asserts does not happen around its own connections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::error::BoxError;
use chat_domain::events::policy::PUSH_ATTEMPTS;
use chat_domain::events::{Event, EventBatch};
use chat_domain::ConversationId;
use chat_store::telemetry::{BeforeTransmit, ReadBeforeTransmit};
use chat_store::{ChatStore, ConnectionStore};
use chat_tests::push::{
    bounded, chat_config, connected_direct, connection_ids, connection_store, first_seqs, gateway,
    register_a_minute_ago, WsClient,
};
use chat_tests::{server, unique, TestApp};
use serde_json::Value;

/// Time for an event to reach a client, redeliveries included.
const EVENT: Duration = Duration::from_secs(30);
/// How long to listen for an event that must not come.
const QUIET: Duration = Duration::from_millis(600);

/// `message.new` seqs of `conversation` in `events`, every arrival.
fn arrivals(events: &[Value], conversation: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["type"] == "message.new" && e["conversationId"] == conversation)
        .filter_map(|e| e["seq"].as_u64())
        .collect()
}

#[tokio::test]
async fn a_403_never_forgets_a_connection_and_its_push_comes_once_it_clears() {
    bounded(90, async {
        let store = connection_store().await;
        let gw = gateway();
        let (t, a, b, conv, mut wa) = connected_direct().await;
        let ids = connection_ids(&store, &a).await;
        register_a_minute_ago(&store, &a, &ids[0]).await;
        // Longer than one invocation's retries: as while IAM propagates after a deploy.
        gw.inject_post_failures(&ids[0], 403, PUSH_ATTEMPTS + 2);
        let (redeliveries, forgotten) = (
            gw.stats().fanout.redeliveries(),
            gw.fanout_stats().forgotten(),
        );

        assert_eq!(t.send(&conv, &b, "during the 403s").await.status, 201);
        let events = wa
            .until_quiet(EVENT, QUIET, |e| first_seqs(e, &conv) == [1])
            .await;
        assert_eq!(arrivals(&events, &conv), [1], "{events:#?}");
        assert_eq!(gw.pending_post_failures(&ids[0]), 0);
        assert!(
            gw.stats().fanout.redeliveries() > redeliveries,
            "its record was delivered again"
        );
        assert_eq!(gw.fanout_stats().forgotten(), forgotten);
        assert_eq!(connection_ids(&store, &a).await, ids, "a 403 is not a 410");
    })
    .await
}

/// A member whose connection answers `status` past one invocation's retries: it gets every
/// event once the fault clears (its record delivered again), the others each exactly once.
async fn a_failing_connection_gets_its_pushes_after_a_redelivery(status: u16) {
    let t = TestApp::new().await;
    let store = connection_store().await;
    let gw = gateway();
    let (owner, bad) = (unique("owner"), unique("bad"));
    let good: Vec<String> = (0..3).map(|i| unique(&format!("good{i}"))).collect();
    let mut members: Vec<&str> = good.iter().map(String::as_str).collect();
    members.push(&bad);
    let conv = t.group(&owner, &members).await;
    let mut clients = Vec::new();
    for user in &good {
        clients.push(WsClient::connect(user).await);
    }
    let mut bad_client = WsClient::connect(&bad).await;
    let bad_ids = connection_ids(&store, &bad).await;
    register_a_minute_ago(&store, &bad, &bad_ids[0]).await;
    gw.inject_post_failures(&bad_ids[0], status, PUSH_ATTEMPTS + 2);
    let redeliveries = gw.stats().fanout.redeliveries();

    for i in 1..=5 {
        assert_eq!(t.send(&conv, &owner, &format!("m{i}")).await.status, 201);
    }
    let events = bad_client
        .until(EVENT, |e| first_seqs(e, &conv).len() == 5)
        .await;
    assert_eq!(first_seqs(&events, &conv), [1, 2, 3, 4, 5], "in order");
    for client in &mut clients {
        let events = client
            .until_quiet(EVENT, QUIET, |e| first_seqs(e, &conv).len() == 5)
            .await;
        assert_eq!(
            arrivals(&events, &conv),
            [1, 2, 3, 4, 5],
            "exactly once, although the records came again"
        );
    }
    assert!(gw.stats().fanout.redeliveries() > redeliveries);
    assert_eq!(gw.stats().fanout.given_up(), 0, "nothing dropped");
    assert_eq!(connection_ids(&store, &bad).await, bad_ids, "kept");
}

#[tokio::test]
async fn a_connection_answering_500_past_its_retries_gets_every_push_and_nobody_else_twice() {
    bounded(
        90,
        a_failing_connection_gets_its_pushes_after_a_redelivery(500),
    )
    .await
}

#[tokio::test]
async fn a_connection_answering_429_past_its_retries_gets_every_push_and_nobody_else_twice() {
    bounded(
        90,
        a_failing_connection_gets_its_pushes_after_a_redelivery(429),
    )
    .await
}

/// Fails every DynamoDB request that names `pk` while `on` is set.
#[derive(Debug)]
struct FailReadsOf {
    pk: String,
    on: Arc<AtomicBool>,
}

impl ReadBeforeTransmit for FailReadsOf {
    const NAME: &'static str = "FailReadsOf";

    fn read(&self, request: &HttpRequest) -> Result<(), BoxError> {
        let body = request.body().bytes().unwrap_or_default();
        let names = String::from_utf8_lossy(body).contains(&self.pk);
        if names && self.on.load(Ordering::SeqCst) {
            return Err("injected: DynamoDB did not answer".into());
        }
        Ok(())
    }
}

/// A Kinesis record of `conversation` with one `message.new` at `seq`, as the mapping sends it.
fn record(sequence: &str, conversation: &str, seq: u64) -> KinesisEventRecord {
    let id = ConversationId::parse(conversation).unwrap();
    let batch = EventBatch {
        conversation_id: id.clone(),
        events: vec![Event::MessageNew {
            conversation_id: id,
            seq,
            sender_id: None,
            client_msg_id: None,
            body: None,
            created_at: None,
            version: None,
            edited_at: None,
            attachments: Vec::new(),
            origin: None,
        }],
    };
    let mut r = KinesisEventRecord::default();
    r.event_id = Some(format!("shardId-000000000000:{sequence}"));
    r.kinesis.sequence_number = sequence.to_owned();
    r.kinesis.partition_key = conversation.to_owned();
    r.kinesis.data.0 = serde_json::to_vec(&batch).unwrap();
    r
}

fn batch(records: &[&KinesisEventRecord]) -> KinesisEvent {
    let mut event = KinesisEvent::default();
    event.records = records.iter().map(|r| (*r).clone()).collect();
    event
}

#[tokio::test]
async fn a_failed_read_makes_only_what_failed_be_pushed_again() {
    bounded(60, async {
        let t = TestApp::new().await;
        let gw = gateway();
        let (a, b, c, d) = (unique("a"), unique("b"), unique("c"), unique("d"));
        let x = t.direct(&a, &b).await;
        let y = t.direct(&c, &d).await;
        let mut wb = WsClient::connect(&b).await;
        let mut wd = WsClient::connect(&d).await;

        // A fanout of our own, whose reads of conversation x fail while `failing` is set, posting
        // to the gateway's sockets.
        let failing = Arc::new(AtomicBool::new(true));
        let config = chat_config();
        let sdk = config.sdk_config().await;
        let db = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .endpoint_url(server::dynamodb_endpoint())
                .interceptor(BeforeTransmit(FailReadsOf {
                    pk: format!("C#{x}"),
                    on: failing.clone(),
                }))
                .build(),
        );
        let management = aws_sdk_apigatewaymanagement::Client::from_conf(
            aws_sdk_apigatewaymanagement::config::Builder::from(&sdk)
                .endpoint_url(&gw.management_url)
                .build(),
        );
        let fanout = fanout::Fanout::new(
            ChatStore::new(db.clone(), config.chat_table.clone()),
            ConnectionStore::new(db, config.connections_table.clone()),
            management,
        );

        let (y1, x1, y2) = (
            record("101", &y, 1),
            record("102", &x, 1),
            record("103", &y, 2),
        );
        let first = fanout.handle(batch(&[&y1, &x1, &y2])).await;
        let reported: Vec<Option<String>> = first
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone())
            .collect();
        assert_eq!(
            reported,
            [Some("102".to_owned())],
            "x's record, the earliest failed"
        );

        // Lambda resumes from x's record: y's second record comes again with it.
        failing.store(false, Ordering::SeqCst);
        let again = fanout.handle(batch(&[&x1, &y2])).await;
        assert!(again.batch_item_failures.is_empty());
        assert_eq!(
            fanout.stats().already_delivered(),
            1,
            "y's record was skipped"
        );

        let got_d = wd
            .until_quiet(Duration::from_secs(10), QUIET, |e| {
                arrivals(e, &y).len() == 2
            })
            .await;
        assert_eq!(
            arrivals(&got_d, &y),
            [1, 2],
            "y's events once each: {got_d:#?}"
        );
        let got_b = wb
            .until_quiet(Duration::from_secs(10), QUIET, |e| {
                arrivals(e, &x).len() == 1
            })
            .await;
        assert_eq!(arrivals(&got_b, &x), [1]);
    })
    .await
}
