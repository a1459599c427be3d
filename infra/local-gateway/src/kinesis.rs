//! The Kinesis event stream as a mapping source, with each record in the Lambda Kinesis event
//! record shape.

use aws_sdk_kinesis::types::{Record as KinesisRecord, ShardIteratorType};
use aws_sdk_kinesis::Client;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use crate::mapping::{Page, Position, Record, Shard, Source};
use crate::{sdk_error, Error};

pub(crate) struct EventStream {
    client: Client,
    stream: String,
    arn: String,
    region: String,
}

impl EventStream {
    pub(crate) async fn open(
        client: Client,
        stream: &str,
        region: String,
    ) -> Result<EventStream, Error> {
        let summary = client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .map_err(sdk_error("DescribeStreamSummary"))?;
        let arn = summary
            .stream_description_summary()
            .map(|s| s.stream_arn().to_owned())
            .ok_or_else(|| format!("no description of stream {stream}"))?;
        Ok(EventStream {
            client,
            stream: stream.to_owned(),
            arn,
            region,
        })
    }
}

impl Source for EventStream {
    fn name(&self) -> &str {
        &self.stream
    }

    async fn shards(&self) -> Result<Vec<Shard>, Error> {
        let mut shards = Vec::new();
        let mut next: Option<String> = None;
        loop {
            // With a NextToken the stream name must not be repeated.
            let request = match next.take() {
                Some(token) => self.client.list_shards().next_token(token),
                None => self.client.list_shards().stream_name(&self.stream),
            };
            let out = request.send().await.map_err(sdk_error("ListShards"))?;
            for s in out.shards() {
                shards.push(Shard {
                    id: s.shard_id().to_owned(),
                    parents: [s.parent_shard_id(), s.adjacent_parent_shard_id()]
                        .into_iter()
                        .flatten()
                        .map(str::to_owned)
                        .collect(),
                    closed: s
                        .sequence_number_range()
                        .and_then(|r| r.ending_sequence_number())
                        .is_some(),
                });
            }
            match out.next_token() {
                Some(token) => next = Some(token.to_owned()),
                None => break,
            }
        }
        Ok(shards)
    }

    async fn iterator(&self, shard: &str, at: &Position) -> Result<String, Error> {
        let request = self
            .client
            .get_shard_iterator()
            .stream_name(&self.stream)
            .shard_id(shard);
        let request = match at {
            Position::TrimHorizon => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            Position::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            Position::After(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
        };
        let out = request
            .send()
            .await
            .map_err(sdk_error("GetShardIterator"))?;
        Ok(out.shard_iterator().ok_or("no shard iterator")?.to_owned())
    }

    async fn read(&self, shard: &str, iterator: &str, limit: usize) -> Result<Page, Error> {
        let out = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(limit.min(10_000) as i32)
            .send()
            .await
            .map_err(sdk_error("GetRecords"))?;
        let records = out
            .records()
            .iter()
            .map(|r| lambda_record(r, shard, &self.arn, &self.region))
            .collect();
        Ok(Page {
            records,
            next: out.next_shard_iterator().map(str::to_owned),
            behind: out.millis_behind_latest().unwrap_or(0) > 0,
        })
    }
}

/// Every record in `stream` now, each shard from its trim horizon, as the Lambda Kinesis event
/// carries it (the tests read what the relay put this way, as the fanout's mapping does).
pub async fn kinesis_lambda_records(
    client: Client,
    stream: &str,
    region: &str,
) -> Result<Vec<Value>, Error> {
    let source = EventStream::open(client, stream, region.to_owned()).await?;
    let mut events = Vec::new();
    for shard in source.shards().await? {
        let mut iterator = source.iterator(&shard.id, &Position::TrimHorizon).await?;
        loop {
            let page = source.read(&shard.id, &iterator, 10_000).await?;
            let read_all = page.records.is_empty();
            events.extend(page.records.into_iter().map(|r| r.event));
            match page.next {
                Some(next) if !read_all => iterator = next,
                _ => break,
            }
        }
    }
    Ok(events)
}

/// A Kinesis record as the Lambda Kinesis event carries it.
fn lambda_record(r: &KinesisRecord, shard: &str, arn: &str, region: &str) -> Record {
    let sequence = r.sequence_number().to_owned();
    let arrival = r
        .approximate_arrival_timestamp()
        .map_or(0.0, |t| t.as_secs_f64());
    let mut kinesis = json!({
        "kinesisSchemaVersion": "1.0",
        "partitionKey": r.partition_key(),
        "sequenceNumber": sequence,
        "data": STANDARD.encode(r.data().as_ref()),
        "approximateArrivalTimestamp": arrival,
    });
    if let Some(encryption) = r.encryption_type() {
        kinesis["encryptionType"] = json!(encryption.as_str());
    }
    Record {
        event: json!({
            "kinesis": kinesis,
            "eventSource": "aws:kinesis",
            "eventVersion": "1.0",
            "eventID": format!("{shard}:{sequence}"),
            "eventName": "aws:kinesis:record",
            "awsRegion": region,
            "eventSourceARN": arn,
        }),
        id: sequence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_kinesis::primitives::{Blob, DateTime};

    #[test]
    fn lambda_shape() {
        let record = KinesisRecord::builder()
            .sequence_number("7")
            .partition_key("conv")
            .data(Blob::new("hello"))
            .approximate_arrival_timestamp(DateTime::from_millis(1_700_000_000_500))
            .build()
            .unwrap();
        let r = lambda_record(&record, "shardId-000000000001", "arn:k", "us-east-1");
        assert_eq!(r.id, "7");
        assert_eq!(
            r.event,
            json!({
                "kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "conv",
                            "sequenceNumber": "7", "data": "aGVsbG8=",
                            "approximateArrivalTimestamp": 1_700_000_000.5},
                "eventSource": "aws:kinesis", "eventVersion": "1.0",
                "eventID": "shardId-000000000001:7", "eventName": "aws:kinesis:record",
                "awsRegion": "us-east-1", "eventSourceARN": "arn:k"
            })
        );
        let event: aws_lambda_events::event::kinesis::KinesisEvent =
            serde_json::from_value(json!({ "Records": [r.event] })).unwrap();
        assert_eq!(&event.records[0].kinesis.data.0[..], b"hello");
    }
}
