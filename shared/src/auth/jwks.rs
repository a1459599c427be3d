//! RS256 tokens of an OpenID issuer (e.g. a Cognito user pool, Okta, Entra ID, Keycloak), for
//! WebSocket `$connect` when deployed: the HTTP API's JWT authorizer does this for REST, but
//! WebSocket APIs have no JWT authorizer.
//!
//! The keys come from the `jwks_uri` of the issuer's discovery document
//! (`{issuer}/.well-known/openid-configuration`), fetched at init and kept. A token signed with a
//! key id the set does not have makes the set be fetched again (the issuer rotated its keys), at
//! most once a minute, so a flood of bad tokens cannot turn into a flood of fetches.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::jwt::{unauthorized, user_from_claims, verified_claims};
use crate::domain::UserId;
use crate::error::ChatError;

/// The least time between two fetches of the key set.
pub const REFRESH_AT_MOST_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
struct Discovery {
    jwks_uri: String,
}

#[derive(Debug, Deserialize)]
struct Jwk {
    kid: String,
    kty: String,
    n: String,
    e: String,
}

#[derive(Debug, Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

/// The RSA keys of a JWKS document, by key id.
fn parse_keys(jwks: &[u8]) -> Result<HashMap<String, DecodingKey>, String> {
    let set: JwkSet = serde_json::from_slice(jwks).map_err(|e| format!("bad JWKS: {e}"))?;
    Ok(set
        .keys
        .into_iter()
        .filter(|k| k.kty == "RSA")
        .filter_map(|k| Some((k.kid, DecodingKey::from_rsa_components(&k.n, &k.e).ok()?)))
        .collect())
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
    last_fetch: RwLock<Option<Instant>>,
    min_refresh: Duration,
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
        Self::with_discovery_url(issuer, audiences, discovery_url, REFRESH_AT_MOST_EVERY).await
    }

    /// As `discover`, with the discovery document at `discovery_url` and the set fetched again at
    /// most every `min_refresh` (tests serve an issuer locally).
    pub async fn with_discovery_url(
        issuer: &str,
        audiences: Vec<String>,
        discovery_url: String,
        min_refresh: Duration,
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
            min_refresh,
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

    /// The key for `kid`, fetching the set again when it is unknown (at most once a minute).
    async fn key_for(&self, kid: &str) -> Option<DecodingKey> {
        if let Some(k) = self.key(kid) {
            return Some(k);
        }
        let recent = self
            .last_fetch
            .read()
            .expect("lock")
            .is_some_and(|at| at.elapsed() < self.min_refresh);
        if recent {
            return None;
        }
        if let Err(e) = self.fetch().await {
            tracing::warn!(error = %e, "refreshing the issuer's keys failed");
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

    #[test]
    fn only_rsa_keys_with_valid_components_are_kept() {
        let f: serde_json::Value =
            serde_json::from_str(include_str!("../../../tests/fixtures/rs256-issuer.json"))
                .unwrap();
        let mut set = f["rotated_jwks"].clone();
        set["keys"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"kty": "EC", "kid": "ec", "n": "", "e": ""}));
        let keys = parse_keys(set.to_string().as_bytes()).unwrap();
        let mut kids: Vec<&String> = keys.keys().collect();
        kids.sort();
        assert_eq!(kids, ["rotated-key", "test-key-1"]);
        assert!(parse_keys(b"not json").is_err());
    }
}
