//! Offline notifications for the tests (docs/api.md §33): the notifier fed from the delay queue
//! on moto's SQS (which honours DelaySeconds) by a poller of this binary, as the local gateway
//! does, delivering to a push sink of its own. `start` once per binary turns it on; from then on
//! the inbox indexer (`TestApp::index`) opens windows too.

use std::time::Duration;

use chat_domain::notify::Content;
use chat_store::notify::NotifySettings;
use chat_store::push::{Notifier, Pusher};
use local_gateway::push_sink::PushSink;
use notifier::NotifierFunction;
use serde_json::Value;
use tokio::sync::OnceCell;

/// The delay of the tests (the local stack's default).
pub const DELAY: Duration = Duration::from_secs(2);

pub struct Notifications {
    pub settings: NotifySettings,
    pub sink: PushSink,
}

static NOTIFICATIONS: OnceCell<Notifications> = OnceCell::const_new();

/// Starts the sink and the queue's poller once per binary, on a runtime of their own (each test
/// has its own runtime, which ends with it).
pub async fn start() -> &'static Notifications {
    NOTIFICATIONS.get_or_init(spawn).await
}

async fn spawn() -> Notifications {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("the notifier's runtime");
        runtime.block_on(async move {
            let t = crate::TestApp::new().await;
            let queue = local_gateway::notify::queue_url(&sqs_of(None).await)
                .await
                .expect("the delay queue (template NotifyQueue)");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let sink_url = format!("http://{}", listener.local_addr().unwrap());
            let sink = PushSink::default();
            sink.spawn(listener);
            let settings = NotifySettings {
                queue_url: Some(queue.clone()),
                delay_seconds: DELAY.as_secs() as u32,
                content: Content::Full,
                push_sink_url: Some(sink_url.clone()),
                ..NotifySettings::default()
            };
            let function = NotifierFunction {
                notifier: Notifier {
                    store: t.store_of_function("notifier"),
                    sqs: sqs_of(Some("notifier")).await,
                    settings: settings.clone(),
                },
                pusher: Pusher::Sink(sink_url),
            };
            let _ = tx.send(Notifications { settings, sink });
            // Lambda's event source mapping receives and deletes, not the function's code.
            let never = std::future::pending();
            local_gateway::notify::poll(sqs_of(None).await, queue, function, never).await;
        });
    });
    rx.await.expect("the notifier started")
}

/// An SQS client on moto, its calls recorded as `function`'s (`CHAT_IAM_LOG`; None: the tests'
/// own).
async fn sqs_of(function: Option<&str>) -> aws_sdk_sqs::Client {
    let config = crate::config();
    let sdk = config.sdk_config().await;
    let mut b =
        aws_sdk_sqs::config::Builder::from(&sdk).endpoint_url(crate::server::kinesis_endpoint());
    if let Some(r) = function.and_then(|f| config.for_function(f).iam_recorder()) {
        b = b.interceptor(r);
    }
    aws_sdk_sqs::Client::from_conf(b.build())
}

/// The inbox indexer's window opener over `store`, once `start` ran in this binary.
pub async fn notifier_for(store: &chat_store::ChatStore) -> Option<Notifier> {
    let settings = NOTIFICATIONS.get()?.settings.clone();
    Some(Notifier {
        store: store.clone(),
        sqs: sqs_of(Some("inbox-index")).await,
        settings,
    })
}

impl Notifications {
    /// What the sink received for `token`.
    pub fn sent_to(&self, token: &str) -> Vec<Value> {
        self.sink.sent_to(token)
    }

    /// Waits up to `within` until `token` has `n` notifications; returns them (fewer at the
    /// timeout).
    pub async fn wait_for(&self, token: &str, n: usize, within: Duration) -> Vec<Value> {
        let until = std::time::Instant::now() + within;
        loop {
            let got = self.sent_to(token);
            if got.len() >= n || std::time::Instant::now() >= until {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
