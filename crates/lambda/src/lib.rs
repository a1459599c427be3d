//! The event functions' Lambda scaffold, written once: the one `run` of the event functions
//! (relay, fanout, inbox-index, ws-connection: `run::<H>()` with an
//! [`EventHandler`]), and the partial batch response of the stream consumers
//! ([`batch_response`], DynamoDB Streams and Kinesis alike). What every function does at init is
//! `chat_store::init`; the REST functions' `serve` is `chat_http::http::serve`, which starts with
//! the same init. A crate of its own so that the REST functions compile neither this nor the
//! stream events' types.
//!
//! The handlers are built from a [`Config`] and the SDK's shared settings, not from the
//! environment, so the local gateway and the tests build them exactly as Lambda does, with their
//! own configuration.

use std::future::Future;
use std::pin::Pin;

use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbRecord;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::streams::{
    DynamoDbBatchItemFailure, DynamoDbEventResponse, KinesisEventResponse,
};
use lambda_runtime::{service_fn, LambdaEvent};
use serde::de::DeserializeOwned;
use serde::Serialize;

use chat_store::config::Config;

pub use chat_store::config::SdkConfig;
pub use chat_store::init;
pub use lambda_runtime::Error;

/// An event function: built once per instance, then called with each event its trigger delivers.
pub trait EventHandler: Clone + Send + Sync + Sized + 'static {
    /// The event of its trigger (a stream batch, a WebSocket route).
    type Event: DeserializeOwned + Send + 'static;
    /// Its answer (for a stream batch: [`batch_response`]).
    type Response: Serialize + Send + 'static;

    /// Builds the handler from the function's configuration.
    fn from_config(
        config: &Config,
        sdk: &SdkConfig,
    ) -> impl Future<Output = Result<Self, Error>> + Send;

    /// Handles one event. Failures are the answer's business (reported records, a status code):
    /// an invocation itself never fails.
    fn handle(&self, event: Self::Event) -> impl Future<Output = Self::Response> + Send;
}

/// Runs an event function: [`init`], builds `H` once, then hands it every event.
pub async fn run<H: EventHandler>() -> Result<(), Error> {
    let (config, sdk) = init().await?;
    let handler = H::from_config(&config, &sdk).await?;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<H::Event>| {
        let handler = handler.clone();
        async move {
            // Boxed: a handler's future is deep, and the runtime nests it further.
            let handled: Pin<Box<dyn Future<Output = H::Response> + Send + '_>> =
                Box::pin(handler.handle(event.payload));
            Ok::<_, Error>(handled.await)
        }
    }))
    .await
}

/// A record of a stream event source, which knows the partial batch response
/// (ReportBatchItemFailures) of its source.
pub trait StreamRecord {
    /// `{"batchItemFailures": [...]}` of this source.
    type Response: Default;

    /// The response that reports this record failed: Lambda delivers it, and every record after
    /// it in its shard, again.
    fn reported(&self) -> Self::Response;
}

impl StreamRecord for DynamoDbRecord {
    type Response = DynamoDbEventResponse;

    fn reported(&self) -> DynamoDbEventResponse {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = self.change.sequence_number.clone();
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures.push(failure);
        response
    }
}

impl StreamRecord for KinesisEventRecord {
    type Response = KinesisEventResponse;

    fn reported(&self) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        response.add_failure(self.kinesis.sequence_number.clone());
        response
    }
}

/// The answer to a stream batch: the earliest failed record (`events::plan::BatchFailures`)
/// reported by its sequence number, or no failure. One record is enough: Lambda resumes the
/// shard from it, so everything after it comes again too.
pub fn batch_response<R: StreamRecord>(
    records: &[R],
    earliest_failed: Option<usize>,
) -> R::Response {
    earliest_failed
        .and_then(|i| records.get(i))
        .map_or_else(R::Response::default, StreamRecord::reported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn records<R: DeserializeOwned>(records: Value) -> Vec<R> {
        serde_json::from_value(records).unwrap()
    }

    fn dynamodb(sequence_number: &str) -> Value {
        json!({"eventID": "e", "eventName": "MODIFY", "eventSource": "aws:dynamodb",
               "awsRegion": "us-east-1", "dynamodb": {"ApproximateCreationDateTime": 1480642020,
               "Keys": {}, "SequenceNumber": sequence_number, "SizeBytes": 54,
               "StreamViewType": "NEW_AND_OLD_IMAGES"}})
    }

    #[test]
    fn batch_responses_have_aws_shape_for_both_stream_kinds() {
        let dynamodb: Vec<DynamoDbRecord> = records(json!([dynamodb("100"), dynamodb("200")]));
        let reported = serde_json::to_value(batch_response(&dynamodb, Some(1))).unwrap();
        assert_eq!(
            reported,
            json!({"batchItemFailures": [{"itemIdentifier": "200"}]})
        );
        let none = serde_json::to_value(batch_response(&dynamodb, None)).unwrap();
        assert_eq!(none, json!({"batchItemFailures": []}));

        let data = "eyJ9"; // base64 of `{"}`: the record's data never matters here
        let kinesis: Vec<KinesisEventRecord> = records(json!([
            {"eventID": "shardId-000:1", "eventSource": "aws:kinesis", "kinesis": {
                "sequenceNumber": "49590338271490256608559692538361571095921575989136588898",
                "partitionKey": "c", "data": data, "approximateArrivalTimestamp": 1.5e9,
                "kinesisSchemaVersion": "1.0"}},
        ]));
        let reported = serde_json::to_value(batch_response(&kinesis, Some(0))).unwrap();
        assert_eq!(
            reported,
            json!({"batchItemFailures": [
                {"itemIdentifier": "49590338271490256608559692538361571095921575989136588898"}
            ]})
        );
        let none = serde_json::to_value(batch_response(&kinesis, None)).unwrap();
        assert_eq!(none, json!({"batchItemFailures": []}));
        // An index past the batch reports nothing rather than failing the invocation.
        assert_eq!(
            batch_response(&kinesis, Some(5)),
            KinesisEventResponse::default()
        );
    }
}
