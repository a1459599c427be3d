//! A minimal HTTP/1.1 server (hyper) shared by the WebSocket API and the Management API.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

pub(crate) type Body = Full<Bytes>;

/// Serves `handle` on `listener` until shutdown; connections may be upgraded (WebSocket).
pub(crate) fn serve<F, Fut>(listener: TcpListener, shutdown: Shutdown, handle: F)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // E.g. out of file descriptors: wait rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.wait() => return,
            };
            let handle = handle.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let response = handle(req, peer);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let conn = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades();
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = shutdown.wait() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            });
        }
    });
}

pub(crate) fn response(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// A JSON answer, saying so in `Content-Type` as the APIs it stands beside do.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut r = response(status, body.to_string());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}
