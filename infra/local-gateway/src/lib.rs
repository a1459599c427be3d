//! Local stand-in for what AWS runs around the push functions (docs/event-pipeline.md):
//!
//! * the API Gateway **WebSocket API** (`ws://127.0.0.1:9001/?token=…`), which calls the
//!   ws-connection handler with `$connect` / `$disconnect` / `$default` events (`websocket.rs`);
//! * its **Management API** (`POST|GET|DELETE /@connections/{id}`, also under `/{stage}`), through
//!   which the fanout pushes (`management.rs`);
//! * the **Lambda event source mappings**: the chat table's DynamoDB stream → relay, and every shard
//!   of the Kinesis stream → fanout, with ReportBatchItemFailures semantics (`mapping.rs`);
//! * the **Lambda Invoke API** for the relay and the fanout (`POST
//!   /2015-03-31/functions/{relay|fanout}/invocations` on the Management API's port, `invoke.rs`),
//!   which `infra/replay_failures.py` uses locally as it uses Lambda deployed.
//!
//! The handlers are the same objects that run in Lambda (`handlers.rs`), called in-process with
//! Lambda-format JSON events. Run one gateway per emulator: two gateways would each relay and fan
//! out every event, and each would answer `410 Gone` for the other's connections (so their fanouts
//! delete each other's connection records).

mod dynamodb_stream;
mod handlers;
mod http;
mod invoke;
mod kinesis;
mod management;
mod mapping;
pub mod notify;
mod pipeline;
pub mod push_sink;
mod queue_poll;
mod registry;
mod rest_edge;
mod shutdown;
mod static_files;
mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chat_store::Config;
use tokio::net::TcpListener;

pub use dynamodb_stream::lambda_event_record;
pub use kinesis::kinesis_lambda_records;
pub use mapping::{MappingStats, StartingPosition, Stats};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// An SDK error with its whole chain of causes (the SDK's own Display is terse, e.g. "dispatch
/// failure"), named by the operation.
pub(crate) fn sdk_error<E: std::error::Error>(operation: &'static str) -> impl Fn(E) -> Error {
    move |e| {
        format!(
            "{operation}: {}",
            aws_sdk_kinesis::error::DisplayErrorContext(&e)
        )
        .into()
    }
}

/// What to serve and where. Port 0 picks a free port (see [`RunningGateway`] for the URLs).
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// WebSocket API address (default `127.0.0.1:9001`).
    pub ws_addr: SocketAddr,
    /// Management API address (default `127.0.0.1:9002`).
    pub management_addr: SocketAddr,
    /// The API's stage: `requestContext.stage`, and the optional Management API path prefix.
    pub stage: String,
    /// Tables, stream, endpoints and authentication of the handlers. `KINESIS_ENDPOINT` unset
    /// means the Kinesis API is at `DYNAMODB_ENDPOINT` (our moto serves DynamoDB, DynamoDB
    /// Streams and Kinesis on one port); the handlers' Management API endpoint is always this
    /// gateway's.
    pub chat: Config,
    /// The stream → relay → Kinesis → fanout pollers; `None` serves the two APIs only.
    pub pipeline: Option<PipelineConfig>,
    /// The HTTP API's stand-in in front of `cargo lambda watch`: `(address, watch's URL,
    /// requests in flight per route, the time within which every request is answered)`.
    pub rest: Option<(SocketAddr, String, usize, Duration)>,
    /// The demo chat page: `(address, folder of the built page)`.
    pub demo: Option<(SocketAddr, std::path::PathBuf)>,
    /// Offline notifications: the push sink's address (`CHAT_PUSH_SINK_PORT`); the delay
    /// queue's poller runs with it.
    pub push_sink: Option<SocketAddr>,
}

/// The two event source mappings (template.yaml: RelayEventSource, FanoutEventSource).
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Where the mappings start reading the shards they find at start-up.
    pub starting_position: StartingPosition,
    /// Records per handler invocation (template: 100).
    pub batch_size: usize,
    /// Idle wait between GetRecords calls on the DynamoDB stream: 250 ms, as Lambda polls a
    /// DynamoDB stream's shards 4 times a second (docs/event-pipeline.md, "Latency on AWS").
    pub poll_interval: Duration,
    /// Idle wait between GetRecords calls on a Kinesis shard. The deployed fanout reads through
    /// an enhanced fan-out consumer, which pushes records as they arrive; locally each batch the
    /// relay delivers wakes the Kinesis pollers at once, the stand-in for that push, so this only
    /// bounds the delay for records put by others.
    pub kinesis_poll_interval: Duration,
    /// Retries of a failing record before it is logged as sent to the on-failure destination
    /// (template: MaximumRetryAttempts 10).
    pub max_retries: u32,
    /// First wait before a retry; doubles per retry of the same record, at most 2 s.
    pub retry_backoff: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            starting_position: StartingPosition::TrimHorizon,
            batch_size: 100,
            poll_interval: Duration::from_millis(250),
            kinesis_poll_interval: Duration::from_millis(500),
            max_retries: 10,
            retry_backoff: Duration::from_millis(100),
        }
    }
}

pub const DEFAULT_REST_PORT: u16 = 9000;
pub const DEFAULT_WS_PORT: u16 = 9001;
pub const DEFAULT_MANAGEMENT_PORT: u16 = 9002;
pub const DEFAULT_DEMO_PORT: u16 = 9003;
pub const DEFAULT_PUSH_SINK_PORT: u16 = 9004;
/// Instances per function under `cargo lambda watch` (infra/run-local.sh: `--concurrency 32`).
pub const DEFAULT_FUNCTIONS_CONCURRENCY: usize = 32;

impl GatewayConfig {
    /// Default addresses and pipeline for these handler settings.
    pub fn new(chat: Config) -> GatewayConfig {
        GatewayConfig {
            ws_addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_WS_PORT)),
            management_addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_MANAGEMENT_PORT)),
            stage: "local".into(),
            chat,
            pipeline: Some(PipelineConfig::default()),
            rest: None,
            demo: None,
            push_sink: None,
        }
    }

    /// `Config::from_env` plus `CHAT_WS_PORT` (9001), `CHAT_MANAGEMENT_PORT` (9002),
    /// `CHAT_GATEWAY_START` (`TRIM_HORIZON`, the default, or `LATEST`), and, when set,
    /// `CHAT_REST_UPSTREAM` (where `cargo lambda watch` listens; the REST API is then served on
    /// `CHAT_REST_PORT`, 9000, with at most `CHAT_FUNCTIONS_CONCURRENCY`, 32, requests of one
    /// route in flight) and `CHAT_DEMO_DIR` (the demo page, on `CHAT_DEMO_PORT`, 9003).
    pub fn from_env() -> Result<GatewayConfig, String> {
        let mut config = GatewayConfig::new(Config::from_env()?);
        let port = |name: &str, default: u16| match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("{name} must be a port number, not {v:?}")),
            _ => Ok(default),
        };
        config
            .ws_addr
            .set_port(port("CHAT_WS_PORT", DEFAULT_WS_PORT)?);
        config
            .management_addr
            .set_port(port("CHAT_MANAGEMENT_PORT", DEFAULT_MANAGEMENT_PORT)?);
        let local = |p| SocketAddr::from(([127, 0, 0, 1], p));
        if let Ok(upstream) = std::env::var("CHAT_REST_UPSTREAM") {
            let per_route = match std::env::var("CHAT_FUNCTIONS_CONCURRENCY") {
                Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        return Err(format!(
                            "CHAT_FUNCTIONS_CONCURRENCY must be a positive number, not {v:?}"
                        ))
                    }
                },
                _ => DEFAULT_FUNCTIONS_CONCURRENCY,
            };
            let addr = local(port("CHAT_REST_PORT", DEFAULT_REST_PORT)?);
            let deadline = rest_edge::deadline(config.chat.timeouts.request_budget);
            config.rest = Some((addr, upstream, per_route, deadline));
        }
        if let Ok(dir) = std::env::var("CHAT_DEMO_DIR") {
            config.demo = Some((
                local(port("CHAT_DEMO_PORT", DEFAULT_DEMO_PORT)?),
                dir.into(),
            ));
        }
        // Offline notifications: the delay queue's poller and the push sink the notifier
        // delivers to, on `CHAT_PUSH_SINK_PORT` (9004).
        config.push_sink = Some(local(port("CHAT_PUSH_SINK_PORT", DEFAULT_PUSH_SINK_PORT)?));
        if let Ok(start) = std::env::var("CHAT_GATEWAY_START") {
            let position = match start.trim() {
                "" | "TRIM_HORIZON" => StartingPosition::TrimHorizon,
                "LATEST" => StartingPosition::Latest,
                other => {
                    return Err(format!(
                        "CHAT_GATEWAY_START must be TRIM_HORIZON or LATEST, not {other:?}"
                    ))
                }
            };
            if let Some(p) = config.pipeline.as_mut() {
                p.starting_position = position;
            }
        }
        Ok(config)
    }
}

/// Starts gateways.
pub struct Gateway;

/// A started gateway. Runs until [`RunningGateway::shutdown`]; dropping it also stops everything
/// (without waiting), as does the end of its runtime.
pub struct RunningGateway {
    /// `ws://HOST:PORT/`; connect with `?token=<JWT>`.
    pub ws_url: String,
    /// `http://HOST:PORT/{stage}`, what `WS_MANAGEMENT_ENDPOINT` would be deployed (the paths also
    /// work without the stage prefix).
    pub management_url: String,
    /// `http://HOST:PORT`, the REST API (when configured).
    pub rest_url: Option<String>,
    /// `http://HOST:PORT/`, the demo page (when configured).
    pub demo_url: Option<String>,
    /// `http://HOST:PORT`, the push sink (when configured).
    pub push_sink_url: Option<String>,
    /// `http://HOST:PORT`: the Lambda Invoke API for `relay` and `fanout` (`invoke.rs`).
    pub lambda_url: String,
    registry: registry::Registry,
    stats: Arc<Stats>,
    fanout: Arc<fanout::FanoutStats>,
    trigger: shutdown::Trigger,
}

impl Gateway {
    /// Binds both ports, builds the handlers, and (with a pipeline) returns once the pollers hold
    /// their first shard iterators, so a write made after `start` returns is always seen.
    pub async fn start(config: GatewayConfig) -> Result<RunningGateway, Error> {
        let ws_listener = TcpListener::bind(config.ws_addr).await?;
        let management_listener = TcpListener::bind(config.management_addr).await?;
        let ws_addr = ws_listener.local_addr()?;
        let management_addr = management_listener.local_addr()?;
        let management_url = format!("http://{management_addr}/{}", config.stage);

        let mut chat = config.chat.clone();
        // moto serves DynamoDB, DynamoDB Streams and Kinesis on one port: without an explicit
        // KINESIS_ENDPOINT, Kinesis is wherever DynamoDB is.
        if chat.kinesis_endpoint.is_none() {
            chat.kinesis_endpoint = chat.dynamodb_endpoint.clone();
        }
        chat.ws_management_endpoint = Some(management_url.clone());
        let sdk = chat.sdk_config().await;
        let (trigger, shutdown) = shutdown::Shutdown::new();
        let push_sink_url = match config.push_sink {
            Some(addr) => Some(start_notifications(&mut chat, &sdk, addr, &shutdown).await?),
            None => None,
        };
        let typing_queue = typing_queue(&mut chat, &sdk).await;
        let handlers = handlers::Handlers::new(&chat, &sdk).await?;
        if let Some((sqs, url)) = typing_queue {
            let handlers = handlers.clone();
            let run = move |event| {
                let handlers = handlers.clone();
                async move { handlers.expiry_checks(event).await }
            };
            queue_poll::spawn(sqs, url, run, shutdown.clone());
        }
        let fanout = handlers.fanout_stats();

        let registry = registry::Registry::default();
        let stats = Arc::new(Stats::default());

        if let Some(pipeline) = &config.pipeline {
            pipeline::start(&chat, &sdk, pipeline, &handlers, &stats, &shutdown).await?;
        }
        let invoker = handlers.clone();
        let ws = Arc::new(websocket::WebSocketApi {
            handlers,
            registry: registry.clone(),
            stage: config.stage.clone(),
            domain: ws_addr.to_string(),
            shutdown: shutdown.clone(),
        });
        http::serve(ws_listener, shutdown.clone(), move |req, peer| {
            let ws = ws.clone();
            async move { ws.handle(req, peer).await }
        });
        let management = registry.clone();
        http::serve(management_listener, shutdown.clone(), move |req, _| {
            let (registry, handlers) = (management.clone(), invoker.clone());
            async move {
                match invoke::handle(req, &handlers).await {
                    Ok(response) => response,
                    Err(req) => management::handle(req, &registry).await,
                }
            }
        });
        let rest_url = match &config.rest {
            Some(rest) => Some(serve_rest(rest, &shutdown).await?),
            None => None,
        };
        let demo_url = match &config.demo {
            Some(demo) => Some(serve_demo(demo, &shutdown).await?),
            None => None,
        };
        Ok(RunningGateway {
            ws_url: format!("ws://{ws_addr}/"),
            management_url,
            rest_url,
            demo_url,
            push_sink_url,
            lambda_url: format!("http://{management_addr}"),
            registry,
            stats,
            fanout,
            trigger,
        })
    }
}

/// Offline notifications: serves the push sink on `addr`, points `chat`'s notifications at it and
/// at the delay queue (on moto's SQS), and polls the queue for the notifier. Returns the sink's
/// URL.
async fn start_notifications(
    chat: &mut chat_store::Config,
    sdk: &aws_config::SdkConfig,
    addr: SocketAddr,
    shutdown: &shutdown::Shutdown,
) -> Result<String, Error> {
    let listener = TcpListener::bind(addr).await?;
    let url = format!("http://{}", listener.local_addr()?);
    push_sink::PushSink::default().serve(listener, shutdown.clone());
    if chat.notify.sqs_endpoint.is_none() {
        chat.notify.sqs_endpoint = chat.kinesis_endpoint.clone();
    }
    chat.notify.push_sink_url = Some(url.clone());
    let sqs = chat.sqs_client(sdk);
    if chat.notify.queue_url.is_none() {
        chat.notify.queue_url = Some(notify::queue_url(&sqs).await?);
    }
    let function = <notifier::NotifierFunction as chat_lambda::EventHandler>::from_config(
        &chat.for_function("notifier"),
        sdk,
    )
    .await?;
    let queue = chat.notify.queue_url.clone().unwrap_or_default();
    let run = move |event| {
        let function = function.clone();
        async move { function.handle(event).await }
    };
    queue_poll::spawn(sqs, queue, run, shutdown.clone());
    Ok(url)
}

/// Typing's expiry checks' queue (template `TypingQueue`, on moto's SQS): points `chat` at it
/// and returns its client and URL, for `queue_poll` to run the ws-connection handler's checks.
/// None (a warning): no such queue where SQS is, and typists expire without a push of their own.
async fn typing_queue(
    chat: &mut chat_store::Config,
    sdk: &aws_config::SdkConfig,
) -> Option<(aws_sdk_sqs::Client, String)> {
    if chat.notify.sqs_endpoint.is_none() {
        chat.notify.sqs_endpoint = chat.kinesis_endpoint.clone();
    }
    let sqs = chat.sqs_client(sdk);
    let url = match &chat.typing_queue_url {
        Some(url) => url.clone(),
        None => match queue_poll::queue_url(&sqs, TYPING_QUEUE).await {
            Ok(url) => url,
            Err(e) => {
                tracing::warn!(error = %e, "typing expiry is not pushed");
                return None;
            }
        },
    };
    chat.typing_queue_url = Some(url.clone());
    Some((sqs, url))
}

/// The expiry checks' queue's logical id (template.yaml), the name the local stack creates it
/// under.
const TYPING_QUEUE: &str = "TypingQueue";

/// The REST edge in front of the REST API's upstream; returns its URL.
async fn serve_rest(
    (addr, upstream, per_route, deadline): &(SocketAddr, String, usize, Duration),
    shutdown: &shutdown::Shutdown,
) -> Result<String, Error> {
    let listener = TcpListener::bind(addr).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let edge = rest_edge::RestEdge::new(upstream.clone(), *per_route, *deadline);
    http::serve(listener, shutdown.clone(), move |req, _| {
        let edge = edge.clone();
        async move { edge.handle(req).await }
    });
    Ok(url)
}

/// The demo's static files; returns its URL.
async fn serve_demo(
    (addr, dir): &(SocketAddr, std::path::PathBuf),
    shutdown: &shutdown::Shutdown,
) -> Result<String, Error> {
    let listener = TcpListener::bind(addr).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let dir = Arc::new(dir.clone());
    http::serve(listener, shutdown.clone(), move |req, _| {
        let dir = dir.clone();
        async move { static_files::serve(&dir, req.method(), req.uri().path()).await }
    });
    Ok(url)
}

impl RunningGateway {
    /// Counters of the two mappings (invocations, redeliveries, records given up).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The fanout's push counters (delivered, retried, given up, records deleted).
    pub fn fanout_stats(&self) -> &fanout::FanoutStats {
        &self.fanout
    }

    /// Test hook: the next `times` `POST /@connections/{connection_id}` answer `status` (e.g. 500)
    /// instead of delivering.
    pub fn inject_post_failures(&self, connection_id: &str, status: u16, times: u32) {
        self.registry.inject_failures(connection_id, status, times);
    }

    /// How many injected failures for this connection have not been served yet.
    pub fn pending_post_failures(&self, connection_id: &str) -> u32 {
        self.registry.pending_failures(connection_id)
    }

    /// Stops accepting, closes every WebSocket (each gets its `$disconnect`), stops the pollers,
    /// and waits (at most 10 s) for all of it.
    pub async fn shutdown(self) {
        self.trigger.fire(Duration::from_secs(10)).await;
    }
}
