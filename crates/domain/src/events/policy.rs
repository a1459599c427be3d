//! The fanout's per-connection failure policy, pure (docs/event-pipeline.md, "Fanout"): what a
//! push answer means for the connection, how long a push is retried, and when a connection record
//! may be forgotten.
//!
//! Only an answer about the connection itself (`410`, `400`) forgets it. A failure that is ours
//! (`429` throttling of our account, API Gateway's `5xx`, `403` for our credentials, clock or
//! endpoint, no answer) is retried in the invocation, then the Kinesis record is reported failed
//! so that Lambda delivers it again: such a push is never dropped while its record is
//! acknowledged. What a redelivery must not push again is `redelivery`'s part.

use std::time::Duration;

use crate::retry::Backoff;

/// What one PostToConnection answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushResult {
    Delivered,
    /// `410 Gone`: the socket is closed (or, for a moment after `$connect`, not open yet).
    Gone,
    /// `400`: API Gateway refuses this connection id (malformed); pushing again cannot help.
    Rejected,
    /// `429`, `5xx`, `403`, a timeout or a network error: our side's trouble, worth another try.
    /// A `403` is about the caller, never the connection: IAM still propagating after a deploy, a
    /// skewed clock, a wrong endpoint. Taking it for a dead connection would delete every live
    /// connection's record during such a window.
    Transient,
    /// Anything else (e.g. `413`): this frame cannot be delivered; the connection may be fine.
    Undeliverable,
}

impl PushResult {
    /// Classifies a failed push by its HTTP status (None: no response, i.e. a timeout or a
    /// network error).
    pub fn of_failure(status: Option<u16>) -> PushResult {
        match status {
            None | Some(403) | Some(429) | Some(500..=599) => PushResult::Transient,
            Some(410) => PushResult::Gone,
            Some(400) => PushResult::Rejected,
            Some(_) => PushResult::Undeliverable,
        }
    }
}

/// Attempts of one frame to one connection in one invocation (the first and five retries). The
/// SDK's own retries are off for the Management API client, so this is the only retry loop in
/// the function; after it, Lambda's redelivery of the record is the next one.
pub const PUSH_ATTEMPTS: u32 = 6;

/// Each attempt's time limit: a connection that hangs costs at most this much per attempt.
pub const PUSH_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// Wait before retry `retry` (1-based): random in 1 ms ..= 50 ms · 2^(retry−1), at most 400 ms.
/// Full jitter: a throttled burst (429) does not come back in lockstep. With [`PUSH_ATTEMPTS`]
/// the retries of one frame wait at most 1.15 s (~0.6 s on average) before the record is
/// reported failed, and at most ~7 s if API Gateway never answers ([`PUSH_ATTEMPT_TIMEOUT`]),
/// while the other connections are served concurrently.
pub const PUSH_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(400));

/// A connection record younger than this is never deleted by the fanout. `$connect` records the
/// connection before API Gateway completes the handshake, and a push in that moment is answered
/// `410 Gone` although the socket is about to open: deleting the record then would leave a live
/// socket that receives nothing for up to two hours. The client misses that one push only, and
/// it connected before catching up (docs/api.md §15.3), so the catch-up has it.
pub const FORGET_GRACE_SECS: i64 = 10;

/// Whether a connection registered at `registered_unix` may be deleted after a `410`/`400` at
/// `now_unix`.
pub fn may_forget(registered_unix: i64, now_unix: i64) -> bool {
    now_unix - registered_unix >= FORGET_GRACE_SECS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_policy() {
        assert_eq!(PushResult::of_failure(Some(410)), PushResult::Gone);
        assert_eq!(PushResult::of_failure(Some(400)), PushResult::Rejected);
        // A 403 is about our credentials, clock or endpoint: never a dead connection.
        for s in [403, 429, 500, 502, 503, 504] {
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
            let d = PUSH_BACKOFF.wait(retry);
            assert!(d >= Duration::from_millis(1), "{retry}: {d:?}");
            assert!(d <= Duration::from_millis(400), "{retry}: {d:?}");
        }
        assert!(PUSH_BACKOFF.wait(1) <= Duration::from_millis(50));
        let spread: std::collections::HashSet<_> = (0..50).map(|_| PUSH_BACKOFF.wait(4)).collect();
        assert!(spread.len() > 5, "jittered: {spread:?}");
        // The whole budget of one frame stays small next to the fanout's 60 s timeout.
        let waits: Duration = (1..PUSH_ATTEMPTS).map(|r| PUSH_BACKOFF.ceiling(r)).sum();
        assert_eq!(waits, Duration::from_millis(1150));
        assert!(PUSH_ATTEMPT_TIMEOUT * PUSH_ATTEMPTS + waits < Duration::from_secs(8));
    }

    #[test]
    fn young_registrations_are_kept() {
        let registered = 1_000;
        assert!(!may_forget(registered, registered));
        assert!(!may_forget(registered, registered + FORGET_GRACE_SECS - 1));
        assert!(may_forget(registered, registered + FORGET_GRACE_SECS));
        assert!(may_forget(registered, registered + 7200));
    }
}
