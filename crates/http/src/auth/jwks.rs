//! RS256 tokens of an OpenID issuer (e.g. a Cognito user pool, Okta, Entra ID, Keycloak), for
//! WebSocket `$connect` when deployed: the HTTP API's JWT authorizer does this for REST, but
//! WebSocket APIs have no JWT authorizer.
//!
//! The keys come from the `jwks_uri` of the issuer's discovery document
//! (`{issuer}/.well-known/openid-configuration`), fetched at init and kept. They are fetched
//! again (`Refresh`):
//! - when a token names a key id the set does not have (the issuer rotated its keys), at most
//!   once a minute, so a flood of bad tokens cannot turn into a flood of fetches;
//! - when the kept set is older than 15 minutes, before the next token is verified, so a key the
//!   issuer withdrew stops being accepted. A failed fetch keeps the current keys.
//!
//! Keys this service cannot use (EC, OKP, encryption keys, keys without `kid`, malformed RSA
//! keys) are skipped one by one: issuers publish such keys next to their RS256 ones, and one of
//! them must not make every token fail.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::jwt::{unauthorized, user_from_claims, verified_claims};
use chat_domain::error::ChatError;
use chat_domain::UserId;

/// When the key set is fetched again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refresh {
    /// The least time between two fetches, whatever the reason.
    pub min_interval: Duration,
    /// A set older than this is fetched again on its next use.
    pub max_age: Duration,
}

impl Refresh {
    /// Whether to fetch the set now, `since_fetch` after the last fetch began (None: never
    /// fetched), for a token whose key id the set has (`kid_known`) or not.
    pub fn due(&self, since_fetch: Option<Duration>, kid_known: bool) -> bool {
        match since_fetch {
            None => true,
            Some(age) if age < self.min_interval => false,
            Some(age) => !kid_known || age >= self.max_age,
        }
    }
}

/// Deployed: an unknown key id fetches at most once a minute; keys are at most 15 minutes old
/// (plus one fetch) when a token is checked against them.
pub const REFRESH: Refresh = Refresh {
    min_interval: Duration::from_secs(60),
    max_age: Duration::from_secs(15 * 60),
};

#[derive(Debug, Deserialize)]
struct Discovery {
    jwks_uri: String,
}

/// A JWKS document; its keys are read one by one (`usable_key`).
#[derive(Debug, Deserialize)]
struct JwkSet {
    keys: Vec<serde_json::Value>,
}

/// An RS256 signing key of a JWKS entry, with its key id; None for anything else.
fn usable_key(jwk: &serde_json::Value) -> Option<(String, DecodingKey)> {
    let field = |name: &str| jwk.get(name).and_then(serde_json::Value::as_str);
    let allowed = |name: &str, wanted: &str| jwk.get(name).is_none() || field(name) == Some(wanted);
    if field("kty") != Some("RSA") || !allowed("use", "sig") || !allowed("alg", "RS256") {
        return None;
    }
    let kid = field("kid").filter(|k| !k.is_empty())?;
    let key = DecodingKey::from_rsa_components(field("n")?, field("e")?).ok()?;
    Some((kid.to_owned(), key))
}

/// The RS256 keys of a JWKS document, by key id. Keys it cannot use are skipped; a document
/// that is not a key set, or holds no usable key, is an error (the kept keys stay).
fn parse_keys(jwks: &[u8]) -> Result<HashMap<String, DecodingKey>, String> {
    let set: JwkSet = serde_json::from_slice(jwks).map_err(|e| format!("bad JWKS: {e}"))?;
    let keys: HashMap<String, DecodingKey> = set.keys.iter().filter_map(usable_key).collect();
    let skipped = set.keys.len() - keys.len();
    if skipped > 0 {
        tracing::debug!(
            skipped,
            kept = keys.len(),
            "JWKS keys skipped (not RS256 signing keys with a kid)"
        );
    }
    if keys.is_empty() {
        return Err(format!(
            "JWKS has no RS256 signing key with a kid ({skipped} skipped)"
        ));
    }
    Ok(keys)
}

type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<bytes::Bytes>,
>;

/// An issuer's keys and what a token must say to be accepted.
pub struct IssuerKeys {
    issuer: String,
    audiences: Vec<String>,
    discovery_url: String,
    http: HttpsClient,
    keys: RwLock<HashMap<String, DecodingKey>>,
    /// When the last fetch began (successful or not).
    last_fetch: RwLock<Option<Instant>>,
    /// One fetch at a time: concurrent tokens wait for it (unknown key id) or go on with the
    /// kept keys (a scheduled refresh).
    fetching: tokio::sync::Mutex<()>,
    refresh: Refresh,
}

impl std::fmt::Debug for IssuerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeys")
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .finish()
    }
}

impl IssuerKeys {
    /// The keys of `issuer`, found through its discovery document (fetched now).
    pub async fn discover(issuer: &str, audiences: Vec<String>) -> Result<IssuerKeys, String> {
        let issuer = issuer.trim_end_matches('/');
        let discovery_url = format!("{issuer}/.well-known/openid-configuration");
        Self::with_discovery_url(issuer, audiences, discovery_url, REFRESH).await
    }

    /// As `discover`, with the discovery document at `discovery_url` and the set fetched again
    /// as `refresh` says (tests serve an issuer locally).
    pub async fn with_discovery_url(
        issuer: &str,
        audiences: Vec<String>,
        discovery_url: String,
        refresh: Refresh,
    ) -> Result<IssuerKeys, String> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("no TLS roots: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let keys = IssuerKeys {
            issuer: issuer.trim_end_matches('/').to_owned(),
            audiences,
            discovery_url,
            http: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https),
            keys: RwLock::new(HashMap::new()),
            last_fetch: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
            refresh,
        };
        keys.fetch().await?;
        Ok(keys)
    }

    /// Fetches the discovery document, then the key set it names; replaces the kept keys.
    async fn fetch(&self) -> Result<(), String> {
        *self.last_fetch.write().expect("lock") = Some(Instant::now());
        let discovery: Discovery = serde_json::from_slice(&self.get(&self.discovery_url).await?)
            .map_err(|e| format!("bad discovery document at {}: {e}", self.discovery_url))?;
        let keys = parse_keys(&self.get(&discovery.jwks_uri).await?)?;
        *self.keys.write().expect("lock") = keys;
        Ok(())
    }

    /// GET over HTTPS (plain HTTP only to this machine: a local test issuer).
    async fn get(&self, url: &str) -> Result<bytes::Bytes, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
        let loopback = matches!(uri.host(), Some("127.0.0.1" | "localhost" | "[::1]"));
        if uri.scheme_str() != Some("https") && !loopback {
            return Err(format!("{url}: keys are fetched over HTTPS only"));
        }
        let resp = tokio::time::timeout(Duration::from_secs(5), self.http.get(uri))
            .await
            .map_err(|_| format!("GET {url}: timed out"))?
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("GET {url}: {}", resp.status()));
        }
        Ok(resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .to_bytes())
    }

    fn key(&self, kid: &str) -> Option<DecodingKey> {
        self.keys.read().expect("lock").get(kid).cloned()
    }

    fn refresh_due(&self, kid_known: bool) -> bool {
        let since = self.last_fetch.read().expect("lock").map(|at| at.elapsed());
        self.refresh.due(since, kid_known)
    }

    /// The key for `kid`, fetching the set first when `Refresh` says so. A fetch under way is
    /// waited for by a token with an unknown key id (it may bring the key) and not by one whose
    /// key is kept (the kept keys are still good).
    async fn key_for(&self, kid: &str) -> Option<DecodingKey> {
        let known = self.key(kid).is_some();
        if self.refresh_due(known) {
            let guard = if known {
                self.fetching.try_lock().ok()
            } else {
                Some(self.fetching.lock().await)
            };
            // Due still: nobody fetched while this request waited.
            if guard.is_some() && self.refresh_due(self.key(kid).is_some()) {
                if let Err(e) = self.fetch().await {
                    tracing::warn!(error = %e, "refreshing the issuer's keys failed; the kept keys stay");
                }
            }
        }
        self.key(kid)
    }

    /// Verifies signature, `exp`, `iss`, and `aud` (ID tokens) or `client_id` (access tokens).
    pub async fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, ChatError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| unauthorized("malformed token"))?;
        if header.alg != Algorithm::RS256 {
            return Err(unauthorized("token must be signed with RS256"));
        }
        let kid = header.kid.ok_or_else(|| unauthorized("token has no kid"))?;
        let key = self
            .key_for(&kid)
            .await
            .ok_or_else(|| unauthorized("unknown signing key"))?;
        let claims = verified_claims(token, &key, Algorithm::RS256)?;
        if claims["iss"].as_str().map(|i| i.trim_end_matches('/')) != Some(self.issuer.as_str()) {
            return Err(unauthorized("token from another issuer"));
        }
        let ours = |a: &str| self.audiences.iter().any(|x| x == a);
        let aud_ok = match &claims["aud"] {
            serde_json::Value::String(a) => ours(a),
            serde_json::Value::Array(list) => list.iter().any(|a| a.as_str().is_some_and(ours)),
            _ => claims["client_id"].as_str().is_some_and(ours),
        };
        if !aud_ok {
            return Err(unauthorized("token for another audience"));
        }
        user_from_claims(&claims, now_unix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_set() -> serde_json::Value {
        let f: serde_json::Value =
            serde_json::from_str(include_str!("../../../../tests/fixtures/rs256-issuer.json"))
                .unwrap();
        f["rotated_jwks"].clone()
    }

    fn kids(keys: &HashMap<String, DecodingKey>) -> Vec<&str> {
        let mut kids: Vec<&str> = keys.keys().map(String::as_str).collect();
        kids.sort();
        kids
    }

    #[test]
    fn keys_it_cannot_use_are_skipped_one_by_one() {
        use serde_json::{json, Value};
        let mut set = fixture_set();
        let rsa = set["keys"][0].clone();
        // The RSA key with some fields set (`Value::Null`: removed).
        let variant = |fields: &[(&str, Value)]| {
            let mut k = rsa.clone();
            let map = k.as_object_mut().unwrap();
            for (name, value) in fields {
                match value {
                    Value::Null => map.remove(*name),
                    v => map.insert((*name).to_owned(), v.clone()),
                };
            }
            k
        };
        set["keys"].as_array_mut().unwrap().extend([
            json!({"kty": "EC", "kid": "ec", "crv": "P-256",
                   "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                   "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}),
            json!({"kty": "OKP", "kid": "ed", "crv": "Ed25519",
                   "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}),
            variant(&[("kid", Value::Null)]),
            variant(&[("kid", json!(""))]),
            variant(&[("kid", json!(7))]),
            variant(&[("kid", json!("enc")), ("use", json!("enc"))]),
            variant(&[("kid", json!("oaep")), ("alg", json!("RSA-OAEP"))]),
            variant(&[("kid", json!("no-n")), ("n", Value::Null)]),
            json!("not a key"),
        ]);
        let keys = parse_keys(set.to_string().as_bytes()).unwrap();
        assert_eq!(kids(&keys), ["rotated-key", "test-key-1"]);
        // A key without `use` and `alg` is taken as a signing key.
        let bare = variant(&[("use", Value::Null), ("alg", Value::Null)]);
        let doc = json!({"keys": [bare]}).to_string();
        assert_eq!(kids(&parse_keys(doc.as_bytes()).unwrap()), ["rotated-key"]);
    }

    #[test]
    fn a_document_without_usable_keys_is_an_error() {
        assert!(parse_keys(b"not json").is_err());
        assert!(parse_keys(br#"{"nokeys": []}"#).is_err());
        assert!(parse_keys(br#"{"keys": []}"#).is_err());
        assert!(parse_keys(br#"{"keys": [{"kty": "EC", "kid": "ec"}]}"#).is_err());
    }

    #[test]
    fn refresh_is_scheduled_and_rate_limited() {
        let r = Refresh {
            min_interval: Duration::from_secs(60),
            max_age: Duration::from_secs(900),
        };
        let secs = |s| Some(Duration::from_secs(s));
        assert!(r.due(None, true), "never fetched");
        // An unknown key id: at most once per minimum interval.
        assert!(!r.due(secs(59), false));
        assert!(r.due(secs(60), false));
        // A known key id: only once the set is old.
        assert!(!r.due(secs(60), true));
        assert!(!r.due(secs(899), true));
        assert!(r.due(secs(900), true));
        // The minimum interval bounds the scheduled refresh too.
        let eager = Refresh {
            min_interval: Duration::from_secs(60),
            max_age: Duration::ZERO,
        };
        assert!(!eager.due(secs(10), true));
        assert_eq!(REFRESH.min_interval, Duration::from_secs(60));
        assert!(REFRESH.max_age > REFRESH.min_interval);
    }
}
