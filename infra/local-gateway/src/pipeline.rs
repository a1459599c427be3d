//! The event pipeline's two mappings, ChatTable stream → relay → Kinesis → fanout, and the
//! stream's second reader, ChatTable stream → inbox-index.

use std::future::Future;
use std::sync::Arc;

use aws_config::SdkConfig;
use chat_store::Config;
use serde_json::Value;
use tokio::sync::watch;

use crate::dynamodb_stream::TableStream;
use crate::handlers::Handlers;
use crate::kinesis::EventStream;
use crate::mapping::{Handler, Mapping, Settings};
use crate::shutdown::Shutdown;
use crate::{Error, PipelineConfig, Stats};

pub(crate) async fn start(
    chat: &Config,
    sdk: &SdkConfig,
    config: &PipelineConfig,
    handlers: &Handlers,
    stats: &Arc<Stats>,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    let (table_stream, event_stream) = open_streams(chat, sdk).await?;
    let index_stream = table_stream.clone();

    let settings = |poll_interval| Settings {
        batch_size: config.batch_size,
        poll_interval,
        max_retries: config.max_retries,
        retry_backoff: config.retry_backoff,
    };
    let (delivered, wake) = watch::channel(());
    let fanout = handler(
        handlers,
        |h, records| async move { h.fanout(records).await },
    );
    let relay = handler(handlers, |h, records| async move { h.relay(records).await });
    // Kinesis first: with LATEST, its iterators must predate anything the relay puts.
    Mapping {
        source: event_stream,
        handler: fanout,
        settings: settings(config.kinesis_poll_interval),
        stats: stats.clone(),
        counters: |s| &s.fanout,
        shutdown: shutdown.clone(),
        wake: Some(wake),
        delivered: None,
    }
    .start(config.starting_position)
    .await?;
    Mapping {
        source: table_stream,
        handler: relay,
        settings: settings(config.poll_interval),
        stats: stats.clone(),
        counters: |s| &s.relay,
        shutdown: shutdown.clone(),
        wake: None,
        delivered: Some(delivered),
    }
    .start(config.starting_position)
    .await?;
    // The stream's second reader (template.yaml: InboxIndexEventSource), with its own iterators.
    let inbox_index = handler(handlers, |h, records| async move {
        h.inbox_index(records).await
    });
    Mapping {
        source: index_stream,
        handler: inbox_index,
        settings: settings(config.poll_interval),
        stats: stats.clone(),
        counters: |s| &s.inbox_index,
        shutdown: shutdown.clone(),
        wake: None,
        delivered: None,
    }
    .start(config.starting_position)
    .await
}

/// The chat table's stream and the event stream (Kinesis).
async fn open_streams(chat: &Config, sdk: &SdkConfig) -> Result<(TableStream, EventStream), Error> {
    let region = sdk
        .region()
        .map_or_else(|| "us-east-1".to_owned(), |r| r.to_string());
    // DynamoDB Streams is served where DynamoDB is (moto, DynamoDB Local).
    let mut streams = aws_sdk_dynamodbstreams::config::Builder::from(sdk);
    if let Some(url) = &chat.dynamodb_endpoint {
        streams = streams.endpoint_url(url);
    }
    let table_stream = TableStream::open(
        &chat.dynamodb_client(sdk),
        aws_sdk_dynamodbstreams::Client::from_conf(streams.build()),
        &chat.chat_table,
        region.clone(),
    )
    .await?;
    let event_stream =
        EventStream::open(chat.kinesis_client(sdk), &chat.event_stream, region).await?;
    Ok((table_stream, event_stream))
}

/// A mapping's handler: `call` with a clone of the handlers, per batch of records.
fn handler<F, Fut>(handlers: &Handlers, call: F) -> Handler
where
    F: Fn(Handlers, Vec<Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, Error>> + Send + 'static,
{
    let h = handlers.clone();
    Arc::new(move |records| Box::pin(call(h.clone(), records)))
}
