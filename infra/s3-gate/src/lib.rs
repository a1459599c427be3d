//! The local stack's S3 gate: an HTTP proxy in front of moto's S3 (path-style URLs) that does what
//! moto does not (TOOLING.md: moto accepts a presigned PUT with another `Content-Type` or length):
//!
//! - a presigned request (`X-Amz-Signature` in its query) is checked as S3 checks it: AWS SigV4
//!   over its method, path, query and every signed header *as sent* (so another `Content-Type` or
//!   `Content-Length` than the one signed breaks the signature), with the secret key the local
//!   stack's functions sign with, and not after `X-Amz-Date` + `X-Amz-Expires`; otherwise 403 with
//!   S3's error XML (`SignatureDoesNotMatch`, `AccessDenied`), and nothing reaches moto;
//! - a request with neither a presigned query nor an `Authorization` header is refused 403
//!   (`AccessDenied`: the bucket blocks public access); SDK calls (`Authorization`) pass through;
//! - CORS for browsers (a preflight `OPTIONS` is answered here, as a bucket's CORS rule would);
//! - moto's 500 to a `DeleteObjectTagging` of a missing object becomes S3's 404 `NoSuchKey`;
//! - the stand-in of the attachments bucket's policy (template.yaml): a read of an object tagged
//!   `chat-deleted=1` (a deleted attachment's tombstone) is refused 403 `AccessDenied`, and so is
//!   a presigned read of a missing key (its signer may not list the bucket);
//! - after a presigned `PUT` stored an object, the S3 event (`ObjectCreated:Put`, S3's event JSON)
//!   is POSTed to `notify` when set: the local stand-in of the bucket's event notification;
//! - with `scan` set, the stand-in of GuardDuty Malware Protection for S3: each object a presigned
//!   `PUT` stored is scanned after `scan.delay` (a zero delay: before the PUT is answered; or when `POST /_scan/<bucket>/<key>` asks, which
//!   answers once it is done): a file that begins with the EICAR test string is `THREATS_FOUND`,
//!   anything else `NO_THREATS_FOUND`; the verdict is added to the object's tags as GuardDuty adds
//!   it (`GuardDutyMalwareScanStatus`: it reads the tags and writes them back with its own), then
//!   GuardDuty's EventBridge event ("GuardDuty Malware Protection Object Scan Result") is POSTed
//!   to `scan.notify` when set.

use bytes::Bytes;
use hmac::{KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the gate listens, what it guards and whom it tells.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub listen: SocketAddr,
    /// moto's S3 endpoint (`http://host:port`).
    pub s3: String,
    /// The secret access key presigned requests are signed with (the local stack's: `local`).
    pub secret: String,
    /// Where S3 events of uploads are POSTed (None: nowhere).
    pub notify: Option<String>,
    /// The stand-in malware scanner (None: uploads are not scanned).
    pub scan: Option<ScanConfig>,
}

/// The stand-in of GuardDuty Malware Protection for S3.
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// How long after an upload it is scanned (None: only when `POST /_scan/…` asks).
    pub delay: Option<Duration>,
    /// Where each scan's result event is POSTed (None: nowhere).
    pub notify: Option<String>,
}

/// The tag whose objects the bucket's policy refuses to read (`DENY_READ_TAG` = `"1"`).
pub const DENY_READ_TAG: &str = "chat-deleted";

/// The tag GuardDuty writes on a scanned object.
pub const SCAN_TAG: &str = "GuardDutyMalwareScanStatus";

/// The EICAR anti-virus test file's content (split, so that this source is not itself a test
/// file to a scanner).
pub const EICAR: &str = concat!(
    "X5O!P%@AP[4\\PZX54(P^)7CC)7}$",
    "EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
);

struct State {
    config: GateConfig,
    client: Client<HttpConnector, Full<Bytes>>,
    /// How long the store behind may take to answer a request the gate passes on.
    upstream_timeout: Duration,
}

/// S3 answers or fails a request in its time; the store behind the gate (moto) may not (a frozen
/// process): past this, the gate answers `503 ServiceUnavailable`, as S3 does when it cannot serve
/// a request, rather than leaving the client without an answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(20);

/// A running gate; dropping it stops it.
pub struct Running {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start(config: GateConfig) -> io::Result<Running> {
    start_with(config, UPSTREAM_TIMEOUT).await
}

async fn start_with(config: GateConfig, upstream_timeout: Duration) -> io::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(HttpConnector::new());
    let state = Arc::new(State {
        config,
        client,
        upstream_timeout,
    });
    let task = tokio::spawn(serve(listener, state));
    Ok(Running { addr, task })
}

async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let state = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(status: StatusCode, headers: &[(&str, String)], body: Bytes) -> Answer {
    let mut r = Response::builder()
        .status(status)
        .header("access-control-allow-origin", "*")
        .header("access-control-expose-headers", "ETag");
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    r.body(Full::new(body)).expect("a valid response")
}

/// S3's error answer.
fn refuse(status: StatusCode, code: &str, message: &str) -> Answer {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    answer(
        status,
        &[("content-type", "application/xml".into())],
        Bytes::from(xml),
    )
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Answer, hyper::Error> {
    let (parts, body) = req.into_parts();
    if let Some(object) = parts.uri.path().strip_prefix("/_scan") {
        return Ok(scan_on_request(&state, &parts, object).await);
    }
    if parts.method == Method::OPTIONS {
        let allow = [
            (
                "access-control-allow-methods",
                "GET, HEAD, PUT, POST".into(),
            ),
            ("access-control-allow-headers", "*".into()),
            ("access-control-max-age", "600".into()),
        ];
        return Ok(answer(StatusCode::NO_CONTENT, &allow, Bytes::new()));
    }
    let query = parts.uri.query().unwrap_or("");
    let presigned = query_pairs(query)
        .iter()
        .any(|(k, _)| k == "X-Amz-Signature");
    if presigned {
        if let Err((code, message)) = verify(&parts, &state.config.secret, now_ms()) {
            return Ok(refuse(StatusCode::FORBIDDEN, code, &message));
        }
    } else if !parts.headers.contains_key("authorization") {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "Access Denied (public access is blocked)",
        ));
    }
    let object_read = matches!(parts.method, Method::GET | Method::HEAD)
        && !query_pairs(query).iter().any(|(k, _)| k == "tagging")
        && parts.uri.path().trim_start_matches('/').contains('/');
    if object_read {
        // Within the store's time, as every request the gate passes on (a frozen store).
        let denied = read_denied(&state, parts.uri.path());
        match tokio::time::timeout(state.upstream_timeout, denied).await {
            Ok(false) => {}
            Ok(true) => {
                return Ok(refuse(
                    StatusCode::FORBIDDEN,
                    "AccessDenied",
                    "Access Denied",
                ))
            }
            Err(_) => return Ok(unanswered()),
        }
    }
    let body = body.collect().await?.to_bytes();
    let size = body.len();
    let (status, headers, bytes) =
        match tokio::time::timeout(state.upstream_timeout, forward(&state, &parts, body)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Ok(refuse(StatusCode::BAD_GATEWAY, "InternalError", &e)),
            Err(_) => return Ok(unanswered()),
        };
    // moto answers 500 to DeleteObjectTagging of a missing object; S3 answers 404 NoSuchKey
    // (which the send relies on: no object, not uploaded).
    if parts.method == Method::DELETE && query.split('&').any(|p| p == "tagging") && status == 500 {
        return Ok(refuse(
            StatusCode::NOT_FOUND,
            "NoSuchKey",
            "The specified key does not exist.",
        ));
    }
    // The functions' roles may not list the attachments bucket (template.yaml), so S3 answers a
    // presigned read of a missing key (a deleted attachment's thumbnail) 403, not 404.
    if presigned && object_read && status == StatusCode::NOT_FOUND {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "Access Denied",
        ));
    }
    if presigned && parts.method == Method::PUT && status.is_success() {
        if let Some(url) = state.config.notify.clone() {
            let event = s3_event(parts.uri.path(), size);
            let state = state.clone();
            tokio::spawn(async move { notify(&state, &url, event).await });
        }
        match state.config.scan.as_ref().and_then(|s| s.delay) {
            // No delay: scanned (and its verdict delivered) before the upload is answered, so a
            // client that sends the file next finds it scanned.
            Some(delay) if delay.is_zero() => {
                let path = parts.uri.path();
                if let Err(e) = scan(&state, path).await {
                    eprintln!("s3-gate: scan of {path}: {e}");
                }
            }
            Some(delay) => {
                let (state, path) = (state.clone(), parts.uri.path().to_owned());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    if let Err(e) = scan(&state, &path).await {
                        eprintln!("s3-gate: scan of {path}: {e}");
                    }
                });
            }
            None => {}
        }
    }
    let mut r = answer(status, &[], bytes);
    for (k, v) in &headers {
        if !is_hop(k.as_str()) && !k.as_str().starts_with("access-control-") {
            r.headers_mut().insert(k.clone(), v.clone());
        }
    }
    Ok(r)
}

/// S3's answer when it cannot serve a request in time (the store behind did not answer).
fn unanswered() -> Answer {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        "The store did not answer in time; the request may or may not have been applied.",
    )
}

fn is_hop(h: &str) -> bool {
    matches!(
        h,
        "host" | "content-length" | "connection" | "transfer-encoding" | "keep-alive"
    )
}

async fn forward(
    state: &State,
    parts: &Parts,
    body: Bytes,
) -> Result<(StatusCode, hyper::HeaderMap, Bytes), String> {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{pq}", state.config.s3.trim_end_matches('/')));
    for (k, v) in &parts.headers {
        if !is_hop(k.as_str()) {
            req = req.header(k, v);
        }
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let resp = state.client.request(req).await.map_err(|e| e.to_string())?;
    let (p, b) = resp.into_parts();
    let bytes = b.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((p.status, p.headers, bytes))
}

/// Whether the bucket's policy refuses to read the object at path-style `path`: it is tagged
/// `DENY_READ_TAG=1`. No such object, or no answer about its tags: not refused here (the read
/// itself then answers).
async fn read_denied(state: &State, path: &str) -> bool {
    let s3 = state.config.s3.trim_end_matches('/');
    match plain(state, Method::GET, &format!("{s3}{path}?tagging"), None).await {
        Ok((status, _, xml)) if status.is_success() => parse_tags(&String::from_utf8_lossy(&xml))
            .iter()
            .any(|(k, v)| k == DENY_READ_TAG && v == "1"),
        _ => false,
    }
}

/// `POST /_scan/<bucket>/<key>`: scans that object now; answers its verdict once the object is
/// tagged and the result event delivered.
async fn scan_on_request(state: &State, parts: &Parts, object: &str) -> Answer {
    if parts.method != Method::POST || state.config.scan.is_none() {
        return refuse(StatusCode::NOT_FOUND, "NoSuchKey", "no scanner here");
    }
    match scan(state, object).await {
        Ok(status) => answer(StatusCode::OK, &[], Bytes::from(status)),
        Err(e) => refuse(StatusCode::NOT_FOUND, "NoSuchKey", &e),
    }
}

/// GuardDuty's verdict of a file, as the stand-in decides it.
pub fn verdict(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(EICAR.as_bytes()) {
        "THREATS_FOUND"
    } else {
        "NO_THREATS_FOUND"
    }
}

/// Scans the object at path-style `path` (`/bucket/key`): reads it, tags it with its verdict
/// (the other tags kept), and delivers the result event. Err: no such object (deleted meanwhile),
/// or moto failed.
async fn scan(state: &State, path: &str) -> Result<&'static str, String> {
    let s3 = state.config.s3.trim_end_matches('/');
    let (status, headers, body) = plain(state, Method::GET, &format!("{s3}{path}"), None).await?;
    if !status.is_success() {
        return Err(format!("GET {path}: {status}"));
    }
    let verdict = verdict(&body);
    let etag = headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    let tagging = format!("{s3}{path}?tagging");
    let (status, _, xml) = plain(state, Method::GET, &tagging, None).await?;
    if !status.is_success() {
        return Err(format!("GET {path}?tagging: {status}"));
    }
    let mut tags: Vec<(String, String)> = parse_tags(&String::from_utf8_lossy(&xml))
        .into_iter()
        .filter(|(k, _)| k != SCAN_TAG)
        .collect();
    tags.push((SCAN_TAG.into(), verdict.into()));
    let body = Bytes::from(tagging_xml(&tags));
    let (status, _, _) = plain(state, Method::PUT, &tagging, Some(body)).await?;
    if !status.is_success() {
        return Err(format!("PUT {path}?tagging: {status}"));
    }
    if let Some(url) = state.config.scan.as_ref().and_then(|s| s.notify.clone()) {
        notify(
            state,
            &url,
            scan_result_event(path, &etag, verdict, now_secs()),
        )
        .await;
    }
    Ok(verdict)
}

/// A request of the scanner to moto: moto does not check signatures, but treats a request
/// without an `Authorization` header as anonymous (refused: the bucket is private), so it carries
/// one in the local credentials' name.
async fn plain(
    state: &State,
    method: Method,
    url: &str,
    body: Option<Bytes>,
) -> Result<(StatusCode, hyper::HeaderMap, Bytes), String> {
    let auth = "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/s3/aws4_request, \
                SignedHeaders=host, Signature=0";
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", auth)
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|e| e.to_string())?;
    let resp = state.client.request(req).await.map_err(|e| e.to_string())?;
    let (p, b) = resp.into_parts();
    let bytes = b.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((p.status, p.headers, bytes))
}

/// The tags of S3's `Tagging` XML, in order.
pub fn parse_tags(xml: &str) -> Vec<(String, String)> {
    let field = |tag: &str, name: &str| {
        let open = format!("<{name}>");
        let start = tag.find(&open)? + open.len();
        let end = tag[start..].find(&format!("</{name}>"))? + start;
        Some(xml_unescape(&tag[start..end]))
    };
    xml.split("<Tag>")
        .skip(1)
        .filter_map(|tag| Some((field(tag, "Key")?, field(tag, "Value")?)))
        .collect()
}

/// S3's `Tagging` XML of `tags`.
pub fn tagging_xml(tags: &[(String, String)]) -> String {
    let tags: String = tags
        .iter()
        .map(|(k, v)| {
            format!(
                "<Tag><Key>{}</Key><Value>{}</Value></Tag>",
                xml_escape(k),
                xml_escape(v)
            )
        })
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Tagging><TagSet>{tags}</TagSet></Tagging>"
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// GuardDuty's EventBridge event of a scan's result, for the object at path-style `path`, at
/// `now` (Unix seconds).
pub fn scan_result_event(path: &str, etag: &str, status: &str, now: u64) -> serde_json::Value {
    let path = path.trim_start_matches('/');
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    let threats = (status == "THREATS_FOUND")
        .then(|| serde_json::json!([{"name": "EICAR-Test-File (not a virus)"}]));
    serde_json::json!({
        "version": "0",
        "id": format!("local-scan-{now}-{etag}"),
        "detail-type": "GuardDuty Malware Protection Object Scan Result",
        "source": "aws.guardduty",
        "account": "123456789012",
        "time": rfc3339(now),
        "region": "us-east-1",
        "resources": ["arn:aws:guardduty:us-east-1:123456789012:malware-protection-plan/local"],
        "detail": {
            "schemaVersion": "1.0",
            "scanStatus": "COMPLETED",
            "resourceType": "S3_OBJECT",
            "s3ObjectDetails": {
                "bucketName": bucket,
                "objectKey": key,
                "eTag": etag,
                "versionId": null,
                "s3Throttled": false,
            },
            "scanResultDetails": {"scanResultStatus": status, "threats": threats},
        },
    })
}

/// Unix seconds → `2026-12-03T13:05:00Z`.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days (Howard Hinnant's algorithm), the inverse of `amz_date_secs`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// S3's event notification JSON for an object created at path-style `path` (`/bucket/key`).
pub fn s3_event(path: &str, size: usize) -> serde_json::Value {
    let path = path.trim_start_matches('/');
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    serde_json::json!({"Records": [{
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": format!("arn:aws:s3:::{bucket}")},
            // As S3 sends it: URL-encoded.
            "object": {"key": key, "size": size},
        },
    }]})
}

/// Delivers the event as S3's notification invokes a function: asynchronously, and a function
/// error is retried twice (Lambda waits about 1 and 2 minutes; here 1 and 2 seconds).
async fn notify(state: &State, url: &str, event: serde_json::Value) {
    let body = Bytes::from(event.to_string());
    for attempt in 0..3u64 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(attempt)).await;
        }
        let req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(body.clone()));
        let Ok(req) = req else { return };
        match state.client.request(req).await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => eprintln!(
                "s3-gate: upload event to {url}: {} (try {})",
                r.status(),
                attempt + 1
            ),
            Err(e) => eprintln!("s3-gate: upload event to {url}: {e} (try {})", attempt + 1),
        }
    }
}

fn now_secs() -> u64 {
    now_ms() / 1000
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The query's pairs, percent-decoded, in their order.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// SigV4's URI encoding: every byte but the unreserved ones as `%XX`.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

type Refusal = (&'static str, String);

fn mismatch() -> Refusal {
    (
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided".into(),
    )
}

/// Checks a presigned request as S3 does (SigV4 in the query), at `now_ms` (Unix milliseconds:
/// a request is valid until its second `X-Amz-Date + X-Amz-Expires` begins, not a second more).
pub fn verify(parts: &Parts, secret: &str, now_ms: u64) -> Result<(), Refusal> {
    let pairs = query_pairs(parts.uri.query().unwrap_or(""));
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let denied = |m: &str| ("AccessDenied", m.to_owned());
    if get("X-Amz-Algorithm") != Some("AWS4-HMAC-SHA256") {
        return Err(denied("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
    }
    let (Some(credential), Some(date), Some(expires), Some(signed), Some(signature)) = (
        get("X-Amz-Credential"),
        get("X-Amz-Date"),
        get("X-Amz-Expires"),
        get("X-Amz-SignedHeaders"),
        get("X-Amz-Signature"),
    ) else {
        return Err(denied("a presigned request needs every X-Amz-* parameter"));
    };
    let scope: Vec<&str> = credential.splitn(2, '/').collect();
    let scope = scope.get(1).copied().unwrap_or("");
    let parts_of_scope: Vec<&str> = scope.split('/').collect();
    let [day, region, service, "aws4_request"] = parts_of_scope[..] else {
        return Err(denied("X-Amz-Credential is malformed"));
    };
    let signed_at = amz_date_secs(date).ok_or_else(|| denied("X-Amz-Date is malformed"))?;
    let expires: u64 = expires
        .parse()
        .map_err(|_| denied("X-Amz-Expires is malformed"))?;
    if now_ms >= (signed_at + expires) * 1000 {
        return Err(denied("Request has expired"));
    }
    let names: Vec<&str> = signed.split(';').collect();
    if !names.contains(&"host") {
        return Err(denied("the host header must be signed"));
    }
    // S3 refuses an `x-amz-*` header the signature does not cover (an ACL, a storage class or
    // metadata a client adds to a presigned upload).
    if parts
        .headers
        .keys()
        .any(|h| h.as_str().starts_with("x-amz-") && !names.contains(&h.as_str()))
    {
        return Err(denied(
            "There were headers present in the request which were not signed",
        ));
    }
    let mut headers = String::new();
    for name in &names {
        let values: Vec<String> = parts
            .headers
            .get_all(*name)
            .iter()
            .map(|v| {
                let v = String::from_utf8_lossy(v.as_bytes());
                v.split_whitespace().collect::<Vec<_>>().join(" ")
            })
            .collect();
        if values.is_empty() {
            // A signed header that was not sent (e.g. another Content-Length framing).
            return Err(mismatch());
        }
        headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let mut query: Vec<(String, String)> = pairs
        .iter()
        .filter(|(k, _)| k != "X-Amz-Signature")
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    query.sort();
    let query: Vec<String> = query.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    let payload = get("X-Amz-Content-Sha256").unwrap_or("UNSIGNED-PAYLOAD");
    let canonical = format!(
        "{}\n{}\n{}\n{headers}\n{signed}\n{payload}",
        parts.method.as_str(),
        parts.uri.path(),
        query.join("&"),
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let expected = hex::encode(hmac(&key, to_sign.as_bytes()));
    if expected != signature.to_ascii_lowercase() {
        return Err(mismatch());
    }
    Ok(())
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// `20261203T130500Z` → Unix seconds.
fn amz_date_secs(d: &str) -> Option<u64> {
    let b = d.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| d.get(r)?.parse::<i64>().ok();
    let (y, m, day) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates() {
        assert_eq!(amz_date_secs("19700101T000000Z"), Some(0));
        assert_eq!(amz_date_secs("20261203T130500Z"), Some(1_796_303_100));
        assert_eq!(amz_date_secs("2026-12-03"), None);
    }

    #[test]
    fn event_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_303_100), "2026-12-03T13:05:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn tags_round_trip_and_eicar_is_found() {
        let tags = vec![
            ("chat-unattached".to_owned(), "1".to_owned()),
            (SCAN_TAG.to_owned(), "a<&>b".to_owned()),
        ];
        assert_eq!(parse_tags(&tagging_xml(&tags)), tags);
        assert_eq!(parse_tags("<Tagging><TagSet/></Tagging>"), vec![]);
        assert_eq!(EICAR.len(), 68);
        assert_eq!(verdict(EICAR.as_bytes()), "THREATS_FOUND");
        assert_eq!(verdict(format!("{EICAR}\n").as_bytes()), "THREATS_FOUND");
        assert_eq!(verdict(b"hello"), "NO_THREATS_FOUND");
    }

    /// A store that never answers (a frozen moto): the gate answers `503 ServiceUnavailable` at
    /// its timeout instead of holding the client for good.
    #[tokio::test]
    async fn a_store_that_never_answers_gets_a_503_at_the_timeout() {
        let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s3 = format!("http://{}", frozen.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = frozen.accept().await {
                open.push(conn);
            }
        });
        let config = GateConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            s3,
            secret: "local".into(),
            notify: None,
            scan: None,
        };
        let gate = start_with(config, Duration::from_millis(300))
            .await
            .unwrap();
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let req = Request::get(format!("{}/bucket/key", gate.url()))
            .header("authorization", "AWS4-HMAC-SHA256 Credential=local/x")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), client.request(req))
            .await
            .expect("answered")
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() >= Duration::from_millis(300));
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("<Code>ServiceUnavailable</Code>"));
    }

    #[test]
    fn encodings() {
        assert_eq!(percent_decode("a%2Fb%3D"), "a/b=");
        assert_eq!(uri_encode("a/b c=~"), "a%2Fb%20c%3D~");
    }
}
