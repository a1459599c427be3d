//! WebSocket tokens of an OpenID issuer (docs/api.md §3): keys found through the issuer's
//! discovery document, kept, and fetched again when a token names a key the set does not have
//! (a rotation), at most as often as allowed, and when the kept set is old (a withdrawn key). The issuer is served here, on this machine, from
//! tests/fixtures/rs256-issuer.json.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chat_http::auth::jwks::{IssuerKeys, Refresh};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

const NOW: i64 = 1_800_000_000;

struct Issuer {
    discovery_url: String,
    key_fetches: Arc<AtomicUsize>,
    /// The key set `/keys` serves.
    served: Arc<Mutex<Value>>,
    fixture: Value,
}

impl Issuer {
    /// A string of the fixture (a token, the issuer's URL, the audience).
    fn text(&self, name: &str) -> &str {
        self.fixture[name].as_str().unwrap()
    }

    fn serve(&self, keys: Value) {
        *self.served.lock().unwrap() = keys;
    }

    /// How many times `/keys` was fetched.
    fn fetches(&self) -> usize {
        self.key_fetches.load(Ordering::SeqCst)
    }
}

/// The user `token` names when `k` accepts it at `NOW`, else why not.
async fn user(k: &IssuerKeys, token: &str) -> Result<String, String> {
    match k.verify(token, NOW).await {
        Ok(user) => Ok(user.as_str().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// Serves `/.well-known/openid-configuration` (naming `/keys` as `jwks_uri`) and `/keys`: the
/// fixture's key set until `serve` names another.
async fn issuer() -> Issuer {
    let fixture: Value =
        serde_json::from_str(include_str!("../fixtures/rs256-issuer.json")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (key_fetches, served) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(Mutex::new(fixture["jwks"].clone())),
    );
    let (fetches, keys, b) = (key_fetches.clone(), served.clone(), base.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (fetches, keys, b) = (fetches.clone(), keys.clone(), b.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = match req.uri().path() {
                        "/.well-known/openid-configuration" => {
                            serde_json::json!({"issuer": "x", "jwks_uri": format!("{b}/keys")})
                        }
                        "/keys" => {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            keys.lock().unwrap().clone()
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
        served,
        fixture,
    }
}

/// Keys fetched again on an unknown key id at most every `min_interval`; never for their age.
async fn keys(i: &Issuer, min_interval: Duration) -> IssuerKeys {
    let refresh = Refresh {
        min_interval,
        max_age: Duration::from_secs(3600),
    };
    keys_refreshed(i, refresh).await
}

/// Keys fetched again once the set is `max_age` old, and on any unknown key id.
async fn keys_kept_for(i: &Issuer, max_age: Duration) -> IssuerKeys {
    let refresh = Refresh {
        min_interval: Duration::ZERO,
        max_age,
    };
    keys_refreshed(i, refresh).await
}

async fn keys_refreshed(i: &Issuer, refresh: Refresh) -> IssuerKeys {
    IssuerKeys::with_discovery_url(
        i.text("issuer"),
        vec![i.text("audience").to_owned()],
        i.discovery_url.clone(),
        refresh,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn tokens_of_the_issuer_are_accepted_others_refused() {
    let i = issuer().await;
    let k = keys(&i, Duration::from_secs(3600)).await;
    assert_eq!(i.fetches(), 1, "fetched once, at start");
    let token = |name: &str| i.text(name).to_owned();
    assert_eq!(
        user(&k, &token("valid_id_token")).await.as_deref(),
        Ok("user-1")
    );
    assert_eq!(
        user(&k, &token("valid_access_token")).await.as_deref(),
        Ok("user-2")
    );
    for bad in ["expired", "wrong_issuer", "wrong_audience", "unknown_kid"] {
        assert!(user(&k, &token(bad)).await.is_err(), "{bad}");
    }
    let tampered = token("valid_id_token").replacen('.', ".e", 1);
    assert!(user(&k, &tampered).await.is_err());
    let hs = chat_http::auth::mint_hs256("user-1", NOW + 60, b"k");
    assert!(
        user(&k, &hs).await.is_err(),
        "HS256 is not accepted in place of RS256"
    );
    assert_eq!(
        i.fetches(),
        1,
        "an unknown key id within the minimum interval fetches nothing"
    );
}

#[tokio::test]
async fn a_rotated_key_is_fetched_when_a_token_names_it() {
    let i = issuer().await;
    let k = keys(&i, Duration::ZERO).await;
    let rotated = i.text("rotated_token");
    assert!(user(&k, rotated).await.is_err(), "not published yet");
    assert_eq!(i.fetches(), 2, "looked again once");
    i.serve(i.fixture["rotated_jwks"].clone());
    assert_eq!(user(&k, rotated).await.as_deref(), Ok("user-3"));
    assert_eq!(i.fetches(), 3);
    // Known keys need no fetch.
    let old = i.text("valid_id_token");
    assert_eq!(user(&k, old).await.as_deref(), Ok("user-1"));
    assert_eq!(i.fetches(), 3);
}

#[tokio::test]
async fn keys_the_service_cannot_use_do_not_spoil_the_set() {
    let i = issuer().await;
    let mut set = i.fixture["jwks"].clone();
    let mut no_kid = set["keys"][0].clone();
    no_kid.as_object_mut().unwrap().remove("kid");
    set["keys"].as_array_mut().unwrap().extend([
        serde_json::json!({"kty": "EC", "kid": "ec-1", "crv": "P-256",
                           "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                           "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}),
        serde_json::json!({"kty": "OKP", "kid": "ed-1", "crv": "Ed25519",
                           "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}),
        no_kid,
    ]);
    i.serve(set);
    let k = keys(&i, Duration::from_secs(3600)).await;
    let token = i.text("valid_id_token");
    assert_eq!(user(&k, token).await.as_deref(), Ok("user-1"));
}

#[tokio::test]
async fn an_old_set_is_fetched_again_and_a_withdrawn_key_stops_working() {
    let i = issuer().await;
    let max_age = Duration::from_millis(300);
    let k = keys_kept_for(&i, max_age).await;
    let old = i.text("valid_id_token");
    assert_eq!(user(&k, old).await.as_deref(), Ok("user-1"));
    assert_eq!(i.fetches(), 1, "fresh: no fetch");

    // The issuer withdraws the key: accepted until the kept set is old, then refused.
    let mut withdrawn = i.fixture["rotated_jwks"].clone();
    withdrawn["keys"]
        .as_array_mut()
        .unwrap()
        .retain(|key| key["kid"] != "test-key-1");
    i.serve(withdrawn);
    assert!(user(&k, old).await.is_ok(), "the kept set is fresh");
    tokio::time::sleep(max_age + Duration::from_millis(50)).await;
    assert!(user(&k, old).await.is_err(), "withdrawn");
    assert_eq!(i.fetches(), 2, "fetched once, for its age");
    let rotated = i.text("rotated_token");
    assert_eq!(user(&k, rotated).await.as_deref(), Ok("user-3"));
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_keys() {
    let i = issuer().await;
    let max_age = Duration::from_millis(200);
    let k = keys_kept_for(&i, max_age).await;
    // The issuer now serves a document with no usable key.
    i.serve(serde_json::json!({"keys": [{"kty": "EC", "kid": "ec-1"}]}));
    tokio::time::sleep(max_age + Duration::from_millis(50)).await;
    let old = i.text("valid_id_token");
    assert_eq!(user(&k, old).await.as_deref(), Ok("user-1"));
    assert_eq!(i.fetches(), 2, "it did look");
}
