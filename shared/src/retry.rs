//! Bounded retries with jittered exponential backoff for optimistic-concurrency conflicts: a hot
//! conversation keeps making progress, and a request that still loses gives up with `429` instead
//! of hanging.

use std::time::Duration;

pub const MAX_ATTEMPTS: u32 = 20;

/// Delay before attempt `attempt` (1-based; the first attempt does not wait): up to 5, 10, 20 … ms,
/// capped at 250 ms, with full jitter so that contending writers spread out instead of colliding
/// again in lockstep. 20 attempts wait about 1.8 s in all on average (3.6 s at most), well inside
/// a Lambda timeout.
pub fn backoff(attempt: u32) -> Duration {
    if attempt <= 1 {
        return Duration::ZERO;
    }
    let cap_ms = (5u64 << (attempt - 2).min(6)).min(250);
    let jitter = uuid::Uuid::new_v4().as_u128() as u64 % (cap_ms + 1);
    Duration::from_millis(jitter.max(1))
}

/// Waits before attempt `attempt`; loops over `1..=MAX_ATTEMPTS` call it first and end in
/// `ChatError::Throttled` when every attempt lost its race.
pub async fn pause(attempt: u32) {
    let d = backoff(attempt);
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(backoff(1), Duration::ZERO);
        for a in 2..50 {
            assert!(backoff(a) <= Duration::from_millis(250));
            assert!(backoff(a) >= Duration::from_millis(1));
        }
    }
}
