//! Injected faults ("the next N requests matching op/table/key get KIND") and injected latency.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// Errors answered without forwarding (HTTP 400, or 500 for InternalServerError).
    ProvisionedThroughputExceededException,
    ThrottlingException,
    RequestLimitExceeded,
    InternalServerError,
    /// Forwarded after `delayMs`.
    #[serde(rename = "slow")]
    Slow,
    /// Late on the wire: it reaches the table `delayMs` after it was sent, holding nothing
    /// meanwhile (`slow` holds its items while it waits, as a transaction in flight does).
    #[serde(rename = "late")]
    Late,
    /// Forwarded (the write happens), then the connection is closed without an answer.
    #[serde(rename = "answerLost")]
    AnswerLost,
    /// Forwarded, then answered with a 500 InternalServerError.
    #[serde(rename = "answerLost500")]
    AnswerLost500,
    /// Forwarded (the write happens, its items are free again), then answered after `delayMs`:
    /// a client that gives up or dies meanwhile never learns the outcome.
    #[serde(rename = "answerSlow")]
    AnswerSlow,
}

/// A fault rule. `op` is the operation (`PutItem`) or the whole target
/// (`Kinesis_20131202.PutRecords`); `table` any table the request touches; `key` the scalar text
/// of any partition-key value it touches. An absent field matches everything.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub kind: FaultKind,
    /// How many matching requests get it.
    #[serde(default = "one")]
    pub count: u32,
    /// For `slow` and `answerSlow`.
    #[serde(default)]
    pub delay_ms: u64,
}

fn one() -> u32 {
    1
}

impl FaultSpec {
    pub fn new(kind: FaultKind) -> Self {
        FaultSpec {
            op: None,
            table: None,
            key: None,
            kind,
            count: 1,
            delay_ms: 0,
        }
    }

    fn matches(&self, target: &str, tables: &[String], keys: &[String]) -> bool {
        let op = target.split_once('.').map_or(target, |(_, op)| op);
        self.op.as_ref().is_none_or(|o| o == op || o == target)
            && self.table.as_ref().is_none_or(|t| tables.contains(t))
            && self.key.as_ref().is_none_or(|k| keys.contains(k))
    }
}

#[derive(Default)]
pub struct Faults {
    rules: Mutex<Vec<FaultSpec>>,
}

impl Faults {
    pub fn add(&self, spec: FaultSpec) {
        if spec.count > 0 {
            self.rules.lock().expect("faults lock").push(spec);
        }
    }

    /// The first rule matching this request, used up by it.
    pub fn take(&self, target: &str, tables: &[String], keys: &[String]) -> Option<FaultSpec> {
        let mut rules = self.rules.lock().expect("faults lock");
        let i = rules.iter().position(|r| r.matches(target, tables, keys))?;
        let fired = rules[i].clone();
        rules[i].count -= 1;
        if rules[i].count == 0 {
            rules.remove(i);
        }
        Some(fired)
    }

    pub fn pending(&self) -> Vec<FaultSpec> {
        self.rules.lock().expect("faults lock").clone()
    }

    pub fn clear(&self) {
        self.rules.lock().expect("faults lock").clear();
    }
}

/// Latency: `base_ms` plus an exponential tail whose 99th percentile is `p99_ms`, drawn from a
/// seeded sequence (the n-th call of a run gets the same delay every run).
#[derive(Default)]
pub struct Latency {
    n: AtomicU64,
}

impl Latency {
    pub fn next(&self, base_ms: f64, p99_ms: f64, seed: u64) -> Duration {
        let n = self.n.fetch_add(1, Ordering::Relaxed);
        let tail_mean = (p99_ms - base_ms).max(0.0) / 100f64.ln();
        let u = (splitmix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 11) as f64
            / (1u64 << 53) as f64;
        let ms = base_ms.max(0.0) - tail_mean * (1.0 - u).ln();
        Duration::from_secs_f64(ms / 1000.0)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::strings as s;

    #[test]
    fn faults_match_op_table_and_key_and_are_used_up() {
        let f = Faults::default();
        f.add(FaultSpec {
            op: Some("PutItem".into()),
            table: Some("t".into()),
            key: Some("k1".into()),
            count: 2,
            ..FaultSpec::new(FaultKind::ThrottlingException)
        });
        let target = "DynamoDB_20120810.PutItem";
        assert!(f
            .take("DynamoDB_20120810.GetItem", &s(&["t"]), &s(&["k1"]))
            .is_none());
        assert!(f.take(target, &s(&["u"]), &s(&["k1"])).is_none());
        assert!(f.take(target, &s(&["t"]), &s(&["k2"])).is_none());
        assert!(f.take(target, &s(&["t"]), &s(&["k1"])).is_some());
        assert!(f.take(target, &s(&["u", "t"]), &s(&["k0", "k1"])).is_some());
        assert!(
            f.take(target, &s(&["t"]), &s(&["k1"])).is_none(),
            "used up after 2"
        );
        // A whole target matches other services too; no table/key needed.
        f.add(FaultSpec {
            op: Some("Kinesis_20131202.PutRecords".into()),
            ..FaultSpec::new(FaultKind::InternalServerError)
        });
        assert!(f.take("Kinesis_20131202.PutRecords", &[], &[]).is_some());
        let json: FaultSpec = serde_json::from_str(r#"{"kind":"slow","delayMs":50}"#).unwrap();
        assert_eq!(
            (json.kind, json.delay_ms, json.count),
            (FaultKind::Slow, 50, 1)
        );
        let json: FaultSpec =
            serde_json::from_str(r#"{"kind":"answerSlow","delayMs":9000,"count":2}"#).unwrap();
        assert_eq!(
            (json.kind, json.delay_ms, json.count),
            (FaultKind::AnswerSlow, 9000, 2)
        );
    }

    #[test]
    fn latency_is_seeded_and_has_the_asked_tail() {
        let (a, b) = (Latency::default(), Latency::default());
        let draw =
            |l: &Latency| -> Vec<Duration> { (0..2000).map(|_| l.next(5.0, 50.0, 7)).collect() };
        let (mut x, y) = (draw(&a), draw(&b));
        assert_eq!(x, y);
        assert!(x.iter().all(|d| *d >= Duration::from_millis(5)));
        x.sort();
        let p99 = x[1980].as_secs_f64() * 1000.0;
        assert!((40.0..62.0).contains(&p99), "p99 {p99}");
        assert_eq!(Latency::default().next(0.0, 0.0, 1), Duration::ZERO);
    }
}
