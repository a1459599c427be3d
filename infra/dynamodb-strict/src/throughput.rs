//! Per-partition throughput: a token bucket per (table or index, partition-key value) and
//! direction, refilled at DynamoDB's per-partition limits (1,000 write / 3,000 read units a
//! second, times a scale), holding at most `burst_secs` of them. A request is refused when a
//! bucket it needs is empty (under one unit) on arrival; an admitted one is charged an estimate then, settled to
//! its actual units once answered (a bucket may go negative after a large charge). Also the
//! record: units, peak units in any 1-s window (at 100-ms resolution), throttled requests.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartitionId {
    pub table: String,
    /// A global secondary index has partitions of its own.
    pub index: Option<String>,
    pub key: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dir {
    Read,
    Write,
}

#[derive(Clone, Debug)]
pub struct Charge {
    pub part: PartitionId,
    pub dir: Dir,
    pub units: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub write_per_sec: f64,
    pub read_per_sec: f64,
    pub burst_secs: f64,
}

#[derive(Default)]
struct Usage {
    tokens: f64,
    at: Option<Instant>,
    units: f64,
    requests: u64,
    throttled: u64,
    slots: [f64; 10],
    slot: u64,
    peak: f64,
}

impl Usage {
    fn refill(&mut self, now: Instant, rate: f64, burst: f64) -> f64 {
        let cap = (rate * burst).max(0.0);
        self.tokens = match self.at {
            None => cap,
            Some(at) => (self.tokens + rate * (now - at).as_secs_f64()).min(cap),
        };
        self.at = Some(now);
        self.tokens
    }

    fn record(&mut self, slot: u64, units: f64) {
        if slot > self.slot {
            for s in (self.slot + 1)..=slot.min(self.slot + 10) {
                self.slots[(s % 10) as usize] = 0.0;
            }
            self.slot = slot;
        }
        self.slots[(slot % 10) as usize] += units;
        self.units += units;
        self.peak = self.peak.max(self.slots.iter().sum());
    }
}

#[derive(Default)]
struct Partition {
    read: Usage,
    write: Usage,
}

impl Partition {
    fn usage(&mut self, dir: Dir) -> &mut Usage {
        match dir {
            Dir::Read => &mut self.read,
            Dir::Write => &mut self.write,
        }
    }
}

pub struct Throughput {
    parts: Mutex<HashMap<PartitionId, Partition>>,
    start: Instant,
}

impl Default for Throughput {
    fn default() -> Self {
        Throughput {
            parts: Mutex::default(),
            start: Instant::now(),
        }
    }
}

impl Limits {
    fn rate(&self, dir: Dir) -> f64 {
        match dir {
            Dir::Read => self.read_per_sec,
            Dir::Write => self.write_per_sec,
        }
    }
}

impl Throughput {
    /// Admits groups of charges (one group per item of a request). `all`: every group or none
    /// (a transaction, a single-item call); otherwise each group on its own (batch items).
    /// Returns which groups were admitted; admitted ones are charged their estimates.
    pub fn admit(&self, groups: &[Vec<Charge>], all: bool, limits: &Limits) -> Vec<bool> {
        let now = Instant::now();
        let mut parts = self.parts.lock().expect("throughput lock");
        let mut ok = Vec::with_capacity(groups.len());
        for g in groups {
            let mut admitted = true;
            for c in g {
                let u = parts.entry(c.part.clone()).or_default().usage(c.dir);
                // Empty: less than one unit (or than the charge, for a half-unit read) left.
                if u.refill(now, limits.rate(c.dir), limits.burst_secs) < c.units.min(1.0) {
                    u.throttled += 1;
                    admitted = false;
                }
            }
            if admitted && !all {
                Self::charge(&mut parts, g);
            }
            ok.push(admitted);
        }
        if all && ok.iter().all(|&a| a) {
            groups.iter().for_each(|g| Self::charge(&mut parts, g));
        }
        ok
    }

    fn charge(parts: &mut HashMap<PartitionId, Partition>, g: &[Charge]) {
        for c in g {
            parts.entry(c.part.clone()).or_default().usage(c.dir).tokens -= c.units;
        }
    }

    /// Records a forwarded request's `actual` units; `metered`: it was admitted, its bucket
    /// is trued up from the estimate charged on arrival to the actual units.
    pub fn settle(&self, c: &Charge, actual: f64, metered: bool) {
        let slot = (self.start.elapsed().as_millis() / 100) as u64;
        let mut parts = self.parts.lock().expect("throughput lock");
        let u = parts.entry(c.part.clone()).or_default().usage(c.dir);
        if metered {
            u.tokens += c.units - actual;
        }
        u.requests += 1;
        u.record(slot, actual);
    }

    pub fn reset(&self) {
        self.parts.lock().expect("throughput lock").clear();
    }

    /// The record, busiest partitions first.
    pub fn snapshot(&self) -> Value {
        let parts = self.parts.lock().expect("throughput lock");
        let mut rows: Vec<(f64, Value)> = parts
            .iter()
            .map(|(id, p)| {
                let row = json!({
                    "table": id.table, "index": id.index, "key": id.key,
                    "writeUnits": p.write.units, "readUnits": p.read.units,
                    "writeRequests": p.write.requests, "readRequests": p.read.requests,
                    "peakWriteUnitsPerSec": p.write.peak, "peakReadUnitsPerSec": p.read.peak,
                    "throttledWrites": p.write.throttled, "throttledReads": p.read.throttled,
                });
                (p.write.units + p.read.units, row)
            })
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        Value::Array(rows.into_iter().map(|r| r.1).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(key: &str, units: f64) -> Vec<Charge> {
        let part = PartitionId {
            table: "t".into(),
            index: None,
            key: key.into(),
        };
        vec![Charge {
            part,
            dir: Dir::Write,
            units,
        }]
    }

    const LIMITS: Limits = Limits {
        write_per_sec: 10.0,
        read_per_sec: 30.0,
        burst_secs: 1.0,
    };

    #[test]
    fn bucket_refuses_once_empty_and_refills_at_the_rate() {
        let t = Throughput::default();
        // 10 units of burst: ten 1-unit writes pass, the eleventh is refused.
        for _ in 0..10 {
            assert_eq!(t.admit(&[charge("hot", 1.0)], true, &LIMITS), vec![true]);
        }
        assert_eq!(t.admit(&[charge("hot", 1.0)], true, &LIMITS), vec![false]);
        // Another partition is not affected.
        assert_eq!(t.admit(&[charge("cold", 1.0)], true, &LIMITS), vec![true]);
        // 10 units/s: after 150 ms one unit is back.
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert_eq!(t.admit(&[charge("hot", 1.0)], true, &LIMITS), vec![true]);
        let rows = t.snapshot();
        let hot = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "hot")
            .unwrap();
        assert_eq!(hot["throttledWrites"], 1);
    }

    #[test]
    fn a_large_charge_drives_the_bucket_negative_and_groups_are_all_or_each() {
        let t = Throughput::default();
        // Admitted while not empty, then 25 units in debt: refused for ~1.5 s.
        assert_eq!(t.admit(&[charge("p", 35.0)], true, &LIMITS), vec![true]);
        assert_eq!(t.admit(&[charge("p", 1.0)], true, &LIMITS), vec![false]);
        // All-or-nothing: q is not charged when p refuses; batch mode charges q alone.
        let groups = [charge("q", 5.0), charge("p", 1.0)];
        assert_eq!(t.admit(&groups, true, &LIMITS), vec![true, false]);
        assert_eq!(t.admit(&groups, false, &LIMITS), vec![true, false]);
        assert_eq!(t.admit(&[charge("q", 6.0)], true, &LIMITS), vec![true]);
        assert_eq!(t.admit(&[charge("q", 1.0)], true, &LIMITS), vec![false]);
    }

    #[test]
    fn record_keeps_totals_and_the_peak_second() {
        let t = Throughput::default();
        let c = &charge("p", 0.0)[0];
        for _ in 0..5 {
            t.settle(c, 2.0, true);
        }
        let rows = t.snapshot();
        assert_eq!(rows[0]["writeUnits"], 10.0);
        assert_eq!(rows[0]["writeRequests"], 5);
        assert_eq!(rows[0]["peakWriteUnitsPerSec"], 10.0);
    }
}
