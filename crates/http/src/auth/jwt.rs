//! JSON Web Tokens (docs/api.md §3), verified with the `jsonwebtoken` crate: the claims every
//! token must carry, and HS256 for the local stack. RS256 with an issuer's keys (deployed
//! WebSocket `$connect`) is in `jwks`.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use chat_domain::error::ChatError;
use chat_domain::UserId;

pub(crate) fn unauthorized(msg: &str) -> ChatError {
    ChatError::Unauthorized(msg.to_owned())
}

/// The user of a `sub` claim, or 401 when it is missing or not a valid user id.
pub fn user_from_sub(sub: Option<&str>) -> Result<UserId, ChatError> {
    let sub = sub.ok_or_else(|| unauthorized("token has no sub claim"))?;
    UserId::parse(sub).ok_or_else(|| unauthorized("token sub is not a valid user id"))
}

/// What `jsonwebtoken` checks for us: the algorithm and the signature. Times, issuer and audience
/// are checked by `user_from_claims` and the callers, against an explicit clock.
pub(crate) fn signature_only(algorithm: Algorithm) -> Validation {
    let mut v = Validation::new(algorithm);
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.required_spec_claims.clear();
    v
}

/// Refuses a token whose header names critical extensions (`crit`): RFC 7515 §4.1.11 says a
/// recipient must reject those it does not understand, and this server understands none.
/// `jsonwebtoken` ignores header fields it does not know, so the header is read here.
fn no_critical_extensions(token: &str) -> Result<(), ChatError> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = token.split('.').next().unwrap_or_default();
    let header = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
    match header {
        Some(h) if h.get("crit").is_some() => Err(unauthorized(
            "token names critical header extensions (crit), which this server does not support",
        )),
        // Not base64 or not JSON: `jsonwebtoken` refuses it as malformed.
        _ => Ok(()),
    }
}

/// The claims of a token whose algorithm and signature check out.
pub(crate) fn verified_claims(
    token: &str,
    key: &DecodingKey,
    algorithm: Algorithm,
) -> Result<serde_json::Value, ChatError> {
    no_critical_extensions(token)?;
    jsonwebtoken::decode::<serde_json::Value>(token, key, &signature_only(algorithm))
        .map(|data| data.claims)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => unauthorized("bad token signature"),
            ErrorKind::InvalidAlgorithm => unauthorized(match algorithm {
                Algorithm::HS256 => "token must be signed with HS256",
                _ => "token must be signed with RS256",
            }),
            _ => unauthorized("malformed token"),
        })
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
    if let Some(nbf) = claims.get("nbf") {
        // Present but not a time: malformed, not "no nbf" (RFC 7519 §4.1.5: a NumericDate).
        let nbf = nbf
            .as_f64()
            .ok_or_else(|| unauthorized("token's nbf claim is not a number"))?;
        if nbf as i64 > now_unix {
            return Err(unauthorized("token not yet valid"));
        }
    }
    user_from_sub(claims.get("sub").and_then(|s| s.as_str()))
}

/// Verifies an HS256 token: signature, `alg`, required `sub` and `exp`, optional `nbf`.
pub fn verify_hs256(token: &str, secret: &[u8], now_unix: i64) -> Result<UserId, ChatError> {
    verify_hs256_claims(token, secret, now_unix).map(|(user, _)| user)
}

/// `verify_hs256`, with the token's claims (for its moderator scope or groups).
pub fn verify_hs256_claims(
    token: &str,
    secret: &[u8],
    now_unix: i64,
) -> Result<(UserId, serde_json::Value), ChatError> {
    let claims = verified_claims(token, &DecodingKey::from_secret(secret), Algorithm::HS256)?;
    Ok((user_from_claims(&claims, now_unix)?, claims))
}

/// Mints an HS256 token (local mode, tests and tools).
pub fn mint_hs256(sub: &str, exp_unix: i64, secret: &[u8]) -> String {
    mint_hs256_claims(&serde_json::json!({"sub": sub, "exp": exp_unix}), secret)
}

/// Mints an HS256 token of any claims (a moderator's `scope`, tests).
pub fn mint_hs256_claims(claims: &serde_json::Value, secret: &[u8]) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("HS256 signing takes any key")
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    const NOW: i64 = 1_800_000_000;

    fn sign(header: &str, payload: &str, secret: &[u8]) -> String {
        let h = URL_SAFE_NO_PAD.encode(header);
        let p = URL_SAFE_NO_PAD.encode(payload);
        let sig = jsonwebtoken::crypto::sign(
            format!("{h}.{p}").as_bytes(),
            &EncodingKey::from_secret(secret),
            Algorithm::HS256,
        )
        .unwrap();
        format!("{h}.{p}.{sig}")
    }

    #[test]
    fn critical_header_extensions_are_refused() {
        let claims = format!(r#"{{"sub":"u1","exp":{}}}"#, NOW + 60);
        let plain = sign(r#"{"alg":"HS256","typ":"JWT"}"#, &claims, b"k");
        assert_eq!(verify_hs256(&plain, b"k", NOW).unwrap().as_str(), "u1");
        for header in [
            r#"{"alg":"HS256","crit":["exp"],"exp":1}"#,
            r#"{"alg":"HS256","crit":[]}"#,
        ] {
            let err = verify_hs256(&sign(header, &claims, b"k"), b"k", NOW).unwrap_err();
            assert!(
                matches!(&err, ChatError::Unauthorized(m) if m.contains("crit")),
                "{header}: {err:?}"
            );
        }
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
        // exp is required; nbf in the future refuses.
        let no_exp = sign(r#"{"alg":"HS256","typ":"JWT"}"#, r#"{"sub":"u1"}"#, b"k");
        assert!(verify_hs256(&no_exp, b"k", NOW).is_err());
        let early = sign(
            r#"{"alg":"HS256","typ":"JWT"}"#,
            &format!(r#"{{"sub":"u1","exp":{},"nbf":{}}}"#, NOW + 60, NOW + 30),
            b"k",
        );
        assert!(verify_hs256(&early, b"k", NOW).is_err());
        assert!(verify_hs256(&early, b"k", NOW + 31).is_ok());
        // An nbf that is not a number is a malformed token (found by probing: it was ignored).
        let odd = sign(
            r#"{"alg":"HS256","typ":"JWT"}"#,
            &format!(r#"{{"sub":"u1","exp":{},"nbf":"x"}}"#, NOW + 60),
            b"k",
        );
        assert!(verify_hs256(&odd, b"k", NOW).is_err());
    }
}
