//! Offline notifications on the local stack (docs/api.md §33): the delay queue's poller, which
//! does what Lambda's SQS event source mapping does for the notifier deployed (`queue_poll`), and
//! the push sink it delivers to (`push_sink`).

use notifier::NotifierFunction;

/// The delay queue's logical id (template.yaml), the name the local stack creates it under.
pub const QUEUE: &str = "NotifyQueue";

/// The queue's URL on `sqs`.
pub async fn queue_url(sqs: &aws_sdk_sqs::Client) -> Result<String, crate::Error> {
    crate::queue_poll::queue_url(sqs, QUEUE).await
}

/// Receives the queue's due jobs and hands them to the notifier, until `stop` resolves.
pub async fn poll(
    sqs: aws_sdk_sqs::Client,
    queue: String,
    function: NotifierFunction,
    stop: impl std::future::Future<Output = ()>,
) {
    crate::queue_poll::poll(sqs, queue, |event| function.handle(event), stop).await
}
