//! Safety (docs/api.md §27–§30): blocking, reports, moderators and suspensions — the requests,
//! their bounds and who is a moderator. The store keeps them (docs/data-model.md §10).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::ChatError;
use crate::ids::UserId;
use crate::requests::{page_limit, Fields, QueryParams};

/// A report's note: at most this many characters.
pub const MAX_NOTE_CHARS: usize = 1_000;
/// How long a report (and its snapshot of the message) is kept: 30 days.
pub const REPORT_TTL_SECS: i64 = 30 * 24 * 3600;
/// The OAuth scope that makes a token a moderator's.
pub const MODERATOR_SCOPE: &str = "chat:moderator";
/// The group claim value that makes a token a moderator's.
pub const MODERATOR_GROUP: &str = "moderators";
pub const DEFAULT_REPORTS_LIMIT: u32 = 50;
pub const DEFAULT_BLOCKS_LIMIT: u32 = 100;

/// `PUT /me/blocks/{userId}`: nobody blocks themselves (`400`).
pub fn check_block_target(caller: &UserId, target: &UserId) -> Result<(), ChatError> {
    if caller == target {
        return Err(ChatError::invalid(
            "path parameter `userId` is the caller: a user cannot block themselves",
        ));
    }
    Ok(())
}

/// `PUT /moderation/suspensions/{userId}`: no moderator suspends themselves (`400`): they could
/// not lift it (every request of theirs would be `403 suspended`).
pub fn check_suspension_target(moderator: &UserId, target: &UserId) -> Result<(), ChatError> {
    if moderator == target {
        return Err(ChatError::invalid(
            "path parameter `userId` is the caller: a moderator cannot suspend themselves",
        ));
    }
    Ok(())
}

/// Why a message is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportReason {
    Spam,
    Abuse,
    Other,
}

/// `POST …/messages/{seq}/reports` `{"reason", "note"?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRequest {
    pub reason: ReportReason,
    pub note: Option<String>,
}

impl ReportRequest {
    pub fn parse(body: &[u8]) -> Result<ReportRequest, ChatError> {
        let fields = Fields::parse(body)?;
        let reason = match fields.required_str("reason")? {
            "spam" => ReportReason::Spam,
            "abuse" => ReportReason::Abuse,
            "other" => ReportReason::Other,
            _ => {
                return Err(ChatError::invalid(
                    "field `reason` must be one of \"spam\", \"abuse\", \"other\"",
                ))
            }
        };
        let note = fields.optional_str("note")?;
        if note.is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS) {
            return Err(ChatError::invalid(format!(
                "field `note` must be at most {MAX_NOTE_CHARS} characters"
            )));
        }
        Ok(ReportRequest {
            reason,
            note: note.map(str::to_owned),
        })
    }
}

/// Whether verified token claims (or the JWT authorizer's claims) name a moderator: the scope
/// `chat:moderator` in `scope` (space-separated) or `scp` (a string or a list), or the group
/// `moderators` in `cognito:groups` or `groups` (a list, or a string as API Gateway passes
/// lists: `[a b]`, or comma/space separated).
pub fn is_moderator(claim: impl Fn(&str) -> Option<Vec<String>>) -> bool {
    let has = |names: &[&str], wanted: &str| {
        names
            .iter()
            .filter_map(|n| claim(n))
            .any(|values| values.iter().any(|v| v == wanted))
    };
    has(&["scope", "scp"], MODERATOR_SCOPE) || has(&["cognito:groups", "groups"], MODERATOR_GROUP)
}

/// The words of a claim's value as a JSON value: a string's space-, comma- or bracket-separated
/// parts, or a list's strings.
pub fn claim_words(value: &serde_json::Value) -> Vec<String> {
    match value {
        serde_json::Value::String(s) => split_words(s),
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str())
            .flat_map(split_words)
            .collect(),
        _ => Vec::new(),
    }
}

/// `"a b"`, `"a,b"`, `"[a b]"` (API Gateway's rendering of a list claim) → `a`, `b`.
pub fn split_words(s: &str) -> Vec<String> {
    s.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A page of a list (blocks, reports): its size and where it starts (after the opaque cursor,
/// the sort key of the last item shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageQuery {
    pub limit: u32,
    pub after: Option<String>,
}

impl PageQuery {
    pub fn parse(q: &dyn QueryParams, default: u32, prefix: &str) -> Result<PageQuery, ChatError> {
        let limit = page_limit(q, default)?;
        let after = q
            .one("cursor")?
            .map(|c| decode_cursor(c, prefix))
            .transpose()?;
        Ok(PageQuery { limit, after })
    }
}

/// The opaque cursor of a sort key.
pub fn cursor(sk: &str) -> String {
    URL_SAFE_NO_PAD.encode(sk)
}

fn decode_cursor(cursor: &str, prefix: &str) -> Result<String, ChatError> {
    let bad = || ChatError::invalid("query parameter `cursor` is malformed");
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let sk = String::from_utf8(bytes).map_err(|_| bad())?;
    // Only a key of the list it pages (a forged one would start a Query elsewhere).
    sk.starts_with(prefix).then_some(sk).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn nobody_blocks_themselves() {
        assert!(check_block_target(&u("a"), &u("b")).is_ok());
        assert_eq!(
            check_block_target(&u("a"), &u("a")).unwrap_err().status(),
            400
        );
    }

    #[test]
    fn no_moderator_suspends_themselves() {
        assert!(check_suspension_target(&u("m"), &u("b")).is_ok());
        assert_eq!(
            check_suspension_target(&u("m"), &u("m"))
                .unwrap_err()
                .status(),
            400
        );
    }

    #[test]
    fn reports_take_a_known_reason_and_a_bounded_note() {
        let r = ReportRequest::parse(br#"{"reason":"spam"}"#).unwrap();
        assert_eq!((r.reason, r.note), (ReportReason::Spam, None));
        let r = ReportRequest::parse(br#"{"reason":"other","note":"why"}"#).unwrap();
        assert_eq!(
            (r.reason, r.note.as_deref()),
            (ReportReason::Other, Some("why"))
        );
        let long = json!({"reason": "abuse", "note": "n".repeat(MAX_NOTE_CHARS)}).to_string();
        assert!(ReportRequest::parse(long.as_bytes()).is_ok());
        for bad in [
            json!({"reason": "rude"}).to_string(),
            json!({}).to_string(),
            json!({"reason": 3}).to_string(),
            json!({"reason": "spam", "note": 5}).to_string(),
            json!({"reason": "abuse", "note": "n".repeat(MAX_NOTE_CHARS + 1)}).to_string(),
        ] {
            let e = ReportRequest::parse(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
    }

    fn claims(v: serde_json::Value) -> impl Fn(&str) -> Option<Vec<String>> {
        move |name| v.get(name).map(claim_words)
    }

    #[test]
    fn moderators_by_scope_or_group_claim() {
        assert!(is_moderator(claims(
            json!({"scope": "openid chat:moderator"})
        )));
        assert!(is_moderator(claims(json!({"scp": ["chat:moderator"]}))));
        assert!(is_moderator(claims(json!({"scp": "chat:moderator email"}))));
        assert!(is_moderator(claims(
            json!({"cognito:groups": ["moderators"]})
        )));
        assert!(is_moderator(claims(
            json!({"cognito:groups": "[admins moderators]"})
        )));
        assert!(is_moderator(claims(json!({"groups": "moderators,x"}))));
        for not in [
            json!({}),
            json!({"scope": "chat:moderators"}),
            json!({"scope": "openid"}),
            json!({"groups": ["admins"]}),
            json!({"moderators": true}),
            json!({"scope": 1}),
        ] {
            assert!(!is_moderator(claims(not.clone())), "{not}");
        }
    }

    #[test]
    fn cursors_round_trip_and_stay_in_their_list() {
        let sk = "O#2026-01-01T00:00:00.000Z#r1";
        let c = cursor(sk);
        let q: HashMap<&str, &str> = [("cursor", c.as_str()), ("limit", "5")].into();
        let page = PageQuery::parse(&q, 50, "O#").unwrap();
        assert_eq!((page.limit, page.after.as_deref()), (5, Some(sk)));
        let q: HashMap<&str, &str> = [("cursor", c.as_str())].into();
        assert_eq!(PageQuery::parse(&q, 50, "B#").unwrap_err().status(), 400);
        let q: HashMap<&str, &str> = [("cursor", "%%%")].into();
        assert_eq!(PageQuery::parse(&q, 50, "O#").unwrap_err().status(), 400);
    }
}
