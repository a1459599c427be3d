//! Compact JWTs (docs/api.md §3): parsing, the claims every token must carry, and HS256 for the
//! local stack. RS256 (deployed WebSocket `$connect`) is in `jwks`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::UserId;
use crate::error::ChatError;

pub(crate) fn unauthorized(msg: &str) -> ChatError {
    ChatError::Unauthorized(msg.to_owned())
}

/// The user of a `sub` claim, or 401 when it is missing or not a valid user id.
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

/// Mints an HS256 token (local mode, tests and tools).
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
