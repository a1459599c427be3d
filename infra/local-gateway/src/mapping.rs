//! A local Lambda event source mapping for a sharded stream (DynamoDB Streams or Kinesis): one
//! ordered consumer per shard (ParallelizationFactor 1), children after their parents, batches of
//! at most `batch_size` records, and ReportBatchItemFailures semantics: when the handler reports
//! an item, the records before it are done and that item and everything after it is delivered
//! again after a backoff. A record still failing after `max_retries` retries is logged as sent to
//! the on-failure destination (there is none locally) and skipped: never dropped silently.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::shutdown::Shutdown;
use crate::Error;

/// How often the shard list is read again to find new (child) shards.
const RESCAN: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where a mapping starts reading the shards that exist when it starts. Shards found later are
/// always read from their start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartingPosition {
    TrimHorizon,
    Latest,
}

/// Counters of the mappings (for logs and tests).
#[derive(Debug, Default)]
pub struct Stats {
    pub relay: MappingStats,
    pub fanout: MappingStats,
    pub inbox_index: MappingStats,
}

/// Counters of one mapping.
#[derive(Debug, Default)]
pub struct MappingStats {
    invocations: AtomicU64,
    redeliveries: AtomicU64,
    given_up: AtomicU64,
}

impl MappingStats {
    /// Handler invocations.
    pub fn invocations(&self) -> u64 {
        self.invocations.load(Ordering::SeqCst)
    }

    /// Times records were delivered again from a failed record.
    pub fn redeliveries(&self) -> u64 {
        self.redeliveries.load(Ordering::SeqCst)
    }

    /// Records given up on after all retries (logged as sent to the on-failure destination).
    pub fn given_up(&self) -> u64 {
        self.given_up.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Shard {
    pub id: String,
    pub parents: Vec<String>,
    /// Has an ending sequence number: no new records will be added.
    pub closed: bool,
}

/// Where to get a shard iterator. Sequence numbers are passed back as they came, never parsed
/// (moto's Kinesis numbers are small counters).
#[derive(Debug, Clone)]
pub(crate) enum Position {
    TrimHorizon,
    Latest,
    After(String),
}

/// One record as the Lambda event carries it, and the id `batchItemFailures` names it by.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub id: String,
    pub event: Value,
}

pub(crate) struct Page {
    pub records: Vec<Record>,
    /// None: the shard is closed and fully read.
    pub next: Option<String>,
    /// More records are already waiting (no idle wait).
    pub behind: bool,
}

/// DynamoDB Streams or Kinesis.
pub(crate) trait Source: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn shards(&self) -> impl Future<Output = Result<Vec<Shard>, Error>> + Send;
    fn iterator(
        &self,
        shard: &str,
        at: &Position,
    ) -> impl Future<Output = Result<String, Error>> + Send;
    fn read(
        &self,
        shard: &str,
        iterator: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Page, Error>> + Send;
}

/// The function: Lambda-format records in, the JSON response out.
pub(crate) type Handler =
    Arc<dyn Fn(Vec<Value>) -> BoxFuture<'static, Result<Value, Error>> + Send + Sync>;

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub max_retries: u32,
    pub retry_backoff: Duration,
}

pub(crate) struct Mapping<S> {
    pub source: S,
    pub handler: Handler,
    pub settings: Settings,
    pub stats: Arc<Stats>,
    /// Which of `stats` is this mapping's.
    pub counters: fn(&Stats) -> &MappingStats,
    pub shutdown: Shutdown,
    /// Ends an idle wait early (the relay wakes the Kinesis pollers).
    pub wake: Option<watch::Receiver<()>>,
    /// Signalled after each delivered batch.
    pub delivered: Option<watch::Sender<()>>,
}

impl<S: Source> Mapping<S> {
    /// Reads the shard list and takes the first iterators, then runs in the background.
    pub(crate) async fn start(self, start: StartingPosition) -> Result<(), Error> {
        let this = Arc::new(self);
        let shards = this.source.shards().await?;
        let listed: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
        let (mut first, mut done) = (Vec::new(), HashSet::new());
        for shard in &shards {
            let root = shard.parents.iter().all(|p| !listed.contains(p.as_str()));
            let at = match start {
                StartingPosition::Latest if shard.closed => {
                    done.insert(shard.id.clone());
                    continue;
                }
                StartingPosition::Latest => Position::Latest,
                StartingPosition::TrimHorizon if root => Position::TrimHorizon,
                StartingPosition::TrimHorizon => continue, // after its parents
            };
            let iterator = this.source.iterator(&shard.id, &at).await?;
            first.push((shard.id.clone(), at, iterator));
        }
        tokio::spawn(this.supervise(first, done));
        Ok(())
    }

    /// Runs a consumer per shard, starting new shards once their parents are read.
    async fn supervise(
        self: Arc<Self>,
        first: Vec<(String, Position, String)>,
        mut done: HashSet<String>,
    ) {
        let mut running = HashSet::new();
        let mut consumers = JoinSet::new();
        for (shard, at, iterator) in first {
            running.insert(shard.clone());
            consumers.spawn(self.clone().consume(shard, at, iterator));
        }
        loop {
            tokio::select! {
                Some(finished) = consumers.join_next() => match finished {
                    Ok(Some(shard)) => {
                        running.remove(&shard);
                        done.insert(shard);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::error!(source = self.source.name(), error = %e, "shard consumer died"),
                },
                _ = tokio::time::sleep(RESCAN) => {}
                _ = self.shutdown.wait() => break,
            }
            let shards = match self.source.shards().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(source = self.source.name(), error = %e, "listing shards failed");
                    continue;
                }
            };
            let listed: HashSet<String> = shards.iter().map(|s| s.id.clone()).collect();
            for shard in shards {
                let ready = shard
                    .parents
                    .iter()
                    .all(|p| done.contains(p) || !listed.contains(p));
                if running.contains(&shard.id) || done.contains(&shard.id) || !ready {
                    continue;
                }
                match self
                    .source
                    .iterator(&shard.id, &Position::TrimHorizon)
                    .await
                {
                    Ok(iterator) => {
                        tracing::info!(
                            source = self.source.name(),
                            shard = shard.id,
                            "reading new shard"
                        );
                        running.insert(shard.id.clone());
                        consumers.spawn(self.clone().consume(
                            shard.id,
                            Position::TrimHorizon,
                            iterator,
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(source = self.source.name(), error = %e, "no shard iterator")
                    }
                }
            }
        }
        while consumers.join_next().await.is_some() {}
    }

    /// Reads one shard to its end (returns its id) or until shutdown (returns None).
    async fn consume(
        self: Arc<Self>,
        shard: String,
        start: Position,
        mut iterator: String,
    ) -> Option<String> {
        let mut checkpoint: Option<String> = None;
        let mut wake = self.wake.clone();
        while !self.shutdown.is_set() {
            let page = match self
                .source
                .read(&shard, &iterator, self.settings.batch_size)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(source = self.source.name(), shard, error = %e, "GetRecords failed; taking a new iterator");
                    if !self.shutdown.sleep(self.settings.poll_interval * 10).await {
                        return None;
                    }
                    let at = checkpoint.clone().map_or(start.clone(), Position::After);
                    match self.source.iterator(&shard, &at).await {
                        Ok(it) => iterator = it,
                        Err(e) => {
                            tracing::warn!(source = self.source.name(), shard, error = %e, "no shard iterator")
                        }
                    }
                    continue;
                }
            };
            let idle = page.records.is_empty() && !page.behind;
            if let Some(last) = page.records.last() {
                checkpoint = Some(last.id.clone());
                self.deliver(&shard, page.records).await;
                if let Some(delivered) = &self.delivered {
                    delivered.send_replace(());
                }
            }
            match page.next {
                Some(next) => iterator = next,
                None => {
                    tracing::info!(source = self.source.name(), shard, "shard closed and read");
                    return Some(shard);
                }
            }
            if idle {
                let waker_gone = {
                    let woken = async {
                        match wake.as_mut() {
                            Some(w) => w.changed().await.is_err(),
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(self.settings.poll_interval) => false,
                        gone = woken => gone,
                        _ = self.shutdown.wait() => return None,
                    }
                };
                if waker_gone {
                    wake = None;
                }
            }
        }
        None
    }

    fn counters(&self) -> &MappingStats {
        (self.counters)(&self.stats)
    }

    /// Hands `records` to the handler until each is delivered or given up (or shutdown).
    pub(crate) async fn deliver(&self, shard: &str, records: Vec<Record>) {
        let mut pending = VecDeque::from(records);
        let mut failures = 0; // of the record at the front
        while !pending.is_empty() {
            let batch: Vec<Record> = pending
                .iter()
                .take(self.settings.batch_size)
                .cloned()
                .collect();
            let Some(failed) = self.invoke(&batch).await else {
                pending.drain(..batch.len());
                failures = 0;
                continue;
            };
            if failed > 0 {
                pending.drain(..failed);
                failures = 0;
            }
            failures += 1;
            let record = &pending[0];
            if failures > self.settings.max_retries {
                tracing::error!(
                    source = self.source.name(),
                    shard,
                    sequence_number = record.id,
                    record = %record.event,
                    retries = self.settings.max_retries,
                    "record still failing after all retries: SENT TO THE ON-FAILURE DESTINATION (logged here only), skipping it"
                );
                self.counters().given_up.fetch_add(1, Ordering::SeqCst);
                pending.pop_front();
                failures = 0;
                continue;
            }
            let backoff = self
                .settings
                .retry_backoff
                .saturating_mul(1 << (failures - 1).min(16))
                .min(MAX_BACKOFF);
            tracing::warn!(
                source = self.source.name(),
                shard,
                sequence_number = record.id,
                retry = failures,
                ?backoff,
                "batch item failure: delivering again from this record"
            );
            self.counters().redeliveries.fetch_add(1, Ordering::SeqCst);
            if !self.shutdown.sleep(backoff).await {
                return;
            }
        }
    }

    /// One invocation; the index of the first record to deliver again, None when all succeeded.
    async fn invoke(&self, batch: &[Record]) -> Option<usize> {
        self.counters().invocations.fetch_add(1, Ordering::SeqCst);
        let events = batch.iter().map(|r| r.event.clone()).collect();
        // Spawned, so a panicking handler is a failed invocation like in Lambda.
        let response = match tokio::spawn((self.handler)(events)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                tracing::error!(source = self.source.name(), error = %e, "invocation failed");
                return Some(0);
            }
            Err(e) => {
                tracing::error!(source = self.source.name(), error = %e, "handler panicked");
                return Some(0);
            }
        };
        first_failure(&response, batch)
    }
}

/// Lambda's reading of `batchItemFailures`: the earliest reported record; the whole batch when an
/// identifier is missing, empty or not in the batch.
fn first_failure(response: &Value, batch: &[Record]) -> Option<usize> {
    let failures = response.get("batchItemFailures")?.as_array()?;
    failures
        .iter()
        .map(|f| {
            let id = f.get("itemIdentifier").and_then(Value::as_str)?;
            batch.iter().position(|r| !id.is_empty() && r.id == id)
        })
        .map(|position| position.unwrap_or(0))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    struct NoSource;

    impl Source for NoSource {
        fn name(&self) -> &str {
            "test"
        }
        async fn shards(&self) -> Result<Vec<Shard>, Error> {
            Ok(vec![])
        }
        async fn iterator(&self, _: &str, _: &Position) -> Result<String, Error> {
            Ok(String::new())
        }
        async fn read(&self, _: &str, _: &str, _: usize) -> Result<Page, Error> {
            unreachable!()
        }
    }

    fn records(ids: &[&str]) -> Vec<Record> {
        ids.iter()
            .map(|id| Record {
                id: (*id).into(),
                event: json!({ "id": id }),
            })
            .collect()
    }

    /// The ids of each batch the handler was given.
    type Seen = Arc<Mutex<Vec<Vec<String>>>>;

    /// A handler answering from a script of responses, recording the ids of each batch.
    fn mapping(script: Vec<Value>, max_retries: u32) -> (Mapping<NoSource>, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let log = seen.clone();
        let handler: Handler = Arc::new(move |events: Vec<Value>| {
            let ids = events
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_owned())
                .collect();
            log.lock().unwrap().push(ids);
            let response = script.lock().unwrap().pop_front().unwrap_or(json!({}));
            Box::pin(async move {
                if response == json!("panic") {
                    panic!("handler bug");
                }
                Ok(response)
            })
        });
        let (_trigger, shutdown) = Shutdown::new();
        std::mem::forget(_trigger);
        let m = Mapping {
            source: NoSource,
            handler,
            settings: Settings {
                batch_size: 3,
                poll_interval: Duration::from_millis(1),
                max_retries,
                retry_backoff: Duration::from_millis(1),
            },
            stats: Arc::new(Stats::default()),
            counters: |s| &s.relay,
            shutdown,
            wake: None,
            delivered: None,
        };
        (m, seen)
    }

    fn failure(id: &str) -> Value {
        json!({ "batchItemFailures": [{ "itemIdentifier": id }] })
    }

    fn batches(seen: &Seen) -> Vec<Vec<String>> {
        seen.lock().unwrap().clone()
    }

    fn ids(batches: &[&[&str]]) -> Vec<Vec<String>> {
        batches
            .iter()
            .map(|b| b.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[tokio::test]
    async fn redelivers_from_the_reported_record() {
        let (m, seen) = mapping(vec![failure("2"), json!({"batchItemFailures": []})], 3);
        m.deliver("s", records(&["1", "2", "3", "4"])).await;
        assert_eq!(batches(&seen), ids(&[&["1", "2", "3"], &["2", "3", "4"]]));
        assert_eq!(m.stats.relay.redeliveries(), 1);
    }

    #[tokio::test]
    async fn the_earliest_of_several_reported_records_wins() {
        let (m, seen) = mapping(
            vec![json!({"batchItemFailures": [{"itemIdentifier": "3"}, {"itemIdentifier": "2"}]})],
            3,
        );
        m.deliver("s", records(&["1", "2", "3"])).await;
        assert_eq!(batches(&seen), ids(&[&["1", "2", "3"], &["2", "3"]]));
    }

    #[tokio::test]
    async fn unknown_ids_errors_and_panics_fail_the_whole_batch() {
        let (m, seen) = mapping(
            vec![
                failure("nope"),
                json!({"batchItemFailures": [{"itemIdentifier": null}]}),
                json!("panic"),
            ],
            5,
        );
        m.deliver("s", records(&["1", "2"])).await;
        assert_eq!(
            batches(&seen),
            ids(&[&["1", "2"], &["1", "2"], &["1", "2"], &["1", "2"]])
        );
        assert_eq!(m.stats.relay.redeliveries(), 3);
    }

    #[tokio::test]
    async fn a_record_failing_every_retry_is_given_up_loudly_and_the_rest_delivered() {
        let (m, seen) = mapping(vec![failure("2"), failure("2"), failure("2")], 2);
        m.deliver("s", records(&["1", "2", "3"])).await;
        assert_eq!(
            batches(&seen),
            ids(&[&["1", "2", "3"], &["2", "3"], &["2", "3"], &["3"]])
        );
        assert_eq!(
            (m.stats.relay.redeliveries(), m.stats.relay.given_up()),
            (2, 1)
        );
    }
}
