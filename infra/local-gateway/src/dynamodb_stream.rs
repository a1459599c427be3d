//! The chat table's DynamoDB stream as a mapping source, with each record in the Lambda
//! DynamoDB event record shape (attribute values in DynamoDB JSON).

use aws_sdk_dynamodbstreams::types::{AttributeValue, Record as StreamRecord, ShardIteratorType};
use aws_sdk_dynamodbstreams::Client;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

use crate::mapping::{Page, Position, Record, Shard, Source};
use crate::{sdk_error, Error};

#[derive(Clone)]
pub(crate) struct TableStream {
    client: Client,
    arn: String,
    region: String,
    name: String,
}

impl TableStream {
    /// The table's current stream (DescribeTable → LatestStreamArn).
    pub(crate) async fn open(
        db: &aws_sdk_dynamodb::Client,
        client: Client,
        table: &str,
        region: String,
    ) -> Result<TableStream, Error> {
        let described = db
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(sdk_error("DescribeTable"))?;
        let arn = described
            .table()
            .and_then(|t| t.latest_stream_arn())
            .ok_or_else(|| format!("table {table} has no stream"))?
            .to_owned();
        Ok(TableStream {
            client,
            arn,
            region,
            name: format!("{table} stream"),
        })
    }
}

impl Source for TableStream {
    fn name(&self) -> &str {
        &self.name
    }

    async fn shards(&self) -> Result<Vec<Shard>, Error> {
        let mut shards = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_stream()
                .stream_arn(&self.arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .map_err(sdk_error("DescribeStream"))?;
            let Some(description) = out.stream_description() else {
                break;
            };
            for s in description.shards() {
                shards.push(Shard {
                    id: s.shard_id().unwrap_or_default().to_owned(),
                    parents: s.parent_shard_id().map(str::to_owned).into_iter().collect(),
                    closed: s
                        .sequence_number_range()
                        .and_then(|r| r.ending_sequence_number())
                        .is_some(),
                });
            }
            match description.last_evaluated_shard_id() {
                Some(last) => start = Some(last.to_owned()),
                None => break,
            }
        }
        Ok(shards)
    }

    async fn iterator(&self, shard: &str, at: &Position) -> Result<String, Error> {
        let request = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.arn)
            .shard_id(shard);
        let request = match at {
            Position::TrimHorizon => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            Position::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            Position::After(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
        };
        let out = request
            .send()
            .await
            .map_err(sdk_error("GetShardIterator"))?;
        Ok(out.shard_iterator().ok_or("no shard iterator")?.to_owned())
    }

    async fn read(&self, _shard: &str, iterator: &str, limit: usize) -> Result<Page, Error> {
        let out = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(limit.min(1000) as i32)
            .send()
            .await
            .map_err(sdk_error("GetRecords"))?;
        let records = out
            .records()
            .iter()
            .map(|r| lambda_record(r, &self.arn, &self.region))
            .collect::<Result<_, _>>()?;
        Ok(Page {
            records,
            next: out.next_shard_iterator().map(str::to_owned),
            behind: false,
        })
    }
}

/// A DynamoDB Streams record as the Lambda DynamoDB event carries it, with its sequence number
/// (the tests' own inbox indexer feeds the same records as the gateway's mapping).
pub fn lambda_event_record(
    r: &StreamRecord,
    arn: &str,
    region: &str,
) -> Result<(String, Value), Error> {
    lambda_record(r, arn, region).map(|r| (r.id, r.event))
}

/// A stream record as the Lambda DynamoDB event carries it.
fn lambda_record(r: &StreamRecord, arn: &str, region: &str) -> Result<Record, Error> {
    let change = r.dynamodb().ok_or("stream record without dynamodb")?;
    let sequence = change
        .sequence_number()
        .ok_or("stream record without SequenceNumber")?
        .to_owned();
    let mut dynamodb = Map::new();
    if let Some(t) = change.approximate_creation_date_time() {
        dynamodb.insert("ApproximateCreationDateTime".into(), json!(t.secs()));
    }
    for (name, image) in [
        ("Keys", change.keys()),
        ("NewImage", change.new_image()),
        ("OldImage", change.old_image()),
    ] {
        if let Some(image) = image {
            dynamodb.insert(name.into(), item(image));
        }
    }
    dynamodb.insert("SequenceNumber".into(), json!(sequence));
    dynamodb.insert("SizeBytes".into(), json!(change.size_bytes().unwrap_or(0)));
    if let Some(view) = change.stream_view_type() {
        dynamodb.insert("StreamViewType".into(), json!(view.as_str()));
    }
    let mut event = json!({
        "eventID": r.event_id(),
        "eventName": r.event_name().map(|n| n.as_str()),
        "eventVersion": r.event_version().unwrap_or("1.1"),
        "eventSource": "aws:dynamodb",
        "awsRegion": r.aws_region().unwrap_or(region),
        "eventSourceARN": arn,
        "dynamodb": dynamodb,
    });
    // Deletions by TTL say so.
    if let Some(who) = r.user_identity() {
        event["userIdentity"] = json!({"type": who.r#type(), "principalId": who.principal_id()});
    }
    Ok(Record {
        id: sequence,
        event,
    })
}

fn item(attributes: &HashMap<String, AttributeValue>) -> Value {
    Value::Object(
        attributes
            .iter()
            .map(|(k, v)| (k.clone(), attribute(v)))
            .collect(),
    )
}

/// DynamoDB JSON: `{"S":"x"}`, `{"N":"1"}`, `{"M":{…}}`, `{"L":[…]}`, binary as base64.
fn attribute(v: &AttributeValue) -> Value {
    let b64 = |b: &aws_sdk_dynamodbstreams::primitives::Blob| json!(STANDARD.encode(b.as_ref()));
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => json!({ "B": b64(b) }),
        AttributeValue::Ss(v) => json!({ "SS": v }),
        AttributeValue::Ns(v) => json!({ "NS": v }),
        AttributeValue::Bs(v) => json!({ "BS": v.iter().map(b64).collect::<Vec<_>>() }),
        AttributeValue::M(m) => json!({ "M": item(m) }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(attribute).collect::<Vec<_>>() }),
        AttributeValue::Null(b) => json!({ "NULL": b }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        // A type newer than this SDK: the event then fails to deserialize and the record is
        // retried and finally logged, not silently changed.
        _ => json!({ "UNKNOWN": format!("{v:?}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodbstreams::primitives::DateTime;
    use aws_sdk_dynamodbstreams::types::{OperationType, StreamRecord as Change, StreamViewType};

    #[test]
    fn lambda_shape() {
        let s = |v: &str| AttributeValue::S(v.into());
        let change = Change::builder()
            .approximate_creation_date_time(DateTime::from_secs(1_700_000_000))
            .keys("pk", s("C#1"))
            .keys("sk", s("C"))
            .new_image("pk", s("C#1"))
            .new_image("n", AttributeValue::N("2".into()))
            .new_image(
                "m",
                AttributeValue::M(HashMap::from([(
                    "l".into(),
                    AttributeValue::L(vec![AttributeValue::Bool(true), AttributeValue::Null(true)]),
                )])),
            )
            .sequence_number("100")
            .size_bytes(42)
            .stream_view_type(StreamViewType::NewAndOldImages)
            .build();
        let record = StreamRecord::builder()
            .event_id("e1")
            .event_name(OperationType::Insert)
            .event_version("1.1")
            .dynamodb(change)
            .build();
        let r = lambda_record(&record, "arn:s", "us-east-1").unwrap();
        assert_eq!(r.id, "100");
        assert_eq!(
            r.event,
            json!({
                "eventID": "e1", "eventName": "INSERT", "eventVersion": "1.1",
                "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "eventSourceARN": "arn:s",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1_700_000_000,
                    "Keys": {"pk": {"S": "C#1"}, "sk": {"S": "C"}},
                    "NewImage": {"pk": {"S": "C#1"}, "n": {"N": "2"},
                                 "m": {"M": {"l": {"L": [{"BOOL": true}, {"NULL": true}]}}}},
                    "SequenceNumber": "100", "SizeBytes": 42, "StreamViewType": "NEW_AND_OLD_IMAGES"
                }
            })
        );
        // The relay's event type accepts it.
        let event: aws_lambda_events::event::dynamodb::Event =
            serde_json::from_value(json!({ "Records": [r.event] })).unwrap();
        assert_eq!(event.records[0].change.new_image.len(), 3);
    }
}
