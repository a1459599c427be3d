//! Pure chat rules (SPEC §2, §4): conversation ids, the read-watermark clamp, idempotent-send
//! fingerprints, inbox ordering and cursors. No I/O here.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::ChatError;
use crate::identity::UserId;

fn hex_digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed so ("ab","c") and ("a","bc") differ.
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One direct conversation per unordered pair: its id is derived from the pair, so two users
/// opening it at the same instant write the same key and the database lets only one create it.
pub fn direct_conversation_id(a: &UserId, b: &UserId) -> String {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    format!("d-{}", hex_digest(&["direct", lo.as_str(), hi.as_str()]))
}

/// A group created with a `clientRequestId` gets an id derived from (creator, request id), so a
/// retry lands on the same key; without one it gets a random id.
pub fn group_conversation_id(creator: &UserId, client_request_id: Option<&str>) -> String {
    match client_request_id {
        Some(r) => format!("g-{}", hex_digest(&["group", creator.as_str(), r])),
        None => format!("g-{}", uuid::Uuid::new_v4().simple()),
    }
}

/// Conversation ids this service hands out; anything else cannot exist (→ 404 without a lookup).
pub fn is_conversation_id(s: &str) -> bool {
    let hex = |h: &str| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    s.strip_prefix("d-")
        .or_else(|| s.strip_prefix("g-"))
        .is_some_and(hex)
}

/// What a resent group creation must match to count as the same request.
pub fn group_fingerprint(title: &str, members: &[UserId]) -> String {
    let mut ids: Vec<&str> = members.iter().map(UserId::as_str).collect();
    ids.sort_unstable();
    let mut parts = vec!["group-request", title];
    parts.extend(ids);
    hex_digest(&parts)
}

/// What identifies the content of a send, so a replay with a different body is a conflict.
pub fn message_fingerprint(sender: &str, body: &str) -> String {
    hex_digest(&["message", sender, body])
}

/// Effective watermark for a read request: `max(current, min(requested, lastSeq))`.
pub fn effective_watermark(current: u64, requested: u64, last_seq: u64) -> u64 {
    current.max(requested.min(last_seq))
}

pub const PREVIEW_CHARS: usize = 200;

/// The first 200 characters of a body, for the inbox.
pub fn preview(body: &str) -> String {
    match body.char_indices().nth(PREVIEW_CHARS) {
        Some((i, _)) => body[..i].to_owned(),
        None => body.to_owned(),
    }
}

/// Inbox order: newest activity first; ties broken by conversation id so pages never overlap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InboxPosition {
    /// RFC 3339, fixed width: sorts as time.
    pub activity: String,
    pub conversation_id: String,
}

impl InboxPosition {
    /// True when `self` comes after `cursor` in newest-first order.
    pub fn is_after(&self, cursor: &InboxPosition) -> bool {
        self < cursor
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::json!([self.activity, self.conversation_id]).to_string())
    }

    pub fn decode(cursor: &str) -> Result<InboxPosition, ChatError> {
        let bad = || ChatError::invalid("query parameter `cursor` is malformed");
        let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
        let (activity, conversation_id): (String, String) =
            serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if crate::time::parse_rfc3339(&activity).is_none() || !is_conversation_id(&conversation_id)
        {
            return Err(bad());
        }
        Ok(InboxPosition {
            activity,
            conversation_id,
        })
    }
}

/// Sorts newest first and returns one page plus the cursor of the next one.
pub fn inbox_page<T>(
    mut entries: Vec<(InboxPosition, T)>,
    after: Option<&InboxPosition>,
    limit: usize,
) -> (Vec<T>, Option<String>) {
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    let mut rest = entries
        .into_iter()
        .filter(|(p, _)| after.is_none_or(|c| p.is_after(c)))
        .peekable();
    let mut page = Vec::with_capacity(limit);
    let mut last = None;
    while page.len() < limit {
        let Some((pos, item)) = rest.next() else {
            break;
        };
        last = Some(pos);
        page.push(item);
    }
    let next = match (rest.peek(), last) {
        (Some(_), Some(last)) => Some(last.encode()),
        _ => None,
    };
    (page, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn direct_id_is_per_unordered_pair() {
        assert_eq!(
            direct_conversation_id(&u("a"), &u("b")),
            direct_conversation_id(&u("b"), &u("a"))
        );
        assert_ne!(
            direct_conversation_id(&u("a"), &u("b")),
            direct_conversation_id(&u("a"), &u("c"))
        );
        // Concatenation ambiguity does not collide.
        assert_ne!(
            direct_conversation_id(&u("ab"), &u("c")),
            direct_conversation_id(&u("a"), &u("bc"))
        );
        assert!(is_conversation_id(&direct_conversation_id(
            &u("a"),
            &u("b")
        )));
    }

    #[test]
    fn group_ids() {
        let r = "6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f";
        assert_eq!(
            group_conversation_id(&u("a"), Some(r)),
            group_conversation_id(&u("a"), Some(r))
        );
        assert_ne!(
            group_conversation_id(&u("a"), Some(r)),
            group_conversation_id(&u("b"), Some(r))
        );
        assert_ne!(
            group_conversation_id(&u("a"), None),
            group_conversation_id(&u("a"), None)
        );
        assert!(is_conversation_id(&group_conversation_id(&u("a"), None)));
        assert!(!is_conversation_id("g-xyz"));
        assert!(!is_conversation_id("../etc"));
    }

    #[test]
    fn watermark_clamps_and_never_goes_back() {
        assert_eq!(effective_watermark(40, 50, 42), 42);
        assert_eq!(effective_watermark(40, 30, 42), 40);
        assert_eq!(effective_watermark(40, 41, 42), 41);
        assert_eq!(effective_watermark(0, u64::MAX, 0), 0);
    }

    #[test]
    fn preview_cuts_characters_not_bytes() {
        let s = "日".repeat(250);
        assert_eq!(preview(&s).chars().count(), 200);
        assert_eq!(preview("short"), "short");
    }

    #[test]
    fn inbox_paging_is_newest_first_and_complete() {
        let mk = |t: &str, id: &str| InboxPosition {
            activity: t.into(),
            conversation_id: id.into(),
        };
        let ids: Vec<String> = (0..5).map(|i| format!("g-{:032x}", i)).collect();
        let entries: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                (
                    mk(&format!("2026-01-01T00:00:0{}.000Z", i % 3), id),
                    id.clone(),
                )
            })
            .collect();
        let (p1, c1) = inbox_page(entries.clone(), None, 2);
        let after = InboxPosition::decode(c1.as_deref().unwrap()).unwrap();
        let (p2, c2) = inbox_page(entries.clone(), Some(&after), 2);
        let after = InboxPosition::decode(c2.as_deref().unwrap()).unwrap();
        let (p3, c3) = inbox_page(entries, Some(&after), 2);
        assert_eq!(c3, None);
        let all: Vec<String> = p1.into_iter().chain(p2).chain(p3).collect();
        assert_eq!(all.len(), 5);
        let mut uniq = all.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 5);
        // Activity 2,2 first (ids 2 and ... ), newest first.
        assert!(all[0] == ids[2]);
        assert!(InboxPosition::decode("!!!").is_err());
        assert!(InboxPosition::decode(&URL_SAFE_NO_PAD.encode("[1,2]")).is_err());
    }
}
