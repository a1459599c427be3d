//! Offline notifications for the tests (docs/api.md §33): the notifier fed from the delay queue
//! on moto's SQS (which honours DelaySeconds) by a poller of this binary, as the local gateway
//! does, delivering to a push sink of its own. `start` once per binary turns it on; from then on
//! the inbox indexer (`TestApp::index`) opens windows too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::error::BoxError;
use chat_domain::notify::{Content, NotifyWindow};
use chat_domain::ConversationId;
use chat_store::notify::{NotifySettings, PlatformArns};
use chat_store::push::{Notifier, Pusher, WindowReport};
use chat_store::telemetry::{BeforeTransmit, ReadBeforeTransmit};
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

/// The tests' AWS settings, and the recorder of `function`'s calls (`CHAT_IAM_LOG`; None: the
/// tests' own client, unrecorded).
async fn sdk_of(
    function: Option<&str>,
) -> (
    aws_config::SdkConfig,
    Option<chat_store::iam_log::RecordIamNeeds>,
) {
    let config = crate::config();
    let recorder = function.and_then(|f| config.for_function(f).iam_recorder());
    (config.sdk_config().await, recorder)
}

/// An SQS client on moto, its calls recorded as `function`'s.
async fn sqs_of(function: Option<&str>) -> aws_sdk_sqs::Client {
    let (sdk, recorder) = sdk_of(function).await;
    let mut b =
        aws_sdk_sqs::config::Builder::from(&sdk).endpoint_url(crate::server::kinesis_endpoint());
    if let Some(r) = recorder {
        b = b.interceptor(r);
    }
    aws_sdk_sqs::Client::from_conf(b.build())
}

/// An SNS client on moto, its calls recorded as `function`'s and, when given, their actions
/// into `actions`.
pub async fn sns_of(function: Option<&str>, actions: Option<&SnsActions>) -> aws_sdk_sns::Client {
    let (sdk, recorder) = sdk_of(function).await;
    let mut b =
        aws_sdk_sns::config::Builder::from(&sdk).endpoint_url(crate::server::kinesis_endpoint());
    if let Some(r) = recorder {
        b = b.interceptor(r);
    }
    if let Some(a) = actions {
        b = b.interceptor(BeforeTransmit(a.clone()));
    }
    aws_sdk_sns::Client::from_conf(b.build())
}

/// The SNS actions a client sent (`Action=` of each attempt), in order.
#[derive(Debug, Clone, Default)]
pub struct SnsActions(Arc<Mutex<Vec<String>>>);

impl SnsActions {
    /// The actions since the last take.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl ReadBeforeTransmit for SnsActions {
    const NAME: &'static str = "SnsActions";

    fn read(&self, request: &HttpRequest) -> Result<(), BoxError> {
        let body = request.body().bytes().unwrap_or_default();
        let action = form_action(body).unwrap_or_else(|| "?".into());
        self.0.lock().unwrap().push(action);
        Ok(())
    }
}

fn form_action(body: &[u8]) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&')
        .find_map(|p| p.strip_prefix("Action="))
        .map(str::to_owned)
}

/// A platform application per platform on moto's SNS, named for this test.
pub async fn platform_applications() -> PlatformArns {
    let sns = sns_of(None, None).await;
    let app = |platform: &'static str| {
        let sns = sns.clone();
        async move {
            sns.create_platform_application()
                .name(crate::unique("chat"))
                .platform(platform)
                .attributes("PlatformCredential", "test-credential")
                .send()
                .await
                .expect("CreatePlatformApplication")
                .platform_application_arn
        }
    };
    PlatformArns {
        apns: app("APNS").await,
        apns_sandbox: app("APNS_SANDBOX").await,
        fcm: app("GCM").await,
    }
}

/// The notifier's window job delivering through SNS on moto, as deployed (`Pusher::Sns`, a
/// platform application per platform), its calls recorded as the notifier's.
pub struct SnsNotifier {
    pub notifier: Notifier,
    pub pusher: Pusher,
    /// What the notifier's SNS client sent.
    pub actions: SnsActions,
    /// The test's own SNS client, to act as SNS itself does (disable an endpoint).
    pub own: aws_sdk_sns::Client,
    /// The test's own store, to open windows as the inbox indexer does.
    opener: chat_store::ChatStore,
}

impl SnsNotifier {
    pub async fn new(t: &crate::TestApp) -> SnsNotifier {
        let arns = platform_applications().await;
        let actions = SnsActions::default();
        SnsNotifier {
            notifier: Notifier {
                store: t.store_of_function("notifier"),
                sqs: sqs_of(Some("notifier")).await,
                settings: NotifySettings {
                    delay_seconds: DELAY.as_secs() as u32,
                    content: Content::Full,
                    platform_arns: arns.clone(),
                    ..NotifySettings::default()
                },
            },
            pusher: Pusher::Sns(sns_of(Some("notifier"), Some(&actions)).await, arns),
            actions,
            own: sns_of(None, None).await,
            opener: t.app.store.clone(),
        }
    }

    /// Opens the conversation's window at message `seq` (as the inbox indexer does) and runs its
    /// job at once (as if its delay were over). Hold `indexer::hold` meanwhile, so that no other
    /// test's indexer opens it first.
    pub async fn notify(&self, conversation: &str, seq: u64) -> WindowReport {
        let id = ConversationId::parse(conversation).expect("a conversation id");
        let now = chat_domain::time::unix_millis(chat_domain::time::now());
        let opened = self
            .opener
            .open_notify_window(&id, seq, now, now + 60_000)
            .await
            .expect("the window opens");
        assert!(opened, "no other window of {conversation} is open");
        // As if its delay were over: a window without its opening time never waits.
        let window = NotifyWindow {
            conversation_id: id,
            from_seq: seq,
            opened_at_ms: 0,
        };
        self.notifier
            .window_due(&window, &uuid::Uuid::new_v4().to_string(), &self.pusher)
            .await
            .expect("the window's job")
    }
}

/// moto's SNS platform endpoints of `token`: `{"arn", "token", "attributes": {"Enabled"},
/// "messages": {id: message}}` each.
pub fn sns_endpoints_of(token: &str) -> Vec<Value> {
    let data = crate::server::moto_data();
    data["sns"]["PlatformEndpoint"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|e| e["token"] == token)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
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
