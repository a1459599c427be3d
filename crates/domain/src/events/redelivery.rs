//! What the fanout already got through of the Kinesis records Lambda delivers again, pure
//! (docs/event-pipeline.md, "Fanout").
//!
//! Lambda resumes a Kinesis batch from the earliest record reported failed: every record after it
//! comes again, other conversations' too, and so do the connections a failed record did reach.
//! A warm instance remembers, for the records it reported or that follow one it reported, whom
//! they reached, and a redelivery pushes only the rest. The memory is per instance: a redelivery
//! that lands on another instance pushes everything again, which clients dedupe by
//! `(conversationId, seq)` (at-least-once).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connection ids.
pub type Connections = Arc<HashSet<String>>;

#[derive(Debug, Clone)]
enum Reach {
    /// Every connection it was for (delivered, or gone for good).
    Everyone,
    /// These connections.
    Only(Connections),
}

/// Whom records reached, by record id (a Kinesis record's `eventID`: shard and sequence number).
#[derive(Debug, Default)]
pub struct Redeliveries {
    records: HashMap<String, (Instant, Reach)>,
}

impl Redeliveries {
    /// Records remembered at most; past this, everything is forgotten at once (a lost entry only
    /// costs duplicates).
    pub const MAX_RECORDS: usize = 20_000;
    /// How long a record is remembered: Lambda redelivers a reported batch at once, and gives
    /// up after its retries (`MaximumRetryAttempts`).
    pub const KEEP: Duration = Duration::from_secs(600);

    fn get(&self, record: &str, now: Instant) -> Option<&Reach> {
        self.records
            .get(record)
            .filter(|(at, _)| now.duration_since(*at) < Self::KEEP)
            .map(|(_, reach)| reach)
    }

    /// Whether an earlier invocation got `record` through to every connection it was for.
    pub fn reached_everyone(&self, record: &str, now: Instant) -> bool {
        matches!(self.get(record, now), Some(Reach::Everyone))
    }

    /// Whether an earlier invocation got `record` through to `connection`.
    pub fn reached(&self, record: &str, connection: &str, now: Instant) -> bool {
        match self.get(record, now) {
            Some(Reach::Everyone) => true,
            Some(Reach::Only(c)) => c.contains(connection),
            None => false,
        }
    }

    /// `record` got through to every connection it was for.
    pub fn everyone(&mut self, record: &str, now: Instant) {
        self.put(record, Reach::Everyone, now);
    }

    /// `record` got through to `connections`, besides those an earlier invocation reached.
    pub fn some(&mut self, record: &str, connections: &Connections, now: Instant) {
        let reach = match self.get(record, now) {
            Some(Reach::Everyone) => Reach::Everyone,
            Some(Reach::Only(before)) => {
                Reach::Only(Arc::new(before.union(connections).cloned().collect()))
            }
            None => Reach::Only(connections.clone()),
        };
        self.put(record, reach, now);
    }

    fn put(&mut self, record: &str, reach: Reach, now: Instant) {
        if self.records.len() >= Self::MAX_RECORDS && !self.records.contains_key(record) {
            self.records
                .retain(|_, (at, _)| now.duration_since(*at) < Self::KEEP);
            if self.records.len() >= Self::MAX_RECORDS {
                self.records.clear();
            }
        }
        self.records.insert(record.to_owned(), (now, reach));
    }
}

/// The records of `records` that `connection` still needs: those no earlier invocation got
/// through to it.
pub fn due_for<'a>(
    memory: &Redeliveries,
    records: impl IntoIterator<Item = (usize, &'a str)>,
    connection: &str,
    now: Instant,
) -> Vec<usize> {
    records
        .into_iter()
        .filter(|(_, id)| !memory.reached(id, connection, now))
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> Connections {
        Arc::new(ids.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn a_redelivery_skips_whom_a_record_reached() {
        let now = Instant::now();
        let mut m = Redeliveries::default();
        assert!(!m.reached_everyone("s:1", now));
        assert!(!m.reached("s:1", "a", now));
        m.everyone("s:1", now);
        m.some("s:2", &set(&["a", "b"]), now);
        assert!(m.reached_everyone("s:1", now));
        assert!(m.reached("s:1", "anyone", now));
        assert!(!m.reached_everyone("s:2", now));
        assert!(m.reached("s:2", "a", now) && !m.reached("s:2", "c", now));
        // A later invocation adds whom it reached.
        m.some("s:2", &set(&["c"]), now);
        assert!(["a", "b", "c"].iter().all(|c| m.reached("s:2", c, now)));
        m.everyone("s:2", now);
        assert!(m.reached_everyone("s:2", now));
        m.some("s:2", &set(&[]), now);
        assert!(m.reached_everyone("s:2", now), "never taken back");
    }

    #[test]
    fn each_connection_gets_what_it_has_not_had() {
        let now = Instant::now();
        let mut m = Redeliveries::default();
        m.some("s:1", &set(&["a"]), now);
        m.everyone("s:3", now);
        let records = [(0, "s:1"), (1, "s:2"), (2, "s:3")];
        assert_eq!(due_for(&m, records, "a", now), vec![1]);
        assert_eq!(due_for(&m, records, "b", now), vec![0, 1]);
    }

    #[test]
    fn memory_is_bounded_in_time_and_size() {
        let now = Instant::now();
        let mut m = Redeliveries::default();
        m.everyone("old", now);
        let later = now + Redeliveries::KEEP;
        assert!(!m.reached_everyone("old", later), "forgotten after KEEP");
        for i in 0..Redeliveries::MAX_RECORDS + 10 {
            m.everyone(&format!("s:{i}"), now);
        }
        assert!(m.records.len() <= Redeliveries::MAX_RECORDS);
        assert!(m.reached_everyone(&format!("s:{}", Redeliveries::MAX_RECORDS + 9), now));
    }
}
