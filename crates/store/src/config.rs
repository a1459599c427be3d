//! Configuration: every environment variable the functions read, read here once at init (README
//! "Configuration"), and the AWS clients built from it.

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use std::fmt;
use std::time::Duration;

pub use aws_config::SdkConfig;

use crate::retry::Timeouts;

pub const DEFAULT_LOCAL_JWT_SECRET: &str = "local-dev-secret";

/// How callers are identified (docs/api.md §3). Chosen by configuration, never guessed from a
/// request.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// Deployed: REST trusts only the `sub` that the HTTP API's JWT authorizer verified; WebSocket
    /// `$connect` verifies RS256 tokens of `issuer` for one of `audiences` itself.
    ApiGateway {
        issuer: Option<String>,
        audiences: Vec<String>,
    },
    /// Local stack (`CHAT_AUTH_MODE=local`): HS256 tokens with this secret, for REST and WebSocket.
    Local { secret: Vec<u8> },
}

impl fmt::Debug for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthMode::ApiGateway { issuer, audiences } => f
                .debug_struct("ApiGateway")
                .field("issuer", issuer)
                .field("audiences", audiences)
                .finish(),
            AuthMode::Local { .. } => f.write_str("Local(HS256)"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub chat_table: String,
    pub connections_table: String,
    /// The archived idempotency keys' table (`CHAT_ARCHIVED_KEYS_TABLE`, default
    /// `ArchivedKeysTable`).
    pub archived_keys_table: String,
    pub event_stream: String,
    pub dynamodb_endpoint: Option<String>,
    pub kinesis_endpoint: Option<String>,
    /// Management API endpoint of the WebSocket API (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`).
    pub ws_management_endpoint: Option<String>,
    pub auth: AuthMode,
    /// `AWS_REGION` / `AWS_DEFAULT_REGION` is set (otherwise a local endpoint gets `us-east-1`).
    pub region_configured: bool,
    /// `AWS_ACCESS_KEY_ID` is set (otherwise a local endpoint gets dummy credentials).
    pub credentials_configured: bool,
    /// Time bounds of REST requests and DynamoDB calls (`CHAT_REQUEST_BUDGET_MS`,
    /// `CHAT_DYNAMODB_TIMEOUT_MS`).
    pub timeouts: Timeouts,
    /// `CHAT_METRICS=emf`: metrics as CloudWatch embedded-metric-format lines (`telemetry`).
    pub metrics: bool,
    /// `AWS_LAMBDA_FUNCTION_NAME` (set by Lambda; `cargo lambda watch` sets the binary's name):
    /// the metrics' dimension, and the function whose IAM role the clients act for.
    pub function_name: Option<String>,
    /// `CHAT_IAM_LOG`: a directory where every client records the IAM actions its calls need
    /// (`iam_log`; tests only).
    pub iam_log: Option<std::path::PathBuf>,
    /// The archive bucket (`CHAT_ARCHIVE_BUCKET`): where history reads archived messages and the
    /// archiver writes them. None: no archive tier (nothing is archived or listed).
    pub archive_bucket: Option<String>,
    /// An S3-API endpoint (`S3_ENDPOINT`, locally moto's), addressed path-style.
    pub s3_endpoint: Option<String>,
    /// The archive age and work-list buckets (`ARCHIVE_AFTER_DAYS`, default 90; locally
    /// `CHAT_ARCHIVE_AFTER_SECONDS`, which also makes the buckets 5 s wide).
    pub archive: crate::ArchiveSettings,
    /// Offline notifications (`notify`): the delay queue (`CHAT_NOTIFY_QUEUE_URL`; None: no
    /// notifications), its SQS endpoint (`SQS_ENDPOINT`, locally moto's), the delay
    /// (`NOTIFY_DELAY_SECONDS`, template `NotifyDelaySeconds`), what a notification shows
    /// (`NOTIFICATION_CONTENT`), and locally the push sink that stands in for SNS
    /// (`CHAT_PUSH_SINK_URL`).
    pub notify: crate::notify::NotifySettings,
    /// Typing's expiry checks' delay queue (`CHAT_TYPING_QUEUE_URL`, template `TypingQueue`; its
    /// SQS endpoint is `notify`'s). None: a typist who goes quiet without `stop` is dropped from
    /// the set without a push of its own (docs/api.md §37).
    pub typing_queue_url: Option<String>,
    /// Per-user rate limits (`CHAT_SEND_RATE`, `CHAT_SEND_BURST`, `CHAT_REQUEST_RATE`,
    /// `CHAT_REQUEST_BURST`, `CHAT_REQUEST_SAMPLE`; template parameters; 0 turns one off).
    pub rate_limits: crate::RateLimits,
    /// The attachments bucket (`CHAT_ATTACHMENTS_BUCKET`; None: attachments are off).
    pub attachments_bucket: Option<String>,
    /// Its S3 endpoint, when not `s3_endpoint` (`CHAT_ATTACHMENTS_S3_ENDPOINT`; locally the S3
    /// gate, infra/s3-gate, which clients reach with the presigned URLs signed for it).
    pub attachments_s3_endpoint: Option<String>,
    /// What uploads may be (`CHAT_MAX_ATTACHMENT_BYTES`, `CHAT_ATTACHMENT_CONTENT_TYPES`:
    /// template parameters `MaxAttachmentBytes`, `AttachmentContentTypes`), and whether they are
    /// scanned for malware (`CHAT_SCAN_UPLOADS`: `ScanUploads`).
    pub attachment_policy: chat_domain::attachments::AttachmentPolicy,
}

fn attachment_policy() -> Result<chat_domain::attachments::AttachmentPolicy, String> {
    use chat_domain::attachments::{
        AttachmentPolicy, DEFAULT_CONTENT_TYPES, DEFAULT_MAX_ATTACHMENT_BYTES,
    };
    let max = match var("CHAT_MAX_ATTACHMENT_BYTES") {
        None => DEFAULT_MAX_ATTACHMENT_BYTES,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("CHAT_MAX_ATTACHMENT_BYTES must be a number, not {v:?}"))?,
    };
    let types = var("CHAT_ATTACHMENT_CONTENT_TYPES");
    // Template parameter `ScanUploads` ("true"/"false"); locally `1`.
    let scan = match var("CHAT_SCAN_UPLOADS").as_deref().map(str::trim) {
        None | Some("" | "false" | "0" | "off") => false,
        Some("true" | "1" | "on") => true,
        Some(other) => {
            return Err(format!(
                "CHAT_SCAN_UPLOADS must be true or false, not {other:?}"
            ))
        }
    };
    Ok(
        AttachmentPolicy::new(max, types.as_deref().unwrap_or(DEFAULT_CONTENT_TYPES))
            .with_scanning(scan),
    )
}

fn millis(name: &str, default: Duration) -> Result<Duration, String> {
    match var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{name} must be a number of milliseconds, not {v:?}")),
    }
}

/// The rate limits from the environment, each unset one at its default.
fn rate_limits() -> Result<crate::RateLimits, String> {
    let number = |name: &str, default: u32| -> Result<u32, String> {
        var(name).map_or(Ok(default), |v| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("{name} must be a whole number, not {v:?}"))
        })
    };
    let d = crate::RateLimits::DEFAULT;
    let bucket = |rate: &str, burst: &str, default: chat_domain::rate::Bucket| {
        Ok::<_, String>(chat_domain::rate::Bucket {
            per_second: number(rate, default.per_second)?,
            burst: number(burst, default.burst)?.max(1),
        })
    };
    Ok(crate::RateLimits {
        sends: bucket("CHAT_SEND_RATE", "CHAT_SEND_BURST", d.sends)?,
        requests: bucket("CHAT_REQUEST_RATE", "CHAT_REQUEST_BURST", d.requests)?,
        sample: number("CHAT_REQUEST_SAMPLE", d.sample)?.max(1),
    })
}

/// `ARCHIVE_AFTER_DAYS` (template parameter `ArchiveAfterDays`), or locally
/// `CHAT_ARCHIVE_AFTER_SECONDS`, with 5-second work-list buckets so that the archiver, run every
/// 5 s, keeps up with an age of seconds.
fn archive_settings() -> Result<crate::ArchiveSettings, String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        var(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name} must be a whole number, not {v:?}"))
            })
            .transpose()
    };
    let mut settings = crate::ArchiveSettings::AWS;
    if let Some(days) = number("ARCHIVE_AFTER_DAYS")? {
        settings.age = Duration::from_secs(days * 86_400);
    }
    if let Some(seconds) = number("CHAT_ARCHIVE_AFTER_SECONDS")? {
        settings.age = Duration::from_secs(seconds);
        settings.bucket_seconds = 5;
    }
    Ok(settings)
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Config {
    pub fn from_env() -> Result<Config, String> {
        let auth = match var("CHAT_AUTH_MODE").as_deref() {
            None | Some("apigw") => AuthMode::ApiGateway {
                issuer: var("JWT_ISSUER"),
                audiences: var("JWT_AUDIENCE")
                    .unwrap_or_default()
                    .split(',')
                    .map(|a| a.trim().to_owned())
                    .filter(|a| !a.is_empty())
                    .collect(),
            },
            // No silent default: a function deployed with CHAT_AUTH_MODE=local by mistake would
            // otherwise accept tokens anyone can mint with the public default secret. The local
            // stack (infra/run-local.sh) sets it explicitly.
            Some("local") => AuthMode::Local {
                secret: var("CHAT_LOCAL_JWT_SECRET")
                    .ok_or(format!(
                        "CHAT_AUTH_MODE=local needs CHAT_LOCAL_JWT_SECRET (the local stack sets \
                         {DEFAULT_LOCAL_JWT_SECRET:?})"
                    ))?
                    .into_bytes(),
            },
            Some(other) => {
                return Err(format!(
                    "CHAT_AUTH_MODE must be 'apigw' or 'local', not {other:?}"
                ))
            }
        };
        let dynamodb_endpoint = var("DYNAMODB_ENDPOINT");
        let defaults = if dynamodb_endpoint.is_some() {
            Timeouts::LOCAL
        } else {
            Timeouts::AWS
        };
        let timeouts = Timeouts {
            request_budget: millis("CHAT_REQUEST_BUDGET_MS", defaults.request_budget)?,
            dynamodb_attempt: millis("CHAT_DYNAMODB_TIMEOUT_MS", defaults.dynamodb_attempt)?,
        };
        Ok(Config {
            chat_table: var("CHAT_TABLE").unwrap_or_else(|| "ChatTable".into()),
            connections_table: var("CONNECTIONS_TABLE")
                .unwrap_or_else(|| "ConnectionsTable".into()),
            archived_keys_table: var("CHAT_ARCHIVED_KEYS_TABLE")
                .unwrap_or_else(|| crate::ARCHIVED_KEYS_TABLE.into()),
            event_stream: var("EVENT_STREAM").unwrap_or_else(|| "EventStream".into()),
            dynamodb_endpoint,
            kinesis_endpoint: var("KINESIS_ENDPOINT"),
            ws_management_endpoint: var("WS_MANAGEMENT_ENDPOINT"),
            auth,
            region_configured: var("AWS_REGION").is_some() || var("AWS_DEFAULT_REGION").is_some(),
            credentials_configured: var("AWS_ACCESS_KEY_ID").is_some(),
            timeouts,
            metrics: match var("CHAT_METRICS").as_deref() {
                None | Some("off") => false,
                Some("emf") => true,
                Some(other) => {
                    return Err(format!(
                        "CHAT_METRICS must be 'emf' or 'off', not {other:?}"
                    ))
                }
            },
            function_name: var("AWS_LAMBDA_FUNCTION_NAME"),
            iam_log: var("CHAT_IAM_LOG").map(Into::into),
            archive_bucket: var("CHAT_ARCHIVE_BUCKET"),
            s3_endpoint: var("S3_ENDPOINT"),
            archive: archive_settings()?,
            attachments_bucket: var("CHAT_ATTACHMENTS_BUCKET"),
            attachments_s3_endpoint: var("CHAT_ATTACHMENTS_S3_ENDPOINT"),
            attachment_policy: attachment_policy()?,
            rate_limits: rate_limits()?,
            notify: crate::notify::NotifySettings::from_env(var)?,
            typing_queue_url: var("CHAT_TYPING_QUEUE_URL"),
        })
    }

    /// The same settings for the clients of the function `name` (its binary name): what they do
    /// is recorded under its name in `iam_log`, and counted under it in metrics.
    pub fn for_function(&self, name: &str) -> Config {
        Config {
            function_name: Some(name.to_owned()),
            ..self.clone()
        }
    }

    /// The recorder of the IAM actions this function's calls need, when `CHAT_IAM_LOG` is set
    /// and the clients are a function's (a test's own clients are no function's).
    pub fn iam_recorder(&self) -> Option<crate::iam_log::RecordIamNeeds> {
        let dir = self.iam_log.as_ref()?;
        let function = self.function_name.as_deref()?;
        Some(crate::iam_log::RecordIamNeeds::new(dir, function))
    }

    /// Shared AWS settings. With a local endpoint and no region or credentials configured,
    /// `us-east-1` and dummy credentials are used so the local stack needs no AWS account.
    pub async fn sdk_config(&self) -> SdkConfig {
        let https = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        // Bounded calls: every request must answer within its deadline (retry.rs), so no single
        // call may hang; the SDK retries throttling itself, briefly, before our own retries.
        let attempt = self.timeouts.dynamodb_attempt;
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(1))
            .operation_attempt_timeout(attempt)
            .operation_timeout(attempt * 2)
            .build();
        let retries = RetryConfig::standard()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(20))
            .with_max_backoff(Duration::from_millis(500));
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(https)
            .timeout_config(timeouts)
            .retry_config(retries);
        let local = self.dynamodb_endpoint.is_some() || self.kinesis_endpoint.is_some();
        if local && !self.region_configured {
            loader = loader.region(Region::new("us-east-1"));
        }
        if local && !self.credentials_configured {
            loader = loader
                .credentials_provider(Credentials::new("local", "local", None, None, "local"));
        }
        loader.load().await
    }

    pub fn dynamodb_client(&self, sdk: &SdkConfig) -> aws_sdk_dynamodb::Client {
        let mut b = dynamodb_interceptors(aws_sdk_dynamodb::config::Builder::from(sdk));
        if let Some(url) = &self.dynamodb_endpoint {
            b = b.endpoint_url(url);
        }
        if let Some(r) = self.iam_recorder() {
            b = b.interceptor(r);
        }
        aws_sdk_dynamodb::Client::from_conf(b.build())
    }

    /// The chat table, its requests bounded by `timeouts.request_budget`.
    #[allow(clippy::let_and_return)] // one of the two `let store`s is compiled
    pub fn chat_store(&self, sdk: &SdkConfig) -> crate::ChatStore {
        let store = crate::ChatStore::new(self.dynamodb_client(sdk), self.chat_table.clone())
            .with_archived_keys_table(self.archived_keys_table.clone())
            .with_budget(self.timeouts.request_budget)
            .with_rate_limits(self.rate_limits, self.connections_table.clone());
        #[cfg(feature = "archive")]
        let store = store.with_archive(self.archive(sdk), self.archive);
        #[cfg(not(feature = "archive"))]
        let store = store.with_archive_tier(self.archive_bucket.is_some(), self.archive);
        #[cfg(feature = "attachments")]
        let store = store.with_attachments(self.attachments(sdk));
        store
    }

    #[cfg(any(feature = "archive", feature = "attachments"))]
    pub fn s3_client(&self, sdk: &SdkConfig) -> aws_sdk_s3::Client {
        self.s3_client_at(sdk, self.s3_endpoint.as_ref())
    }

    #[cfg(any(feature = "archive", feature = "attachments"))]
    fn s3_client_at(&self, sdk: &SdkConfig, endpoint: Option<&String>) -> aws_sdk_s3::Client {
        let mut b = aws_sdk_s3::config::Builder::from(sdk);
        if let Some(url) = endpoint {
            // A local stand-in (moto) serves buckets by path, not by host name.
            b = b.endpoint_url(url).force_path_style(true);
        }
        if let Some(r) = self.iam_recorder() {
            b = b.interceptor(r);
        }
        aws_sdk_s3::Client::from_conf(b.build())
    }

    /// The archive tier, when a bucket is configured.
    #[cfg(feature = "archive")]
    pub fn archive(&self, sdk: &SdkConfig) -> Option<crate::archive::Archive> {
        let bucket = self.archive_bucket.as_ref()?;
        Some(crate::archive::Archive::new(
            self.s3_client(sdk),
            bucket.clone(),
        ))
    }

    /// The attachments bucket, when one is configured.
    #[cfg(feature = "attachments")]
    pub fn attachments(&self, sdk: &SdkConfig) -> Option<crate::attachments::Attachments> {
        let bucket = self.attachments_bucket.as_ref()?;
        let endpoint = self.attachments_s3_endpoint.as_ref();
        Some(crate::attachments::Attachments::new(
            self.s3_client_at(sdk, endpoint.or(self.s3_endpoint.as_ref())),
            bucket.clone(),
            self.attachment_policy.clone(),
        ))
    }

    /// The connections table.
    pub fn connection_store(&self, sdk: &SdkConfig) -> crate::ConnectionStore {
        crate::ConnectionStore::new(self.dynamodb_client(sdk), self.connections_table.clone())
    }

    #[cfg(feature = "kinesis")]
    pub fn kinesis_client(&self, sdk: &SdkConfig) -> aws_sdk_kinesis::Client {
        let mut b = aws_sdk_kinesis::config::Builder::from(sdk);
        if let Some(url) = &self.kinesis_endpoint {
            b = b.endpoint_url(url);
        }
        if let Some(r) = self.iam_recorder() {
            b = b.interceptor(r);
        }
        aws_sdk_kinesis::Client::from_conf(b.build())
    }

    #[cfg(feature = "management")]
    pub fn management_client(
        &self,
        sdk: &SdkConfig,
    ) -> Option<aws_sdk_apigatewaymanagement::Client> {
        let url = self.ws_management_endpoint.as_ref()?;
        let mut b = aws_sdk_apigatewaymanagement::config::Builder::from(sdk).endpoint_url(url);
        if let Some(r) = self.iam_recorder() {
            b = b.interceptor(r);
        }
        Some(aws_sdk_apigatewaymanagement::Client::from_conf(b.build()))
    }
}

#[cfg(feature = "notify")]
impl Config {
    /// The notification delay queue's client (SQS).
    pub fn sqs_client(&self, sdk: &SdkConfig) -> aws_sdk_sqs::Client {
        let mut b = aws_sdk_sqs::config::Builder::from(sdk);
        if let Some(url) = &self.notify.sqs_endpoint {
            b = b.endpoint_url(url);
        }
        if let Some(r) = self.iam_recorder() {
            b = b.interceptor(r);
        }
        aws_sdk_sqs::Client::from_conf(b.build())
    }

    /// Where notifications go: the push sink when configured (local stack), else SNS.
    pub fn pusher(&self, sdk: &SdkConfig) -> crate::push::Pusher {
        match &self.notify.push_sink_url {
            Some(url) => crate::push::Pusher::Sink(url.clone()),
            None => {
                let mut b = aws_sdk_sns::config::Builder::from(sdk);
                if let Some(r) = self.iam_recorder() {
                    b = b.interceptor(r);
                }
                crate::push::Pusher::Sns(
                    aws_sdk_sns::Client::from_conf(b.build()),
                    self.notify.platform_arns.clone(),
                )
            }
        }
    }
}

impl Config {
    /// Logs and metrics of a function (`telemetry::init`), from this configuration.
    pub fn init_telemetry(&self) {
        crate::telemetry::init(self.metrics, self.function_name.clone());
    }
}

/// What every function does first, once per instance (REST and event functions alike): its
/// configuration from the environment, its logs and metrics, and the SDK's shared settings.
/// The error is the Lambda runtime's (`lambda_runtime::Error` is this type).
pub async fn init() -> Result<(Config, SdkConfig), Box<dyn std::error::Error + Send + Sync>> {
    let config = Config::from_env()?;
    config.init_telemetry();
    let sdk = config.sdk_config().await;
    Ok((config, sdk))
}

/// The interceptors every DynamoDB client of the product carries (the tests' clients too, so
/// that they see what production sees): the call counter of the request log, and the rule that
/// an attempt whose answer was lost never ends as "throttled" ([`crate::retry::UnknownOutcomes`]).
pub fn dynamodb_interceptors(
    builder: aws_sdk_dynamodb::config::Builder,
) -> aws_sdk_dynamodb::config::Builder {
    builder
        .interceptor(crate::telemetry::BeforeTransmit(
            crate::telemetry::CountCalls,
        ))
        .interceptor(crate::retry::UnknownOutcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Environment variables are process-wide: the cases run in one test, one after the other.
    #[test]
    fn local_auth_needs_an_explicit_secret() {
        std::env::set_var("CHAT_AUTH_MODE", "local");
        std::env::remove_var("CHAT_LOCAL_JWT_SECRET");
        let err = Config::from_env().unwrap_err();
        assert!(err.contains("CHAT_LOCAL_JWT_SECRET"), "{err}");
        std::env::set_var("CHAT_LOCAL_JWT_SECRET", "s3cret");
        let config = Config::from_env().unwrap();
        assert_eq!(
            config.auth,
            AuthMode::Local {
                secret: b"s3cret".to_vec()
            }
        );
        std::env::remove_var("CHAT_AUTH_MODE");
        std::env::remove_var("CHAT_LOCAL_JWT_SECRET");
        assert!(matches!(
            Config::from_env().unwrap().auth,
            AuthMode::ApiGateway { .. }
        ));
    }
}
