//! What operators see (README "Deploy", "Operating it"): logs as the Lambda runtime's default
//! subscriber writes them (so `AWS_LAMBDA_LOG_FORMAT=JSON` and `AWS_LAMBDA_LOG_LEVEL` work), but
//! never a raw event or SDK payload even at TRACE (`payload_free`), a line per REST request (errors,
//! throttles and slow ones always, one in `CHAT_LOG_EVERY` of the rest: `request_line_due`), and
//! metrics in CloudWatch's embedded metric format (EMF): JSON lines on stdout that CloudWatch
//! turns into metrics, with no API call and no extra latency.

use std::cell::Cell;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use chat_domain::log_sampling::LogSampling;
use tracing::Level;
use tracing_subscriber::filter::{filter_fn, EnvFilter, LevelFilter};
use tracing_subscriber::fmt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "Chat";

/// Where metrics go: the function's name (their dimension), when metrics are on.
static METRICS: OnceLock<Option<String>> = OnceLock::new();

/// Sets up logging and, with `metrics` on, EMF metrics named after `function`. Call once per
/// process (later calls are ignored).
pub fn init(metrics: bool, function: Option<String>) {
    init_with_writer(metrics, function, std::io::stdout);
}

/// As `init`, with logs written to `writer` (tests read them back).
///
/// The subscriber is the Lambda runtime's default one (`AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`,
/// else INFO; `RUST_LOG`'s directives; JSON lines with `AWS_LAMBDA_LOG_FORMAT=JSON`), plus
/// [`payload_free`].
pub fn init_with_writer<W>(metrics: bool, function: Option<String>, writer: W)
where
    W: for<'w> fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    static LOGS: std::sync::Once = std::sync::Once::new();
    LOGS.call_once(|| {
        let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
            .or_else(|_| std::env::var("RUST_LOG"))
            .ok();
        let directives = std::env::var("RUST_LOG").ok();
        let json =
            std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
        let logs = fmt()
            .with_target(false)
            .without_time()
            .with_env_filter(log_filter(level.as_deref(), directives.as_deref()))
            .with_writer(writer);
        let no_payloads = filter_fn(|m| payload_free(m.target(), *m.level()));
        let installed = if json {
            logs.json().finish().with(no_payloads).try_init()
        } else {
            logs.finish().with(no_payloads).try_init()
        };
        if let Err(e) = installed {
            eprintln!("logging not set up: {e}");
        }
    });
    let _ = METRICS.set(metrics.then(|| function.unwrap_or_else(|| "local".into())));
}

/// Which routine lines are written (`chat_domain::log_sampling`): `CHAT_LOG_EVERY` and
/// `CHAT_LOG_SLOW_MS`, read once; a value that does not parse writes every line (and says so).
static SAMPLING: Mutex<Option<LogSampling>> = Mutex::new(None);
/// Routine lines of each kind so far in this instance: REST requests, stream consumers' batches.
static REQUEST_LINES: AtomicU64 = AtomicU64::new(0);
static BATCH_LINES: AtomicU64 = AtomicU64::new(0);

fn sampling() -> LogSampling {
    let mut s = SAMPLING.lock().unwrap_or_else(|p| p.into_inner());
    *s.get_or_insert_with(|| {
        let every = std::env::var("CHAT_LOG_EVERY").ok();
        let slow = std::env::var("CHAT_LOG_SLOW_MS").ok();
        LogSampling::parse(every.as_deref(), slow.as_deref()).unwrap_or_else(|e| {
            eprintln!("{e}: every line is logged");
            LogSampling {
                every: 1,
                ..LogSampling::DEFAULT
            }
        })
    })
}

/// Replaces the sampling read from the environment and starts the counts over (tests, the bench).
pub fn set_log_sampling(s: LogSampling) {
    *SAMPLING.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    REQUEST_LINES.store(0, Ordering::Relaxed);
    BATCH_LINES.store(0, Ordering::Relaxed);
}

/// Whether a REST request's `request` line is written: its status is 400 or above, it was slow,
/// or it is the one in `CHAT_LOG_EVERY` ordinary requests of this instance.
pub fn request_line_due(status: u16, latency_ms: u64) -> bool {
    let s = sampling();
    s.keeps_request(
        status,
        latency_ms,
        REQUEST_LINES.fetch_add(1, Ordering::Relaxed),
    )
}

/// Whether a stream consumer's per-batch line is written (`abnormal`: a retry, a failure, a
/// record given up): as `request_line_due`.
pub fn batch_line_due(abnormal: bool, latency_ms: u64) -> bool {
    let s = sampling();
    s.keeps(
        abnormal,
        latency_ms,
        BATCH_LINES.fetch_add(1, Ordering::Relaxed),
    )
}

/// `level` (default INFO) for everything, refined by `directives` (the `RUST_LOG` syntax): the
/// Lambda runtime's default filter.
pub fn log_filter(level: Option<&str>, directives: Option<&str>) -> EnvFilter {
    let level = level
        .and_then(|l| LevelFilter::from_str(l).ok())
        .unwrap_or(LevelFilter::INFO);
    EnvFilter::builder()
        .with_default_directive(level.into())
        .parse_lossy(directives.unwrap_or_default())
}

/// Crates whose TRACE lines are raw payloads: the Lambda runtime logs every event it receives
/// ("raw JSON event received from Lambda": the `Authorization` header of REST requests, the
/// `?token=` of `$connect`, message bodies), the AWS SDK every request and response (items with
/// message bodies).
pub const NO_TRACE_FROM: [&str; 2] = ["lambda_runtime", "aws_smithy_runtime"];

/// Whether a line of `target` at `level` may be logged: everything but [`NO_TRACE_FROM`]'s TRACE
/// lines, whatever `LogLevel` or `RUST_LOG` say (TRACE is for our own code's detail, never for
/// credentials or content).
pub fn payload_free(target: &str, level: Level) -> bool {
    let payload_crate = NO_TRACE_FROM.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    });
    !(payload_crate && level == Level::TRACE)
}

/// One metric data point (`unit`: `Count`, `Milliseconds`, …), if metrics are on.
pub fn metric(name: &str, value: f64, unit: &str) {
    let Some(Some(function)) = METRICS.get() else {
        return;
    };
    let line = serde_json::json!({
        "_aws": {
            "Timestamp": chat_domain::time::unix_millis(chat_domain::time::now()),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["Function"]],
                "Metrics": [{"Name": name, "Unit": unit}],
            }],
        },
        "Function": function,
        name: value,
    });
    println!("{line}");
}

pub fn count(name: &str, n: u64) {
    metric(name, n as f64, "Count");
}

tokio::task_local! {
    /// DynamoDB calls made by the request being served (see `CountCalls`).
    static CALLS: Cell<u32>;
}

/// Runs `fut` (one request) counting its DynamoDB calls; returns its output and the count.
pub async fn counting_calls<F: std::future::Future>(fut: F) -> (F::Output, u32) {
    CALLS
        .scope(Cell::new(0), async {
            let out = fut.await;
            (out, CALLS.with(Cell::get))
        })
        .await
}

/// Counts every DynamoDB HTTP attempt of the request in whose task it runs (as an SDK
/// interceptor: `BeforeTransmit(CountCalls)`).
#[derive(Debug, Clone, Copy)]
pub struct CountCalls;

impl ReadBeforeTransmit for CountCalls {
    const NAME: &'static str = "CountCalls";

    fn read(&self, _request: &HttpRequest) -> Result<(), BoxError> {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        Ok(())
    }
}

/// What an interceptor that only reads each request just before it is sent (every attempt,
/// retries included) does with it; `BeforeTransmit` makes it an SDK interceptor.
pub trait ReadBeforeTransmit: std::fmt::Debug + Send + Sync {
    /// The interceptor's name in the SDK's logs.
    const NAME: &'static str;

    /// Reads the request; an error fails this attempt.
    fn read(&self, request: &HttpRequest) -> Result<(), BoxError>;
}

/// The SDK interceptor of a `ReadBeforeTransmit` (of any client of this workspace's SDKs).
#[derive(Debug, Clone)]
pub struct BeforeTransmit<R>(pub R);

impl<R: ReadBeforeTransmit> Intercept for BeforeTransmit<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }

    fn read_before_transmit(
        &self,
        ctx: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.read(ctx.request())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_are_counted_per_request() {
        let (out, calls) = counting_calls(async {
            let _ = CALLS.try_with(|c| c.set(c.get() + 2));
            7
        })
        .await;
        assert_eq!((out, calls), (7, 2));
        // Outside a request nothing is counted, nothing fails.
        assert!(CALLS.try_with(Cell::get).is_err());
    }

    /// Log output kept in memory.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the filters let through of the runtime's raw-event line, the SDK's request dump, and
    /// our own trace and their debug lines, at `level` with `RUST_LOG` = `directives`.
    fn logged(level: &str, directives: Option<&str>) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = fmt()
            .with_env_filter(log_filter(Some(level), directives))
            .with_writer(move || writer.clone())
            .finish()
            .with(filter_fn(|m| payload_free(m.target(), *m.level())));
        tracing::subscriber::with_default(subscriber, || {
            tracing::trace!(
                target: "lambda_runtime::layers::api_response",
                body = "Bearer secret-token",
                "raw JSON event received from Lambda"
            );
            tracing::trace!(
                target: "aws_smithy_runtime::client::orchestrator",
                request = "secret body",
                "transmitting request"
            );
            tracing::trace!(target: "chat_store", "our own trace");
            tracing::debug!(target: "lambda_runtime::runtime", "their debug");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn trace_never_logs_raw_events_or_sdk_payloads() {
        for (level, directives) in [
            ("TRACE", None),
            // Asked for by name.
            (
                "trace",
                Some("trace,lambda_runtime=trace,aws_smithy_runtime::client=trace"),
            ),
        ] {
            let text = logged(level, directives);
            assert!(!text.contains("secret"), "{level} {directives:?}: {text}");
            assert!(text.contains("our own trace"), "{text}");
            assert!(text.contains("their debug"), "{text}");
        }
        let info = logged("INFO", None);
        assert!(!info.contains("our own trace") && !info.contains("their debug"));
    }

    #[test]
    fn only_the_payload_crates_trace_lines_are_dropped() {
        assert!(!payload_free("lambda_runtime", Level::TRACE));
        assert!(!payload_free(
            "lambda_runtime::layers::api_response",
            Level::TRACE
        ));
        assert!(!payload_free(
            "aws_smithy_runtime::client::orchestrator",
            Level::TRACE
        ));
        assert!(payload_free(
            "lambda_runtime::layers::api_response",
            Level::DEBUG
        ));
        assert!(payload_free("lambda_runtime_api_client", Level::TRACE));
        assert!(payload_free("aws_smithy_runtime_api::client", Level::TRACE));
        assert!(payload_free("chat_store", Level::TRACE));
    }
}
