//! The fanout's per-connection failure policy, pure (docs/event-pipeline.md, "Fanout"): what a
//! push answer means for the connection, how long a push is retried, and when a connection record
//! may be forgotten.
//!
//! One bad connection must never cost the other members anything: its failures are handled
//! (retried, or the record deleted) inside the invocation and never fail the Kinesis record, which
//! Lambda would redeliver to everyone.

use std::time::Duration;

/// What one PostToConnection answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushResult {
    Delivered,
    /// `410 Gone`: the socket is closed (or, for a moment after `$connect`, not open yet).
    Gone,
    /// `400`/`403`: API Gateway refuses this connection id; pushing again cannot help.
    Rejected,
    /// `429`, `5xx`, a timeout or a network error: worth another try soon.
    Transient,
    /// Anything else (e.g. `413`): this frame cannot be delivered; the connection may be fine.
    Undeliverable,
}

impl PushResult {
    /// Classifies a failed push by its HTTP status (None: no response, i.e. a timeout or a
    /// network error).
    pub fn of_failure(status: Option<u16>) -> PushResult {
        match status {
            None | Some(429) | Some(500..=599) => PushResult::Transient,
            Some(410) => PushResult::Gone,
            Some(400) | Some(403) => PushResult::Rejected,
            Some(_) => PushResult::Undeliverable,
        }
    }
}

/// Attempts of one frame to one connection (the first and two retries). The SDK's own retries
/// are off for the Management API client, so this is the only retry loop.
pub const PUSH_ATTEMPTS: u32 = 3;

/// Each attempt's time limit: a connection that hangs costs at most this much per attempt.
pub const PUSH_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// Wait before retry `retry` (1-based): random in 1 ms ..= 50 ms · 2^(retry−1), at most 400 ms.
/// Full jitter: a throttled burst (429) does not come back in lockstep. Together with
/// [`PUSH_ATTEMPTS`] and [`PUSH_ATTEMPT_TIMEOUT`] one frame costs at most ~3.5 s on one
/// connection, ~0.2 s on a fast-failing one, while the other connections are served
/// concurrently.
pub fn push_backoff(retry: u32) -> Duration {
    let cap_ms = (50u64 << retry.saturating_sub(1).min(3)).min(400);
    crate::retry::jitter(Duration::from_millis(1), Duration::from_millis(cap_ms))
}

/// A connection record younger than this is never deleted by the fanout. `$connect` records the
/// connection before API Gateway completes the handshake, and a push in that moment is answered
/// `410 Gone` (or refused) although the socket is about to open: deleting the record then would
/// leave a live socket that receives nothing for up to two hours. The client misses that one push
/// only, and it connected before catching up (docs/api.md §15.3), so the catch-up has it.
pub const FORGET_GRACE_SECS: i64 = 10;

/// Whether a connection registered at `registered_unix` may be deleted after a `410`/`400`/`403`
/// at `now_unix`.
pub fn may_forget(registered_unix: i64, now_unix: i64) -> bool {
    now_unix - registered_unix >= FORGET_GRACE_SECS
}

/// A connection that exhausted its retries is "suspect" this long (per warm fanout instance): its
/// frames get one attempt each and no retries, so a permanently failing connection costs every
/// later batch one quick attempt instead of the whole retry budget, and the shard keeps moving.
pub const SUSPECT_SECS: u64 = 60;

/// How many attempts a frame to a connection gets.
pub fn attempts_for(suspect: bool) -> u32 {
    if suspect {
        1
    } else {
        PUSH_ATTEMPTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_policy() {
        assert_eq!(PushResult::of_failure(Some(410)), PushResult::Gone);
        assert_eq!(PushResult::of_failure(Some(403)), PushResult::Rejected);
        assert_eq!(PushResult::of_failure(Some(400)), PushResult::Rejected);
        for s in [429, 500, 502, 503, 504] {
            assert_eq!(
                PushResult::of_failure(Some(s)),
                PushResult::Transient,
                "{s}"
            );
        }
        assert_eq!(PushResult::of_failure(None), PushResult::Transient);
        assert_eq!(PushResult::of_failure(Some(413)), PushResult::Undeliverable);
        assert_eq!(PushResult::of_failure(Some(404)), PushResult::Undeliverable);
    }

    #[test]
    fn backoff_is_jittered_and_bounded() {
        for retry in 1..20 {
            let d = push_backoff(retry);
            assert!(d >= Duration::from_millis(1), "{retry}: {d:?}");
            assert!(d <= Duration::from_millis(400), "{retry}: {d:?}");
        }
        assert!(push_backoff(1) <= Duration::from_millis(50));
        let spread: std::collections::HashSet<_> = (0..50).map(|_| push_backoff(4)).collect();
        assert!(spread.len() > 5, "jittered: {spread:?}");
        // The whole budget of one frame stays small next to the fanout's 60 s timeout.
        let worst = PUSH_ATTEMPT_TIMEOUT * PUSH_ATTEMPTS + Duration::from_millis(50 + 100);
        assert!(worst < Duration::from_secs(4));
    }

    #[test]
    fn young_registrations_are_kept() {
        let registered = 1_000;
        assert!(!may_forget(registered, registered));
        assert!(!may_forget(registered, registered + FORGET_GRACE_SECS - 1));
        assert!(may_forget(registered, registered + FORGET_GRACE_SECS));
        assert!(may_forget(registered, registered + 7200));
    }

    #[test]
    fn suspects_get_one_attempt() {
        assert_eq!(attempts_for(false), PUSH_ATTEMPTS);
        assert_eq!(attempts_for(true), 1);
    }
}
