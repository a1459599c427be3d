//! The notifier (docs/api.md §33): each message of the delay queue is one conversation's window,
//! due `NotifyDelaySeconds` after its first message; its job notifies each member for whom the
//! window's messages are still unread (`chat_store::push::Notifier::window_due`). A job that
//! fails is reported (partial batch response) and SQS delivers it again; after the queue's
//! `maxReceiveCount` it goes to NotifierFailureQueue.

use std::future::Future;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use chat_domain::notify::NotifyWindow;
use chat_lambda::{Error, EventHandler, SdkConfig};
use chat_store::push::{Notifier, Pusher};
use chat_store::{telemetry, Config};
use futures::stream::{self, StreamExt};

/// Windows of one batch worked at once (a batch holds at most 10).
const WINDOWS_IN_FLIGHT: usize = 10;

#[derive(Clone, Debug)]
pub struct NotifierFunction {
    pub notifier: Notifier,
    pub pusher: Pusher,
}

impl NotifierFunction {
    pub async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        // A batch's windows at once (each is its own conversation's, or a second job of one,
        // which its close makes send nothing): found by probing, ten windows one after another
        // made the last ones seconds late.
        let failed: Vec<Option<String>> = stream::iter(event.records)
            .map(|record| self.window_job(record))
            .buffer_unordered(WINDOWS_IN_FLIGHT)
            .collect()
            .await;
        let mut response = SqsBatchResponse::default();
        for id in failed.into_iter().flatten() {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// One window's job; `Some(message id)` when it failed (SQS delivers it again).
    async fn window_job(&self, record: SqsMessage) -> Option<String> {
        let window: Option<NotifyWindow> = record
            .body
            .as_deref()
            .and_then(|b| serde_json::from_str(b).ok());
        let Some(window) = window else {
            // Not ours to retry: a malformed job would fail forever.
            tracing::error!(id = ?record.message_id, "malformed notification job");
            return None;
        };
        let job = record.message_id.clone().unwrap_or_default();
        match self.notifier.window_due(&window, &job, &self.pusher).await {
            Ok(report) => {
                tracing::debug!(conversation = %window.conversation_id, ?report, "window done");
                telemetry::count("NotifyWindowsDone", 1);
                None
            }
            Err(e) => {
                tracing::warn!(error = ?e, conversation = %window.conversation_id, "notification window failed; retried");
                Some(record.message_id.unwrap_or_default())
            }
        }
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
