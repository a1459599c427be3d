//! Which routine log lines are written (docs/cost.md, "Logs"): a REST request's `request` line and a
//! stream consumer's per-batch line cost more in CloudWatch ingestion than the work they describe
//! ($0.33 per 1 M requests for a 665-byte line). Every line that says something went wrong or
//! was slow is kept; of the ordinary ones, one in `every` (per function instance), so an operator
//! still sees the traffic's shape. The access log of the APIs stays one line per request.

/// What an operator sets (`CHAT_LOG_EVERY`, `CHAT_LOG_SLOW_MS`; README "Operating it").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSampling {
    /// One ordinary line in this many is written: 1 writes all, 0 none.
    pub every: u64,
    /// A request or batch at least this slow (ms) is always logged.
    pub slow_ms: u64,
}

impl LogSampling {
    pub const DEFAULT: LogSampling = LogSampling {
        every: 20,
        slow_ms: 1_000,
    };

    /// From the two settings as given (unset: the default); a value that is not a whole number
    /// is refused, so a typo cannot silently turn the lines off.
    pub fn parse(every: Option<&str>, slow_ms: Option<&str>) -> Result<LogSampling, String> {
        let number = |name: &str, v: Option<&str>, default: u64| match v.map(str::trim) {
            None | Some("") => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| format!("{name} must be a whole number, not {v:?}")),
        };
        Ok(LogSampling {
            every: number("CHAT_LOG_EVERY", every, Self::DEFAULT.every)?,
            slow_ms: number("CHAT_LOG_SLOW_MS", slow_ms, Self::DEFAULT.slow_ms)?,
        })
    }

    /// Whether the `nth` line of its kind (counted from 0 per instance) is written: always when
    /// `abnormal` (an error, a 4xx or 5xx, a 429, a retry or failure in a batch) or slow, else one
    /// in `every`.
    pub fn keeps(&self, abnormal: bool, latency_ms: u64, nth: u64) -> bool {
        abnormal || latency_ms >= self.slow_ms || (self.every > 0 && nth.is_multiple_of(self.every))
    }

    /// A REST request's line: abnormal when its status is 400 or above (429 and 5xx included).
    pub fn keeps_request(&self, status: u16, latency_ms: u64, nth: u64) -> bool {
        self.keeps(status >= 400, latency_ms, nth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_lines_are_sampled_one_in_every() {
        let s = LogSampling::DEFAULT;
        let kept = (0..100).filter(|&n| s.keeps_request(200, 5, n)).count();
        assert_eq!(kept, 5);
        let all = LogSampling { every: 1, ..s };
        assert_eq!(
            (0..100).filter(|&n| all.keeps_request(201, 5, n)).count(),
            100
        );
        let none = LogSampling { every: 0, ..s };
        assert_eq!(
            (0..100).filter(|&n| none.keeps_request(200, 5, n)).count(),
            0
        );
    }

    #[test]
    fn errors_throttles_and_slow_requests_are_always_logged() {
        let s = LogSampling {
            every: 0,
            ..LogSampling::DEFAULT
        };
        for status in [400, 401, 404, 409, 429, 500, 503] {
            assert!(s.keeps_request(status, 5, 7), "{status}");
        }
        assert!(s.keeps_request(200, 1_000, 7));
        assert!(!s.keeps_request(200, 999, 7));
        assert!(s.keeps(true, 0, 3));
    }

    #[test]
    fn settings_parse_or_are_refused() {
        assert_eq!(LogSampling::parse(None, None), Ok(LogSampling::DEFAULT));
        assert_eq!(
            LogSampling::parse(Some("1"), Some(" 250 ")),
            Ok(LogSampling {
                every: 1,
                slow_ms: 250
            })
        );
        assert!(LogSampling::parse(Some("often"), None).is_err());
        assert!(LogSampling::parse(None, Some("-1")).is_err());
    }
}
