//! The relay against the emulator's Kinesis with refused PutRecords entries injected
//! (infra/moto_server.py, `/moto-api/chat/faults`), as a throttled stream refuses them.
//!
//! Its own test binary, so its emulator has no other Kinesis writer (no gateway's relay) that
//! could use up the injected failures; and one test, since the injection is emulator-wide.

use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use chat_tests::push::{chat_config, read_record};
use chat_tests::server::inject_kinesis_put_failures;
use serde_json::{json, Value};

async fn kinesis() -> aws_sdk_kinesis::Client {
    let mut config = chat_config();
    config.kinesis_endpoint = config.dynamodb_endpoint.clone();
    let sdk = config.sdk_config().await;
    config.kinesis_client(&sdk)
}

/// Each read event in its own Kinesis record: a conversation's events take several rounds.
async fn relay(budget: Duration) -> relay::Relay {
    let config = chat_config();
    let sdk = config.sdk_config().await;
    relay::Relay::new(
        kinesis().await,
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
    let stream = chat_config().event_stream;
    let shards = kinesis
        .list_shards()
        .stream_name(&stream)
        .send()
        .await
        .unwrap();
    let mut users = Vec::new();
    for shard in shards.shards() {
        let mut iterator = kinesis
            .get_shard_iterator()
            .stream_name(&stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        loop {
            let page = kinesis
                .get_records()
                .shard_iterator(&iterator)
                .send()
                .await
                .unwrap();
            for r in page.records() {
                if r.partition_key() != Some(conversation) {
                    continue;
                }
                let batch: Value = serde_json::from_slice(r.data().as_ref()).unwrap();
                for e in batch["events"].as_array().unwrap() {
                    users.push(e["userId"].as_str().unwrap().to_owned());
                }
            }
            match page.next_shard_iterator() {
                Some(next) if !page.records().is_empty() => iterator = next.to_owned(),
                _ => break,
            }
        }
    }
    users
}

fn conversation() -> String {
    format!("g-{}", uuid::Uuid::new_v4().simple())
}

fn failures(response: &aws_lambda_events::event::streams::DynamoDbEventResponse) -> Value {
    serde_json::to_value(response).unwrap()["batchItemFailures"].clone()
}

#[tokio::test]
async fn refused_entries_are_put_again_in_order_and_reported_only_after_the_budget() {
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
