//! The inbox indexer for the API tests, which run the REST handlers without the event pipeline:
//! the real handler (`inbox_index::InboxIndex`) fed with the emulator's DynamoDB stream, read with
//! the SDK the way the local gateway's mapping reads it (one consumer per test binary, in stream
//! order, Lambda's event shape).
//!
//! Nothing moves inbox entries until a test calls `TestApp::index`, which brings the index up to
//! date with everything written so far (by any test of the binary, as the deployed indexer would).
//! So a test controls the lag: before `index` every entry sits where its conversation's creation
//! or join filed it, however many messages came since; `hold` keeps other tests from indexing
//! while a test looks at a lagging index.

use std::collections::HashMap;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use chat_store::ChatStore;
use inbox_index::InboxIndex;
use serde_json::{json, Value};
use tokio::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Records per handler invocation (template.yaml: BatchSize 100).
pub const BATCH: i32 = 100;

/// Per shard, the sequence number of the last record handed to the indexer.
static READ_UP_TO: Mutex<Option<HashMap<String, String>>> = Mutex::const_new(None);
/// `index` takes it exclusively; `hold` shares it.
static GATE: RwLock<()> = RwLock::const_new(());

/// While held, no test of this binary moves inbox entries (do not call `index` meanwhile).
pub async fn hold() -> RwLockReadGuard<'static, ()> {
    GATE.read().await
}

/// While held, only its holder moves inbox entries (`TestApp::index_exclusively`): what it
/// writes and then indexes is indexed by it, so its call log has the indexer's calls.
pub struct Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

pub async fn exclusive() -> Exclusive {
    Exclusive(GATE.write().await)
}

/// What one catch-up did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Indexed {
    pub records: usize,
    pub invocations: usize,
}

/// The table's current stream: its ARN and its shards.
pub async fn stream_shards(
    db: &aws_sdk_dynamodb::Client,
    streams: &aws_sdk_dynamodbstreams::Client,
    table: &str,
) -> (String, Vec<aws_sdk_dynamodbstreams::types::Shard>) {
    let arn = db
        .describe_table()
        .table_name(table)
        .send()
        .await
        .expect("DescribeTable")
        .table()
        .and_then(|t| t.latest_stream_arn())
        .expect("the chat table has a stream")
        .to_owned();
    let shards = streams
        .describe_stream()
        .stream_arn(&arn)
        .send()
        .await
        .expect("DescribeStream")
        .stream_description()
        .map(|d| d.shards().to_vec())
        .unwrap_or_default();
    (arn, shards)
}

/// An iterator of `shard` of the stream `arn`: after the sequence number `after`, else from the
/// shard's trim horizon.
pub async fn shard_iterator(
    streams: &aws_sdk_dynamodbstreams::Client,
    arn: &str,
    shard: &str,
    after: Option<&str>,
) -> String {
    let request = streams.get_shard_iterator().stream_arn(arn).shard_id(shard);
    let request = match after {
        Some(seq) => request
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq),
        None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    request
        .send()
        .await
        .expect("GetShardIterator")
        .shard_iterator
        .expect("a shard iterator")
}

/// The page of at most `limit` records at `iterator`, and the shard's next iterator (None: the
/// shard is closed and read to its end).
pub async fn records_at(
    streams: &aws_sdk_dynamodbstreams::Client,
    iterator: &str,
    limit: i32,
) -> (Vec<aws_sdk_dynamodbstreams::types::Record>, Option<String>) {
    let page = streams
        .get_records()
        .shard_iterator(iterator)
        .limit(limit)
        .send()
        .await
        .expect("GetRecords");
    (page.records.unwrap_or_default(), page.next_shard_iterator)
}

/// Reads the chat table's stream from where the last catch-up stopped to its end and hands it to
/// the indexer in batches of at most `batch` records, as Lambda would; a batch whose response
/// reports a failure is handed over again from the reported record (at most 10 times, then the
/// test fails). Only the holder of `Exclusive` indexes.
pub async fn catch_up(
    _gate: &Exclusive,
    db: &aws_sdk_dynamodb::Client,
    streams: &aws_sdk_dynamodbstreams::Client,
    store: &ChatStore,
    table: &str,
    batch: i32,
) -> Indexed {
    let mut read_up_to = READ_UP_TO.lock().await;
    let positions = read_up_to.get_or_insert_with(HashMap::new);
    let (arn, shards) = stream_shards(db, streams, table).await;
    let notifier = crate::notify::notifier_for(store).await;
    let indexer = InboxIndex::new(store.clone()).with_notifier(notifier);
    let mut done = Indexed::default();
    for shard in shards {
        let id = shard.shard_id().unwrap_or_default().to_owned();
        let after = positions.get(&id).map(String::as_str);
        let mut iterator = shard_iterator(streams, &arn, &id, after).await;
        loop {
            let (page, next) = records_at(streams, &iterator, batch).await;
            let records: Vec<(String, Value)> = page.iter().map(lambda_record).collect();
            if records.is_empty() {
                break;
            }
            done.records += records.len();
            done.invocations += deliver(&indexer, &records).await;
            positions.insert(id.clone(), records.last().unwrap().0.clone());
            match next {
                Some(next) => iterator = next,
                None => break,
            }
        }
    }
    done
}

/// Invokes the indexer until the whole batch is done; returns the number of invocations.
async fn deliver(indexer: &InboxIndex, records: &[(String, Value)]) -> usize {
    let mut from = 0;
    for invocation in 1..=10 {
        let batch: Vec<Value> = records[from..].iter().map(|(_, r)| r.clone()).collect();
        let event: DynamoDbEvent =
            serde_json::from_value(json!({ "Records": batch })).expect("a Lambda DynamoDB event");
        let response = indexer.handle(event).await;
        let Some(failed) = response.batch_item_failures.first() else {
            return invocation;
        };
        let id = failed.item_identifier.as_deref().unwrap_or_default();
        from = records
            .iter()
            .position(|(seq, _)| seq == id)
            .expect("the reported record is in the batch");
    }
    panic!("the inbox indexer failed the same batch 10 times");
}

/// `(sequence number, the record as the Lambda DynamoDB event carries it)`, as the local
/// gateway's stream mapping makes it.
fn lambda_record(r: &aws_sdk_dynamodbstreams::types::Record) -> (String, Value) {
    let arn = "arn:aws:dynamodb:us-east-1:000000000000:table/chat/stream/local";
    local_gateway::lambda_event_record(r, arn, "us-east-1").expect("a stream record")
}
