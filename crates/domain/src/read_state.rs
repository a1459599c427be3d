//! Read state (docs/api.md §4.2, §12): one monotonic watermark per member.

/// The watermark after a read request: `max(current, min(requested, lastSeq))`. A late, older
/// request never moves it back, and nobody reads past the last message.
pub fn effective_watermark(current: u64, requested: u64, last_seq: u64) -> u64 {
    current.max(requested.min(last_seq))
}

/// A watermark as shown next to `last_seq`: never above it. The two come from different items
/// read by one non-snapshot Query or BatchGetItem, so a send committing between the two reads
/// can pair the sender's new watermark with the previous `lastSeq`; clamped, the pair is one that
/// existed a moment before.
pub fn shown_watermark(last_read_seq: u64, last_seq: u64) -> u64 {
    last_read_seq.min(last_seq)
}

/// Unread messages: everything after the watermark. Exact, with no counting query.
pub fn unread_count(last_seq: u64, last_read_seq: u64) -> u64 {
    last_seq.saturating_sub(last_read_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_clamps_and_never_goes_back() {
        assert_eq!(effective_watermark(40, 50, 42), 42);
        assert_eq!(effective_watermark(40, 30, 42), 40);
        assert_eq!(effective_watermark(40, 41, 42), 41);
        assert_eq!(effective_watermark(0, u64::MAX, 0), 0);
    }

    #[test]
    fn a_shown_watermark_never_passes_last_seq() {
        assert_eq!(
            shown_watermark(5, 4),
            4,
            "a send's watermark read before its lastSeq"
        );
        assert_eq!(shown_watermark(3, 4), 3);
        assert_eq!(shown_watermark(4, 4), 4);
        assert_eq!(shown_watermark(0, 0), 0);
    }

    #[test]
    fn unread() {
        assert_eq!(unread_count(42, 40), 2);
        assert_eq!(unread_count(42, 42), 0);
        assert_eq!(unread_count(3, 5), 0);
    }
}
