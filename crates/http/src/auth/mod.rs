//! Who is calling (docs/api.md §3). REST: deployed, the HTTP API's JWT authorizer has verified the
//! token and only its `sub` claim is trusted; locally, HS256 tokens are verified here. WebSocket
//! `$connect`: the `?token=` is verified here in both modes (RS256 with the issuer's keys when
//! deployed, since WebSocket APIs have no JWT authorizer).

pub mod jwks;
pub mod jwt;

use std::sync::Arc;

use chat_domain::error::ChatError;
use chat_domain::UserId;
use chat_store::config::AuthMode;

pub use jwt::{mint_hs256, mint_hs256_claims, user_from_sub, verify_hs256, verify_hs256_claims};

/// How REST requests are authenticated.
#[derive(Clone)]
pub enum Authenticator {
    /// Deployed: trust only the JWT authorizer's `sub` claim.
    ApiGateway,
    /// Local mode: verify HS256 tokens with this secret.
    LocalHs256 { secret: Vec<u8> },
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authenticator::ApiGateway => f.write_str("ApiGateway"),
            Authenticator::LocalHs256 { .. } => f.write_str("LocalHs256"),
        }
    }
}

impl From<&AuthMode> for Authenticator {
    fn from(mode: &AuthMode) -> Self {
        match mode {
            AuthMode::ApiGateway { .. } => Authenticator::ApiGateway,
            AuthMode::Local { secret } => Authenticator::LocalHs256 {
                secret: secret.clone(),
            },
        }
    }
}

/// Verifies the `?token=` of a WebSocket `$connect`: HS256 in local mode; deployed, RS256 with the
/// JWT issuer's published keys (the same tokens the HTTP API's JWT authorizer accepts).
#[derive(Debug, Clone)]
pub enum TokenVerifier {
    LocalHs256 { secret: Vec<u8> },
    Issuer(Arc<jwks::IssuerKeys>),
}

impl TokenVerifier {
    pub async fn from_config(auth: &AuthMode) -> Result<TokenVerifier, String> {
        match auth {
            AuthMode::Local { secret } => Ok(TokenVerifier::LocalHs256 {
                secret: secret.clone(),
            }),
            AuthMode::ApiGateway { issuer, audiences } => {
                let issuer = issuer.as_deref().ok_or("JWT_ISSUER is not set")?;
                let keys = jwks::IssuerKeys::discover(issuer, audiences.clone()).await?;
                Ok(TokenVerifier::Issuer(Arc::new(keys)))
            }
        }
    }

    pub async fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, ChatError> {
        match self {
            TokenVerifier::LocalHs256 { secret } => verify_hs256(token, secret, now_unix),
            TokenVerifier::Issuer(keys) => keys.verify(token, now_unix).await,
        }
    }
}
