//! The notifier (docs/api.md §33): each message of the delay queue is one conversation's window,
//! due `NotifyDelaySeconds` after its first message; its job notifies each member for whom the
//! window's messages are still unread (`chat_store::push::Notifier::window_due`). A job that
//! fails is reported (partial batch response) and SQS delivers it again; after the queue's
//! `maxReceiveCount` it goes to NotifierFailureQueue.

use std::future::Future;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use chat_domain::notify::NotifyWindow;
use chat_lambda::{Error, EventHandler, SdkConfig};
use chat_store::push::{Notifier, Pusher};
use chat_store::{telemetry, Config};

#[derive(Clone, Debug)]
pub struct NotifierFunction {
    pub notifier: Notifier,
    pub pusher: Pusher,
}

impl NotifierFunction {
    pub async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for record in event.records {
            let window: Option<NotifyWindow> = record
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str(b).ok());
            let Some(window) = window else {
                // Not ours to retry: a malformed job would fail forever.
                tracing::error!(id = ?record.message_id, "malformed notification job");
                continue;
            };
            let job = record.message_id.clone().unwrap_or_default();
            match self.notifier.window_due(&window, &job, &self.pusher).await {
                Ok(report) => {
                    tracing::debug!(conversation = %window.conversation_id, ?report, "window done");
                    telemetry::count("NotifyWindowsDone", 1);
                }
                Err(e) => {
                    tracing::warn!(error = ?e, conversation = %window.conversation_id, "notification window failed; retried");
                    let mut failure = BatchItemFailure::default();
                    failure.item_identifier = record.message_id.unwrap_or_default();
                    response.batch_item_failures.push(failure);
                }
            }
        }
        response
    }
}

impl EventHandler for NotifierFunction {
    type Event = SqsEvent;
    type Response = SqsBatchResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        Ok(NotifierFunction {
            notifier: Notifier {
                store: config.chat_store(sdk),
                sqs: config.sqs_client(sdk),
                settings: config.notify.clone(),
            },
            pusher: config.pusher(sdk),
        })
    }

    fn handle(&self, event: SqsEvent) -> impl Future<Output = SqsBatchResponse> + Send {
        NotifierFunction::handle(self, event)
    }
}
