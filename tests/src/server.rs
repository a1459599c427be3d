//! The AWS-API services the tests talk to, started once per test binary by infra/local_aws.py on
//! free ports and stopped when the test process exits (the launcher exits when its stdin closes,
//! and its children with it):
//!
//! - DynamoDB + DynamoDB Streams: Amazon DynamoDB Local by default (`CHAT_DYNAMODB=local`), which
//!   serves requests in parallel as DynamoDB does; our moto launcher with `CHAT_DYNAMODB=moto`;
//!   or `DYNAMODB_ENDPOINT` when set (the launcher then creates the tables there).
//! - Kinesis, SQS (the failure queues, the notification delay queue) and SNS (mobile push
//!   endpoints): our moto launcher (infra/moto_server.py), which also takes the Kinesis fault
//!   injection; `KINESIS_ENDPOINT` when set together with `DYNAMODB_ENDPOINT` (then nothing is
//!   started and the resources are expected to exist).
//!
//! Neither DynamoDB Local nor moto has transaction conflicts, throttling, latency or faults: the
//! strictness layer (infra/dynamodb-strict) in front of either adds them, on by default
//! (`CHAT_STRICT=off`, or `CHAT_STRICT_*` per part; `in_front_of_dynamodb`, the one place it goes).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// What serves DynamoDB in this test binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamoDb {
    /// Amazon DynamoDB Local (the default).
    Local,
    /// Our moto launcher, which also serves Kinesis (`CHAT_DYNAMODB=moto`).
    Moto,
    /// `DYNAMODB_ENDPOINT`: whatever runs there.
    Given,
}

struct Services {
    /// What the handlers use: DynamoDB, or the proxy in front of it.
    dynamodb: String,
    dynamodb_kind: DynamoDb,
    /// Kinesis and SQS; moto's control endpoints (`/moto-api/...`) are here too.
    kinesis: String,
    /// The strictness proxy's control endpoint (`/strict/config`), when one is in front.
    strict_control: Option<String>,
    /// The DynamoDB endpoint behind the proxy (DynamoDB Local's own port).
    backend: String,
}

static SERVICES: OnceLock<Services> = OnceLock::new();
static LAUNCHER: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The Python with the pinned moto: the project's virtualenv (infra/setup.sh), else `python3`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("CHAT_PYTHON") {
        return p.into();
    }
    let venv = workspace_root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn services() -> &'static Services {
    SERVICES.get_or_init(|| {
        let given = env("DYNAMODB_ENDPOINT");
        let (dynamodb, kinesis, kind) = match (given, env("KINESIS_ENDPOINT")) {
            (Some(dynamodb), Some(kinesis)) => (dynamodb, kinesis, DynamoDb::Given),
            (Some(dynamodb), None) => {
                let (_, kinesis) = start_launcher(&["--dynamodb-endpoint", &dynamodb]);
                (dynamodb, kinesis, DynamoDb::Given)
            }
            (None, _) => {
                let kind = match env("CHAT_DYNAMODB").as_deref() {
                    None | Some("local") => DynamoDb::Local,
                    Some("moto") => DynamoDb::Moto,
                    Some(other) => panic!("CHAT_DYNAMODB must be 'local' or 'moto', not {other:?}"),
                };
                let backend = if kind == DynamoDb::Moto {
                    "moto"
                } else {
                    "local"
                };
                let (dynamodb, kinesis) =
                    start_launcher(&["--dynamodb", backend, "--dynamodb-endpoint", ""]);
                (dynamodb, kinesis, kind)
            }
        };
        let backend = dynamodb.clone();
        let (dynamodb, strict_control) = in_front_of_dynamodb(kind, dynamodb);
        Services {
            dynamodb,
            dynamodb_kind: kind,
            kinesis,
            strict_control,
            backend,
        }
    })
}

/// The one place where the DynamoDB strictness proxy (infra/dynamodb-strict: DynamoDB's
/// transaction conflicts, per-partition throttling, latency and faults, which DynamoDB Local lacks)
/// is put in front of the DynamoDB endpoint. Returns the endpoint the handlers use and the proxy's
/// control endpoint.
fn in_front_of_dynamodb(kind: DynamoDb, dynamodb: String) -> (String, Option<String>) {
    if env("CHAT_STRICT").as_deref() == Some("off") {
        return (dynamodb, None);
    }
    // `CHAT_STRICT_*` switch its parts (infra/dynamodb-strict); on by default. It runs on a
    // runtime thread of its own: each #[tokio::test] runtime ends with its test.
    let mut config = dynamodb_strict::StrictConfig::from_env().expect("CHAT_STRICT_* settings");
    // moto (the fallback for machines without Java) gets the conflicts; partition throttling
    // only when asked for (`CHAT_STRICT_THROUGHPUT=on`): moto commits a 1,000-member group's 21
    // transactions within a second, past one partition's 1,000 units a second, which the app
    // answers 429 instead of retrying.
    if kind == DynamoDb::Moto && env("CHAT_STRICT_THROUGHPUT").is_none() {
        config.rules.throughput = false;
    }
    config.dynamodb = dynamodb;
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let url = on_own_runtime("dynamodb-strict", || async move {
        let running = dynamodb_strict::start(config).await;
        let url = running.as_ref().map(|r| r.url()).map_err(|e| e.to_string());
        (url, running)
    })
    .expect("the DynamoDB strictness layer starts");
    (url.clone(), Some(url))
}

/// Starts a service on a runtime thread of its own, which runs for the rest of the test binary
/// (each `#[tokio::test]` runtime ends with its test): `start` gives what the caller gets and
/// what the thread keeps (the running service).
pub fn on_own_runtime<T, K, F>(name: &str, start: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    K: 'static,
    F: std::future::Future<Output = (T, K)>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (out, _keep) = start().await;
                tx.send(out).unwrap();
                std::future::pending::<()>().await
            })
        })
        .unwrap();
    rx.recv().unwrap()
}

/// The process of this binary's DynamoDB Local (None on other backends), found by its port: the
/// chaos soak freezes it (SIGSTOP) to see what a DynamoDB brownout does.
pub fn dynamodb_local_pid() -> Option<u32> {
    let s = services();
    if s.dynamodb_kind != DynamoDb::Local {
        return None;
    }
    let port = s
        .backend
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .to_owned();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let jar = args.iter().any(|a| a.ends_with(b"DynamoDBLocal.jar"));
        let on_port = args
            .windows(2)
            .any(|w| w[0] == b"-port" && w[1] == port.as_bytes());
        if jar && on_port {
            return Some(pid);
        }
    }
    None
}

/// Injects DynamoDB faults through the strictness layer (`POST /strict/faults`, one spec or a
/// list: `{"op":"TransactWriteItems","table":"ChatTable","kind":"InternalServerError","count":1}`).
/// Only for a test binary's own layer; panics without one (`CHAT_STRICT=off`).
pub fn dynamodb_faults(faults: &serde_json::Value) {
    let control = services()
        .strict_control
        .clone()
        .expect("DynamoDB faults need the strictness layer (not with CHAT_STRICT=off)");
    post(&control, "/strict/faults", JSON, &faults.to_string());
}

/// The DynamoDB faults not yet fired (`GET /strict/faults`); empty without the layer.
pub fn pending_dynamodb_faults() -> Vec<serde_json::Value> {
    let Some(control) = services().strict_control.clone() else {
        return Vec::new();
    };
    let listed = request("GET", &control, "/strict/faults", "", "");
    listed["faults"].as_array().cloned().unwrap_or_default()
}

/// Freezes (true) or thaws (false) DynamoDB behind the strictness layer (`POST /strict/freeze`,
/// `/strict/thaw`): a brownout without a process of its own to stop (moto serves Kinesis too).
/// False when there is no layer (`CHAT_STRICT=off`).
pub fn freeze_dynamodb(frozen: bool) -> bool {
    let Some(control) = services().strict_control.clone() else {
        return false;
    };
    let path = if frozen {
        "/strict/freeze"
    } else {
        "/strict/thaw"
    };
    post(&control, path, JSON, "");
    true
}

/// Clears the DynamoDB faults not yet fired (`DELETE /strict/faults`).
pub fn clear_dynamodb_faults() {
    if let Some(control) = services().strict_control.clone() {
        request("DELETE", &control, "/strict/faults", "", "");
    }
}

/// The strictness layer's per-partition record (`GET /strict/partitions`), when one runs.
pub fn dynamodb_partitions() -> Option<serde_json::Value> {
    let control = services().strict_control.clone()?;
    Some(request("GET", &control, "/strict/partitions", "", ""))
}

/// Starts infra/local_aws.py; its `READY <dynamodb-url> <kinesis-url>`.
fn start_launcher(args: &[&str]) -> (String, String) {
    let root = workspace_root();
    let mut child = Command::new(python())
        .arg(root.join("infra/local_aws.py"))
        .args(["--exit-with-stdin", "--port", "0", "--dynamodb-port", "0"])
        .arg("--template")
        .arg(root.join("template.yaml"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start infra/local_aws.py (run infra/setup.sh first)");
    let stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = loop {
        let line = lines
            .next()
            .expect(
                "infra/local_aws.py exited before READY (its error is above; without Java 17+, \
                 CHAT_DYNAMODB=moto runs the tests on moto)",
            )
            .expect("read the launcher's output");
        if let Some(urls) = line.strip_prefix("READY ") {
            break urls.to_owned();
        }
    };
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    *LAUNCHER.lock().unwrap() = Some((child, stdin));
    let mut urls = ready.split_whitespace().map(str::to_owned);
    let dynamodb = urls.next().expect("READY <dynamodb-url> <kinesis-url>");
    let kinesis = urls.next().expect("READY <dynamodb-url> <kinesis-url>");
    (dynamodb, kinesis)
}

/// The DynamoDB (and DynamoDB Streams) endpoint the handlers use.
pub fn dynamodb_endpoint() -> String {
    services().dynamodb.clone()
}

/// The Kinesis endpoint (moto), also serving SQS and the Kinesis fault injection.
pub fn kinesis_endpoint() -> String {
    services().kinesis.clone()
}

static S3_GATE: OnceLock<String> = OnceLock::new();

/// The attachments' S3 endpoint: the S3 gate (infra/s3-gate: presigned requests checked as S3
/// checks them, which moto does not) in front of moto's S3, once per test binary. Upload events
/// go nowhere here (the tests run the thumbnailer themselves).
pub fn s3_gate_endpoint() -> String {
    S3_GATE
        .get_or_init(|| {
            let config = s3_gate::GateConfig {
                listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                s3: kinesis_endpoint(),
                secret: "local".into(),
                notify: None,
                scan: None,
            };
            on_own_runtime("s3-gate", || async move {
                let running = s3_gate::start(config).await.expect("the S3 gate starts");
                (running.url(), running)
            })
        })
        .clone()
}

/// What serves DynamoDB in this test binary.
pub fn dynamodb_kind() -> DynamoDb {
    services().dynamodb_kind
}

/// Changes the DynamoDB simulation settings at run time, e.g. `{"txWindowMs": 2000}` (how long a
/// committed transaction's items stay "in a transaction" after its answer: other writes to them
/// get DynamoDB's `TransactionConflict`); returns the previous values of the settings it changed,
/// to put back: the strictness layer's `/strict/config`. Only for a test binary's own services.
pub fn emulator_settings(settings: &serde_json::Value) -> serde_json::Value {
    let Some(control) = services().strict_control.clone() else {
        panic!(
            "DynamoDB settings {settings} need the strictness layer in front of DynamoDB \
             (it is off: CHAT_STRICT=off)"
        )
    };
    let (endpoint, path) = (control, "/strict/config");
    let current = request("GET", &endpoint, path, "", "");
    let before: serde_json::Map<String, serde_json::Value> = settings
        .as_object()
        .expect("settings are a JSON object")
        .keys()
        .map(|k| (k.clone(), current[k].clone()))
        .collect();
    post(&endpoint, path, JSON, &settings.to_string());
    serde_json::Value::Object(before)
}

/// Makes the Kinesis emulator refuse the next `n` PutRecords entries like a throttled Kinesis
/// (infra/moto_server.py, `/moto-api/chat/faults`); returns the failures still to come. Only for a
/// test binary whose emulator no other Kinesis writer (a gateway's relay) shares.
pub fn inject_kinesis_put_failures(n: u32) -> u32 {
    let body = format!("{{\"kinesisPutFailures\": {n}}}");
    let answer = post(&kinesis_endpoint(), "/moto-api/chat/faults", JSON, &body);
    answer["kinesisPutFailures"]
        .as_u64()
        .expect("faults answer") as u32
}

/// One SQS action (AWS JSON protocol, e.g. `SendMessage`) on the emulator; the JSON answer.
pub fn sqs(action: &str, request: serde_json::Value) -> serde_json::Value {
    post(
        &kinesis_endpoint(),
        "/",
        // The service is named by the credential scope (moto does not check the signature).
        &format!(
            "Content-Type: application/x-amz-json-1.0\r\nX-Amz-Target: AmazonSQS.{action}\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/sqs/aws4_request, \
             SignedHeaders=host, Signature=0\r\n"
        ),
        &request.to_string(),
    )
}

/// What moto holds, by service and model (`GET /moto-api/data.json`): e.g. `["sns"]
/// ["PlatformEndpoint"]`, each with its public attributes (`arn`, `token`, `attributes`,
/// `messages`).
pub fn moto_data() -> serde_json::Value {
    request("GET", &kinesis_endpoint(), "/moto-api/data.json", "", "")
}

const JSON: &str = "Content-Type: application/json\r\n";

/// One POST to `endpoint`, with its header lines; the JSON answer (a 200 is required).
fn post(endpoint: &str, path: &str, headers: &str, body: &str) -> serde_json::Value {
    request("POST", endpoint, path, headers, body)
}

fn request(
    method: &str,
    endpoint: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> serde_json::Value {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).expect("emulator reachable");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, json) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    serde_json::from_str(json).expect("JSON body")
}
