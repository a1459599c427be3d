//! Who is calling (SPEC §3): user ids, and HS256 token verification for local mode.
//! Deployed, API Gateway's JWT authorizer verifies tokens and `http` reads `sub` from its claims.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

use crate::error::ChatError;

pub const MAX_USER_ID_CHARS: usize = 128;

/// A validated user id: 1–128 chars of `A-Za-z0-9._:@-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct UserId(String);

impl UserId {
    pub fn parse(s: &str) -> Option<UserId> {
        let ok = !s.is_empty()
            && s.len() <= MAX_USER_ID_CHARS
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-')
            });
        ok.then(|| UserId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How requests are authenticated. Chosen once at init from configuration, never guessed from a
/// request.
#[derive(Clone)]
pub enum Authenticator {
    /// Deployed: the HTTP API JWT authorizer has verified the token; trust only its `sub` claim.
    ApiGateway,
    /// Local mode: verify HS256 tokens with this secret.
    LocalHs256 { secret: Vec<u8> },
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authenticator::ApiGateway => f.write_str("ApiGateway"),
            Authenticator::LocalHs256 { .. } => f.write_str("LocalHs256"),
        }
    }
}

pub(crate) fn unauthorized(msg: &str) -> ChatError {
    ChatError::Unauthorized(msg.to_owned())
}

/// The user of a `sub` claim, or 401 when it is not a valid user id.
pub fn user_from_sub(sub: Option<&str>) -> Result<UserId, ChatError> {
    let sub = sub.ok_or_else(|| unauthorized("token has no sub claim"))?;
    UserId::parse(sub).ok_or_else(|| unauthorized("token sub is not a valid user id"))
}

/// A compact JWT (`header.payload.signature`) split into its parts; nothing is verified yet.
pub(crate) struct CompactJwt<'a> {
    pub header: serde_json::Value,
    /// `header.payload`, what the signature covers.
    pub signing_input: &'a str,
    payload: &'a str,
    pub signature: Vec<u8>,
}

fn decode_part(part: &str) -> Result<Vec<u8>, ChatError> {
    URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| unauthorized("malformed token"))
}

impl<'a> CompactJwt<'a> {
    pub fn parse(token: &'a str) -> Result<Self, ChatError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(unauthorized("malformed token"));
        };
        let header = serde_json::from_slice(&decode_part(h)?)
            .map_err(|_| unauthorized("malformed token"))?;
        Ok(CompactJwt {
            header,
            signing_input: &token[..h.len() + 1 + p.len()],
            payload: p,
            signature: decode_part(s)?,
        })
    }

    /// The claims; call only once the signature is verified.
    pub fn claims(&self) -> Result<serde_json::Value, ChatError> {
        serde_json::from_slice(&decode_part(self.payload)?)
            .map_err(|_| unauthorized("malformed token"))
    }
}

/// The user of verified claims: `exp` required and in the future, `nbf` (if any) not in the
/// future, `sub` a valid user id.
pub(crate) fn user_from_claims(
    claims: &serde_json::Value,
    now_unix: i64,
) -> Result<UserId, ChatError> {
    let exp = claims
        .get("exp")
        .and_then(|e| e.as_f64())
        .ok_or_else(|| unauthorized("token has no exp claim"))?;
    if (exp as i64) <= now_unix {
        return Err(unauthorized("token expired"));
    }
    if let Some(nbf) = claims.get("nbf").and_then(|n| n.as_f64()) {
        if nbf as i64 > now_unix {
            return Err(unauthorized("token not yet valid"));
        }
    }
    user_from_sub(claims.get("sub").and_then(|s| s.as_str()))
}

/// Verifies a compact HS256 JWT: signature, `alg`, required `sub` and `exp`, optional `nbf`.
pub fn verify_hs256(token: &str, secret: &[u8], now_unix: i64) -> Result<UserId, ChatError> {
    let jwt = CompactJwt::parse(token)?;
    if jwt.header.get("alg").and_then(|a| a.as_str()) != Some("HS256") {
        return Err(unauthorized("token must be signed with HS256"));
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(jwt.signing_input.as_bytes());
    mac.verify_slice(&jwt.signature)
        .map_err(|_| unauthorized("bad token signature"))?;
    user_from_claims(&jwt.claims()?, now_unix)
}

/// Mints an HS256 token (local mode, tests and the `mint-token` tool).
pub fn mint_hs256(sub: &str, exp_unix: i64, secret: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload =
        URL_SAFE_NO_PAD.encode(serde_json::json!({"sub": sub, "exp": exp_unix}).to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(header.as_bytes());
    mac.update(b".");
    mac.update(payload.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{header}.{payload}.{sig}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn user_ids() {
        assert!(UserId::parse("alice.b_c:d@e-f9").is_some());
        assert!(UserId::parse(&"a".repeat(128)).is_some());
        assert!(UserId::parse(&"a".repeat(129)).is_none());
        assert!(UserId::parse("").is_none());
        assert!(UserId::parse("a b").is_none());
        assert!(UserId::parse("a/b").is_none());
        assert!(UserId::parse("é").is_none());
    }

    #[test]
    fn valid_token_roundtrip() {
        let t = mint_hs256("u1", NOW + 60, b"k");
        assert_eq!(verify_hs256(&t, b"k", NOW).unwrap().as_str(), "u1");
    }

    #[test]
    fn rejects_bad_tokens() {
        let good = mint_hs256("u1", NOW + 60, b"k");
        assert!(verify_hs256(&good, b"other", NOW).is_err(), "wrong secret");
        assert!(
            verify_hs256(&mint_hs256("u1", NOW, b"k"), b"k", NOW).is_err(),
            "expired"
        );
        assert!(verify_hs256(&mint_hs256("bad id", NOW + 60, b"k"), b"k", NOW).is_err());
        assert!(verify_hs256("abc", b"k", NOW).is_err());
        assert!(verify_hs256("a.b.c.d", b"k", NOW).is_err());
        // Tampered payload keeps the old signature.
        let mut parts: Vec<&str> = good.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(r#"{"sub":"admin","exp":9999999999}"#);
        parts[1] = &forged;
        assert!(verify_hs256(&parts.join("."), b"k", NOW).is_err());
        // alg=none is refused even with an empty signature.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(r#"{"sub":"u1","exp":9999999999}"#)
        );
        assert!(verify_hs256(&none, b"k", NOW).is_err());
        // exp is required.
        let no_exp_payload = URL_SAFE_NO_PAD.encode(r#"{"sub":"u1"}"#);
        let header = good.split('.').next().unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(b"k").unwrap();
        mac.update(format!("{header}.{no_exp_payload}").as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        let no_exp = format!("{header}.{no_exp_payload}.{sig}");
        assert!(verify_hs256(&no_exp, b"k", NOW).is_err());
    }
}

/// Verifies the `?token=` of a WebSocket `$connect`: HS256 in local mode; deployed, RS256 with the
/// JWT issuer's published keys (the same tokens the HTTP API's JWT authorizer accepts).
#[derive(Debug, Clone)]
pub enum TokenVerifier {
    LocalHs256 { secret: Vec<u8> },
    Jwks(std::sync::Arc<crate::jwks::Jwks>),
}

impl TokenVerifier {
    /// Local mode from `CHAT_AUTH_MODE=local`; otherwise keys of `JWT_ISSUER` for the comma
    /// separated `JWT_AUDIENCE`.
    pub async fn from_config(config: &crate::config::Config) -> Result<TokenVerifier, String> {
        match &config.auth {
            Authenticator::LocalHs256 { secret } => Ok(TokenVerifier::LocalHs256 {
                secret: secret.clone(),
            }),
            Authenticator::ApiGateway => {
                let issuer =
                    std::env::var("JWT_ISSUER").map_err(|_| "JWT_ISSUER is not set".to_owned())?;
                let audiences = std::env::var("JWT_AUDIENCE")
                    .unwrap_or_default()
                    .split(',')
                    .map(|a| a.trim().to_owned())
                    .filter(|a| !a.is_empty())
                    .collect();
                let jwks = crate::jwks::Jwks::fetch(&issuer, audiences).await?;
                Ok(TokenVerifier::Jwks(std::sync::Arc::new(jwks)))
            }
        }
    }

    pub fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, ChatError> {
        match self {
            TokenVerifier::LocalHs256 { secret } => verify_hs256(token, secret, now_unix),
            TokenVerifier::Jwks(jwks) => jwks.verify(token, now_unix),
        }
    }
}
