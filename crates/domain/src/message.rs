//! Messages (docs/api.md §10, §16): body bounds, what makes a resend "the same", the inbox preview.

use super::ids::{hex_digest, UserId};
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
