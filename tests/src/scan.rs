//! Malware scanning in the tests (docs/api.md §36): S3 gates whose stand-in scanner (infra/s3-gate
//! `scan`) tags each upload with its verdict as GuardDuty Malware Protection for S3 does, and
//! delivers the verdict's event ("GuardDuty Malware Protection Object Scan Result") to the
//! thumbnailer (functions/thumbnails) of this test binary, as the EventBridge rule of
//! template.yaml does deployed. One gate per kind of scanner and one receiver per test binary.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::server::{kinesis_endpoint, on_own_runtime, s3_gate_endpoint};
use crate::{raw_http, TestApp, ATTACHMENTS_BUCKET, TEST_SECRET};

/// When the stand-in scans an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scanner {
    /// A moment (`PROMPT_DELAY`) after it, as GuardDuty does, on its own.
    Prompt,
    /// Only when the test asks (`scan_now`): until then its scan stays pending.
    OnRequest,
}

/// How long after an upload the prompt scanner scans it.
pub const PROMPT_DELAY: Duration = Duration::from_millis(100);

static PROMPT: OnceLock<String> = OnceLock::new();
static ON_REQUEST: OnceLock<String> = OnceLock::new();
static RECEIVER: OnceLock<String> = OnceLock::new();

/// The endpoint of this binary's S3 gate with `scanner`.
pub fn gate_endpoint(scanner: Scanner) -> String {
    let (cell, delay) = match scanner {
        Scanner::Prompt => (&PROMPT, Some(PROMPT_DELAY)),
        Scanner::OnRequest => (&ON_REQUEST, None),
    };
    cell.get_or_init(|| {
        let config = s3_gate::GateConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            s3: kinesis_endpoint(),
            secret: "local".into(),
            notify: None,
            scan: Some(s3_gate::ScanConfig {
                delay,
                notify: Some(receiver()),
            }),
        };
        on_own_runtime("s3-gate-scan", || async move {
            let running = s3_gate::start(config).await.expect("the S3 gate starts");
            (running.url(), running)
        })
    })
    .clone()
}

/// Has the on-request scanner scan `a/<conversation>/<attachmentId>` now: its verdict
/// (`NO_THREATS_FOUND`, `THREATS_FOUND`), once the object is tagged and the thumbnailer has
/// handled the result.
pub async fn scan_now(conversation: &str, attachment_id: &str) -> String {
    let url = format!(
        "{}/_scan/{ATTACHMENTS_BUCKET}/a/{conversation}/{attachment_id}",
        gate_endpoint(Scanner::OnRequest)
    );
    let (status, _, body) = raw_http("POST", &url, &[], Vec::new()).await;
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "the stand-in scanned it: {body}");
    body
}

/// Where the gates deliver scan results: a server of this binary that hands each to the
/// thumbnailer, answering once it handled it (500 when it failed: the gate tries again, as
/// Lambda retries an asynchronous invocation).
fn receiver() -> String {
    RECEIVER
        .get_or_init(|| {
            on_own_runtime("scan-results", || async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind the scan results' receiver");
                let url = format!("http://{}", listener.local_addr().unwrap());
                let task = tokio::spawn(serve(listener));
                (url, task)
            })
        })
        .clone()
}

async fn serve(listener: tokio::net::TcpListener) {
    // The thumbnailer's app, built on first use (it needs the plain gate, which is up by then).
    let app: &'static tokio::sync::OnceCell<TestApp> = Box::leak(Box::default());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await?.to_bytes();
                    let event: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    let app = app.get_or_init(thumbnailer_app).await;
                    let (status, text) = match app.thumbnailer().handle(&event).await {
                        Ok(outcomes) => (StatusCode::OK, format!("{outcomes:?}")),
                        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:?}")),
                    };
                    let mut answer = Response::new(Full::new(Bytes::from(text)));
                    *answer.status_mut() = status;
                    Ok::<_, hyper::Error>(answer)
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// An app whose thumbnailer records verdicts with scanning on (its calls recorded as the
/// thumbnailer's, `CHAT_IAM_LOG`).
async fn thumbnailer_app() -> TestApp {
    let auth = chat_http::auth::Authenticator::LocalHs256 {
        secret: TEST_SECRET.as_bytes().to_vec(),
    };
    let budget = chat_store::retry::Timeouts::LOCAL.request_budget;
    TestApp::build(auth, budget, None, None, Some(s3_gate_endpoint())).await
}
