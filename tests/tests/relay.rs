//! The relay against the emulator's Kinesis with refused PutRecords entries injected
//! (infra/moto_server.py, `/moto-api/chat/faults`), as a throttled stream refuses them.
//!
//! Its own test binary, so its emulator has no other Kinesis writer (no gateway's pipeline) that
//! could use up the injected failures; its tests take turns, since the injection is emulator-wide.
//!
//! Also: replaying the relay's failure queue (infra/replay_failures.py) against the emulator and
//! the local gateway's Lambda Invoke API.

use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use chat_tests::push::{chat_config, gateway_config, read_record};
use chat_tests::server::{self, inject_kinesis_put_failures, sqs};
use chat_tests::{indexer, TestApp};
use serde_json::{json, Value};

/// One test at a time: injected failures are emulator-wide.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Kinesis client as `config`'s (the relay's, or the test's own to read what it put).
async fn kinesis_of(mut config: chat_store::Config) -> aws_sdk_kinesis::Client {
    config.kinesis_endpoint = Some(server::kinesis_endpoint());
    let sdk = config.sdk_config().await;
    config.kinesis_client(&sdk)
}

async fn kinesis() -> aws_sdk_kinesis::Client {
    kinesis_of(chat_config()).await
}

/// Each read event in its own Kinesis record: a conversation's events take several rounds.
async fn relay(budget: Duration) -> relay::Relay {
    let config = chat_config().for_function("relay");
    let sdk = config.sdk_config().await;
    relay::Relay::new(
        kinesis_of(config.clone()).await,
        config.event_stream.clone(),
        config.chat_store(&sdk),
    )
    .with_max_record_bytes(200)
    .with_retry_budget(budget)
}

/// `(conversation, user)` of each read event in the Lambda event, in order.
fn stream_event(reads: &[(&str, &str)], first_sequence: u64) -> (DynamoDbEvent, Vec<String>) {
    let records: Vec<Value> = reads
        .iter()
        .enumerate()
        .map(|(i, (c, u))| read_record(&(first_sequence + i as u64).to_string(), c, u, 0, 1))
        .collect();
    let sequences = records
        .iter()
        .map(|r| r["dynamodb"]["SequenceNumber"].as_str().unwrap().to_owned())
        .collect();
    let event = serde_json::from_value(json!({ "Records": records })).unwrap();
    (event, sequences)
}

/// The users of the `read.updated` events in Kinesis for this conversation, in stream order.
async fn in_kinesis(kinesis: &aws_sdk_kinesis::Client, conversation: &str) -> Vec<String> {
    events_in_kinesis(kinesis, conversation)
        .await
        .iter()
        .map(|e| e["userId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The events in Kinesis for this conversation, in stream order.
async fn events_in_kinesis(kinesis: &aws_sdk_kinesis::Client, conversation: &str) -> Vec<Value> {
    let stream = chat_config().event_stream;
    let records = local_gateway::kinesis_lambda_records(kinesis.clone(), &stream, "us-east-1")
        .await
        .unwrap();
    let mut events = Vec::new();
    for r in records {
        let r: KinesisEventRecord = serde_json::from_value(r).unwrap();
        if r.kinesis.partition_key != conversation {
            continue;
        }
        let batch: Value = serde_json::from_slice(&r.kinesis.data.0).unwrap();
        events.extend(batch["events"].as_array().unwrap().iter().cloned());
    }
    events
}

fn conversation() -> String {
    format!("g-{}", uuid::Uuid::new_v4().simple())
}

fn failures(response: &aws_lambda_events::event::streams::DynamoDbEventResponse) -> Value {
    serde_json::to_value(response).unwrap()["batchItemFailures"].clone()
}

#[tokio::test]
async fn refused_entries_are_put_again_in_order_and_reported_only_after_the_budget() {
    let _turn = TURN.lock().await;
    let kinesis = kinesis().await;

    // 1. A burst of refusals: retried in-process, every record put once, each conversation in order.
    let (x, y) = (conversation(), conversation());
    let reads = [
        (x.as_str(), "x1"),
        (y.as_str(), "y1"),
        (x.as_str(), "x2"),
        (x.as_str(), "x3"),
        (y.as_str(), "y2"),
        (x.as_str(), "x4"),
        (x.as_str(), "x5"),
        (y.as_str(), "y3"),
        (x.as_str(), "x6"),
    ];
    let (event, _) = stream_event(&reads, 3_000_000_000_000_000_000);
    // Round 1 is [x1, y1]: refused twice, then y1 goes and x1 is refused once more.
    assert_eq!(inject_kinesis_put_failures(5), 5);
    let response = relay(relay::PUT_RETRY_BUDGET).await.handle(event).await;
    assert_eq!(
        failures(&response),
        json!([]),
        "nothing left for Lambda to redeliver"
    );
    assert_eq!(
        inject_kinesis_put_failures(0),
        0,
        "the refusals were all served"
    );
    assert_eq!(
        in_kinesis(&kinesis, &x).await,
        ["x1", "x2", "x3", "x4", "x5", "x6"],
        "each once, in order"
    );
    assert_eq!(in_kinesis(&kinesis, &y).await, ["y1", "y2", "y3"]);

    // 2. Refused beyond the budget: the earliest stream record of a refused entry is reported,
    // and none of that conversation's later records is put ahead of it.
    let (z, w) = (conversation(), conversation());
    let reads = [
        (w.as_str(), "w1"),
        (z.as_str(), "z1"),
        (z.as_str(), "z2"),
        (w.as_str(), "w2"),
    ];
    let (event, sequences) = stream_event(&reads, 3_000_000_000_000_000_100);
    inject_kinesis_put_failures(1_000);
    let response = relay(Duration::from_millis(300)).await.handle(event).await;
    inject_kinesis_put_failures(0);
    assert_eq!(
        failures(&response),
        json!([{ "itemIdentifier": sequences[0] }]),
        "the earliest record behind a refused entry"
    );
    assert!(in_kinesis(&kinesis, &z).await.is_empty());
    assert!(in_kinesis(&kinesis, &w).await.is_empty());
    // Lambda redelivers from there: now everything goes, in order.
    let (event, _) = stream_event(&reads, 3_000_000_000_000_000_100);
    let response = relay(relay::PUT_RETRY_BUDGET).await.handle(event).await;
    assert_eq!(failures(&response), json!([]));
    assert_eq!(in_kinesis(&kinesis, &z).await, ["z1", "z2"]);
    assert_eq!(in_kinesis(&kinesis, &w).await, ["w1", "w2"]);
}

/// The chat table stream's records of one conversation: (shard, sequence numbers), in order.
async fn stream_records_of(conversation: &str) -> (String, String, Vec<String>) {
    let config = chat_config();
    let sdk = config.sdk_config().await;
    let db = config.dynamodb_client(&sdk);
    let streams = aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
            .endpoint_url(config.dynamodb_endpoint.clone().unwrap())
            .build(),
    );
    let (arn, shards) = indexer::stream_shards(&db, &streams, &config.chat_table).await;
    let shard = shards[0].shard_id().unwrap().to_owned();
    let mut iterator = indexer::shard_iterator(&streams, &arn, &shard, None).await;
    let pk = format!("C#{conversation}");
    let mut sequences = Vec::new();
    loop {
        let (records, next) = indexer::records_at(&streams, &iterator, 1_000).await;
        for r in &records {
            let change = r.dynamodb().unwrap();
            let key = change.keys().unwrap()["pk"].as_s().unwrap();
            if *key == pk {
                sequences.push(change.sequence_number().unwrap().to_owned());
            }
        }
        match next {
            Some(next) if !records.is_empty() => iterator = next,
            _ => break,
        }
    }
    (arn, shard, sequences)
}

#[tokio::test]
async fn what_reaches_the_failure_queue_is_replayed_with_the_documented_command() {
    let _turn = TURN.lock().await;
    let t = TestApp::new().await;
    let (a, _, conv) = t.new_direct().await;
    for i in 1..=3 {
        assert_eq!(t.send(&conv, &a, &format!("m{i}")).await.status, 201);
    }
    // What Lambda sends to the on-failure destination when a batch's retries ran out.
    let (arn, shard, sequences) = stream_records_of(&conv).await;
    assert!(
        sequences.len() >= 4,
        "creation and three sends: {sequences:?}"
    );
    let failure = json!({
        "requestContext": {"requestId": uuid::Uuid::new_v4().to_string(),
                           "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:relay",
                           "condition": "RecordAgeExceeded", "approximateInvokeCount": 3},
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": null},
        "version": "1.0", "timestamp": "2026-11-30T10:00:00.000Z",
        "DDBStreamBatchInfo": {
            "shardId": shard, "startSequenceNumber": sequences[0],
            "endSequenceNumber": sequences.last().unwrap(), "batchSize": sequences.len(),
            "approximateArrivalOfFirstRecord": "2026-11-30T09:59:00Z",
            "approximateArrivalOfLastRecord": "2026-11-30T09:59:01Z", "streamArn": arn,
        },
    });
    let queue = sqs("GetQueueUrl", json!({"QueueName": "RelayFailureQueue"}))["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    sqs(
        "SendMessage",
        json!({"QueueUrl": queue, "MessageBody": failure.to_string()}),
    );
    // A fanout failure (pushes are not replayed): it stays, and the command says so.
    let push = json!({"KinesisBatchInfo": {"shardId": "shardId-000000000000"}});
    sqs(
        "SendMessage",
        json!({"QueueUrl": queue, "MessageBody": push.to_string()}),
    );
    // A range whose end the stream does not reach (yet): it stays, rather than being replayed in
    // part and deleted as done.
    let mut unreached = failure.clone();
    let info = &mut unreached["DDBStreamBatchInfo"];
    let last: u128 = sequences.last().unwrap().parse().unwrap();
    info["endSequenceNumber"] = json!((last + 1_000_000_000).to_string());
    sqs(
        "SendMessage",
        json!({"QueueUrl": queue, "MessageBody": unreached.to_string()}),
    );

    // The local gateway serves the Lambda Invoke API for the relay (no pipeline: nothing else
    // writes to Kinesis here).
    let mut config = gateway_config();
    config.pipeline = None;
    let gw = local_gateway::Gateway::start(config).await.unwrap();
    let script = server::workspace_root().join("infra/replay_failures.py");
    let (queue_url, lambda) = (queue.clone(), gw.lambda_url.clone());
    // Off the test's runtime thread, which serves the gateway meanwhile.
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(server::python())
            .arg(script)
            .args(["--queue-url", &queue_url, "--function", "relay"])
            .args(["--sqs-endpoint", &server::kinesis_endpoint()])
            .args(["--streams-endpoint", &server::dynamodb_endpoint()])
            .args(["--lambda-endpoint", &lambda, "--range-timeout", "3"])
            .output()
            .expect("run infra/replay_failures.py")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        run.status.code(),
        Some(1),
        "two messages stay: {stdout}\n{stderr}"
    );
    assert!(stdout.contains("replayed 1, kept 2"), "{stdout}\n{stderr}");
    assert!(stdout.contains("pushes are not replayed"), "{stdout}");
    assert!(stdout.contains("did not give the whole range"), "{stdout}");

    let kinesis = kinesis().await;
    let seqs: Vec<u64> = events_in_kinesis(&kinesis, &conv)
        .await
        .iter()
        .filter(|e| e["type"] == "message.new")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3], "the three messages, once each, in order");
    let left = sqs(
        "ReceiveMessage",
        json!({"QueueUrl": queue, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}),
    );
    let left = left["Messages"].as_array().cloned().unwrap_or_default();
    let mut kinds: Vec<bool> = left
        .iter()
        .map(|m| m["Body"].as_str().unwrap().contains("KinesisBatchInfo"))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [false, true],
        "only the unreplayable messages are left: {left:?}"
    );
    gw.shutdown().await;
}
