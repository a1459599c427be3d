//! The waits between attempts of a retried operation: exponential backoff with full jitter, pure
//! (the deadline that bounds the attempts, and the sleeping, are the store's: `chat_store::retry`).

use std::time::Duration;

/// A random duration in `[lo, hi]` (jitter, so contenders do not collide again in lockstep).
pub fn jitter(lo: Duration, hi: Duration) -> Duration {
    let span = hi.saturating_sub(lo).as_micros() as u64;
    let r = uuid::Uuid::new_v4().as_u128() as u64 % (span + 1);
    lo + Duration::from_micros(r)
}

/// Exponential backoff with full jitter, the one of every retry loop: before retry `retry`
/// (1-based), a random wait in 1 ms ..= `first` · 2^(retry−1), at most `cap`. Full jitter keeps
/// contenders that failed together from coming back in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Backoff { first, cap }
    }

    /// The longest wait before retry `retry` (what [`Backoff::wait`] draws up to).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.cap)
    }

    /// The wait before retry `retry`.
    pub fn wait(&self, retry: u32) -> Duration {
        jitter(Duration::from_millis(1), self.ceiling(retry))
    }
}

/// The backoff of an operation that lost to throttling or a transaction conflict: random up to
/// 5, 10, 20 … ms, capped at 320 ms.
pub const CONTENTION: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(320));

/// Delay before attempt `attempt` (1-based; the first attempt does not wait) of an operation that
/// lost to throttling or a transaction conflict ([`CONTENTION`]).
pub fn backoff(attempt: u32) -> Duration {
    if attempt <= 1 {
        return Duration::ZERO;
    }
    CONTENTION.wait(attempt - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(backoff(1), Duration::ZERO);
        for a in 2..50 {
            assert!(backoff(a) <= Duration::from_millis(320));
            assert!(backoff(a) >= Duration::from_millis(1));
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff::new(Duration::from_millis(50), Duration::from_millis(400));
        let ceilings: Vec<u128> = (0..7).map(|r| b.ceiling(r).as_millis()).collect();
        assert_eq!(ceilings, [50, 50, 100, 200, 400, 400, 400]);
        assert_eq!(
            b.ceiling(u32::MAX),
            Duration::from_millis(400),
            "no overflow"
        );
        assert_eq!(CONTENTION.ceiling(7), Duration::from_millis(320));
        for r in 1..40 {
            let d = b.wait(r);
            assert!(
                d >= Duration::from_millis(1) && d <= b.ceiling(r),
                "{r}: {d:?}"
            );
        }
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(2), Duration::from_millis(5));
            assert!(j >= Duration::from_millis(2) && j <= Duration::from_millis(5));
        }
    }
}
