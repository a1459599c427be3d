//! Test harness: starts our DynamoDB/Kinesis emulator (infra/moto_server.py, tables created from
//! template.yaml) once per test binary, or uses `DYNAMODB_ENDPOINT` when set, and calls the real
//! function handlers with API Gateway v2 (HTTP API) events routed like `cargo lambda watch` does.

pub mod capacity;
pub mod function_process;
pub mod indexer;
pub mod notify;
pub mod push;
pub mod scan;
pub mod server;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextMut;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents, SharedInterceptor};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use chat_http::auth::{mint_hs256, Authenticator};
use chat_http::http::{self, App};
use chat_http::routes::{self, percent_decode};
use chat_store::archive::Archive;
use chat_store::retry::Timeouts;
use chat_store::ArchiveSettings;
use chat_store::{ChatStore, Config, ConnectionStore};
use serde_json::{json, Value};

pub const TEST_SECRET: &str = "test-secret";

/// Every DynamoDB round trip (HTTP request, retries included): its operation, how long it took,
/// for writes the request body (to compute write units from item sizes, `capacity`), and, once
/// `keep_reads` was called, for reads the request and the response (read units from the items
/// read, the benches).
#[derive(Debug, Default)]
pub struct CallLog {
    calls: Mutex<Vec<Call>>,
    /// Whether reads keep their request and response (`keep_reads`).
    reads: AtomicBool,
}

#[derive(Debug, Clone)]
pub struct Call {
    /// `GetItem`, `TransactWriteItems`, …
    pub name: String,
    pub elapsed: Duration,
    /// Answered with a 2xx (a cancelled transaction or a failed condition is not).
    pub ok: bool,
    /// The JSON request of a write (PutItem, UpdateItem, DeleteItem, TransactWriteItems,
    /// BatchWriteItem).
    pub write: Option<Vec<u8>>,
    /// A read's (GetItem, BatchGetItem, Query, Scan, TransactGetItems) request and response, when
    /// the log keeps reads.
    pub read: Option<Read>,
}

/// A read as sent and as answered, both DynamoDB JSON as the bytes on the wire (the benches parse
/// the few they need; a log of parsed responses would be several times larger).
#[derive(Debug, Clone)]
pub struct Read {
    pub request: Vec<u8>,
    /// The response body (an error's too), when the attempt got one in full; `None` when it got
    /// no answer.
    pub response: Option<Vec<u8>>,
}

impl CallLog {
    /// The operation names since the last take, in order.
    pub fn take(&self) -> Vec<String> {
        self.take_calls().into_iter().map(|c| c.name).collect()
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// From now on, reads keep their request and response (`Call::read`). Off by default: the
    /// tests and most benches only count calls, and a burst of reads keeps every item it read.
    pub fn keep_reads(&self) {
        self.reads.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
struct Counter(Arc<CallLog>);

#[derive(Debug, Clone)]
struct Started(Call, Instant);

impl Storable for Started {
    type Storer = StoreReplace<Self>;
}

/// The DynamoDB operations that write.
pub const WRITES: [&str; 5] = [
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "TransactWriteItems",
    "BatchWriteItem",
];

const READS: [&str; 5] = [
    "GetItem",
    "BatchGetItem",
    "Query",
    "Scan",
    "TransactGetItems",
];

/// The DynamoDB operation a request is for, by its `X-Amz-Target` (`DynamoDB_20120810.GetItem` →
/// `GetItem`); empty for S3 (REST, no target).
fn operation_of<'a>(
    ctx: &'a aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
) -> &'a str {
    let target = ctx.request().headers().get("x-amz-target");
    target
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or_default()
}

/// An armed action, run just before the next `TransactWriteItems` goes out (on a thread of its
/// own, to completion): something that happens between a request's reads and its commit, such as
/// a recorder's or a scanner's write at that moment.
#[derive(Clone, Default)]
pub struct BeforeNextTransaction(Arc<Mutex<Option<Action>>>);

/// What `BeforeNextTransaction` runs.
type Action = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for BeforeNextTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeNextTransaction")
    }
}

impl BeforeNextTransaction {
    /// Runs `action`'s future on a runtime of its own before the next transaction.
    pub fn arm<F>(&self, action: impl FnOnce() -> F + Send + 'static)
    where
        F: std::future::Future<Output = ()>,
    {
        let run = move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(action());
        };
        *self.0.lock().unwrap() = Some(Box::new(run));
    }

    /// Whether the armed action ran.
    pub fn fired(&self) -> bool {
        self.0.lock().unwrap().is_none()
    }

    pub fn interceptor(&self) -> SharedInterceptor {
        SharedInterceptor::new(self.clone())
    }
}

impl Intercept for BeforeNextTransaction {
    fn name(&self) -> &'static str {
        "BeforeNextTransaction"
    }

    fn read_before_transmit(
        &self,
        ctx: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if operation_of(ctx) != "TransactWriteItems" {
            return Ok(());
        }
        let Some(action) = self.0.lock().unwrap().take() else {
            return Ok(());
        };
        // The interceptor is synchronous: the action runs on a thread of its own.
        std::thread::spawn(action)
            .join()
            .expect("the action before the transaction");
        Ok(())
    }
}

/// A DynamoDB client of the test server's, for a `BeforeNextTransaction` action (its own runtime).
pub async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    let sdk = config().sdk_config().await;
    let db = aws_sdk_dynamodb::config::Builder::from(&sdk)
        .endpoint_url(server::dynamodb_endpoint())
        .build();
    aws_sdk_dynamodb::Client::from_conf(db)
}

impl Intercept for Counter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    /// Names the attempt by its `X-Amz-Target` (`DynamoDB_20120810.GetItem` → `GetItem`).
    fn read_before_transmit(
        &self,
        ctx: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let name = operation_of(ctx).to_owned();
        // S3 (REST, no target): `S3:GET`, `S3:PUT`, `S3:DELETE`.
        let name = if name.is_empty() {
            format!("S3:{}", ctx.request().method())
        } else {
            name
        };
        let body = ctx.request().body().bytes();
        let write = WRITES
            .contains(&name.as_str())
            .then(|| body.map(<[u8]>::to_vec))
            .flatten();
        let read =
            (self.0.reads.load(Ordering::Relaxed) && READS.contains(&name.as_str())).then(|| {
                Read {
                    request: body.unwrap_or_default().to_vec(),
                    response: None,
                }
            });
        let call = Call {
            name,
            elapsed: Duration::ZERO,
            ok: false,
            write,
            read,
        };
        cfg.interceptor_state()
            .store_put(Started(call, Instant::now()));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        ctx: &aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        if let Some(Started(mut call, at)) = cfg.load::<Started>().cloned() {
            call.elapsed = at.elapsed();
            call.ok = ctx.response().is_some_and(|r| r.status().is_success());
            if let Some(read) = &mut call.read {
                // Read in full before it was deserialized (an error's too).
                read.response = ctx
                    .response()
                    .and_then(|r| r.body().bytes())
                    .map(<[u8]>::to_vec);
            }
            self.0.calls.lock().unwrap().push(call);
        }
        Ok(())
    }
}

/// The tests' archive bucket on moto (once per binary; creating it again is harmless).
async fn create_archive_bucket(sdk: &aws_config::SdkConfig) {
    create_bucket(sdk, ARCHIVE_BUCKET).await
}

/// An S3 client with the tests' credentials, path-style, at `endpoint`: moto's S3 itself
/// (`server::kinesis_endpoint`) or the S3 gate in front of it (`server::s3_gate_endpoint`).
pub async fn s3_client(endpoint: String) -> aws_sdk_s3::Client {
    s3_client_of(&config().sdk_config().await, endpoint)
}

fn s3_client_of(sdk: &aws_config::SdkConfig, endpoint: String) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(sdk)
            .endpoint_url(endpoint)
            .force_path_style(true)
            .build(),
    )
}

async fn create_bucket(sdk: &aws_config::SdkConfig, bucket: &str) {
    let s3 = s3_client_of(sdk, server::kinesis_endpoint());
    if let Err(e) = s3.create_bucket().bucket(bucket).send().await {
        let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e);
        assert!(
            matches!(
                code,
                Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")
            ),
            "create the bucket {bucket}: {}",
            aws_sdk_s3::error::DisplayErrorContext(&e)
        );
    }
}

/// Retries DynamoDB's `TransactionConflictException` (a write meeting a transaction in flight),
/// which the SDK does not: for the tests' own set-up writes.
#[derive(Debug)]
struct RetryConflicts;

impl aws_smithy_runtime_api::client::retries::classifiers::ClassifyRetry for RetryConflicts {
    fn classify_retry(
        &self,
        ctx: &aws_smithy_runtime_api::client::interceptors::context::InterceptorContext,
    ) -> aws_smithy_runtime_api::client::retries::classifiers::RetryAction {
        use aws_smithy_runtime_api::client::retries::classifiers::RetryAction;
        let conflict = ctx.response().is_some_and(|r| {
            r.status().as_u16() == 400
                && r.body()
                    .bytes()
                    .is_some_and(|b| String::from_utf8_lossy(b).contains("TransactionConflict"))
        });
        if conflict {
            RetryAction::transient_error()
        } else {
            RetryAction::NoActionIndicated
        }
    }

    fn name(&self) -> &'static str {
        "RetryConflicts"
    }
}

type AnswerChange = dyn Fn(&mut HttpResponse) -> Result<(), BoxError> + Send + Sync;

/// Passes the answer of each `TransactWriteItems` attempt through a closure before the SDK reads
/// it: the closure may replace the answer, or fail the attempt (an answer lost on the way back).
/// For `TestApp::custom`: it knows a transaction by the call log's record of the attempt.
pub struct TransactionAnswers(Box<AnswerChange>);

impl TransactionAnswers {
    /// An interceptor that passes each `TransactWriteItems` answer through `change`.
    pub fn through(
        change: impl Fn(&mut HttpResponse) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> SharedInterceptor {
        SharedInterceptor::new(TransactionAnswers(Box::new(change)))
    }
}

impl std::fmt::Debug for TransactionAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransactionAnswers")
    }
}

impl Intercept for TransactionAnswers {
    fn name(&self) -> &'static str {
        "TransactionAnswers"
    }

    fn modify_before_deserialization(
        &self,
        ctx: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let attempt = cfg
            .load::<Started>()
            .map(|Started(call, _)| call.name.as_str());
        if attempt == Some("TransactWriteItems") {
            return (self.0)(ctx.response_mut());
        }
        Ok(())
    }
}

/// Log output kept in memory, for `chat_store::telemetry::init_with_writer`: every writer it
/// makes appends to the same buffer.
#[derive(Debug, Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    /// What was written since the last take.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> lambda_http::tracing::subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

/// The functions of the HTTP API, by the names the router and template.yaml use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Conversations,
    SendMessage,
    History,
    MarkRead,
    ReadStates,
    Inbox,
    MessageChanges,
    Attachments,
    Devices,
}

/// The inbox indexer's function (`TestApp::index`).
const INBOX_INDEX: &str = "inbox-index";
/// The notifier's function (`notify`).
const NOTIFIER: &str = "notifier";
/// The thumbnailer's function (`TestApp::thumbnailer`).
const THUMBNAILS: &str = "thumbnails";
/// The archiver's function (`TestApp::archiver`).
const ARCHIVER: &str = "archiver";
/// The archive bucket the tests create on moto: the template's logical id, in lower case as S3
/// names must be (infra/test_iam.py compares it so).
pub const ARCHIVE_BUCKET: &str = "archivebucket";
/// The attachments bucket the tests create on moto (reached through the S3 gate).
pub const ATTACHMENTS_BUCKET: &str = "attachmentsbucket";

impl Function {
    pub const ALL: [&'static str; 9] = [
        "conversations",
        "send-message",
        "history",
        "mark-read",
        "read-states",
        "inbox",
        "message-changes",
        "attachments",
        "devices",
    ];

    pub fn by_name(name: &str) -> Option<Function> {
        Some(match name {
            "conversations" => Function::Conversations,
            "send-message" => Function::SendMessage,
            "history" => Function::History,
            "mark-read" => Function::MarkRead,
            "read-states" => Function::ReadStates,
            "inbox" => Function::Inbox,
            "message-changes" => Function::MessageChanges,
            "attachments" => Function::Attachments,
            "devices" => Function::Devices,
            _ => return None,
        })
    }

    /// Its binary's name (template.yaml `BuildProperties.Binary`, the router's `function`).
    pub fn name(self) -> &'static str {
        match self {
            Function::Conversations => "conversations",
            Function::SendMessage => "send-message",
            Function::History => "history",
            Function::MarkRead => "mark-read",
            Function::ReadStates => "read-states",
            Function::Inbox => "inbox",
            Function::MessageChanges => "message-changes",
            Function::Attachments => "attachments",
            Function::Devices => "devices",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub headers: HashMap<String, String>,
    /// The body's size as sent (gzipped when it was: docs/api.md §1, "Compression").
    pub wire_bytes: usize,
}

impl Resp {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// A body as the client reads it: unpacked when its `Content-Encoding` is gzip.
pub fn gunzipped(headers: &HashMap<String, String>, bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    if headers.get("content-encoding").map(String::as_str) != Some("gzip") {
        return bytes.to_vec();
    }
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut unpacked)
        .expect("a gzip body");
    unpacked
}

/// The handlers' settings for the test server: its endpoint, and the local stack's timeouts (the
/// emulator answers one request at a time).
pub fn config() -> Config {
    Config {
        dynamodb_endpoint: Some(server::dynamodb_endpoint()),
        timeouts: Timeouts::LOCAL,
        ..Config::from_env().unwrap()
    }
}

/// The handlers over a store on the test server, with call counting.
pub struct TestApp {
    /// The handlers' shared state, for tests that use the store directly.
    pub app: App,
    /// The same per function, each with its own DynamoDB client, so that each function's calls
    /// are recorded under its name for the IAM check (`CHAT_IAM_LOG`, infra/test_iam.py).
    apps: HashMap<&'static str, App>,
    pub calls: Arc<CallLog>,
    /// The same DynamoDB client the store uses, for tests that set up or inspect items directly.
    pub db: aws_sdk_dynamodb::Client,
    /// The chat table's name.
    pub table: String,
    streams: aws_sdk_dynamodbstreams::Client,
    /// What the conversations function closes a suspended user's connections with (none: it
    /// closes none), `with_sessions`.
    sessions: Option<conversations::Sessions>,
}

/// Runs the requests at once, each on its own task (as concurrent clients do), and gives their
/// answers in order.
pub async fn at_once<T: Send + 'static>(
    requests: impl IntoIterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let tasks: Vec<_> = requests.into_iter().map(tokio::spawn).collect();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("a request task"))
        .collect()
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Asserts a send's answer: `status` (201 sent, 200 a replay) with its message at `seq`.
#[track_caller]
pub fn assert_sent(r: &Resp, status: u16, seq: u64) {
    assert_eq!((r.status, &r.body["seq"]), (status, &json!(seq)), "{r:?}");
}

/// `n` new user ids.
pub fn unique_users(n: usize) -> Vec<String> {
    let prefix = unique("u");
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The seqs of the messages of a history answer, in its order.
pub fn seqs(history: &Value) -> Vec<u64> {
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect()
}

/// `user`'s entry among the members of a read-states answer.
pub fn member_state<'a>(read_states: &'a Value, user: &str) -> &'a Value {
    read_states["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["userId"] == user)
        .unwrap_or_else(|| panic!("no read state of {user}: {read_states}"))
}

pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub fn token(user: &str) -> String {
    mint_hs256(user, 4_000_000_000, TEST_SECRET.as_bytes())
}

/// A token of `user` with these extra claims (a moderator's `scope`, `cognito:groups` …).
pub fn token_with(user: &str, claims: Value) -> String {
    let mut all = json!({"sub": user, "exp": 4_000_000_000u64});
    if let (Some(all), Some(extra)) = (all.as_object_mut(), claims.as_object()) {
        all.extend(extra.clone());
    }
    chat_http::auth::mint_hs256_claims(&all, TEST_SECRET.as_bytes())
}

impl TestApp {
    pub async fn new() -> TestApp {
        Self::with_auth(Authenticator::LocalHs256 {
            secret: TEST_SECRET.as_bytes().to_vec(),
        })
        .await
    }

    pub async fn with_auth(auth: Authenticator) -> TestApp {
        Self::build(auth, Timeouts::LOCAL.request_budget, None, None, None).await
    }

    /// With malware scanning on (`ScanUploads`, docs/api.md §36): uploads go through an S3 gate
    /// whose stand-in scanner (`scanner`) tags them and delivers each verdict to the
    /// thumbnailer, as GuardDuty and its EventBridge rule do deployed (`scan`).
    pub async fn scanning(scanner: scan::Scanner) -> TestApp {
        let auth = Authenticator::LocalHs256 {
            secret: TEST_SECRET.as_bytes().to_vec(),
        };
        let gate = scan::gate_endpoint(scanner);
        Self::build(auth, Timeouts::LOCAL.request_budget, None, None, Some(gate)).await
    }

    /// `scanning`, with an extra interceptor on the DynamoDB client (`custom`).
    pub async fn scanning_custom(
        scanner: scan::Scanner,
        interceptor: Option<SharedInterceptor>,
    ) -> TestApp {
        let auth = Authenticator::LocalHs256 {
            secret: TEST_SECRET.as_bytes().to_vec(),
        };
        let gate = scan::gate_endpoint(scanner);
        let budget = Timeouts::LOCAL.request_budget;
        Self::build(auth, budget, interceptor, None, Some(gate)).await
    }

    /// Local auth with per-user rate limits on (docs/api.md §24): each function's store keeps
    /// its own memory of the buckets, as separate instances do; the buckets are shared.
    pub async fn with_rate_limits(limits: chat_store::RateLimits) -> TestApp {
        let mut t = TestApp::new().await;
        let table = config().connections_table;
        t.app.store = t.app.store.clone().with_rate_limits(limits, &table);
        for app in t.apps.values_mut() {
            app.store = app.store.clone().with_rate_limits(limits, &table);
        }
        t
    }

    /// With the archive tier (docs/data-model.md §7) on moto's S3: history reads archived
    /// messages, the indexer lists conversations for the archiver (`archiver`), by `settings`.
    pub async fn with_archive(settings: ArchiveSettings) -> TestApp {
        let auth = Authenticator::LocalHs256 {
            secret: TEST_SECRET.as_bytes().to_vec(),
        };
        Self::build(
            auth,
            Timeouts::LOCAL.request_budget,
            None,
            Some(settings),
            None,
        )
        .await
    }

    /// Local auth, requests bounded by `budget`, and an extra interceptor on the DynamoDB client
    /// (e.g. one that loses an answer).
    pub async fn custom(budget: Duration, interceptor: Option<SharedInterceptor>) -> TestApp {
        let auth = Authenticator::LocalHs256 {
            secret: TEST_SECRET.as_bytes().to_vec(),
        };
        Self::build(auth, budget, interceptor, None, None).await
    }

    /// `scanning`: the S3 gate uploads go through, with malware scanning on (None: the plain
    /// gate, scanning off).
    async fn build(
        auth: Authenticator,
        budget: Duration,
        interceptor: Option<SharedInterceptor>,
        archive: Option<ArchiveSettings>,
        scanning: Option<String>,
    ) -> TestApp {
        let config = config();
        let sdk = config.sdk_config().await;
        let calls = Arc::new(CallLog::default());
        let client = |function: Option<&str>| {
            let mut conf = chat_store::config::dynamodb_interceptors(
                aws_sdk_dynamodb::config::Builder::from(&sdk),
            )
            .endpoint_url(server::dynamodb_endpoint())
            .interceptor(Counter(calls.clone()));
            if let Some(i) = &interceptor {
                conf = conf.interceptor(i.clone());
            }
            if let Some(r) = function.and_then(|f| config.for_function(f).iam_recorder()) {
                conf = conf.interceptor(r);
            }
            aws_sdk_dynamodb::Client::from_conf(conf.build())
        };
        if archive.is_some() {
            create_archive_bucket(&sdk).await;
        }
        let s3 = |function: Option<&str>| {
            let mut conf = aws_sdk_s3::config::Builder::from(&sdk)
                .endpoint_url(server::kinesis_endpoint())
                .force_path_style(true)
                .interceptor(Counter(calls.clone()));
            if let Some(r) = function.and_then(|f| config.for_function(f).iam_recorder()) {
                conf = conf.interceptor(r);
            }
            aws_sdk_s3::Client::from_conf(conf.build())
        };
        create_bucket(&sdk, ATTACHMENTS_BUCKET).await;
        // Attachments through the S3 gate, which checks presigned requests as S3 does.
        let scan_uploads = scanning.is_some();
        let gate = scanning.unwrap_or_else(server::s3_gate_endpoint);
        let gated_s3 = |function: Option<&str>| {
            let mut conf = aws_sdk_s3::config::Builder::from(&sdk)
                .endpoint_url(&gate)
                .force_path_style(true)
                .interceptor(Counter(calls.clone()));
            if let Some(r) = function.and_then(|f| config.for_function(f).iam_recorder()) {
                conf = conf.interceptor(r);
            }
            aws_sdk_s3::Client::from_conf(conf.build())
        };
        let store_of = |function: Option<&str>| {
            let attachments = chat_store::attachments::Attachments::new(
                gated_s3(function),
                ATTACHMENTS_BUCKET,
                chat_domain::attachments::AttachmentPolicy::default().with_scanning(scan_uploads),
            );
            // A suspension state stays known for the whole test run: a user's first request reads
            // it, the next ones (which the round-trip budgets count) do not, however slow the
            // test; a suspension served in this process takes effect at once anyway.
            let store = ChatStore::new(client(function), config.chat_table.clone())
                .with_archived_keys_table(config.archived_keys_table.clone())
                .with_budget(budget)
                .with_suspension_ttl(Duration::from_secs(3600))
                .with_attachments(Some(attachments));
            match archive {
                Some(settings) => {
                    store.with_archive(Some(Archive::new(s3(function), ARCHIVE_BUCKET)), settings)
                }
                None => store,
            }
        };
        let store = store_of(None);
        // The test's own writes (setting up items) may meet a transaction's conflict window
        // (the strictness layer): unlike the handlers, which handle conflicts themselves, they
        // just retry.
        let db = aws_sdk_dynamodb::Client::from_conf(
            client(None)
                .config()
                .to_builder()
                .retry_classifier(RetryConflicts)
                .build(),
        );
        let apps = Function::ALL
            .iter()
            .chain([&INBOX_INDEX, &ARCHIVER, &NOTIFIER, &THUMBNAILS])
            .map(|name| {
                let app = App {
                    store: store_of(Some(name)),
                    auth: auth.clone(),
                    connections: ConnectionStore::new(
                        client(Some(name)),
                        config.connections_table.clone(),
                    ),
                };
                (*name, app)
            })
            .collect();
        let streams = aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
                .endpoint_url(server::dynamodb_endpoint())
                .build(),
        );
        TestApp {
            app: App {
                store,
                auth,
                connections: ConnectionStore::new(client(None), config.connections_table.clone()),
            },
            apps,
            calls,
            db,
            table: config.chat_table,
            streams,
            sessions: None,
        }
    }

    /// Every function's store checking suspensions as deployed (`chat_store::SUSPENSION_TTL`:
    /// a read per request), not remembering them for the whole run as tests that count a
    /// handler's own calls do.
    pub fn with_deployed_suspension_checks(mut self) -> TestApp {
        let ttl = chat_store::SUSPENSION_TTL;
        self.app.store = self.app.store.clone().with_suspension_ttl(ttl);
        for app in self.apps.values_mut() {
            app.store = app.store.clone().with_suspension_ttl(ttl);
        }
        self
    }

    /// Suspends `user` as another instance's `suspendUser` would: its suspension item written
    /// straight to the table, which no store of this process has seen. Returns the item's key.
    pub async fn suspend_elsewhere(&self, user: &str) -> chat_store::Item {
        let key = chat_store::keys::suspension_key(&chat_domain::UserId::parse(user).unwrap());
        let mut item = key.clone();
        item.insert(
            "userId".into(),
            aws_sdk_dynamodb::types::AttributeValue::S(user.to_owned()),
        );
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
        key
    }

    /// The conversations function closing suspended users' connections through `sessions` (a
    /// gateway's Management API, `push`).
    pub fn with_sessions(self, sessions: conversations::Sessions) -> TestApp {
        TestApp {
            sessions: Some(sessions),
            ..self
        }
    }

    /// Puts items straight into the chat table (set-up): BatchWriteItem of 25, sending again
    /// what the strictness layer's throughput refused.
    pub async fn put_items(
        &self,
        items: &[HashMap<String, aws_sdk_dynamodb::types::AttributeValue>],
    ) {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        for chunk in items.chunks(25) {
            let mut pending: Vec<WriteRequest> = chunk
                .iter()
                .map(|item| {
                    let put = PutRequest::builder()
                        .set_item(Some(item.clone()))
                        .build()
                        .unwrap();
                    WriteRequest::builder().put_request(put).build()
                })
                .collect();
            while !pending.is_empty() {
                let out = self
                    .db
                    .batch_write_item()
                    .request_items(&self.table, pending)
                    .send()
                    .await
                    .expect("BatchWriteItem");
                pending = out
                    .unprocessed_items
                    .and_then(|mut u| u.remove(&self.table))
                    .unwrap_or_default();
                if !pending.is_empty() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Every item of one partition (`pk`), strongly consistent, as stored.
    pub async fn partition(
        &self,
        pk: &str,
    ) -> Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let r = self
                .db
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(
                    ":pk",
                    aws_sdk_dynamodb::types::AttributeValue::S(pk.to_owned()),
                )
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .expect("Query a partition");
            out.extend(r.items.unwrap_or_default());
            match r.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return out,
            }
        }
    }

    /// The store of one function, its calls recorded under its name (`CHAT_IAM_LOG`).
    pub fn store_of_function(&self, name: &str) -> ChatStore {
        self.apps
            .get(name)
            .map_or_else(|| self.app.store.clone(), |a| a.store.clone())
    }

    /// The thumbnailer (functions/thumbnails), its calls recorded as its own: the tests give it
    /// the upload event themselves.
    pub fn thumbnailer(&self) -> thumbnails::Thumbnailer {
        thumbnails::Thumbnailer {
            store: self.apps[THUMBNAILS].store.clone(),
        }
    }

    /// The archiver's store (its calls recorded as the archiver's).
    pub fn archiver(&self) -> ChatStore {
        self.apps[ARCHIVER].store.clone()
    }

    /// Runs the inbox indexer over everything written so far (`indexer`): until a test calls
    /// this, every inbox entry stays where its conversation's creation or join filed it. Its
    /// DynamoDB calls go to `calls` like the handlers'.
    pub async fn index(&self) -> indexer::Indexed {
        self.index_in_batches_of(indexer::BATCH).await
    }

    /// `index` for the holder of `indexer::exclusive()`.
    pub async fn index_exclusively(&self, gate: &indexer::Exclusive) -> indexer::Indexed {
        self.catch_up(gate, indexer::BATCH).await
    }

    /// `index` with at most `records` stream records per indexer invocation.
    pub async fn index_in_batches_of(&self, records: i32) -> indexer::Indexed {
        self.catch_up(&indexer::exclusive().await, records).await
    }

    async fn catch_up(&self, gate: &indexer::Exclusive, records: i32) -> indexer::Indexed {
        let store = self.apps[INBOX_INDEX]
            .store
            .clone()
            .with_budget(inbox_index::BUDGET);
        indexer::catch_up(gate, &self.db, &self.streams, &store, &self.table, records).await
    }

    /// An API Gateway v2 event as the HTTP API (or `cargo lambda watch`) sends it.
    pub fn event(
        &self,
        method: &str,
        path_and_query: &str,
        user: Option<&str>,
        body: Option<&str>,
    ) -> (Value, Option<Function>) {
        self.event_with_token(method, path_and_query, user.map(token), body)
    }

    /// `event` with this bearer token (any claims: `token_with`).
    pub fn event_with_token(
        &self,
        method: &str,
        path_and_query: &str,
        bearer: Option<String>,
        body: Option<&str>,
    ) -> (Value, Option<Function>) {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let mut headers = json!({"content-type": "application/json", "host": "localhost"});
        if let Some(t) = bearer {
            headers["authorization"] = json!(format!("Bearer {t}"));
        }
        let mut qs = serde_json::Map::new();
        // Decoded as API Gateway decodes parameters; what is not percent-encoded UTF-8 reaches
        // the handler as it came (which refuses it).
        let decode = |s: &str| {
            let s = s.replace('+', " ");
            percent_decode(&s).unwrap_or(s)
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            qs.entry(decode(k)).or_insert(json!(decode(v)));
        }
        // Routed by the route table, as the local router and API Gateway route by the same.
        let route = routes::find(method, path);
        let function = route
            .as_ref()
            .and_then(|(r, _)| Function::by_name(r.function));
        let route_key = route.as_ref().map_or("$default".into(), |(r, _)| r.key());
        let path_params: HashMap<&str, String> = route
            .iter()
            .flat_map(|(_, p)| {
                p.iter()
                    .map(|(name, v)| (name, percent_decode(v).unwrap_or_else(|| v.to_owned())))
            })
            .collect();
        let event = json!({
            "version": "2.0",
            "routeKey": route_key,
            "rawPath": path,
            "rawQueryString": query,
            "headers": headers,
            "queryStringParameters": if qs.is_empty() { Value::Null } else { Value::Object(qs) },
            "pathParameters": if path_params.is_empty() { Value::Null } else { json!(path_params) },
            "requestContext": {
                "accountId": "123456789012", "apiId": "local", "domainName": "localhost",
                "domainPrefix": "localhost", "requestId": new_uuid(), "routeKey": route_key,
                "stage": "$default", "time": "30/Nov/2026:00:00:00 +0000", "timeEpoch": 0,
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                         "sourceIp": "127.0.0.1", "userAgent": "chat-tests"}
            },
            "body": body,
            "isBase64Encoded": false
        });
        (event, function)
    }

    /// `call` with this bearer token (`token_with`).
    pub async fn call_with_token(
        &self,
        method: &str,
        path: &str,
        bearer: String,
        body: Option<&str>,
    ) -> Resp {
        let (event, function) = self.event_with_token(method, path, Some(bearer), body);
        self.invoke(event, function).await
    }

    /// Sends one request through the routed function's real handler.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        user: Option<&str>,
        body: Option<&str>,
    ) -> Resp {
        let (event, function) = self.event(method, path, user, body);
        self.invoke(event, function).await
    }

    pub async fn invoke(&self, event: Value, function: Option<Function>) -> Resp {
        let req =
            lambda_http::request::from_str(&event.to_string()).expect("valid API Gateway v2 event");
        let app = match function {
            Some(f) => self.apps[f.name()].clone(),
            None => self.app.clone(),
        };
        let resp = match function {
            Some(Function::Conversations) => {
                let sessions = self.sessions.clone();
                let handler = |a, r| conversations::handle_with(a, r, sessions);
                http::handle(app, req, handler).await
            }
            Some(Function::SendMessage) => http::handle(app, req, send_message::handle).await,
            Some(Function::History) => http::handle(app, req, history::handle).await,
            Some(Function::MarkRead) => http::handle(app, req, mark_read::handle).await,
            Some(Function::ReadStates) => http::handle(app, req, read_states::handle).await,
            Some(Function::Inbox) => http::handle(app, req, inbox::handle).await,
            Some(Function::MessageChanges) => http::handle(app, req, message_changes::handle).await,
            Some(Function::Attachments) => http::handle(app, req, attachments::handle).await,
            Some(Function::Devices) => http::handle(app, req, devices::handle).await,
            // What the router answers for an unknown route.
            None => {
                return Resp {
                    status: 404,
                    body: Value::Null,
                    headers: HashMap::new(),
                    wire_bytes: 0,
                }
            }
        };
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let bytes: &[u8] = resp.body().as_ref();
        let unpacked = gunzipped(&headers, bytes);
        let body = if unpacked.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&unpacked).expect("JSON response")
        };
        Resp {
            status,
            body,
            headers,
            wire_bytes: bytes.len(),
        }
    }

    /// `post` naming the client's own WebSocket connection (`X-Connection-Id`, docs/api.md
    /// §15.4; as the client sends it, valid or not).
    pub async fn post_from(&self, path: &str, user: &str, body: Value, connection: &str) -> Resp {
        let (mut event, function) = self.event("POST", path, Some(user), Some(&body.to_string()));
        event["headers"]["x-connection-id"] = json!(connection);
        self.invoke(event, function).await
    }

    pub async fn post(&self, path: &str, user: &str, body: Value) -> Resp {
        self.call("POST", path, Some(user), Some(&body.to_string()))
            .await
    }

    pub async fn get(&self, path: &str, user: &str) -> Resp {
        self.call("GET", path, Some(user), None).await
    }

    /// `a` opens (creates, or finds) its direct conversation with `b`.
    pub async fn open_direct(&self, a: &str, b: &str) -> Resp {
        self.post("/conversations", a, json!({"type": "direct", "peerId": b}))
            .await
    }

    pub async fn direct(&self, a: &str, b: &str) -> String {
        let r = self.open_direct(a, b).await;
        assert!(r.status == 201 || r.status == 200, "{r:?}");
        r.body["conversationId"].as_str().unwrap().to_owned()
    }

    pub async fn group(&self, owner: &str, members: &[impl AsRef<str>]) -> String {
        let members: Vec<&str> = members.iter().map(AsRef::as_ref).collect();
        let r = self
            .post(
                "/conversations",
                owner,
                json!({"type": "group", "title": "Team", "memberIds": members}),
            )
            .await;
        assert_eq!(r.status, 201, "{r:?}");
        r.body["conversationId"].as_str().unwrap().to_owned()
    }

    /// Two new users, `a` and `b`, and their direct conversation: (a, b, conversation).
    pub async fn new_direct(&self) -> (String, String, String) {
        let (a, b) = (unique("a"), unique("b"));
        let c = self.direct(&a, &b).await;
        (a, b, c)
    }

    /// Two new users and a group of them: (owner `a`, member `b`, conversation).
    pub async fn new_group(&self) -> (String, String, String) {
        let (a, b) = (unique("a"), unique("b"));
        let c = self.group(&a, &[&b]).await;
        (a, b, c)
    }

    pub async fn send(&self, conversation: &str, user: &str, body: &str) -> Resp {
        self.send_with_id(conversation, user, &new_uuid(), body)
            .await
    }

    /// `send` under a `clientMsgId` of the caller's (a replay, a retry).
    pub async fn send_with_id(
        &self,
        conversation: &str,
        user: &str,
        client_msg_id: &str,
        body: &str,
    ) -> Resp {
        self.post(
            &format!("/conversations/{conversation}/messages"),
            user,
            json!({"clientMsgId": client_msg_id, "body": body}),
        )
        .await
    }

    /// `markRead`: `user` has read `conversation` up to `seq`.
    /// `editMessage` of message `seq` with `clientChangeId` `id`.
    pub async fn edit(&self, c: &str, seq: u64, user: &str, id: &str, body: &str) -> Resp {
        let body = json!({"clientChangeId": id, "body": body}).to_string();
        let path = format!("/conversations/{c}/messages/{seq}");
        self.call("PATCH", &path, Some(user), Some(&body)).await
    }

    /// `deleteMessage` of message `seq` with `clientChangeId` `id`.
    pub async fn delete_message(&self, c: &str, seq: u64, user: &str, id: &str) -> Resp {
        let path = format!("/conversations/{c}/messages/{seq}?clientChangeId={id}");
        self.call("DELETE", &path, Some(user), None).await
    }

    /// `addReaction` (`add`) or `removeReaction` of `reaction` (as it stands in the path).
    pub async fn react(&self, c: &str, seq: u64, user: &str, reaction: &str, add: bool) -> Resp {
        let path = format!("/conversations/{c}/messages/{seq}/reactions/{reaction}");
        let method = if add { "PUT" } else { "DELETE" };
        self.call(method, &path, Some(user), None).await
    }

    pub async fn mark_read(&self, conversation: &str, user: &str, seq: impl Into<Value>) -> Resp {
        self.post(
            &format!("/conversations/{conversation}/read"),
            user,
            json!({ "seq": seq.into() }),
        )
        .await
    }

    /// `removeMember`: `by` removes `user` from `conversation` (`by` = `user`: leaves it).
    pub async fn remove_member(&self, conversation: &str, by: &str, user: &str) -> Resp {
        self.call(
            "DELETE",
            &format!("/conversations/{conversation}/members/{user}"),
            Some(by),
            None,
        )
        .await
    }

    /// `addMembers`: `by` adds `users` (a JSON array of ids) to `conversation`.
    pub async fn add_members(&self, conversation: &str, by: &str, users: Value) -> Resp {
        self.post(
            &format!("/conversations/{conversation}/members"),
            by,
            json!({ "userIds": users }),
        )
        .await
    }

    /// Marks the conversation busy for a minute, as a group commit does: every send queues.
    pub async fn mark_busy(&self, conversation: &str) {
        let until = chat_domain::time::unix_millis(chat_domain::time::now()) + 60_000;
        let id = chat_domain::ConversationId::parse(conversation).unwrap();
        self.db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(chat_store::keys::conversation_key(&id)))
            .update_expression("SET busyUntil = :u")
            .expression_attribute_values(":u", AttributeValue::N(until.to_string()))
            .send()
            .await
            .unwrap();
    }

    /// The item `sk` of the conversation's partition (`C#<id>`), read strongly consistent.
    pub async fn conversation_item(
        &self,
        conversation: &str,
        sk: &str,
    ) -> Option<HashMap<String, AttributeValue>> {
        let id = chat_domain::ConversationId::parse(conversation).unwrap();
        let pk = chat_store::keys::conversation_pk(&id);
        self.db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(chat_store::keys::key(pk, sk.to_owned())))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
    }

    /// The `clientMsgId`s (lower-cased) of the sends still queued in the conversation.
    pub async fn queued_sends(&self, conversation: &str) -> Vec<String> {
        let id = chat_domain::ConversationId::parse(conversation).unwrap();
        let out = self
            .db
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND begins_with(sk, :p)")
            .expression_attribute_values(
                ":pk",
                AttributeValue::S(chat_store::keys::conversation_pk(&id)),
            )
            .expression_attribute_values(
                ":p",
                AttributeValue::S(chat_store::keys::QUEUED_PREFIX.into()),
            )
            .send()
            .await
            .unwrap();
        out.items()
            .iter()
            .filter_map(|i| i.get("clientMsgKey")?.as_s().ok().cloned())
            .collect()
    }
}

/// One plain HTTP/1.1 request (a browser's or curl's, e.g. to a presigned S3 URL): its status,
/// headers and body.
/// Sends `bytes` with the upload's presigned request, its headers replaced by `headers` where
/// given: S3's status.
pub async fn upload_with(upload: &Value, bytes: Vec<u8>, headers: &[(&str, &str)]) -> u16 {
    let mut sent: Vec<(String, String)> = upload["headers"]
        .as_object()
        .unwrap()
        .iter()
        // hyper frames the body itself (Content-Length from `bytes`).
        .filter(|(k, _)| k.as_str() != "content-length")
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    for (k, v) in headers {
        sent.retain(|(n, _)| n != k);
        sent.push(((*k).to_owned(), (*v).to_owned()));
    }
    let sent: Vec<(&str, &str)> = sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let method = upload["method"].as_str().unwrap();
    raw_http(method, upload["url"].as_str().unwrap(), &sent, bytes)
        .await
        .0
}

pub async fn raw_http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, HashMap<String, String>, Vec<u8>) {
    use http_body_util::{BodyExt, Full};
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(bytes::Bytes::from(body))).unwrap();
    let resp = client.request(req).await.expect("an HTTP answer");
    let (parts, body) = resp.into_parts();
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let bytes = body.collect().await.unwrap().to_bytes().to_vec();
    (parts.status.as_u16(), headers, bytes)
}
