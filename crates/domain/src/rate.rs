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
    /// A sampled debit of a bucket in use: `tat := tat + cost`, on condition `now < tat` (no upper
    /// bound: it pays for requests already admitted); the request itself is admitted if the
    /// bucket as it was admits one token (`admits`).
    Charge { cost: u64 },
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

    /// A sampled debit at `now_us` (the all-requests limit: a sampled request debits, the others
    /// go by what their instance saw): the request's own token and one for each of the `owed`
    /// requests its instance admitted since its last debit. Those are charged whatever the
    /// bucket holds: a debit refused for want of tokens would leave them free, and every
    /// instance could then grant about the full rate on its own. With nothing owed, a plain
    /// take of one token (refused, nothing is charged). Refused without a write when the `tat`
    /// seen already refuses a request of one token.
    pub fn debit(&self, tat: Option<u64>, now_us: u64, owed: u32) -> Take {
        if owed == 0 {
            return self.take(tat, now_us, 1);
        }
        let cost = (u64::from(owed) + 1) * self.interval_us();
        match tat {
            None => Take::Fresh { to: now_us + cost },
            Some(t) if t <= now_us => Take::Fresh { to: now_us + cost },
            Some(t) => match self.refused_by(t, now_us) {
                Some(retry_after) => Take::Over { retry_after },
                None => Take::Charge { cost },
            },
        }
    }

    /// Whether a `tat` this instance has seen refuses a request that is not sampled (the
    /// all-requests limit, one in `sample` debits), after the `owed` it admitted since: while
    /// the bucket as seen, less those, holds fewer than `sample` tokens, only the sampled
    /// requests go on, each paying its way; so what an instance admits before its next debit
    /// was in the bucket when it last looked. The seconds to wait.
    pub fn refuses_unsampled(
        &self,
        seen_tat: u64,
        owed: u32,
        now_us: u64,
        sample: u32,
    ) -> Option<u64> {
        let seen_tat = seen_tat.max(now_us) + u64::from(owed) * self.interval_us();
        match self.take(Some(seen_tat), now_us, sample) {
            Take::Over { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// What a request that was not drawn does (the all-requests limit): admitted by what this
    /// instance saw; refused, when that already refuses a request of one token (the stored `tat`
    /// is at least as late: certain); or, near the limit (`refuses_unsampled`), drawn after all:
    /// it debits as a sampled request does, so that only the stored bucket refuses it (found by
    /// probing: under load, lumpy debits made instances refuse a user at 30 requests a second
    /// by their view alone).
    pub fn unsampled(&self, seen_tat: u64, owed: u32, now_us: u64, sample: u32) -> Unsampled {
        if let Some(retry_after) = self.refused_by(seen_tat, now_us) {
            return Unsampled::Refuse { retry_after };
        }
        match self.refuses_unsampled(seen_tat, owed, now_us, sample) {
            None => Unsampled::Admit,
            Some(_) => Unsampled::Draw,
        }
    }

    /// Whether the bucket as it was before a charge (`tat`) admits the charging request: as a
    /// request of one token. The seconds to wait when not.
    pub fn admits(&self, tat: u64, now_us: u64) -> Result<(), u64> {
        match self.refused_by(tat, now_us) {
            Some(retry_after) => Err(retry_after),
            None => Ok(()),
        }
    }

    /// The bucket after admitting one request at `now_us` (a bucket kept in memory), or None:
    /// refused.
    pub fn admit(&self, tat: Option<u64>, now_us: u64) -> Option<u64> {
        match self.take(tat, now_us, 1) {
            Take::Fresh { to } => Some(to),
            Take::Behind { cost, .. } | Take::Charge { cost } => tat.map(|t| t + cost),
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

/// What a request that was not drawn does (`Bucket::unsampled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsampled {
    Admit,
    Refuse { retry_after: u64 },
    Draw,
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
            Take::Charge { .. } => unreachable!("a send is never charged"),
        }
    }

    /// A user flooding `instances` instances (1,000 requests a second, round robin) for 10 s
    /// under the all-requests limit sampled one in 16: every instance refuses by what it saw,
    /// and draws as the store does (a stored `tat` shared by all, conditional writes). Returns
    /// the requests admitted.
    fn sampled_flood(instances: usize) -> u64 {
        let b = Bucket {
            per_second: 50,
            burst: 50,
        };
        let (sample, t0) = (16u32, 1_000_000_000u64);
        let mut stored: Option<u64> = None;
        let mut seen: Vec<Option<u64>> = vec![None; instances];
        let mut served = vec![0u32; instances];
        // Admitted without a debit since the instance's last one.
        let mut owed = vec![0u32; instances];
        let mut admitted = 0;
        for ms in 0..10_000u64 {
            let now = t0 + ms * 1_000;
            let i = ms as usize % instances;
            served[i] += 1;
            if !served[i].is_multiple_of(sample) {
                match b.unsampled(seen[i].unwrap_or(now), owed[i], now, sample) {
                    Unsampled::Admit => {
                        admitted += 1;
                        owed[i] += 1;
                        continue;
                    }
                    Unsampled::Refuse { .. } => continue,
                    Unsampled::Draw => {}
                }
            }
            // The draw: a wrong guess is corrected from the stored value and tried again.
            loop {
                match b.debit(seen[i], now, owed[i]) {
                    Take::Over { .. } => break,
                    Take::Fresh { to } if stored.is_none_or(|t| t <= now) => {
                        stored = Some(to);
                        seen[i] = stored;
                        owed[i] = 0;
                        admitted += 1;
                        break;
                    }
                    Take::Behind { cost, slack }
                        if stored.is_some_and(|t| t > now && t - now <= slack) =>
                    {
                        stored = Some(stored.unwrap() + cost);
                        seen[i] = stored;
                        admitted += 1;
                        break;
                    }
                    Take::Charge { cost } if stored.is_some_and(|t| t > now) => {
                        let before = stored.unwrap();
                        stored = Some(before + cost);
                        seen[i] = stored;
                        owed[i] = 0;
                        admitted += u64::from(b.admits(before, now).is_ok());
                        break;
                    }
                    _ => seen[i] = stored,
                }
            }
        }
        admitted
    }

    #[test]
    fn a_sampled_limit_holds_across_instances() {
        // 50 a second for 10 s and the burst: 550, give or take what the instances admit before
        // their draws see the bucket (at most a sample each, now and then).
        for instances in [1, 4, 16, 32] {
            let admitted = sampled_flood(instances);
            assert!(
                (450..=550 + 16 * instances as u64).contains(&admitted),
                "{instances} instances admitted {admitted}"
            );
        }
    }

    #[test]
    fn a_request_near_the_limit_is_drawn_not_refused_by_a_view() {
        let b = Bucket {
            per_second: 50,
            burst: 50,
        };
        let (now, interval) = (1_000_000_000u64, b.interval_us());
        // The view: 40 of 50 tokens used (a lump another instance charged): 10 left.
        let seen = now + 40 * interval;
        assert_eq!(b.unsampled(seen, 0, now, 16), Unsampled::Draw);
        assert_eq!(b.unsampled(now, 0, now, 16), Unsampled::Admit);
        // Past the limit in the view: certain, refused without a write.
        let over = now + 50 * interval;
        assert!(matches!(
            b.unsampled(over, 0, now, 16),
            Unsampled::Refuse { .. }
        ));
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
