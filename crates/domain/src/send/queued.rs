//! A queued send waiting for its commit (docs/data-model.md §3 "Send", steps 3–6), as a step
//! function: the store looks at the queue, hands the look here, and does what the step says. The
//! request of the oldest queued send commits at once; the others wait about one commit per batch
//! ahead of them and take over only when the oldest has not moved for a while.

use std::time::Duration;

use super::group_commit::{commit_order, first_batch};
use super::{Entry, Head, LastCommit, GATHER, MAX_BATCH, TAKE_OVER_AFTER};

/// One look at the queue: what one Query of `P!…P$` showed, and when.
#[derive(Debug, Clone)]
pub struct Look<'a> {
    /// The queued sends as read (any order).
    pub queue: &'a [Entry<'a>],
    pub last_commit: Option<LastCommit<'a>>,
    /// The wall clock after the read (unix ms): which entries have expired, how old the record is.
    pub now_ms: u64,
    /// Time since this request began to wait (a monotonic clock): how long the oldest sat still.
    pub waited: Duration,
    /// How long the read took: a commit is about two such round trips (this read, then the
    /// transaction), so waits and patience scale with it.
    pub round_trip: Duration,
}

/// What the request does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Look again after about this long.
    Wait(Duration),
    /// The last commit took this request's send at `seq`, its messages' time `created_at`:
    /// answer `201`.
    Answered { seq: u64, created_at: String },
    /// Its send is no longer queued and the record does not name it (an earlier commit took it,
    /// or it was dropped): its key decides (`key_missing` when there is none).
    ReadKey,
    /// The request that queued the send this replay waited for has ended: drop that entry
    /// (`queue[drop]`), queue this request's own and look again at once.
    SendItself { drop: usize },
    /// Commit the sends `batch` (indices into the queue, in commit order) after removing the
    /// expired ones `expired`, from `head` (None: read the conversation first).
    Commit {
        batch: Vec<usize>,
        expired: Vec<usize>,
        head: Option<Head>,
    },
    /// Its own entry expired while it waited (its deadline passed): it ends without its message.
    Withdraw,
}

/// How a group commit this request attempted ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Committed, `sends` sends.
    Committed { sends: usize },
    /// Someone else committed first; the conversation as its cancellation returned it, if it did.
    Moved(Option<Head>),
    /// A send of the batch was taken by someone else meanwhile.
    Taken,
    /// Sends that can never be committed were dropped.
    Dropped,
    /// An item was in another transaction (or the partition was throttled).
    Conflict,
}

/// What an attempt means for this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterCommit {
    /// Its send is the `index`th of the commit; `created`: this request queued it (`201`).
    Mine {
        index: usize,
        created: bool,
    },
    Wait(Duration),
}

/// Its send is gone from the queue and has no key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMissing {
    /// A replay whose original was withdrawn (its request answered or ended): it sends it now.
    SendItself,
    /// Dropped by a commit: its sender is no longer a member (`404`).
    Dropped,
}

/// How the request ends without its message (its deadline, or a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It queued its send: it withdraws it first, so that no later commit takes it.
    Withdraw,
    /// It waited for a replay's entry, which is another request's and may still be committed:
    /// the outcome is unknown to it.
    GiveUp,
}

/// The state of one request's queued send between looks.
#[derive(Debug, Clone)]
pub struct QueuedSend {
    key: String,
    request_id: String,
    /// Whether the entry under `key` is this request's (false: a replay waiting for another's).
    enqueued: bool,
    /// The oldest queued send when it last looked, and since when (`Look::waited`).
    oldest_seen: Option<(String, Duration)>,
    /// The conversation a failed commit returned: good for the next look's commit only.
    head: Option<Head>,
    /// From the last look: about one commit, and this request's place in its commit.
    commit_time: Duration,
    position: usize,
    created: bool,
}

impl QueuedSend {
    /// `enqueued`: whether its put of `P#<key>` wrote this request's entry.
    pub fn new(key: &str, request_id: &str, enqueued: bool) -> QueuedSend {
        QueuedSend {
            key: key.to_owned(),
            request_id: request_id.to_owned(),
            enqueued,
            oldest_seen: None,
            head: None,
            commit_time: GATHER,
            position: 0,
            created: false,
        }
    }

    /// It (re)queued its send: `wrote` whether the entry is its own.
    pub fn enqueued(&mut self, wrote: bool) {
        self.enqueued = wrote;
    }

    /// How long to wait when the read of the queue was throttled: shortly, about one commit.
    pub fn read_throttled(&self) -> Duration {
        GATHER
    }

    /// The step after a look at the queue.
    pub fn look(&mut self, look: &Look<'_>) -> Step {
        let head = self.head.take();
        let (live, expired) = commit_order(look.queue, look.now_ms);
        self.commit_time = GATHER.max(look.round_trip * 2);
        let mine = |i: &usize| look.queue[*i].key == self.key;
        if let Some(&i) = expired.iter().find(|i| mine(i)) {
            return match self.enqueued {
                true => Step::Withdraw,
                false => Step::SendItself { drop: i },
            };
        }
        let Some(position) = live.iter().position(mine) else {
            return self.gone(look.last_commit.as_ref());
        };
        let stalled = self.stalled(look, &live, position);
        if position > 0 && !stalled {
            // Commits ahead of it: the one under way (it may be in it), plus one per full batch
            // beyond that.
            let ahead = ((position / MAX_BATCH) as u32).max(1);
            return Step::Wait(self.commit_time * ahead);
        }
        let batch = first_batch(&live);
        self.position = position;
        self.created = batch
            .get(position)
            .is_some_and(|&i| look.queue[i].request_id == self.request_id);
        // Other commits have likely moved the conversation on since it was last read: a recent
        // record is cheaper than a read, and a read than a transaction bound to fail.
        let head = head.or_else(|| {
            let commit = look.last_commit.as_ref()?;
            Head::after(commit, look.now_ms)
        });
        Step::Commit {
            batch,
            expired,
            head,
        }
    }

    /// Its send is no longer queued: the last commit took it (its record says at which seq), or
    /// an earlier one did, or it was dropped: its key says which.
    fn gone(&self, last_commit: Option<&LastCommit<'_>>) -> Step {
        let committed = last_commit
            .filter(|_| self.enqueued)
            .and_then(|c| Some((c.seq_of(&self.key, &self.request_id)?, c.created_at)));
        match committed {
            Some((seq, at)) => Step::Answered {
                seq,
                created_at: at.to_owned(),
            },
            None => Step::ReadKey,
        }
    }

    /// Whether the oldest queued send has sat still longer than this request's patience,
    /// staggered by position so that one request takes over, not all of them.
    fn stalled(&mut self, look: &Look<'_>, live: &[usize], position: usize) -> bool {
        let oldest = look.queue[live[0]].key;
        let patience = TAKE_OVER_AFTER.max(look.round_trip * 8) * position.max(1) as u32;
        match &self.oldest_seen {
            Some((key, since)) if key == oldest => look.waited.saturating_sub(*since) > patience,
            _ => {
                self.oldest_seen = Some((oldest.to_owned(), look.waited));
                false
            }
        }
    }

    /// The step after the commit that `look` asked for.
    pub fn after_commit(&mut self, attempt: Attempt) -> AfterCommit {
        match attempt {
            Attempt::Committed { sends } if self.position < sends => AfterCommit::Mine {
                index: self.position,
                created: self.created,
            },
            // Committed without it (it sits further back): the next commit is under way.
            Attempt::Committed { .. } => AfterCommit::Wait(self.commit_time),
            // Someone committed first, maybe this very send: look at once.
            Attempt::Moved(head) => {
                self.head = head;
                AfterCommit::Wait(Duration::ZERO)
            }
            Attempt::Taken | Attempt::Dropped => AfterCommit::Wait(Duration::ZERO),
            // Another commit is in flight, likely with this send in it: give it time.
            Attempt::Conflict => AfterCommit::Wait(self.commit_time),
        }
    }

    /// Its send is gone and its key absent (`Step::ReadKey` found none).
    pub fn key_missing(&self) -> KeyMissing {
        match self.enqueued {
            false => KeyMissing::SendItself,
            true => KeyMissing::Dropped,
        }
    }

    /// How it ends when it runs out of time or a call fails.
    pub fn ending(&self) -> Ending {
        match self.enqueued {
            true => Ending::Withdraw,
            false => Ending::GiveUp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::LazyLock;

    use crate::ids::UserId;

    const NOW: u64 = 1_000_000;
    const RT: Duration = Duration::from_millis(5);

    /// Queued sends `k000`, `k001`, … in that order, each queued by the request of its own name.
    fn queued(n: usize) -> Vec<Entry<'static>> {
        static U: LazyLock<UserId> = LazyLock::new(|| UserId::parse("u").unwrap());
        (0..n)
            .map(|i| {
                let key: &'static str = Box::leak(format!("k{i:03}").into_boxed_str());
                Entry {
                    key,
                    request_id: key,
                    sender: &U,
                    enqueued_at: i as u64,
                    expires_at: NOW + 1,
                }
            })
            .collect()
    }

    fn mine(index: usize, created: bool) -> AfterCommit {
        AfterCommit::Mine { index, created }
    }

    fn look<'a>(queue: &'a [Entry<'a>], waited_ms: u64) -> Look<'a> {
        Look {
            queue,
            last_commit: None,
            now_ms: NOW,
            waited: Duration::from_millis(waited_ms),
            round_trip: RT,
        }
    }

    /// A look at the start, when a read takes `round_trip_ms`.
    fn slow_look<'a>(queue: &'a [Entry<'a>], round_trip_ms: u64) -> Look<'a> {
        Look {
            round_trip: Duration::from_millis(round_trip_ms),
            ..look(queue, 0)
        }
    }

    fn record(committed_at: u64) -> LastCommit<'static> {
        LastCommit {
            last_seq: 41,
            created_at: "2026-01-01T00:00:00.000Z",
            committed_at,
            key_moves: 0,
            sends: vec![("k9", "k9", 41)],
        }
    }

    #[test]
    fn the_oldest_queued_send_commits_at_once() {
        let queue = queued(3);
        let mut s = QueuedSend::new("k000", "k000", true);
        let step = s.look(&look(&queue, 0));
        assert_eq!(
            step,
            Step::Commit {
                batch: vec![0, 1, 2],
                expired: vec![],
                head: None
            }
        );
        assert_eq!(
            s.after_commit(Attempt::Committed { sends: 3 }),
            mine(0, true)
        );
    }

    #[test]
    fn a_send_behind_the_oldest_waits_about_one_commit() {
        let queue = queued(3);
        let mut s = QueuedSend::new("k002", "k002", true);
        // A slow database: two round trips are more than the least wait.
        let slow = slow_look(&queue, 30);
        assert_eq!(s.look(&slow), Step::Wait(Duration::from_millis(60)));
        assert_eq!(s.look(&look(&queue, 10)), Step::Wait(GATHER));
    }

    #[test]
    fn a_send_more_than_a_batch_back_waits_one_commit_per_batch_ahead() {
        let queue = queued(60);
        let mut s = QueuedSend::new("k050", "k050", true);
        assert_eq!(s.look(&look(&queue, 0)), Step::Wait(GATHER * 2));
    }

    /// The request of `me` in a queue of `n` whose oldest never moves: it waits while the oldest
    /// sits still for up to `patience_ms`, then commits. Returns it and its commit's batch.
    fn takes_over_after(n: usize, me: &'static str, patience_ms: u64) -> (QueuedSend, usize) {
        let queue = queued(n);
        let mut s = QueuedSend::new(me, me, true);
        for at in [0, patience_ms] {
            assert!(matches!(s.look(&look(&queue, at)), Step::Wait(_)), "{at}");
        }
        match s.look(&look(&queue, patience_ms + 1)) {
            Step::Commit { batch, .. } => (s, batch.len()),
            step => panic!("takes over: {step:?}"),
        }
    }

    fn commit_head(s: &mut QueuedSend, l: &Look<'_>) -> Option<Head> {
        match s.look(l) {
            Step::Commit { head, .. } => head,
            step => panic!("commits: {step:?}"),
        }
    }

    #[test]
    fn a_send_behind_an_oldest_that_sits_still_takes_over() {
        let (mut s, _) = takes_over_after(3, "k001", 1000);
        let committed = Attempt::Committed { sends: 3 };
        assert_eq!(s.after_commit(committed), mine(1, true));
    }

    #[test]
    fn the_next_in_line_takes_over_later_the_further_back_it_is() {
        takes_over_after(4, "k003", 3000);
    }

    #[test]
    fn patience_grows_with_a_slow_database() {
        let queue = queued(2);
        let mut s = QueuedSend::new("k001", "k001", true);
        let mut slow = slow_look(&queue, 200);
        s.look(&slow);
        slow.waited = Duration::from_millis(1600);
        assert!(matches!(s.look(&slow), Step::Wait(_)), "8 round trips");
        slow.waited = Duration::from_millis(1601);
        assert!(matches!(s.look(&slow), Step::Commit { .. }));
    }

    #[test]
    fn an_oldest_that_moved_restarts_the_patience() {
        let queue = queued(3);
        let mut s = QueuedSend::new("k002", "k002", true);
        s.look(&look(&queue, 0));
        // The oldest was committed: a new oldest, seen from now on.
        let moved = &queue[1..];
        assert!(matches!(s.look(&look(moved, 1500)), Step::Wait(_)));
        assert!(matches!(s.look(&look(moved, 2500)), Step::Wait(_)));
        assert!(matches!(s.look(&look(moved, 2501)), Step::Commit { .. }));
    }

    /// The step of the send `key` of `request` once the queue holds no send, with `last_commit`.
    fn when_gone(key: &str, request: &str, enqueued: bool, last: Option<LastCommit>) -> Step {
        let mut s = QueuedSend::new(key, request, enqueued);
        let l = Look {
            last_commit: last,
            ..look(&[], 0)
        };
        s.look(&l)
    }

    #[test]
    fn a_send_committed_by_another_is_answered_from_the_record() {
        let answered = Step::Answered {
            seq: 41,
            created_at: "2026-01-01T00:00:00.000Z".into(),
        };
        assert_eq!(when_gone("k9", "k9", true, Some(record(0))), answered);
    }

    #[test]
    fn a_send_gone_but_not_in_the_record_asks_its_key() {
        assert_eq!(
            when_gone("k1", "k1", true, None),
            Step::ReadKey,
            "no record"
        );
        let overwritten = when_gone("k1", "k1", true, Some(record(0)));
        assert_eq!(overwritten, Step::ReadKey, "a later commit overwrote it");
        let s = QueuedSend::new("k1", "k1", true);
        assert_eq!(s.key_missing(), KeyMissing::Dropped);
    }

    #[test]
    fn a_replay_is_never_answered_from_the_record_of_its_original() {
        let replay = when_gone("k9", "another request", false, Some(record(0)));
        assert_eq!(replay, Step::ReadKey);
        let waiting = when_gone("k9", "k9", false, Some(record(0)));
        assert_eq!(waiting, Step::ReadKey, "nor while not enqueued");
    }

    #[test]
    fn a_replay_whose_original_was_withdrawn_sends_it_itself() {
        let s = QueuedSend::new("k1", "mine", false);
        assert_eq!(s.key_missing(), KeyMissing::SendItself);
    }

    /// `queued(n)` where the request of entry `ended` is over.
    fn with_ended(n: usize, ended: usize) -> Vec<Entry<'static>> {
        let mut queue = queued(n);
        queue[ended].expires_at = NOW;
        queue
    }

    #[test]
    fn a_replay_whose_originals_request_ended_drops_it_and_sends_itself() {
        let queue = with_ended(2, 1);
        let mut s = QueuedSend::new("k001", "mine", false);
        assert_eq!(s.look(&look(&queue, 0)), Step::SendItself { drop: 1 });
        s.enqueued(true);
        assert_eq!(s.look(&look(&queue, 0)), Step::Withdraw);
    }

    #[test]
    fn a_send_whose_own_entry_expired_withdraws() {
        let queue = with_ended(1, 0);
        let step = QueuedSend::new("k000", "k000", true).look(&look(&queue, 0));
        assert_eq!(step, Step::Withdraw);
    }

    #[test]
    fn a_commit_removes_the_expired_sends_of_others() {
        let queue = with_ended(3, 0);
        let step = QueuedSend::new("k001", "k001", true).look(&look(&queue, 0));
        assert_eq!(
            step,
            Step::Commit {
                batch: vec![1, 2],
                expired: vec![0],
                head: None
            }
        );
    }

    #[test]
    fn a_replay_that_commits_its_originals_send_did_not_create_it() {
        let queue = queued(1);
        let mut s = QueuedSend::new("k000", "a replay", false);
        assert!(matches!(s.look(&look(&queue, 0)), Step::Commit { .. }));
        let committed = Attempt::Committed { sends: 1 };
        assert_eq!(s.after_commit(committed), mine(0, false));
    }

    #[test]
    fn a_take_over_beyond_the_first_batch_commits_the_batch_and_waits() {
        // The 25th: just past the first batch.
        let (mut s, batch) = takes_over_after(30, "k024", 24_000);
        assert_eq!(batch, MAX_BATCH);
        let committed = Attempt::Committed { sends: MAX_BATCH };
        assert_eq!(s.after_commit(committed), AfterCommit::Wait(GATHER));
    }

    #[test]
    fn a_commit_uses_a_recent_record_for_the_conversation() {
        let queue = queued(1);
        let mut s = QueuedSend::new("k000", "k000", true);
        let mut l = look(&queue, 0);
        l.last_commit = Some(record(NOW - 4_999));
        let head = commit_head(&mut s, &l);
        assert_eq!(head.map(|h| h.last_seq), Some(41));
        l.last_commit = Some(record(NOW - 5_000));
        let head = commit_head(&mut s, &l);
        assert_eq!(head, None, "too old: read the conversation");
    }

    #[test]
    fn a_commit_lost_to_another_goes_on_from_the_conversation_it_returned() {
        let queue = queued(1);
        let mut s = QueuedSend::new("k000", "k000", true);
        let mut l = look(&queue, 0);
        l.last_commit = Some(record(NOW));
        s.look(&l);
        let returned = Head {
            last_seq: 50,
            last_message_at: None,
            busy_until: 0,
            key_moves: 0,
        };
        assert_eq!(
            s.after_commit(Attempt::Moved(Some(returned.clone()))),
            AfterCommit::Wait(Duration::ZERO)
        );
        let head = commit_head(&mut s, &l);
        assert_eq!(head, Some(returned), "not the record's");
        let head = commit_head(&mut s, &l);
        assert_eq!(head.map(|h| h.last_seq), Some(41), "only once");
    }

    #[test]
    fn a_commit_lost_without_the_conversation_looks_again_at_once() {
        let mut s = QueuedSend::new("k", "k", true);
        for attempt in [Attempt::Moved(None), Attempt::Taken, Attempt::Dropped] {
            assert_eq!(s.after_commit(attempt), AfterCommit::Wait(Duration::ZERO));
        }
    }

    #[test]
    fn a_commit_in_conflict_waits_about_one_commit() {
        let mut s = QueuedSend::new("k000", "k000", true);
        s.look(&slow_look(&queued(1), 40));
        let waits = s.after_commit(Attempt::Conflict);
        assert_eq!(waits, AfterCommit::Wait(Duration::from_millis(80)));
    }

    #[test]
    fn a_throttled_read_of_the_queue_looks_again_shortly() {
        assert_eq!(QueuedSend::new("k", "k", true).read_throttled(), GATHER);
    }

    #[test]
    fn a_request_that_queued_its_send_withdraws_it_and_a_waiting_replay_gives_up() {
        let mut s = QueuedSend::new("k", "k", true);
        assert_eq!(s.ending(), Ending::Withdraw);
        s.enqueued(false);
        assert_eq!(s.ending(), Ending::GiveUp);
    }
}
