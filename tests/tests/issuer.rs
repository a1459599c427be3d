//! WebSocket tokens of an OpenID issuer (docs/api.md §3): keys found through the issuer's
//! discovery document, kept, and fetched again when a token names a key the set does not have
//! (a rotation), at most as often as allowed. The issuer is served here, on this machine, from
//! tests/fixtures/rs256-issuer.json.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chat_shared::auth::jwks::IssuerKeys;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

const NOW: i64 = 1_800_000_000;

struct Issuer {
    discovery_url: String,
    key_fetches: Arc<AtomicUsize>,
    rotated: Arc<AtomicBool>,
    fixture: Value,
}

/// Serves `/.well-known/openid-configuration` (naming `/keys` as `jwks_uri`) and `/keys`: the
/// fixture's key set, or the rotated one once `rotated` is set.
async fn issuer() -> Issuer {
    let fixture: Value =
        serde_json::from_str(include_str!("../fixtures/rs256-issuer.json")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (key_fetches, rotated) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (fetches, rot, f, b) = (
        key_fetches.clone(),
        rotated.clone(),
        fixture.clone(),
        base.clone(),
    );
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (fetches, rot, f, b) = (fetches.clone(), rot.clone(), f.clone(), b.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = match req.uri().path() {
                        "/.well-known/openid-configuration" => {
                            serde_json::json!({"issuer": "x", "jwks_uri": format!("{b}/keys")})
                        }
                        "/keys" => {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            if rot.load(Ordering::SeqCst) {
                                f["rotated_jwks"].clone()
                            } else {
                                f["jwks"].clone()
                            }
                        }
                        _ => Value::Null,
                    };
                    async move {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Issuer {
        discovery_url: format!("{base}/.well-known/openid-configuration"),
        key_fetches,
        rotated,
        fixture,
    }
}

async fn keys(i: &Issuer, min_refresh: Duration) -> IssuerKeys {
    IssuerKeys::with_discovery_url(
        i.fixture["issuer"].as_str().unwrap(),
        vec![i.fixture["audience"].as_str().unwrap().to_owned()],
        i.discovery_url.clone(),
        min_refresh,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn tokens_of_the_issuer_are_accepted_others_refused() {
    let i = issuer().await;
    let k = keys(&i, Duration::from_secs(3600)).await;
    assert_eq!(
        i.key_fetches.load(Ordering::SeqCst),
        1,
        "fetched once, at start"
    );
    let token = |name: &str| i.fixture[name].as_str().unwrap().to_owned();
    assert_eq!(
        k.verify(&token("valid_id_token"), NOW)
            .await
            .unwrap()
            .as_str(),
        "user-1"
    );
    assert_eq!(
        k.verify(&token("valid_access_token"), NOW)
            .await
            .unwrap()
            .as_str(),
        "user-2"
    );
    for bad in ["expired", "wrong_issuer", "wrong_audience", "unknown_kid"] {
        assert!(k.verify(&token(bad), NOW).await.is_err(), "{bad}");
    }
    let tampered = token("valid_id_token").replacen('.', ".e", 1);
    assert!(k.verify(&tampered, NOW).await.is_err());
    let hs = chat_shared::auth::mint_hs256("user-1", NOW + 60, b"k");
    assert!(
        k.verify(&hs, NOW).await.is_err(),
        "HS256 is not accepted in place of RS256"
    );
    assert_eq!(
        i.key_fetches.load(Ordering::SeqCst),
        1,
        "an unknown key id within the minimum interval fetches nothing"
    );
}

#[tokio::test]
async fn a_rotated_key_is_fetched_when_a_token_names_it() {
    let i = issuer().await;
    let k = keys(&i, Duration::ZERO).await;
    let rotated = i.fixture["rotated_token"].as_str().unwrap();
    assert!(k.verify(rotated, NOW).await.is_err(), "not published yet");
    assert_eq!(i.key_fetches.load(Ordering::SeqCst), 2, "looked again once");
    i.rotated.store(true, Ordering::SeqCst);
    assert_eq!(k.verify(rotated, NOW).await.unwrap().as_str(), "user-3");
    assert_eq!(i.key_fetches.load(Ordering::SeqCst), 3);
    // Known keys need no fetch.
    let old = i.fixture["valid_id_token"].as_str().unwrap();
    assert_eq!(k.verify(old, NOW).await.unwrap().as_str(), "user-1");
    assert_eq!(i.key_fetches.load(Ordering::SeqCst), 3);
}
