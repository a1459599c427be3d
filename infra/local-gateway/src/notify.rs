//! Offline notifications on the local stack (docs/api.md §33): the delay queue's poller, which
//! does what Lambda's SQS event source mapping does for the notifier deployed (receive, invoke
//! with the SQS event, delete what the response did not report failed), and the push sink it
//! delivers to.

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use notifier::NotifierFunction;
use serde_json::{json, Value};

use crate::shutdown::Shutdown;

/// The delay queue's logical id (template.yaml), the name the local stack creates it under.
pub const QUEUE: &str = "NotifyQueue";

/// The queue's URL on `sqs`.
pub async fn queue_url(sqs: &aws_sdk_sqs::Client) -> Result<String, crate::Error> {
    let out = sqs
        .get_queue_url()
        .queue_name(QUEUE)
        .send()
        .await
        .map_err(|e| {
            format!(
                "the notification queue {QUEUE}: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })?;
    Ok(out.queue_url.unwrap_or_default())
}

/// Receives the queue's due jobs and hands them to the notifier, until `stop` resolves.
pub async fn poll(
    sqs: aws_sdk_sqs::Client,
    queue: String,
    function: NotifierFunction,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        // A long poll, as Lambda's mapping makes (20 s there): the launcher answers it as soon as
        // a job's delay is over, without holding up other calls meanwhile (infra/moto_server.py).
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
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "receiving notification jobs failed");
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
                tracing::error!(error = %e, "an SQS event the notifier cannot read");
                continue;
            }
        };
        let response = function.handle(event).await;
        for m in &messages {
            let failed = response
                .batch_item_failures
                .iter()
                .any(|f| Some(f.item_identifier.as_str()) == m.message_id.as_deref());
            // A failed job comes back after its visibility timeout, as deployed.
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

/// `poll` until the gateway shuts down.
pub(crate) fn spawn(
    sqs: aws_sdk_sqs::Client,
    queue: String,
    function: NotifierFunction,
    shutdown: Shutdown,
) {
    tokio::spawn(async move {
        let stop = {
            let shutdown = shutdown.clone();
            async move { shutdown.wait().await }
        };
        poll(sqs, queue, function, stop).await;
        drop(shutdown);
    });
}
