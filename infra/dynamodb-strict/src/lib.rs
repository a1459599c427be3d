//! A strictness layer for any DynamoDB-API endpoint: an HTTP proxy adding what AWS does and
//! DynamoDB Local does not — transaction conflicts, per-partition throttling, latency and
//! injected faults — plus a per-partition record of units. It knows DynamoDB's wire protocol
//! (JSON 1.0, `X-Amz-Target: DynamoDB_20120810.<Op>`), nothing about any product.
//!
//! # Routing
//! `DynamoDB_20120810.*` gets the rules below and goes to the DynamoDB upstream;
//! `DynamoDBStreams_*` goes there unchanged; anything else (e.g. `Kinesis_20131202.*`) goes to
//! the `other` upstream when one is given, else to the DynamoDB upstream. Only fault rules apply
//! to those. Upstreams are plain `http://` URLs and must not check SigV4 signatures (DynamoDB
//! Local and moto do not): the layer may rewrite a request body (see below).
//!
//! # Rules (each switchable at run time)
//! - **Transaction conflicts** ([`conflicts`], `conflicts`): while a TransactWriteItems is in
//!   flight (and, committed, for `txWindowMs` after its answer: 0 by default, as DynamoDB; a
//!   cancelled one frees its items at once), its items (table + full primary key) cancel other
//!   TransactWriteItems/TransactGetItems (`TransactionCanceledException`, reason
//!   `TransactionConflict` at the conflicting positions, `None` elsewhere) and reject
//!   PutItem/UpdateItem/DeleteItem (`TransactionConflictException`). GetItem/Query/Scan never
//!   conflict (read-committed). A TransactGetItems is also cancelled by a single or batch write
//!   in flight on its items, or arriving while it is. `conflicts: false` turns the rule off.
//!   The AWS SDK for Rust does not retry either error (neither code is in its throttling or
//!   transient lists), so callers see them.
//! - **Per-partition throughput** ([`throughput`]): 1,000 write and 3,000 read units a second
//!   per (table or global index, partition-key value), times `scale`, with `burstSecs` of
//!   burst. An exhausted partition answers `ProvisionedThroughputExceededException`
//!   (with `ThrottlingReasons`, as for an on-demand hot key); a transaction gets
//!   `TransactionCanceledException` with `ThrottlingError` at the throttled positions; a batch
//!   gets its throttled items back in `UnprocessedKeys`/`UnprocessedItems` (the whole call
//!   fails only when all are throttled). Refused requests are not forwarded. The SDK retries
//!   the exception (up to its max attempts), not the cancellation.
//! - **Latency**: `latencyMs` plus an exponential tail reaching `latencyP99Ms` at the 99th
//!   percentile, seeded by `seed`, on every DynamoDB call (before forwarding, while its
//!   conflict holds are taken).
//! - **Faults** ([`faults`]): the next `count` requests matching `op`/`table`/`key` get `kind`.
//!   The SDK's standard retry re-sends ThrottlingException, RequestLimitExceeded,
//!   ProvisionedThroughputExceededException, 500s and (as a transient I/O error) a closed
//!   connection: test with `max_attempts` 1 to see each one.
//! - **Freeze** ([`freeze`]): a DynamoDB brownout, as a stopped server process makes it. While
//!   frozen, no call to the DynamoDB upstream goes on and no answer from it comes back; at the
//!   thaw all of them do, and a call that arrived during the freeze is served even if its client
//!   gave up meanwhile (its write may land after its client was told nothing).
//!
//! Not covered: PartiQL (ExecuteStatement, BatchExecuteStatement, ExecuteTransaction) is
//! forwarded with no rule but faults and latency; BatchWriteItem is never refused for a
//! transaction conflict (AWS documents none); numbers in keys compare as text (`1` ≠ `1.0`).
//!
//! # Units
//! By DynamoDB's rules ([`units`]). Reads: from the items answered (GetItem and BatchGetItem
//! per item, a Query's items summed before rounding, TransactGetItems 2× per item; eventually
//! consistent halves; a projected GetItem costs at least the item's last seen size; a Query
//! with a filter or a projection undercounts what it read). Scan is not metered. PutItem,
//! UpdateItem, DeleteItem: estimated on arrival (the Put item's size, or the last size seen of
//! the item, or key + update values), then settled to what the upstream reports: the layer adds
//! `ReturnConsumedCapacity: INDEXES` when the client did not ask, reads the table's units, and
//! strips `ConsumedCapacity` from the answer. Transactions (whose reported capacity DynamoDB
//! Local gets wrong) and BatchWriteItem: 2× (transactions) the estimate per item, sizes from
//! the request or as last seen. Global indexes: a Put (single, batch or transactional) is also
//! charged to each global index's partition for the item's projected size; Update and Delete
//! are charged to the table only (their index keys are not known before the answer).
//!
//! # Control API (same listener, JSON)
//! - `GET /strict/config` → `{"conflicts":true,"txWindowMs":0,"throughput":true,"scale":1.0,"burstSecs":1.0,
//!   "latencyMs":0.0,"latencyP99Ms":0.0,"seed":1}`; `POST /strict/config` with any subset of
//!   those fields changes them and answers the whole config.
//! - `POST /strict/faults` `{"op":"PutItem","table":"chat","key":"c1",
//!   "kind":"ThrottlingException","count":2}` (kinds: `ProvisionedThroughputExceededException`,
//!   `ThrottlingException`, `RequestLimitExceeded`, `InternalServerError`, `slow` with
//!   `delayMs` (its items held while it waits, as a transaction in flight), `late` with
//!   `delayMs` (late on the wire: nothing held until it arrives), `answerLost` (forwarded, then the connection closes unanswered),
//!   `answerLost500` (forwarded, then a 500), `answerSlow` with `delayMs` (forwarded, its items
//!   freed, then answered `delayMs` later: a client that dies meanwhile never learns that its
//!   write happened)); a list of such objects adds several.
//!   `GET /strict/faults` lists pending ones, `DELETE /strict/faults` clears them.
//! - `GET /strict/partitions` → `{"partitions":[{"table":"chat","index":null,"key":"c1",
//!   "writeUnits":12.0,"readUnits":3.5,"writeRequests":6,"readRequests":3,
//!   "peakWriteUnitsPerSec":12.0,"peakReadUnitsPerSec":3.5,"throttledWrites":0,
//!   "throttledReads":0}],"txConflicts":0,"writeConflicts":0,"faultsFired":0,"heldByFreeze":0}`.
//! - `POST /strict/freeze`, `POST /strict/thaw` → `{"frozen":bool,"wasFrozen":bool}`;
//!   `GET /strict/freeze` → `{"frozen":bool}`.
//! - `POST /strict/reset`: clears the record, faults, buckets, conflict windows, learnt schemas;
//!   thaws.
//!
//! # Environment ([`StrictConfig::from_env`])
//! `CHAT_STRICT_LISTEN` (default `127.0.0.1:0`), `CHAT_STRICT_DYNAMODB` (default
//! `http://127.0.0.1:8000`), `CHAT_STRICT_OTHER`, `CHAT_STRICT=off` (all rules off),
//! `CHAT_STRICT_CONFLICTS=on|off` (on), `CHAT_STRICT_TX_WINDOW_MS` (0),
//! `CHAT_STRICT_THROUGHPUT=on|off` (on), `CHAT_STRICT_SCALE`
//! (1.0), `CHAT_STRICT_BURST_SECS` (1.0), `CHAT_STRICT_LATENCY_MS` (0),
//! `CHAT_STRICT_LATENCY_P99_MS` (0), `CHAT_STRICT_SEED` (1).

pub mod conflicts;
mod control;
pub mod faults;
pub mod freeze;
mod proxy;
pub mod schema;
pub mod throughput;
pub mod units;
mod wire;

pub use faults::{FaultKind, FaultSpec};

/// Owned strings of a list of literals (the unit tests' item ids and keys).
#[cfg(test)]
fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

use serde::{Deserialize, Serialize};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// The rules, changeable at run time (`POST /strict/config`, [`Running::set_rules`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rules {
    /// Transaction conflicts: a transaction's items are held from its arrival until its answer.
    pub conflicts: bool,
    /// How much longer a committed transaction's items stay held after its answer (0: none, as
    /// DynamoDB; more widens the overlap for tests that need one).
    pub tx_window_ms: u64,
    pub throughput: bool,
    /// Multiplies the per-partition limits (0.1 = 100 write / 300 read units a second).
    pub scale: f64,
    pub burst_secs: f64,
    pub latency_ms: f64,
    pub latency_p99_ms: f64,
    pub seed: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            conflicts: true,
            tx_window_ms: 0,
            throughput: true,
            scale: 1.0,
            burst_secs: 1.0,
            latency_ms: 0.0,
            latency_p99_ms: 0.0,
            seed: 1,
        }
    }
}

impl Rules {
    /// Forwarding only.
    pub fn off() -> Self {
        Rules {
            conflicts: false,
            throughput: false,
            ..Rules::default()
        }
    }
}

#[derive(Clone, Debug)]
pub struct StrictConfig {
    pub listen: SocketAddr,
    /// The DynamoDB-API upstream, e.g. `http://127.0.0.1:8000`.
    pub dynamodb: String,
    /// Where non-DynamoDB targets (Kinesis, ...) go; the DynamoDB upstream when absent.
    pub other: Option<String>,
    pub rules: Rules,
}

impl StrictConfig {
    pub fn new(dynamodb: impl Into<String>) -> Self {
        StrictConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            dynamodb: dynamodb.into(),
            other: None,
            rules: Rules::default(),
        }
    }

    /// From `CHAT_STRICT_*` (see the crate docs); an unparsable value is an error.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(format!("CHAT_STRICT_{name}")).ok();
        fn parse<T: std::str::FromStr>(
            name: &str,
            v: Option<String>,
            into: &mut T,
        ) -> Result<(), String> {
            if let Some(v) = v {
                *into = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("CHAT_STRICT_{name}: bad value {v:?}"))?;
            }
            Ok(())
        }
        let mut c = StrictConfig::new(var("DYNAMODB").unwrap_or("http://127.0.0.1:8000".into()));
        c.other = var("OTHER");
        if std::env::var("CHAT_STRICT").is_ok_and(|v| v == "off") {
            c.rules = Rules::off();
        }
        let r = &mut c.rules;
        parse("LISTEN", var("LISTEN"), &mut c.listen)?;
        parse("TX_WINDOW_MS", var("TX_WINDOW_MS"), &mut r.tx_window_ms)?;
        parse("SCALE", var("SCALE"), &mut r.scale)?;
        parse("BURST_SECS", var("BURST_SECS"), &mut r.burst_secs)?;
        parse("LATENCY_MS", var("LATENCY_MS"), &mut r.latency_ms)?;
        parse(
            "LATENCY_P99_MS",
            var("LATENCY_P99_MS"),
            &mut r.latency_p99_ms,
        )?;
        parse("SEED", var("SEED"), &mut r.seed)?;
        for (name, switch) in [
            ("THROUGHPUT", &mut r.throughput),
            ("CONFLICTS", &mut r.conflicts),
        ] {
            match var(name).as_deref() {
                None => {}
                Some("on") => *switch = true,
                Some("off") => *switch = false,
                Some(v) => return Err(format!("CHAT_STRICT_{name}: on or off, not {v:?}")),
            }
        }
        Ok(c)
    }
}

/// A running layer; it serves on the current tokio runtime until dropped.
pub struct Running {
    addr: SocketAddr,
    state: Arc<proxy::State>,
    task: tokio::task::JoinHandle<()>,
}

/// Binds `config.listen` and serves.
pub async fn start(config: StrictConfig) -> io::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(proxy::State::new(&config)?);
    let task = tokio::spawn(proxy::serve(listener, state.clone()));
    Ok(Running { addr, state, task })
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn rules(&self) -> Rules {
        self.state.rules()
    }

    pub fn set_rules(&self, rules: Rules) {
        self.state.set_rules(rules);
    }

    pub fn add_fault(&self, fault: FaultSpec) {
        self.state.faults.add(fault);
    }

    /// Freezes (true) or thaws (false) the DynamoDB upstream ([`freeze`]); whether it was frozen.
    pub fn freeze(&self, frozen: bool) -> bool {
        self.state.freeze.set(frozen)
    }

    /// The record, as `GET /strict/partitions` answers it.
    pub fn partitions(&self) -> serde_json::Value {
        self.state.record()
    }

    pub fn reset(&self) {
        self.state.reset();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}
