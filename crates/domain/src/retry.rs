//! Time bounds of a request: one deadline shared by every retry of it, and the waits between
//! attempts.
//!
//! The bound is time, not a count: how many attempts a contended operation needs depends on how
//! many writers compete and how fast the database answers, while what a client can wait for, and
//! what Lambda allows (REST functions time out after 10 s), is a duration. A request that runs out
//! of time (its budget: `config::Timeouts`) answers `429 throttled` with `Retry-After` (or `503` when the database itself did not
//! answer), never the gateway's bare timeout.

use std::time::{Duration, Instant};

/// When a request must stop starting new attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Deadline(Instant::now() + budget)
    }

    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// Sleeps `d`, or less if the deadline comes first; false once the deadline has passed.
    pub async fn sleep(&self, d: Duration) -> bool {
        tokio::time::sleep(d.min(self.remaining())).await;
        !self.passed()
    }
}

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

/// Attempts of one operation within a deadline: `while retry.next().await { … }`, then give up
/// with `Throttled`.
#[derive(Debug)]
pub struct Retry {
    deadline: Deadline,
    attempt: u32,
}

impl Retry {
    pub fn until(deadline: Deadline) -> Self {
        Retry {
            deadline,
            attempt: 0,
        }
    }

    /// Waits before the next attempt (backoff); false once the deadline has passed.
    pub async fn next(&mut self) -> bool {
        self.attempt += 1;
        if self.attempt == 1 {
            return !self.deadline.passed();
        }
        self.deadline.sleep(backoff(self.attempt)).await
    }

    /// The next attempt without waiting: the previous one lost to someone who made progress (a
    /// failed condition), so there is nothing to wait for.
    pub fn next_now(&mut self) -> bool {
        self.attempt += 1;
        !self.deadline.passed()
    }
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

    #[tokio::test]
    async fn retries_end_at_the_deadline() {
        let mut fresh = Retry::until(Deadline::after(Duration::from_secs(5)));
        assert!(fresh.next().await, "the first attempt runs");
        assert!(fresh.next().await, "a retry within the deadline runs");
        assert!(fresh.next_now());
        let mut spent = Retry::until(Deadline::after(Duration::ZERO));
        assert!(!spent.next().await, "nothing runs past the deadline");
        assert!(!spent.next_now());
    }

    #[tokio::test]
    async fn a_sleep_never_outlasts_the_deadline() {
        let d = Deadline::after(Duration::from_millis(30));
        let started = Instant::now();
        assert!(!d.sleep(Duration::from_secs(10)).await);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
