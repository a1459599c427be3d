//! Messages (docs/api.md §10, §16): body bounds, what makes a resend "the same", the inbox preview.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::ids::{digest, hex_digest, ConversationId, UserId};
use crate::error::ChatError;

pub const MAX_MESSAGE_CHARS: usize = 4_000;
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Inbox previews show the first 200 characters of the last message.
pub const PREVIEW_CHARS: usize = 200;

/// A message body: 1–4,000 characters and at most 16 KiB of UTF-8; any text, stored as sent
/// (not trimmed). Empty is `400`, too long is `413`.
pub fn check_body(body: &str) -> Result<(), ChatError> {
    if body.is_empty() {
        return Err(ChatError::invalid("field `body` must not be empty"));
    }
    if body.len() > MAX_MESSAGE_BYTES || body.chars().count() > MAX_MESSAGE_CHARS {
        return Err(ChatError::PayloadTooLarge(format!(
            "field `body` is limited to {MAX_MESSAGE_CHARS} characters and {MAX_MESSAGE_BYTES} bytes of UTF-8"
        )));
    }
    Ok(())
}

/// What identifies the content of a send, so a replay with another body (or by another sender)
/// is a conflict rather than the original.
pub fn message_fingerprint(sender: &UserId, body: &str) -> String {
    hex_digest(&["message", sender.as_str(), body])
}

/// A send's fingerprint: its attachment ids count too (none: `message_fingerprint`, as before).
pub fn send_fingerprint(sender: &UserId, body: &str, attachments: &[String]) -> String {
    if attachments.is_empty() {
        return message_fingerprint(sender, body);
    }
    let ids = attachments.join(",");
    hex_digest(&["message+attachments", sender.as_str(), body, &ids])
}

/// The name of a send's idempotency key once its message is archived (docs/data-model.md §2.4c):
/// 128 bits of SHA-256 over the conversation and the lower-case `clientMsgId`, in base64url (22
/// characters, against 36 + the conversation's id for the key it replaces).
pub fn archived_key_id(conversation: &ConversationId, client_msg_key: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest(&["key", conversation.as_str(), client_msg_key]))
}

/// The part of a fingerprint (`message_fingerprint`, hex) an archived key keeps: its first 64
/// bits, as bytes. Enough to tell a replay from another body: the `clientMsgId` already matched.
pub fn fingerprint_prefix(fingerprint: &str) -> Vec<u8> {
    let hex = fingerprint.as_bytes();
    (0..8)
        .filter_map(|i| {
            let pair = std::str::from_utf8(hex.get(2 * i..2 * i + 2)?).ok()?;
            u8::from_str_radix(pair, 16).ok()
        })
        .collect()
}

/// A new message's `createdAt`: the clock's time, but never before the conversation's previous
/// message (clocks of two servers differ by a few milliseconds; times within one conversation
/// must not go backwards). Both are fixed-width RFC 3339 UTC strings, which sort as time.
pub fn message_time(now: String, previous: Option<&str>) -> String {
    match previous {
        Some(p) if p > now.as_str() => p.to_owned(),
        _ => now,
    }
}

/// The first 200 characters of a body.
pub fn preview(body: &str) -> &str {
    match body.char_indices().nth(PREVIEW_CHARS) {
        Some((i, _)) => &body[..i],
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archived_key_names_one_conversation_and_one_client_msg_id() {
        let (a, b) = (
            ConversationId::direct(&UserId::parse("a").unwrap(), &UserId::parse("b").unwrap()),
            ConversationId::direct(&UserId::parse("a").unwrap(), &UserId::parse("c").unwrap()),
        );
        let key = "6f1c2c1e-0000-4000-8000-000000000001";
        let id = archived_key_id(&a, key);
        assert_eq!(id.len(), 22);
        assert_eq!(id, archived_key_id(&a, key), "the same send, the same name");
        assert_ne!(id, archived_key_id(&b, key));
        assert_ne!(
            id,
            archived_key_id(&a, "6f1c2c1e-0000-4000-8000-000000000002")
        );
    }

    #[test]
    fn a_fingerprint_prefix_is_its_first_eight_bytes() {
        let f = message_fingerprint(&UserId::parse("u1").unwrap(), "hi");
        let prefix = fingerprint_prefix(&f);
        assert_eq!(prefix.len(), 8);
        let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, f[..16]);
        let other = message_fingerprint(&UserId::parse("u1").unwrap(), "hi!");
        assert_ne!(fingerprint_prefix(&other), prefix);
    }

    #[test]
    fn body_bounds() {
        assert!(check_body(&"x".repeat(4000)).is_ok());
        assert_eq!(check_body(&"x".repeat(4001)).unwrap_err().status(), 413);
        // 4,000 four-byte characters are 16,000 bytes: within both limits.
        assert!(check_body(&"😀".repeat(4000)).is_ok());
        assert_eq!(check_body(&"日".repeat(4001)).unwrap_err().status(), 413);
        assert_eq!(check_body("").unwrap_err().status(), 400);
        assert!(check_body(" \n<script>").is_ok());
    }

    #[test]
    fn fingerprints_tell_sender_and_body_apart() {
        let (a, b) = (UserId::parse("a").unwrap(), UserId::parse("b").unwrap());
        assert_eq!(message_fingerprint(&a, "x"), message_fingerprint(&a, "x"));
        assert_ne!(message_fingerprint(&a, "x"), message_fingerprint(&b, "x"));
        assert_ne!(message_fingerprint(&a, "x"), message_fingerprint(&a, "y"));
    }

    #[test]
    fn message_times_never_go_backwards() {
        let earlier = "2026-01-01T00:00:00.100Z".to_owned();
        let later = "2026-01-01T00:00:00.200Z";
        assert_eq!(message_time(earlier.clone(), Some(later)), later);
        assert_eq!(message_time(later.to_owned(), Some(&earlier)), later);
        assert_eq!(message_time(earlier.clone(), None), earlier);
    }

    #[test]
    fn preview_cuts_characters_not_bytes() {
        let s = "日".repeat(250);
        assert_eq!(preview(&s).chars().count(), 200);
        assert_eq!(preview("short"), "short");
    }
}
