//! Per-user rate limits (docs/api.md §24): a token bucket kept as one number, its "theoretical
//! arrival time" (GCRA, the generic cell rate algorithm). `tat` is when the bucket would be full
//! again; each admitted request moves it `weight × interval` later. A request at `now` is admitted
//! while `max(tat, now) + weight × interval − now ≤ burst × interval`: `burst` at once, then one
//! per `interval`. One number, so that the store can keep it on a tiny item and update it with one
//! conditional write, whichever instance serves the request.
//!
//! The store cannot take `max(tat, now)` in an update expression, so a decision names which of
//! the two updates applies: `Fresh` (the bucket is full: `tat := now + cost`, on condition
//! `tat ≤ now`) or `Behind` (`tat := tat + cost`, on condition `now < tat ≤ now + slack`).

use std::time::Duration;

/// A limit: `per_second` requests a second, `burst` at once. `per_second == 0`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub per_second: u32,
    pub burst: u32,
}

/// What a request at `now` does to the bucket (times in microseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The bucket is full (`tat ≤ now`, or none yet): `tat := to`, on condition `tat ≤ now`.
    Fresh { to: u64 },
    /// Tokens were used recently: `tat := tat + cost`, on condition `now < tat ≤ now + slack`.
    Behind { cost: u64, slack: u64 },
    /// Over the limit: refused, nothing written; `retry_after` whole seconds (≥ 1).
    Over { retry_after: u64 },
}

impl Bucket {
    pub const OFF: Bucket = Bucket {
        per_second: 0,
        burst: 0,
    };

    pub fn is_on(&self) -> bool {
        self.per_second > 0
    }

    /// Microseconds per token.
    pub fn interval_us(&self) -> u64 {
        1_000_000 / u64::from(self.per_second.max(1))
    }

    /// What a request of `weight` tokens at `now_us` does, given the stored `tat` (None: never
    /// used). `weight` is capped at `burst` (a sampled debit can never be refused for its size
    /// alone).
    pub fn take(&self, tat: Option<u64>, now_us: u64, weight: u32) -> Take {
        let interval = self.interval_us();
        let cost = u64::from(weight.clamp(1, self.burst.max(1))) * interval;
        let capacity = u64::from(self.burst.max(1)) * interval;
        // The latest `tat` that still admits this request.
        let slack = capacity - cost;
        match tat {
            None => Take::Fresh { to: now_us + cost },
            Some(t) if t <= now_us => Take::Fresh { to: now_us + cost },
            Some(t) if t - now_us <= slack => Take::Behind { cost, slack },
            Some(t) => Take::Over {
                retry_after: whole_seconds(t - now_us - slack),
            },
        }
    }

    /// The bucket after admitting one request at `now_us` (a bucket kept in memory), or None:
    /// refused.
    pub fn admit(&self, tat: Option<u64>, now_us: u64) -> Option<u64> {
        match self.take(tat, now_us, 1) {
            Take::Fresh { to } => Some(to),
            Take::Behind { cost, .. } => tat.map(|t| t + cost),
            Take::Over { .. } => None,
        }
    }

    /// Whether a `tat` this instance has seen already refuses a request now (no call needed:
    /// `tat` only ever grows, so the stored one is at least as late). The seconds to wait.
    pub fn refused_by(&self, seen_tat: u64, now_us: u64) -> Option<u64> {
        match self.take(Some(seen_tat), now_us, 1) {
            Take::Over { retry_after } => Some(retry_after),
            _ => None,
        }
    }
}

/// How often a user's refused sends may look up whether they are retries of a stored send (to
/// answer those with the original), per instance: a flood of refused sends then costs its
/// conversation's partition a few reads a second, not one per send. A retry beyond it is refused
/// like any send and learns its outcome after `Retry-After`.
pub const REPLAY_LOOKUPS: Bucket = Bucket {
    per_second: 2,
    burst: 5,
};

/// A wait in microseconds as `Retry-After`: whole seconds, rounded up, at least 1.
pub fn whole_seconds(us: u64) -> u64 {
    us.div_ceil(1_000_000).max(1)
}

/// Slow mode (docs/api.md §25): a member who last sent at `last_sent_ms` may send again at
/// `last_sent_ms + period`. `Some(seconds left)` while it may not (whole seconds, ≥ 1).
pub fn slow_mode_wait(period: Duration, last_sent_ms: Option<u64>, now_ms: u64) -> Option<u64> {
    let next = last_sent_ms? + period.as_millis() as u64;
    (period > Duration::ZERO && next > now_ms).then(|| whole_seconds((next - now_ms) * 1_000))
}

/// The longest slow-mode period a group may set.
pub const MAX_SLOW_MODE_SECONDS: u64 = 120;

#[cfg(test)]
mod tests {
    use super::*;

    const SENDS: Bucket = Bucket {
        per_second: 10,
        burst: 20,
    };

    /// Applies `take` as the store does; `None` when refused.
    fn apply(b: &Bucket, tat: &mut Option<u64>, now: u64, weight: u32) -> Option<u64> {
        match b.take(*tat, now, weight) {
            Take::Fresh { to } => {
                *tat = Some(to);
                None
            }
            Take::Behind { cost, slack } => {
                let t = tat.unwrap();
                assert!(t > now && t - now <= slack);
                *tat = Some(t + cost);
                None
            }
            Take::Over { retry_after } => Some(retry_after),
        }
    }

    #[test]
    fn burst_at_once_then_one_per_interval() {
        let (mut tat, t0) = (None, 1_000_000_000);
        let admitted = (0..1_000)
            .filter(|_| apply(&SENDS, &mut tat, t0, 1).is_none())
            .count();
        assert_eq!(admitted, 20);
        // Refill: one token per 100 ms.
        assert!(apply(&SENDS, &mut tat, t0 + 99_999, 1).is_some());
        assert!(apply(&SENDS, &mut tat, t0 + 100_000, 1).is_none());
        assert!(apply(&SENDS, &mut tat, t0 + 100_000, 1).is_some());
        // A second later: ten more, exactly.
        let later = t0 + 1_100_000;
        let admitted = (0..100)
            .filter(|_| apply(&SENDS, &mut tat, later, 1).is_none())
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn a_flood_over_a_second_gets_burst_plus_rate() {
        // 1,000 requests evenly over one second: 20 + 10 (one per 100 ms after the burst).
        let (mut tat, t0) = (None, 5_000_000);
        let admitted = (0..1_000u64)
            .filter(|i| apply(&SENDS, &mut tat, t0 + i * 1_000, 1).is_none())
            .count();
        assert_eq!(admitted, 20 + 9);
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        let (mut tat, t0) = (None, 0);
        for _ in 0..20 {
            apply(&SENDS, &mut tat, t0, 1);
        }
        assert_eq!(apply(&SENDS, &mut tat, t0, 1), Some(1));
        assert_eq!(whole_seconds(1), 1);
        assert_eq!(whole_seconds(1_000_000), 1);
        assert_eq!(whole_seconds(1_000_001), 2);
        // Refused by what was seen, without a call.
        assert_eq!(SENDS.refused_by(tat.unwrap(), t0), Some(1));
        assert_eq!(SENDS.refused_by(tat.unwrap(), t0 + 100_000), None);
    }

    #[test]
    fn an_idle_bucket_fills_up_to_burst_only() {
        let (mut tat, t0) = (None, 0);
        apply(&SENDS, &mut tat, t0, 1);
        let hour = t0 + 3_600_000_000;
        let admitted = (0..100)
            .filter(|_| apply(&SENDS, &mut tat, hour, 1).is_none())
            .count();
        assert_eq!(admitted, 20);
    }

    #[test]
    fn weighted_debits_count_as_many_tokens() {
        let requests = Bucket {
            per_second: 50,
            burst: 50,
        };
        let (mut tat, t0) = (None, 0);
        let admitted = (0..100)
            .filter(|_| apply(&requests, &mut tat, t0, 10).is_none())
            .count();
        assert_eq!(admitted, 5);
        // A weight above the burst is capped, never refused on a full bucket.
        let (mut tat, t0) = (None, 0);
        assert!(apply(&requests, &mut tat, t0, 500).is_none());
    }

    #[test]
    fn slow_mode_waits_the_rest_of_the_period() {
        let p = Duration::from_secs(10);
        assert_eq!(slow_mode_wait(p, None, 5_000), None);
        assert_eq!(slow_mode_wait(p, Some(1_000), 1_000), Some(10));
        assert_eq!(slow_mode_wait(p, Some(1_000), 10_500), Some(1));
        assert_eq!(slow_mode_wait(p, Some(1_000), 11_000), None);
        assert_eq!(slow_mode_wait(Duration::ZERO, Some(1_000), 1_000), None);
    }

    #[test]
    fn an_in_memory_bucket_admits_its_burst_then_its_rate() {
        let b = REPLAY_LOOKUPS;
        let mut tat = None;
        let mut admitted = 0;
        for _ in 0..20 {
            if let Some(t) = b.admit(tat, 1_000_000) {
                tat = Some(t);
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "the burst, at one instant");
        assert_eq!(b.admit(tat, 1_000_000 + 499_999), None);
        assert!(
            b.admit(tat, 1_000_000 + 500_000).is_some(),
            "one more per 1/rate"
        );
    }
}
