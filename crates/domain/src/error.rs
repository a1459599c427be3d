//! The one error type of the API and its mapping to HTTP status and error code (docs/api.md §2).

use thiserror::Error;

/// `Retry-After` of `attachment_pending`: a scan usually takes seconds (GuardDuty's of a
/// small file; the local stand-in's 1 s).
pub const SCAN_RETRY_AFTER_SECS: u64 = 2;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChatError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// The other user blocks the caller (docs/api.md §28).
    #[error("{0}")]
    Blocked(String),
    /// A moderator suspended the caller (docs/api.md §30): every request is refused.
    #[error("this account is suspended")]
    Suspended,
    /// Unknown conversation, or the caller is not a member: deliberately indistinguishable.
    #[error("conversation not found")]
    NotFound,
    /// A message the conversation does not have (a seq above its `lastSeq`).
    #[error("message not found")]
    MessageNotFound,
    /// An attachment a member asks for that the conversation does not have to show: unknown,
    /// deleted, never uploaded, or not sent yet by another member (docs/api.md §35).
    #[error("attachment not found")]
    AttachmentNotFound,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// An attachment's content type outside the allowlist (docs/api.md §34).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// An attachment whose malware scan has no verdict yet (docs/api.md §35): not served; the
    /// same request may succeed after `Retry-After`.
    #[error("{0}")]
    AttachmentPending(String),
    /// An attachment its malware scan found infected (docs/api.md §36): never served, never sent.
    #[error("{0}")]
    AttachmentUnsafe(String),
    /// An attachment the malware scan could not scan (docs/api.md §36): never served, never sent.
    #[error("{0}")]
    AttachmentUnscannable(String),
    /// Contention or DynamoDB throttling that did not clear within the request's deadline.
    #[error("too many concurrent requests, retry later")]
    Throttled,
    /// The caller's own rate limit (docs/api.md §24): nothing was done; retry after
    /// `retry_after` whole seconds.
    #[error("rate limit exceeded, retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
    /// The group's slow mode (docs/api.md §25): this member may send again in `retry_after`
    /// whole seconds; nothing was stored.
    #[error("slow mode: you may send again in {retry_after} s")]
    SlowMode { retry_after: u64 },
    /// A dependency did not answer (in time, or at all): the outcome is unknown, a write may
    /// still land. The client retries with the same `clientMsgId` to learn it (every write is
    /// safe to retry, docs/api.md §2).
    #[error(
        "temporarily unavailable; the outcome is unknown: retry with the same request to learn it"
    )]
    Unavailable,
    /// Details are logged, never returned to the client.
    #[error("internal error")]
    Internal(String),
}

impl ChatError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        ChatError::InvalidRequest(msg.into())
    }

    pub fn internal(msg: impl std::fmt::Display) -> Self {
        ChatError::Internal(msg.to_string())
    }

    pub fn status(&self) -> u16 {
        match self {
            ChatError::InvalidRequest(_) => 400,
            ChatError::Unauthorized(_) => 401,
            ChatError::Forbidden(_) | ChatError::Blocked(_) | ChatError::Suspended => 403,
            ChatError::NotFound | ChatError::MessageNotFound | ChatError::AttachmentNotFound => 404,
            ChatError::Conflict(_)
            | ChatError::AttachmentPending(_)
            | ChatError::AttachmentUnsafe(_)
            | ChatError::AttachmentUnscannable(_) => 409,
            ChatError::PayloadTooLarge(_) => 413,
            ChatError::UnsupportedMediaType(_) => 415,
            ChatError::Throttled | ChatError::RateLimited { .. } | ChatError::SlowMode { .. } => {
                429
            }

            ChatError::Internal(_) => 500,
            ChatError::Unavailable => 503,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ChatError::InvalidRequest(_) => "invalid_request",
            ChatError::Unauthorized(_) => "unauthorized",
            ChatError::Forbidden(_) => "forbidden",
            ChatError::Blocked(_) => "blocked",
            ChatError::Suspended => "suspended",
            ChatError::NotFound | ChatError::MessageNotFound | ChatError::AttachmentNotFound => {
                "not_found"
            }
            ChatError::Conflict(_) => "conflict",
            ChatError::PayloadTooLarge(_) => "payload_too_large",
            ChatError::UnsupportedMediaType(_) => "unsupported_media_type",
            ChatError::AttachmentPending(_) => "attachment_pending",
            ChatError::AttachmentUnsafe(_) => "attachment_unsafe",
            ChatError::AttachmentUnscannable(_) => "attachment_unscannable",
            ChatError::Throttled => "throttled",
            ChatError::RateLimited { .. } => "rate_limited",
            ChatError::SlowMode { .. } => "slow_mode",
            ChatError::Unavailable => "unavailable",
            ChatError::Internal(_) => "internal",
        }
    }

    /// `Retry-After` in whole seconds, for the answers that carry one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ChatError::Throttled | ChatError::Unavailable => Some(1),
            ChatError::AttachmentPending(_) => Some(SCAN_RETRY_AFTER_SECS),
            ChatError::RateLimited { retry_after } | ChatError::SlowMode { retry_after } => {
                Some((*retry_after).max(1))
            }
            _ => None,
        }
    }

    /// The client-facing message; internal details stay in the logs.
    pub fn public_message(&self) -> String {
        self.to_string()
    }

    /// `{"error":{"code":..,"message":..}}`
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code(), "message": self.public_message()}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_are_not_leaked() {
        let e = ChatError::internal("dynamodb: table ChatTable missing");
        assert_eq!(e.status(), 500);
        let body = e.to_json().to_string();
        assert!(!body.contains("ChatTable"), "{body}");
        assert!(body.contains("\"code\":\"internal\""));
    }

    #[test]
    fn codes_match_spec() {
        let cases = [
            (ChatError::invalid("x"), 400, "invalid_request"),
            (ChatError::Unauthorized("x".into()), 401, "unauthorized"),
            (ChatError::Forbidden("x".into()), 403, "forbidden"),
            (ChatError::Blocked("x".into()), 403, "blocked"),
            (ChatError::Suspended, 403, "suspended"),
            (ChatError::NotFound, 404, "not_found"),
            (ChatError::AttachmentNotFound, 404, "not_found"),
            (ChatError::Conflict("x".into()), 409, "conflict"),
            (
                ChatError::PayloadTooLarge("x".into()),
                413,
                "payload_too_large",
            ),
            (
                ChatError::UnsupportedMediaType("x".into()),
                415,
                "unsupported_media_type",
            ),
            (
                ChatError::AttachmentPending("x".into()),
                409,
                "attachment_pending",
            ),
            (
                ChatError::AttachmentUnsafe("x".into()),
                409,
                "attachment_unsafe",
            ),
            (
                ChatError::AttachmentUnscannable("x".into()),
                409,
                "attachment_unscannable",
            ),
            (ChatError::Throttled, 429, "throttled"),
            (
                ChatError::RateLimited { retry_after: 2 },
                429,
                "rate_limited",
            ),
            (ChatError::SlowMode { retry_after: 3 }, 429, "slow_mode"),
            (ChatError::Unavailable, 503, "unavailable"),
        ];
        for (e, status, code) in cases {
            assert_eq!((e.status(), e.code()), (status, code));
        }
    }
}
