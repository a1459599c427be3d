//! A function binary run as Lambda runs it: a separate OS process that takes its invocations from
//! the Lambda Runtime API (`AWS_LAMBDA_RUNTIME_API`), here a small one served by the test itself.
//! The process can be killed (SIGKILL) at any moment, as Lambda may kill an instance: what a
//! request it was serving leaves behind is then what the tests check (tests/tests/process_kill.rs).
//!
//! Runtime API, as the Lambda runtime client uses it: `GET /2018-06-01/runtime/invocation/next`
//! (the next event, with its `Lambda-Runtime-*` headers), `POST …/invocation/{id}/response`,
//! `POST …/invocation/{id}/error`, `POST /2018-06-01/runtime/init/error`.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};

use crate::{server, Resp, TEST_SECRET};

const PREFIX: &str = "/2018-06-01/runtime";

/// What an invocation came to.
#[derive(Debug)]
pub enum Outcome {
    /// The function's answer, as API Gateway would pass it on.
    Answered(Resp),
    /// The function reported an error to the Runtime API (Lambda answers such an invocation 502).
    Failed(Value),
    /// The process ended (or was killed) before it answered.
    NoAnswer,
}

#[derive(Default)]
struct Api {
    /// Events not yet taken by the process: (request id, event).
    queued: Mutex<VecDeque<(String, Value)>>,
    arrived: Notify,
    /// Invocations taken and not yet answered.
    waiting: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    /// What the process reported at init, if it failed there.
    init_error: Mutex<Option<String>>,
}

/// One function process and the Runtime API it polls.
pub struct FunctionProcess {
    name: String,
    api: Arc<Api>,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

/// An invocation handed to the process; its outcome comes later.
pub struct Invocation {
    answer: oneshot::Receiver<Outcome>,
}

impl Invocation {
    /// Its outcome: `NoAnswer` when its process ended without answering. `None` while it is still
    /// unanswered after `wait`.
    pub async fn outcome(&mut self, wait: Duration) -> Option<Outcome> {
        match tokio::time::timeout(wait, &mut self.answer).await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(_)) => Some(Outcome::NoAnswer),
            Err(_) => None,
        }
    }

    /// Whether it has been answered (or failed) by now.
    pub fn answered(&mut self) -> bool {
        !matches!(
            self.answer.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        )
    }
}

/// The workspace's binary `name`, built on first use in this test binary (a no-op when it is up
/// to date) in the profile and target directory of this test binary, so that the process runs
/// the code under test. The build may wait for other builds' lock: start processes before
/// anything that is timed.
pub fn function_binary(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    // A failed build panics with the lock held: the next test tries again and says why.
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, bin)) = built.iter().find(|(n, _)| n == name) {
        return bin.clone();
    }
    let bin = build(name);
    built.push((name.to_owned(), bin.clone()));
    bin
}

fn build(name: &str) -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in <target>/<profile>/deps")
        .to_path_buf();
    let profile = profile_dir
        .file_name()
        .and_then(|p| p.to_str())
        .unwrap_or("debug")
        .to_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "-p", name, "--bin", name])
        .current_dir(server::workspace_root());
    match profile.as_str() {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        other => {
            build.args(["--profile", other]);
        }
    }
    if let Some(target) = profile_dir.parent() {
        build.env("CARGO_TARGET_DIR", target);
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p {name}: {status}");
    let bin = profile_dir.join(name);
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

impl FunctionProcess {
    /// Starts the function `name` (its binary, built if needed) against this test binary's
    /// DynamoDB, with local auth (the tests' secret) and `env` on top.
    pub async fn start(name: &str, env: &[(&str, String)]) -> FunctionProcess {
        let bin = function_binary(name);
        let api = Arc::new(Api::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the Runtime API");
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, api.clone()));
        let config = crate::config();
        let mut cmd = Command::new(&bin);
        cmd.env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "process")
            .env_remove("AWS_LAMBDA_MAX_CONCURRENCY")
            .env("CHAT_AUTH_MODE", "local")
            .env("CHAT_LOCAL_JWT_SECRET", TEST_SECRET)
            .env("DYNAMODB_ENDPOINT", server::dynamodb_endpoint())
            .env("CHAT_TABLE", &config.chat_table)
            // As the harness's stores: no rate limits (tests/tests/api/limits.rs tests them).
            .env("CHAT_SEND_RATE", "0")
            .env("CHAT_REQUEST_RATE", "0")
            .env("RUST_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let logs = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    logs.lock().unwrap().push(line);
                }
            });
        }
        FunctionProcess {
            name: name.to_owned(),
            api,
            child,
            logs,
            server,
        }
    }

    /// Hands the process an event (an API Gateway v2 event for an HTTP function).
    pub fn invoke(&self, event: Value) -> Invocation {
        let id = crate::new_uuid();
        let (tx, rx) = oneshot::channel();
        self.api.waiting.lock().unwrap().insert(id.clone(), tx);
        self.api.queued.lock().unwrap().push_back((id, event));
        self.api.arrived.notify_one();
        Invocation { answer: rx }
    }

    /// Invokes and waits for the outcome (at most `wait`; panics past it).
    pub async fn call(&self, event: Value, wait: Duration) -> Outcome {
        let mut invocation = self.invoke(event);
        match invocation.outcome(wait).await {
            Some(outcome) => outcome,
            None => panic!(
                "{} did not answer within {wait:?}; its output:\n{}",
                self.name,
                self.logs()
            ),
        }
    }

    /// SIGKILL, as Lambda ends an instance: no handler, no clean-up, nothing flushed. Every
    /// invocation it had not answered ends `NoAnswer`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.api.waiting.lock().unwrap().clear();
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the process wrote to stdout and stderr (its logs), and any init error it reported.
    pub fn logs(&self) -> String {
        let mut out = self.logs.lock().unwrap().join("\n");
        if let Some(e) = self.api.init_error.lock().unwrap().as_ref() {
            out.push_str(&format!("\ninit error: {e}"));
        }
        out
    }
}

impl Drop for FunctionProcess {
    fn drop(&mut self) {
        self.kill();
        self.server.abort();
    }
}

async fn serve(listener: tokio::net::TcpListener, api: Arc<Api>) {
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        let api = api.clone();
        conns.spawn(async move {
            let svc = hyper::service::service_fn(move |req| answer(api.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static headers are valid")
}

async fn answer(
    api: Arc<Api>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let accepted = || reply(StatusCode::ACCEPTED, json!({"status": "OK"}));
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return Ok(reply(
            StatusCode::NOT_FOUND,
            json!({"error": "unknown path"}),
        ));
    };
    if method == Method::GET && rest == "/invocation/next" {
        let (id, event) = loop {
            let next = api.queued.lock().unwrap().pop_front();
            match next {
                Some(e) => break e,
                None => api.arrived.notified().await,
            }
        };
        let deadline = chat_domain::time::unix_millis(chat_domain::time::now()) + 60_000;
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .header("lambda-runtime-aws-request-id", id.as_str())
            .header("lambda-runtime-deadline-ms", deadline.to_string())
            .header(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:process",
            )
            .header("lambda-runtime-trace-id", format!("Root=1-{id}"))
            .body(Full::new(Bytes::from(event.to_string())))
            .expect("valid headers");
        return Ok(resp);
    }
    if method == Method::POST && rest == "/init/error" {
        *api.init_error.lock().unwrap() = Some(String::from_utf8_lossy(&body).into_owned());
        return Ok(accepted());
    }
    let Some((id, what)) = rest
        .strip_prefix("/invocation/")
        .and_then(|r| r.split_once('/'))
    else {
        return Ok(reply(
            StatusCode::NOT_FOUND,
            json!({"error": "unknown path"}),
        ));
    };
    let Some(tx) = api.waiting.lock().unwrap().remove(id) else {
        return Ok(reply(
            StatusCode::BAD_REQUEST,
            json!({"errorType": "InvalidRequestID"}),
        ));
    };
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let outcome = match what {
        "response" => Outcome::Answered(api_gateway_answer(&json)),
        _ => Outcome::Failed(json),
    };
    let _ = tx.send(outcome);
    Ok(accepted())
}

/// A function's API Gateway v2 answer (`statusCode`, `headers`, `body`) as the client sees it.
fn api_gateway_answer(json: &Value) -> Resp {
    let headers: HashMap<String, String> = json["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    let text = json["body"].as_str().filter(|b| !b.is_empty());
    let mut wire_bytes = text.map_or(0, str::len);
    // A binary answer comes base64-encoded, which API Gateway decodes; a gzipped one the client
    // unpacks (`Content-Encoding: gzip`, docs/api.md §1).
    let text = match (json["isBase64Encoded"].as_bool(), text) {
        (Some(true), Some(b)) => {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b)
                .expect("base64 body");
            wire_bytes = bytes.len();
            let unpacked = crate::gunzipped(&headers, &bytes);
            Some(String::from_utf8(unpacked).expect("UTF-8 body"))
        }
        (_, text) => text.map(str::to_owned),
    };
    let body = text
        .map(|b| serde_json::from_str(&b).unwrap_or(Value::String(b)))
        .unwrap_or(Value::Null);
    Resp {
        status: json["statusCode"].as_u64().unwrap_or(0) as u16,
        body,
        headers,
        wire_bytes,
    }
}
