//! HTTP plumbing for the REST functions: who is calling, path and query parameters, JSON
//! responses, and the one place where `ChatError` becomes an HTTP response (docs/api.md §2).

use lambda_http::http::{header, Method, StatusCode};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use serde::Serialize;
use std::future::Future;

use crate::auth::{user_from_sub, verify_hs256_claims, Authenticator};
use crate::routes::{self, percent_decode, Operation, PathParams, Route};
use chat_domain::error::ChatError;
use chat_domain::requests::{QueryParams, MAX_REQUEST_BYTES};
use chat_domain::safety::{claim_words, is_moderator, split_words};
use chat_domain::UserId;
use chat_store::ChatStore;

/// What every REST function builds once at init: storage and the authenticator.
#[derive(Clone, Debug)]
pub struct App {
    pub store: ChatStore,
    pub auth: Authenticator,
    /// ConnectionsTable: presence (docs/api.md §38).
    pub connections: chat_store::ConnectionStore,
}

impl App {
    pub async fn from_env() -> Result<App, lambda_http::Error> {
        let (config, sdk) = chat_store::init().await?;
        Ok(App {
            store: config.chat_store(&sdk),
            auth: Authenticator::from(&config.auth),
            connections: config.connection_store(&sdk),
        })
    }

    /// The caller, from the authorizer's claims (deployed) or a verified local token.
    pub fn caller(&self, req: &Request) -> Result<UserId, ChatError> {
        self.identity(req).map(|i| i.user)
    }

    /// The caller and whether its token is a moderator's (scope `chat:moderator` or group
    /// `moderators`, docs/api.md §30): from the JWT authorizer's claims (deployed, where API
    /// Gateway passes a list claim as `[a b]`) or a verified local token.
    pub fn identity(&self, req: &Request) -> Result<Identity, ChatError> {
        match &self.auth {
            Authenticator::ApiGateway => {
                let claims = match req.request_context_ref() {
                    Some(RequestContext::ApiGatewayV2(ctx)) => ctx
                        .authorizer
                        .as_ref()
                        .and_then(|a| a.jwt.as_ref())
                        .map(|jwt| &jwt.claims),
                    _ => None,
                };
                let claim = |name: &str| claims.and_then(|c| c.get(name));
                Ok(Identity {
                    user: user_from_sub(claim("sub").map(String::as_str))?,
                    moderator: is_moderator(|name| claim(name).map(|v| split_words(v))),
                })
            }
            Authenticator::LocalHs256 { secret } => {
                let token = bearer_token(req)?;
                let now = chat_domain::time::unix_seconds(chat_domain::time::now());
                let (user, claims) = verify_hs256_claims(token, secret, now)?;
                Ok(Identity {
                    user,
                    moderator: is_moderator(|name| claims.get(name).map(claim_words)),
                })
            }
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: UserId,
    pub moderator: bool,
}

impl Identity {
    /// The caller, if a moderator (else `403`).
    pub fn moderator(&self) -> Result<&UserId, ChatError> {
        if self.moderator {
            Ok(&self.user)
        } else {
            Err(ChatError::Forbidden(
                "only a moderator may do this (token scope `chat:moderator` or group `moderators`)"
                    .into(),
            ))
        }
    }
}

fn bearer_token(req: &Request) -> Result<&str, ChatError> {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let value = values
        .next()
        .ok_or_else(|| ChatError::Unauthorized("missing Authorization header".into()))?;
    // Two credentials name no one caller (found by probing: the first one was taken).
    if values.next().is_some() {
        return Err(ChatError::Unauthorized(
            "more than one Authorization header".into(),
        ));
    }
    let value = value
        .to_str()
        .map_err(|_| ChatError::Unauthorized("malformed Authorization header".into()))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(ChatError::Unauthorized(
            "Authorization must be `Bearer <token>`".into(),
        )),
    }
}

/// The request body, refused past 64 KiB.
pub fn body(req: &Request) -> Result<&[u8], ChatError> {
    let bytes: &[u8] = req.body().as_ref();
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(ChatError::PayloadTooLarge(format!(
            "request body is larger than {MAX_REQUEST_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

/// The WebSocket connection the request names as the client's own (`X-Connection-Id`, docs/api.md
/// §15.4; None: none named), or a 400.
pub fn origin(req: &Request) -> Result<Option<String>, ChatError> {
    let value = req.headers().get(chat_domain::requests::ORIGIN_HEADER);
    chat_domain::requests::parse_origin(value.map(|v| v.as_bytes()))
}

/// The route a request is for (`routes::locate`: behind a stage prefix too), with its path
/// parameters as they stand in the path.
pub fn route_of(req: &Request) -> Option<(&'static Route, PathParams)> {
    routes::locate(req.method().as_str(), req.uri().path())
}

/// The operation a request is for, by the route table.
pub fn operation(req: &Request) -> Option<Operation> {
    route_of(req).map(|(route, _)| route.operation)
}

/// A path parameter, from API Gateway's `pathParameters` or, failing that, from the path by its
/// route's template. Percent-escapes are decoded either way (`routes::percent_decode`); a
/// malformed one is no parameter (its parser's `400`).
pub fn path_param(req: &Request, name: &str) -> Option<String> {
    if let Some(v) = req.path_parameters_ref().and_then(|p| p.first(name)) {
        return percent_decode(v);
    }
    let (_, params) = route_of(req)?;
    params.get(name).and_then(percent_decode)
}

/// The raw query string is percent-encoded UTF-8 (`400` naming the parameter otherwise): the
/// decoded parameters a handler reads turn `%FF` into U+FFFD, so a reaction or a cursor would be
/// read as another (found by probing: `?reaction=%FF` was `200`, its path form `400`).
fn query_encoding(req: &Request) -> Result<(), ChatError> {
    let raw = req.uri().query().unwrap_or_default();
    for pair in raw.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode(name).is_none() || percent_decode(value).is_none() {
            let name = percent_decode(name).unwrap_or_else(|| name.to_owned());
            return Err(ChatError::invalid(format!(
                "query parameter `{name}` is not percent-encoded UTF-8"
            )));
        }
    }
    Ok(())
}

/// Query-string parameters of a request.
pub struct Query<'a>(&'a Request);

impl<'a> Query<'a> {
    pub fn of(req: &'a Request) -> Self {
        Query(req)
    }
}

impl QueryParams for Query<'_> {
    fn values(&self, name: &str) -> Vec<&str> {
        self.0
            .query_string_parameters_ref()
            .and_then(|q| q.all(name))
            .unwrap_or_default()
    }
}

pub fn json<T: Serialize>(status: u16, value: &T) -> Result<Response<Body>, ChatError> {
    let text = serde_json::to_string(value).map_err(ChatError::internal)?;
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::Text(text))
        .map_err(ChatError::internal)
}

/// `302 Found` to `location` (a fresh presigned URL: the link itself stays stable).
pub fn redirect(location: &str) -> Result<Response<Body>, ChatError> {
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, location)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::Empty)
        .map_err(ChatError::internal)
}

pub fn no_content() -> Result<Response<Body>, ChatError> {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Body::Empty)
        .map_err(ChatError::internal)
}

/// The id that ties a request's log lines to API Gateway's access log.
fn request_id(req: &Request) -> String {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.request_id.clone(),
        _ => None,
    }
    .or_else(|| req.lambda_context_ref().map(|c| c.request_id.clone()))
    .unwrap_or_default()
}

/// The one mapping of a handler's result to HTTP: `ChatError` → `{"error":{"code","message"}}`
/// with its status (and `Retry-After` on 429); an internal error is logged here, once, with the
/// request id, and its details never reach the client.
pub fn respond(result: Result<Response<Body>, ChatError>, request_id: &str) -> Response<Body> {
    let e = match result {
        Ok(response) => return response,
        Err(e) => e,
    };
    if let ChatError::Internal(detail) = &e {
        tracing::error!(request_id, detail, "internal error");
    }
    let mut builder = Response::builder()
        .status(e.status())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(seconds) = e.retry_after() {
        builder = builder.header(header::RETRY_AFTER, seconds.to_string());
    }
    builder
        .body(Body::Text(e.to_json().to_string()))
        .unwrap_or_default()
}

/// When a request's suspension check runs (`handle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    None,
    Before,
    Alongside,
}

/// Calls a handler and maps its result (what `serve` does per request; tests call it too).
pub async fn handle<F, Fut>(app: App, req: Request, handler: F) -> Response<Body>
where
    F: FnOnce(App, Request) -> Fut,
    Fut: Future<Output = Result<Response<Body>, ChatError>>,
{
    let id = request_id(&req);
    let route = route(&req);
    let gzip = req
        .headers()
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(accepts_gzip);
    let conversation = path_param(&req, "conversationId");
    let app = App {
        store: app.store.for_request(),
        ..app
    };
    let started = std::time::Instant::now();
    // Bounded: a DynamoDB call that does not answer (a brownout) must not hold the request
    // past its deadline (and Lambda's timeout); what it was doing may still land: 503.
    let allowed = app.store.time_allowed();
    let bounded = async move {
        let limited = async move {
            // A request without a valid token is left to its handler, which answers 401.
            let Ok(caller) = app.caller(&req) else {
                return handler(app, req).await;
            };
            // A suspended user's every request is refused (docs/api.md §30), by a read of the
            // suspension: before a write runs; a read's at the same time as its handler's (one
            // round trip, its answer dropped). A send under rate limits needs none: its limit's
            // write is refused instead (limits.rs).
            // A path or method the API does not have is `404` for everyone (§2).
            let check = match (operation(&req), req.method()) {
                (None, _) => Check::None,
                (Some(Operation::SendMessage), _) if app.store.limits_sends() => Check::None,
                (_, &Method::GET) => Check::Alongside,
                _ => Check::Before,
            };
            let store = app.store.clone();
            if check == Check::Before && store.is_suspended(&caller).await? {
                return Err(ChatError::Suspended);
            }
            // Then bad input that concerns every route, the caller's all-requests limit (§24)
            // and the handler. After the suspension: a suspended user's every request is 403
            // (found by probing: an oversized body was 413).
            let served = async {
                if operation(&req).is_some() {
                    // Every request's body is bounded (SPEC §8), a GET's or a DELETE's too, which
                    // their handlers never read (found by probing: a GET with 70 KB was 200).
                    body(&req)?;
                    query_encoding(&req)?;
                }
                if app.store.limits_requests() {
                    app.store.limit_request(&caller).await?;
                }
                handler(app, req).await
            };
            if check != Check::Alongside {
                return served.await;
            }
            let (suspended, served) = tokio::join!(store.is_suspended(&caller), served);
            if suspended? {
                return Err(ChatError::Suspended);
            }
            served
        };
        match tokio::time::timeout(allowed, limited).await {
            Ok(result) => result,
            Err(_) => Err(ChatError::Unavailable),
        }
    };
    // Boxed: a handler's future is deep, and callers nest it further (tests, the bench).
    let (result, calls) = chat_store::telemetry::counting_calls(Box::pin(bounded)).await;
    let response = compressed(respond(result, &id), gzip);
    // A line per request that went wrong or was slow, and one in CHAT_LOG_EVERY of the rest
    // (their cost, docs/cost.md "Logs"; the access log has them all): what an operator needs to
    // find it, never a message body.
    let (status, latency_ms) = (
        response.status().as_u16(),
        started.elapsed().as_millis() as u64,
    );
    if chat_store::telemetry::request_line_due(status, latency_ms) {
        tracing::info!(
            request_id = %id,
            route = %route,
            conversation = conversation.as_deref().unwrap_or(""),
            status,
            latency_ms,
            dynamodb_calls = calls,
            "request"
        );
    }
    response
}

/// Answers at least this long are gzipped for a client that accepts it (a history page of 3
/// messages, ~850 bytes, goes out in about half); a send's answer (~270 bytes) stays plain.
pub const COMPRESS_FROM_BYTES: usize = 512;

/// Whether an `Accept-Encoding` value allows gzip (RFC 9110 §12.5.3): `gzip` or `*`, without
/// `q=0`.
pub fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .or_else(|| p.strip_prefix("Q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
    })
}

/// A successful answer of at least `COMPRESS_FROM_BYTES`, gzipped when `gzip` (the client
/// accepts it). The HTTP API does not compress (only REST APIs can), and data out is billed per
/// byte: an inbox page of 20 is about a seventh of its size gzipped (docs/cost.md).
pub fn compressed(response: Response<Body>, gzip: bool) -> Response<Body> {
    use std::io::Write;
    let large = response.body().as_ref().len() >= COMPRESS_FROM_BYTES;
    if !gzip || !large || !response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let packed = encoder
        .write_all(body.as_ref())
        .and_then(|()| encoder.finish());
    match packed {
        Ok(bytes) => {
            parts.headers.insert(
                header::CONTENT_ENCODING,
                header::HeaderValue::from_static("gzip"),
            );
            parts.headers.insert(
                header::VARY,
                header::HeaderValue::from_static("accept-encoding"),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::Binary(bytes))
        }
        // Writing to memory does not fail; if it did, the answer goes out as it was.
        Err(_) => Response::from_parts(parts, body),
    }
}

/// The route as API Gateway matched it (`POST /conversations/{conversationId}/messages`), else
/// the method and path.
fn route(req: &Request) -> String {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx))
            if ctx.route_key.as_deref().is_some_and(|r| r != "$default") =>
        {
            ctx.route_key.clone().unwrap_or_default()
        }
        _ => format!("{} {}", req.method(), req.uri().path()),
    }
}

/// Runs a REST function: builds the `App` once, then serves requests with `handler`, several at
/// once where the host runs concurrent requests in one instance (locally: `cargo lambda watch
/// --concurrency`), one at a time on classic Lambda.
pub async fn serve<F, Fut>(handler: F) -> Result<(), lambda_http::Error>
where
    F: Fn(App, Request) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Body>, ChatError>> + Send,
{
    let app = App::from_env().await?;
    lambda_http::run_concurrent(lambda_http::service_fn(move |req: Request| {
        let (app, handler) = (app.clone(), handler.clone());
        async move { Ok::<_, lambda_http::Error>(handle(app, req, handler).await) }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_accepted_unless_refused() {
        for yes in [
            "gzip",
            "gzip, deflate, br",
            "br;q=1.0, GZIP;q=0.5",
            "*",
            "deflate, *;q=0.1",
        ] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in [
            "",
            "identity",
            "br, deflate",
            "gzip;q=0",
            "gzip; q=0.0",
            "x-gzip2",
        ] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }

    #[test]
    fn large_successful_answers_are_gzipped_for_clients_that_accept_it() {
        use std::io::Read;
        let page = serde_json::json!({"conversations": vec![serde_json::json!({"title": "x".repeat(40)}); 40]});
        let answer = || json(200, &page).unwrap();
        let text = answer().body().as_ref().to_vec();
        assert!(text.len() >= COMPRESS_FROM_BYTES);
        let packed = compressed(answer(), true);
        assert_eq!(packed.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(packed.headers()[header::VARY], "accept-encoding");
        assert!(packed.body().as_ref().len() < text.len() / 4);
        let mut unpacked = Vec::new();
        flate2::read::GzDecoder::new(packed.body().as_ref())
            .read_to_end(&mut unpacked)
            .unwrap();
        assert_eq!(unpacked, text);
        // Not asked, too small, or an error: as it was.
        let plain = compressed(answer(), false);
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(plain.body().as_ref(), &text[..]);
        let small = compressed(json(200, &serde_json::json!({"ok": true})).unwrap(), true);
        assert!(small.headers().get(header::CONTENT_ENCODING).is_none());
        let error = Response::builder()
            .status(413)
            .body(Body::Text("e".repeat(2000)))
            .unwrap();
        assert!(compressed(error, true)
            .headers()
            .get(header::CONTENT_ENCODING)
            .is_none());
    }

    #[test]
    fn a_query_string_that_is_not_percent_encoded_utf8_is_refused_naming_its_parameter() {
        let with = |query: &str| {
            let mut req = Request::default();
            *req.uri_mut() = format!("/inbox{query}").parse().unwrap();
            req
        };
        for ok in ["", "?limit=5", "?reaction=%F0%9F%91%8D&x", "?a=%40&&b="] {
            assert!(query_encoding(&with(ok)).is_ok(), "{ok}");
        }
        for (bad, names) in [
            ("?reaction=%FF", "`reaction`"),
            ("?limit=1&cursor=%C3", "`cursor`"),
            ("?x=%G1", "`x`"),
            ("?%FF=1", "`%FF`"),
        ] {
            match query_encoding(&with(bad)) {
                Err(ChatError::InvalidRequest(m)) => assert!(m.contains(names), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn one_bearer_token_names_the_caller_and_two_name_no_one() {
        let with = |values: &[&str]| {
            let mut req = Request::default();
            for v in values {
                req.headers_mut()
                    .append(header::AUTHORIZATION, v.parse().unwrap());
            }
            req
        };
        assert_eq!(bearer_token(&with(&["Bearer abc"])).unwrap(), "abc");
        assert_eq!(bearer_token(&with(&["bearer  abc "])).unwrap(), "abc");
        for bad in [
            &[][..],
            &["Basic abc"][..],
            &["Bearer "][..],
            &["Bearer abc", "Bearer xyz"][..],
        ] {
            assert!(
                matches!(bearer_token(&with(bad)), Err(ChatError::Unauthorized(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn errors_have_the_documented_shape() {
        let r = respond(Err(ChatError::Throttled), "r1");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = serde_json::from_slice(r.body().as_ref()).unwrap();
        assert_eq!(body["error"]["code"], "throttled");
        let r = respond(Err(ChatError::RateLimited { retry_after: 3 }), "r3");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let r = respond(Err(ChatError::SlowMode { retry_after: 0 }), "r4");
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = respond(Err(ChatError::internal("table ChatTable is gone")), "r2");
        assert_eq!(r.status(), 500);
        assert!(!String::from_utf8_lossy(r.body().as_ref()).contains("ChatTable"));
    }
}
