//! The DynamoDB/Kinesis-API server the tests talk to: `DYNAMODB_ENDPOINT` when set (tables are then
//! expected to exist, see infra/create_resources.py), otherwise our moto launcher, started once per
//! test binary on a free port and stopped when the test process exits (it exits when its stdin
//! closes).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

static ENDPOINT: OnceLock<String> = OnceLock::new();
static SERVER: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

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

pub fn dynamodb_endpoint() -> String {
    ENDPOINT
        .get_or_init(|| match std::env::var("DYNAMODB_ENDPOINT") {
            Ok(e) if !e.is_empty() => e,
            _ => start_emulator(),
        })
        .clone()
}

fn start_emulator() -> String {
    let root = workspace_root();
    let mut child = Command::new(python())
        .arg(root.join("infra/moto_server.py"))
        .args(["--exit-with-stdin", "--port", "0", "--template"])
        .arg(root.join("template.yaml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start infra/moto_server.py (run infra/setup.sh first)");
    let stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let endpoint = loop {
        let line = lines
            .next()
            .expect("emulator exited before READY")
            .expect("read emulator output");
        if let Some(url) = line.strip_prefix("READY ") {
            break url.trim().to_owned();
        }
    };
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    *SERVER.lock().unwrap() = Some((child, stdin));
    endpoint
}

/// Changes the emulator's simulation settings at run time (`POST /moto-api/chat/config`, see
/// infra/moto_server.py), e.g. `{"txWindowMs": 2000}`. Only for a test binary's own emulator.
pub fn emulator_settings(settings: &serde_json::Value) {
    use std::io::{Read, Write};
    let endpoint = dynamodb_endpoint();
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let body = settings.to_string();
    let mut stream = std::net::TcpStream::connect(host).expect("connect to the emulator");
    write!(
        stream,
        "POST /moto-api/chat/config HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "{answer}"
    );
}

/// Makes the emulator refuse the next `n` PutRecords entries like a throttled Kinesis
/// (infra/moto_server.py, `/moto-api/chat/faults`); returns the failures still to come. Only for a
/// test binary whose emulator no other Kinesis writer (a gateway's relay) shares.
pub fn inject_kinesis_put_failures(n: u32) -> u32 {
    let body = format!("{{\"kinesisPutFailures\": {n}}}");
    let answer = emulator_request("/moto-api/chat/faults", "", &body);
    answer["kinesisPutFailures"]
        .as_u64()
        .expect("faults answer") as u32
}

/// One SQS action (AWS JSON protocol, e.g. `SendMessage`) on the emulator; the JSON answer.
pub fn sqs(action: &str, request: serde_json::Value) -> serde_json::Value {
    emulator_request(
        "/",
        // The service is named by the credential scope (moto does not check the signature).
        &format!(
            "X-Amz-Target: AmazonSQS.{action}\r\nAuthorization: AWS4-HMAC-SHA256 \
             Credential=local/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0\r\n"
        ),
        &request.to_string(),
    )
}

/// One POST to the emulator, with extra header lines; the JSON answer (a 200 is required).
fn emulator_request(path: &str, headers: &str, body: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let endpoint = dynamodb_endpoint();
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).expect("emulator reachable");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
