//! What Lambda's SQS event source mapping does for a function deployed (receive, invoke with the
//! SQS event, delete what the response did not report failed), for the local stack's queues: the
//! notifications' delay queue (`notify.rs`) and typing's expiry checks (ws-connection).

use std::future::Future;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde_json::{json, Value};

use crate::shutdown::Shutdown;

/// The URL of the queue the local stack created under `name` (its template logical id).
pub async fn queue_url(sqs: &aws_sdk_sqs::Client, name: &str) -> Result<String, crate::Error> {
    let out = sqs
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| {
            format!(
                "the queue {name}: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })?;
    Ok(out.queue_url.unwrap_or_default())
}

/// Receives the queue's due messages and hands them to `function`, until `stop` resolves.
pub async fn poll<F, R>(
    sqs: aws_sdk_sqs::Client,
    queue: String,
    function: F,
    stop: impl Future<Output = ()>,
) where
    F: Fn(SqsEvent) -> R,
    R: Future<Output = SqsBatchResponse>,
{
    tokio::pin!(stop);
    loop {
        // A long poll, as Lambda's mapping makes (20 s there): the launcher answers it as soon as
        // a message's delay is over, without holding up other calls meanwhile
        // (infra/moto_server.py).
        let receive = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send();
        let got = tokio::select! {
            got = receive => got,
            _ = &mut stop => return,
        };
        let messages = match got {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(queue, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "receiving failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                json!({"messageId": m.message_id, "receiptHandle": m.receipt_handle,
                       "body": m.body, "eventSource": "aws:sqs", "attributes": {},
                       "messageAttributes": {}})
            })
            .collect();
        let event: SqsEvent = match serde_json::from_value(json!({ "Records": records })) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(queue, error = %e, "an SQS event the function cannot read");
                continue;
            }
        };
        let response = function(event).await;
        for m in &messages {
            let failed = response
                .batch_item_failures
                .iter()
                .any(|f| Some(f.item_identifier.as_str()) == m.message_id.as_deref());
            // A failed message comes back after its visibility timeout, as deployed.
            if let (false, Some(handle)) = (failed, &m.receipt_handle) {
                let _ = sqs
                    .delete_message()
                    .queue_url(&queue)
                    .receipt_handle(handle)
                    .send()
                    .await;
            }
        }
    }
}

/// Batches handled at once per queue: Lambda's SQS event source mapping starts with five
/// concurrent batches (found by probing: one batch at a time made notifications seconds late).
pub const POLLERS: usize = 5;

/// `POLLERS` of `poll` until the gateway shuts down.
pub(crate) fn spawn<F, R>(sqs: aws_sdk_sqs::Client, queue: String, function: F, shutdown: Shutdown)
where
    F: Fn(SqsEvent) -> R + Clone + Send + 'static,
    R: Future<Output = SqsBatchResponse> + Send,
{
    for _ in 0..POLLERS {
        let (sqs, queue, function, shutdown) = (
            sqs.clone(),
            queue.clone(),
            function.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            let stop = {
                let shutdown = shutdown.clone();
                async move { shutdown.wait().await }
            };
            poll(sqs, queue, function, stop).await;
            drop(shutdown);
        });
    }
}
