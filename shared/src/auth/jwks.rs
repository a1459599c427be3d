//! RS256 tokens of an OpenID issuer (e.g. a Cognito user pool), for WebSocket `$connect` when
//! deployed: the HTTP API's JWT authorizer does this for REST, but WebSocket APIs have no JWT
//! authorizer. Keys come from `{issuer}/.well-known/jwks.json`, fetched once at init.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http_body_util::BodyExt;
use serde::Deserialize;

use super::jwt::{unauthorized, user_from_claims, CompactJwt};
use crate::domain::UserId;
use crate::error::ChatError;

#[derive(Debug, Clone, Deserialize)]
struct Jwk {
    kid: String,
    kty: String,
    n: String,
    e: String,
}

#[derive(Debug, Clone, Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

/// The issuer's RSA public keys and what a token must say to be accepted.
#[derive(Debug, Clone)]
pub struct Jwks {
    issuer: String,
    audiences: Vec<String>,
    /// kid → (modulus, exponent)
    keys: Vec<(String, Vec<u8>, Vec<u8>)>,
}

impl Jwks {
    /// From a JWKS document (`{"keys":[...]}`).
    pub fn from_json(issuer: &str, audiences: Vec<String>, jwks: &[u8]) -> Result<Jwks, String> {
        let set: JwkSet = serde_json::from_slice(jwks).map_err(|e| format!("bad JWKS: {e}"))?;
        let keys = set
            .keys
            .into_iter()
            .filter(|k| k.kty == "RSA")
            .filter_map(|k| {
                Some((
                    k.kid,
                    URL_SAFE_NO_PAD.decode(k.n).ok()?,
                    URL_SAFE_NO_PAD.decode(k.e).ok()?,
                ))
            })
            .collect();
        Ok(Jwks {
            issuer: issuer.trim_end_matches('/').to_owned(),
            audiences,
            keys,
        })
    }

    /// Downloads `{issuer}/.well-known/jwks.json` over HTTPS.
    pub async fn fetch(issuer: &str, audiences: Vec<String>) -> Result<Jwks, String> {
        let url = format!("{}/.well-known/jwks.json", issuer.trim_end_matches('/'));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("no TLS roots: {e}"))?
            .https_only()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, http_body_util::Empty<bytes::Bytes>>(https);
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| format!("bad issuer URL {url}: {e}"))?;
        let resp = client
            .get(uri)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("GET {url}: {}", resp.status()));
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .to_bytes();
        Jwks::from_json(issuer, audiences, &body)
    }

    /// Verifies signature, `exp`, `iss`, and `aud` (ID tokens) or `client_id` (access tokens).
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, ChatError> {
        let jwt = CompactJwt::parse(token)?;
        if jwt.header["alg"] != "RS256" {
            return Err(unauthorized("token must be signed with RS256"));
        }
        let kid = jwt.header["kid"]
            .as_str()
            .ok_or_else(|| unauthorized("token has no kid"))?;
        let (_, n, e) = self
            .keys
            .iter()
            .find(|(k, _, _)| k == kid)
            .ok_or_else(|| unauthorized("unknown signing key"))?;
        let key = ring::signature::RsaPublicKeyComponents { n, e };
        key.verify(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            jwt.signing_input.as_bytes(),
            &jwt.signature,
        )
        .map_err(|_| unauthorized("bad token signature"))?;

        let claims = jwt.claims()?;
        if claims["iss"].as_str().map(|i| i.trim_end_matches('/')) != Some(self.issuer.as_str()) {
            return Err(unauthorized("token from another issuer"));
        }
        let aud_ok = match &claims["aud"] {
            serde_json::Value::String(a) => self.audiences.contains(a),
            serde_json::Value::Array(list) => list.iter().any(|a| {
                a.as_str()
                    .is_some_and(|a| self.audiences.iter().any(|x| x == a))
            }),
            _ => claims["client_id"]
                .as_str()
                .is_some_and(|c| self.audiences.iter().any(|x| x == c)),
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

    /// A throwaway RSA key's JWKS and tokens it signed (made with Python's `cryptography`).
    const FIXTURE: &str = include_str!("../../../tests/fixtures/rs256-issuer.json");
    const NOW: i64 = 1_800_000_000;

    fn fixture() -> (Jwks, serde_json::Value) {
        let f: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        let jwks = Jwks::from_json(
            f["issuer"].as_str().unwrap(),
            vec![f["audience"].as_str().unwrap().to_owned()],
            f["jwks"].to_string().as_bytes(),
        )
        .unwrap();
        (jwks, f)
    }

    #[test]
    fn accepts_id_and_access_tokens_of_the_issuer() {
        let (jwks, f) = fixture();
        assert_eq!(
            jwks.verify(f["valid_id_token"].as_str().unwrap(), NOW)
                .unwrap()
                .as_str(),
            "user-1"
        );
        assert_eq!(
            jwks.verify(f["valid_access_token"].as_str().unwrap(), NOW)
                .unwrap()
                .as_str(),
            "user-2"
        );
    }

    #[test]
    fn refuses_everything_else() {
        let (jwks, f) = fixture();
        for case in ["expired", "wrong_issuer", "wrong_audience", "unknown_kid"] {
            assert!(
                jwks.verify(f[case].as_str().unwrap(), NOW).is_err(),
                "{case}"
            );
        }
        let good = f["valid_id_token"].as_str().unwrap();
        let tampered = good.replacen('.', ".e", 1);
        assert!(jwks.verify(&tampered, NOW).is_err());
        let hs = crate::auth::mint_hs256("user-1", NOW + 60, b"k");
        assert!(
            jwks.verify(&hs, NOW).is_err(),
            "HS256 is not accepted in place of RS256"
        );
    }
}
