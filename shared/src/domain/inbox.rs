//! Inbox order and paging (docs/api.md §14): newest activity first, an opaque cursor.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::ids::ConversationId;
use crate::error::ChatError;

/// A conversation's place in the inbox: newest activity first; ties broken by conversation id so
/// pages never overlap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InboxPosition {
    /// RFC 3339, fixed width: sorts as time.
    pub activity: String,
    pub conversation_id: ConversationId,
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
        if crate::time::parse_rfc3339(&activity).is_none() {
            return Err(bad());
        }
        Ok(InboxPosition {
            activity,
            conversation_id: ConversationId::parse(&conversation_id).ok_or_else(bad)?,
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

    #[test]
    fn inbox_paging_is_newest_first_and_complete() {
        let mk = |t: &str, id: &ConversationId| InboxPosition {
            activity: t.into(),
            conversation_id: id.clone(),
        };
        let ids: Vec<ConversationId> = (0..5)
            .map(|i| ConversationId::parse(&format!("g-{:032x}", i)).unwrap())
            .collect();
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
        let all: Vec<ConversationId> = p1.into_iter().chain(p2).chain(p3).collect();
        assert_eq!(all.len(), 5);
        let mut uniq = all.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 5);
        // Newest activity first: ids 2 (…:02) before the others.
        assert_eq!(all[0], ids[2]);
        assert!(InboxPosition::decode("!!!").is_err());
        assert!(InboxPosition::decode(&URL_SAFE_NO_PAD.encode("[1,2]")).is_err());
    }
}
