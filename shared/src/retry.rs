//! Bounded retries with jittered exponential backoff for optimistic-concurrency conflicts: a hot
//! conversation keeps making progress, and a request that still loses gives up with `429` instead
//! of hanging.
//!
//! The bound is time, not a count: how many attempts a contended send needs depends on how many
//! writers compete and how fast the database answers, while what a client can wait for is a
//! duration (REST functions time out after 10 s).

use std::time::{Duration, Instant};

/// How long one request may keep retrying before it answers `429 throttled`.
pub const RETRY_BUDGET: Duration = Duration::from_secs(6);

/// Delay before attempt `attempt` (1-based; the first attempt does not wait): random up to 5, 10,
/// 20 … ms, capped at 640 ms. Full jitter spreads contending writers out instead of letting them
/// collide again in lockstep; the growing cap adapts to however many of them there are. (Retrying
/// old requests more eagerly, to stop fresh ones overtaking them, was measured: fewer 429s under
/// overload but half the throughput of a hot conversation, see README "Benchmark".)
pub fn backoff(attempt: u32) -> Duration {
    if attempt <= 1 {
        return Duration::ZERO;
    }
    let cap_ms = 5u64 << (attempt - 2).min(7);
    let jitter = uuid::Uuid::new_v4().as_u128() as u64 % (cap_ms + 1);
    Duration::from_millis(jitter.max(1))
}

/// Attempts of one operation: `while retry.next().await { … }` then give up with `Throttled`.
#[derive(Debug)]
pub struct Retry {
    started: Instant,
    attempt: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            started: Instant::now(),
            attempt: 0,
        }
    }
}

impl Retry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits before the next attempt; false once the time budget is spent.
    pub async fn next(&mut self) -> bool {
        self.attempt += 1;
        if self.attempt > 1 {
            if self.started.elapsed() >= RETRY_BUDGET {
                return false;
            }
            tokio::time::sleep(backoff(self.attempt)).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(backoff(1), Duration::ZERO);
        for a in 2..50 {
            assert!(backoff(a) <= Duration::from_millis(640));
            assert!(backoff(a) >= Duration::from_millis(1));
        }
    }

    #[tokio::test]
    async fn retries_end_after_the_budget() {
        let mut fresh = Retry::new();
        assert!(fresh.next().await, "the first attempt always runs");
        assert!(fresh.next().await, "a retry within the budget runs");
        let mut spent = Retry {
            started: Instant::now() - RETRY_BUDGET,
            attempt: 1,
        };
        assert!(!spent.next().await, "no retry once the budget is spent");
    }
}
