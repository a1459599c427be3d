//! Transaction conflicts, as DynamoDB documents them ("Transaction conflict handling"):
//! - an item of an ongoing TransactWriteItems cancels another TransactWriteItems
//!   (`TransactionConflict`) and rejects a PutItem/UpdateItem/DeleteItem
//!   (`TransactionConflictException`);
//! - a TransactGetItems is cancelled when one of its items is part of an ongoing
//!   TransactWriteItems, BatchWriteItem, PutItem, UpdateItem or DeleteItem — also when such a
//!   write arrives while the TransactGetItems is itself in flight;
//! - GetItem, Query and Scan are read-committed: they never conflict.
//!
//! A transaction holds its items from arrival until its answer plus a window (AWS's two-phase
//! commit outlives the answer a little); a single write holds its item while in flight. Holds
//! are released by dropping the [`Hold`], so a request abandoned by its client releases too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Entry {
    tx_writes: u32,
    held_until: Option<Instant>,
    writes: u32,
    readers: Vec<(Arc<TxRead>, usize)>,
}

impl Entry {
    fn in_tx(&self, now: Instant) -> bool {
        self.tx_writes > 0 || self.held_until.is_some_and(|t| t > now)
    }
    fn idle(&self, now: Instant) -> bool {
        !self.in_tx(now) && self.writes == 0 && self.readers.is_empty()
    }
    fn doom_readers(&self) {
        for (r, pos) in &self.readers {
            r.doomed[*pos].store(true, Ordering::Relaxed);
        }
    }
}

/// A TransactGetItems in flight: which of its positions a write has hit since it started.
pub struct TxRead {
    doomed: Vec<AtomicBool>,
}

#[derive(Default)]
pub struct Conflicts {
    items: Mutex<HashMap<String, Entry>>,
    sweep_at: std::sync::atomic::AtomicUsize,
}

enum Kind {
    TxWrite(Duration),
    Write,
    TxRead(Arc<TxRead>),
}

/// Items held by one request until dropped.
pub struct Hold {
    table: Arc<Conflicts>,
    items: Vec<String>,
    kind: Kind,
}

impl Hold {
    /// Positions of a TransactGetItems hit by a write while it was in flight.
    pub fn doomed(&self) -> Vec<usize> {
        match &self.kind {
            Kind::TxRead(r) => (0..r.doomed.len())
                .filter(|&i| r.doomed[i].load(Ordering::Relaxed))
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Hold {
    /// Releases a request refused after all (throttled): no window after it.
    pub fn release_now(mut self) {
        if let Kind::TxWrite(w) = &mut self.kind {
            *w = Duration::ZERO;
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut map = self.table.items.lock().expect("conflicts lock");
        for id in &self.items {
            let Some(e) = map.get_mut(id) else { continue };
            match &self.kind {
                Kind::TxWrite(window) => {
                    e.tx_writes -= 1;
                    let until = now + *window;
                    e.held_until = Some(e.held_until.map_or(until, |t| t.max(until)));
                }
                Kind::Write => e.writes -= 1,
                Kind::TxRead(r) => e.readers.retain(|(x, _)| !Arc::ptr_eq(x, r)),
            }
        }
    }
}

impl Conflicts {
    fn lock(&self, now: Instant) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let mut map = self.items.lock().expect("conflicts lock");
        // Forget idle entries now and then, so the table stays as small as what is in flight.
        if map.len() > self.sweep_at.load(Ordering::Relaxed) {
            map.retain(|_, e| !e.idle(now));
            self.sweep_at
                .store((map.len() * 2).max(1024), Ordering::Relaxed);
        }
        map
    }

    /// A TransactWriteItems on `items` (one id per position): held, or the conflicting positions.
    pub fn tx_write(
        self: &Arc<Self>,
        items: Vec<String>,
        window: Duration,
    ) -> Result<Hold, Vec<usize>> {
        self.hold_writes(items, true, Kind::TxWrite(window))
    }

    /// Single-item writes (`reject`: PutItem/UpdateItem/DeleteItem, refused on an item in a
    /// transaction; not for BatchWriteItem, which only counts for TransactGetItems).
    /// Refused: the positions in a transaction.
    pub fn write(self: &Arc<Self>, items: Vec<String>, reject: bool) -> Result<Hold, Vec<usize>> {
        self.hold_writes(items, reject, Kind::Write)
    }

    /// Writes of `kind` on `items`, unless (`reject`) some are in a transaction: each item counts
    /// the write, and dooms the transactional reads that hold it.
    fn hold_writes(
        self: &Arc<Self>,
        items: Vec<String>,
        reject: bool,
        kind: Kind,
    ) -> Result<Hold, Vec<usize>> {
        let now = Instant::now();
        let mut map = self.lock(now);
        let hit: Vec<usize> = (0..items.len())
            .filter(|&i| reject && map.get(&items[i]).is_some_and(|e| e.in_tx(now)))
            .collect();
        if !hit.is_empty() {
            return Err(hit);
        }
        for id in &items {
            let e = map.entry(id.clone()).or_default();
            if matches!(kind, Kind::TxWrite(_)) {
                e.tx_writes += 1;
            } else {
                e.writes += 1;
            }
            e.doom_readers();
        }
        drop(map);
        Ok(self.hold(items, kind))
    }

    /// A TransactGetItems: held (a later write dooms it), or the conflicting positions.
    pub fn tx_read(self: &Arc<Self>, items: Vec<String>) -> Result<Hold, Vec<usize>> {
        let now = Instant::now();
        let mut map = self.lock(now);
        let hit: Vec<usize> = (0..items.len())
            .filter(|&i| {
                map.get(&items[i])
                    .is_some_and(|e| e.in_tx(now) || e.writes > 0)
            })
            .collect();
        if !hit.is_empty() {
            return Err(hit);
        }
        let reader = Arc::new(TxRead {
            doomed: items.iter().map(|_| AtomicBool::new(false)).collect(),
        });
        for (pos, id) in items.iter().enumerate() {
            map.entry(id.clone())
                .or_default()
                .readers
                .push((reader.clone(), pos));
        }
        drop(map);
        Ok(self.hold(items, Kind::TxRead(reader)))
    }

    fn hold(self: &Arc<Self>, items: Vec<String>, kind: Kind) -> Hold {
        Hold {
            table: self.clone(),
            items,
            kind,
        }
    }

    /// Ends every window after a transaction (in-flight requests keep their holds).
    pub fn clear_windows(&self) {
        for e in self.items.lock().expect("conflicts lock").values_mut() {
            e.held_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::strings as ids;

    #[test]
    fn transactions_conflict_while_in_flight_and_for_the_window_after() {
        let c = Arc::new(Conflicts::default());
        let window = Duration::from_millis(30);
        let a = c.tx_write(ids(&["x", "y"]), window).unwrap();
        // Overlap on y (position 1) only; single writes on x are refused; other items are free.
        assert_eq!(c.tx_write(ids(&["z", "y"]), window).err(), Some(vec![1]));
        assert!(c.write(ids(&["x"]), true).is_err());
        assert!(
            c.write(ids(&["x"]), false).is_ok(),
            "a batch write is not refused"
        );
        let other = c.tx_write(ids(&["z"]), window).unwrap();
        drop(other);
        drop(a);
        // Answered, but still inside the window.
        assert!(c.write(ids(&["y"]), true).is_err());
        std::thread::sleep(window + Duration::from_millis(5));
        assert!(c.write(ids(&["y"]), true).is_ok());
        assert!(c.tx_write(ids(&["x", "y"]), window).is_ok());
    }

    #[test]
    fn transact_get_is_cancelled_by_writes_before_and_during_it() {
        let c = Arc::new(Conflicts::default());
        let w = c.write(ids(&["b"]), true).unwrap();
        assert_eq!(c.tx_read(ids(&["a", "b"])).err(), Some(vec![1]));
        drop(w);
        let r = c.tx_read(ids(&["a", "b"])).unwrap();
        // A write arriving while the read is in flight dooms it; the read itself blocks nothing.
        let w = c.write(ids(&["a"]), true).unwrap();
        assert_eq!(r.doomed(), vec![0]);
        drop((w, r));
        assert!(c.tx_read(ids(&["a", "b"])).unwrap().doomed().is_empty());
    }
}
