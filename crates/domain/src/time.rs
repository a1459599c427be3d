//! Wall-clock times: display only (`seq` is the order), RFC 3339 UTC with milliseconds.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// `2026-11-30T03:44:07.123Z`: fixed width, so the strings also sort by time.
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

pub fn now_rfc3339() -> String {
    rfc3339(now())
}

pub fn unix_seconds(t: OffsetDateTime) -> i64 {
    t.unix_timestamp()
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis(t: OffsetDateTime) -> u64 {
    (t.unix_timestamp_nanos() / 1_000_000).max(0) as u64
}

/// Microseconds since the Unix epoch (orders sends waiting for a group commit).
pub fn unix_micros(t: OffsetDateTime) -> u64 {
    (t.unix_timestamp_nanos() / 1_000).max(0) as u64
}

/// An RFC 3339 time, in UTC. None also for one whose UTC time falls outside the years 0000–9999
/// (`9999-12-31T23:00:00-01:00`): `rfc3339` could not write it back as RFC 3339.
pub fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    let utc = OffsetDateTime::parse(s, &Rfc3339)
        .ok()?
        .checked_to_offset(time::UtcOffset::UTC)?;
    (0..=9999).contains(&utc.year()).then_some(utc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_whose_utc_year_leaves_0000_to_9999_are_not_rfc_3339() {
        for bad in [
            "9999-12-31T23:00:00-01:00",
            "9999-12-31T23:59:59.999-01:00",
            "0000-01-01T00:30:00+01:00",
            "tomorrow",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        for (good, utc) in [
            ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59.000Z"),
            ("0000-01-01T00:30:00+00:30", "0000-01-01T00:00:00.000Z"),
            ("2026-12-03T18:00:00+01:00", "2026-12-03T17:00:00.000Z"),
        ] {
            assert_eq!(parse_rfc3339(good).map(rfc3339).as_deref(), Some(utc));
        }
    }

    #[test]
    fn formats_fixed_width_utc() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_764_474_247_123_456_789).unwrap();
        let s = rfc3339(t);
        assert_eq!(s, "2025-11-30T03:44:07.123Z");
        assert_eq!(
            parse_rfc3339(&s).unwrap().unix_timestamp(),
            t.unix_timestamp()
        );
    }
}
