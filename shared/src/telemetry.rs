//! What operators see (README "Deploy", "Operating it"): logs through the Lambda runtime's own subscriber (so
//! `AWS_LAMBDA_LOG_FORMAT=JSON` and `AWS_LAMBDA_LOG_LEVEL` work), one line per REST request, and
//! metrics in CloudWatch's embedded metric format (EMF): JSON lines on stdout that CloudWatch
//! turns into metrics, with no API call and no extra latency.

use std::cell::Cell;
use std::sync::OnceLock;

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;

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
pub fn init_with_writer<W>(metrics: bool, function: Option<String>, writer: W)
where
    W: for<'w> lambda_http::tracing::subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    static LOGS: std::sync::Once = std::sync::Once::new();
    LOGS.call_once(|| lambda_http::tracing::init_default_subscriber_with_writer(writer));
    let _ = METRICS.set(metrics.then(|| function.unwrap_or_else(|| "local".into())));
}

/// One metric data point (`unit`: `Count`, `Milliseconds`, …), if metrics are on.
pub fn metric(name: &str, value: f64, unit: &str) {
    let Some(Some(function)) = METRICS.get() else {
        return;
    };
    let line = serde_json::json!({
        "_aws": {
            "Timestamp": crate::time::unix_millis(crate::time::now()),
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

/// Counts every DynamoDB HTTP attempt of the request in whose task it runs.
#[derive(Debug, Clone, Copy)]
pub struct CountCalls;

impl Intercept for CountCalls {
    fn name(&self) -> &'static str {
        "CountCalls"
    }

    fn read_before_transmit(
        &self,
        _ctx: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        Ok(())
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
}
