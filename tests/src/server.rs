//! The AWS-API services the tests talk to, started once per test binary by infra/local_aws.py on
//! free ports and stopped when the test process exits (the launcher exits when its stdin closes,
//! and its children with it):
//!
//! - DynamoDB + DynamoDB Streams: Amazon DynamoDB Local by default (`CHAT_DYNAMODB=local`), which
//!   serves requests in parallel as DynamoDB does; our moto launcher with `CHAT_DYNAMODB=moto`;
//!   or `DYNAMODB_ENDPOINT` when set (the launcher then creates the tables there).
//! - Kinesis and SQS (the failure queues): our moto launcher (infra/moto_server.py), which also
//!   takes the Kinesis fault injection; `KINESIS_ENDPOINT` when set together with
//!   `DYNAMODB_ENDPOINT` (then nothing is started and the resources are expected to exist).
//!
//! DynamoDB Local has no transaction conflicts and no throttling: a strictness proxy in front of
//! it adds them (`in_front_of_dynamodb`, the one place it goes).

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
        let (dynamodb, strict_control) = in_front_of_dynamodb(kind, dynamodb);
        Services {
            dynamodb,
            dynamodb_kind: kind,
            kinesis,
            strict_control,
        }
    })
}

/// The one place where the DynamoDB strictness proxy (infra/dynamodb-strict: DynamoDB's
/// transaction conflicts, per-partition throttling, latency and faults, which DynamoDB Local lacks)
/// is put in front of the DynamoDB endpoint. Returns the endpoint the handlers use and the proxy's
/// control endpoint.
fn in_front_of_dynamodb(kind: DynamoDb, dynamodb: String) -> (String, Option<String>) {
    // TODO(dynamodb-strict): not ready yet. For `DynamoDb::Local` (and `Given`), start the proxy
    // here with `dynamodb_strict::start(...)` towards `dynamodb`, on a runtime thread of its own
    // (like `push::gateway`, since each #[tokio::test] runtime ends with its test), with the
    // transaction-conflict window on by default (moto's default is 10 ms), and return
    // `(proxy_url, Some(proxy_url))`. Until then DynamoDB Local runs without transaction conflicts:
    // `emulator_settings` refuses DynamoDB-side settings there (the tests that need them fail and
    // say why), and the conflict paths are exercised on `CHAT_DYNAMODB=moto` only.
    let _ = kind;
    (dynamodb, None)
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

/// What serves DynamoDB in this test binary.
pub fn dynamodb_kind() -> DynamoDb {
    services().dynamodb_kind
}

/// Changes the DynamoDB simulation settings at run time, e.g. `{"txWindowMs": 2000}` (how long a
/// committed transaction's items stay "in a transaction": other writes to them get DynamoDB's
/// `TransactionConflict`). On moto, its `POST /moto-api/chat/config` (infra/moto_server.py); in
/// front of DynamoDB Local, the strictness proxy's `/strict/config`. Only for a test binary's own
/// services.
pub fn emulator_settings(settings: &serde_json::Value) {
    let s = services();
    match (s.dynamodb_kind, &s.strict_control) {
        (DynamoDb::Moto, _) => {
            post(
                &s.kinesis,
                "/moto-api/chat/config",
                JSON,
                &settings.to_string(),
            );
        }
        // TODO(dynamodb-strict): map these settings to the proxy's names if they differ.
        (_, Some(control)) => {
            post(control, "/strict/config", JSON, &settings.to_string());
        }
        (kind, None) => panic!(
            "DynamoDB settings {settings} need the strictness proxy in front of {} \
             (infra/dynamodb-strict, not slotted in yet: tests/src/server.rs \
             `in_front_of_dynamodb`); run this test with CHAT_DYNAMODB=moto meanwhile",
            match kind {
                DynamoDb::Local => "DynamoDB Local",
                _ => "DYNAMODB_ENDPOINT",
            }
        ),
    }
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

const JSON: &str = "Content-Type: application/json\r\n";

/// One POST to `endpoint`, with its header lines; the JSON answer (a 200 is required).
fn post(endpoint: &str, path: &str, headers: &str, body: &str) -> serde_json::Value {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).expect("emulator reachable");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
