//! Sending a message (docs/api.md §10), pure: what a send alone and a queued send decide, and the
//! layout of the transaction that commits them. The algorithm is docs/data-model.md §3 "Send";
//! its items §2.4–§2.4b; why `seq` stays gap-free §4.1. `store/send.rs` makes the DynamoDB calls
//! in the order decided here and passes the clock in: nothing here reads it.
//!
//! - `group_commit`: which queued sends a commit takes, the parts of its transaction (or of a
//!   send alone), and what a cancellation of it means.
//! - `queued`: the step function of a queued send waiting for its commit.

pub mod group_commit;
pub mod queued;

use std::time::Duration;

use super::ids::UserId;

/// How long after a group commit of several sends new sends queue up rather than try alone.
pub const BUSY_FOR: Duration = Duration::from_secs(5);

/// The least time a queued send waits before it looks again whether it was committed: about one
/// commit, during which more sends queue up for the next.
pub const GATHER: Duration = Duration::from_millis(20);

/// How long the oldest queued send may sit still before the next request in the queue commits
/// it (the one after that waits twice as long, and so on). Its own request normally commits it:
/// this is for a request that ended (a crash, a timeout).
pub const TAKE_OVER_AFTER: Duration = Duration::from_millis(1000);

/// Sends per group commit, and items per transaction (DynamoDB's limit).
pub const MAX_BATCH: usize = 24;
pub const MAX_TX_ITEMS: usize = 100;

/// The conversation item as the next commit needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub last_seq: u64,
    pub last_message_at: Option<String>,
    /// Until when (unix ms) sends queue up (`busyUntil`; 0: never said).
    pub busy_until: u64,
    /// How many times the archiver has moved idempotency keys of this conversation out of it
    /// (`keyMoves`, docs/data-model.md §2.4c; 0: never). Not 0: a new `clientMsgId` may be an
    /// archived one, so its archived key is read after this head was; a commit holds only while
    /// it is unchanged (no key moved since that read).
    pub key_moves: u64,
}

impl Head {
    /// The conversation item as the last group commit left it, while that commit is recent:
    /// exact while the conversation is busy (sends alone are refused then, so only group commits
    /// move `lastSeq`). After a quiet spell a send alone may have moved on, and a commit from this
    /// head fails on its condition, which returns the current head.
    pub fn after(commit: &LastCommit<'_>, now_ms: u64) -> Option<Head> {
        (commit.committed_at + millis(BUSY_FOR) > now_ms).then(|| Head {
            last_seq: commit.last_seq,
            last_message_at: Some(commit.created_at.to_owned()),
            busy_until: 0,
            key_moves: commit.key_moves,
        })
    }

    /// Keys of this conversation were archived: a send must look for its archived key.
    pub fn keys_moved(&self) -> bool {
        self.key_moves > 0
    }

    /// Sends are queued: a new one joins the queue rather than racing it.
    pub fn busy(&self, now_ms: u64) -> bool {
        self.busy_until > now_ms
    }
}

/// What a send whose transaction alone lost the race does before it queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeforeQueueing {
    /// Read its member item first: only a member queues. Not needed when the cancellation
    /// showed its member condition holding.
    pub check_member: bool,
    /// Mark the conversation busy: the first send to lose the race, so that new sends queue
    /// behind it instead of racing the group commit.
    pub mark_busy: bool,
}

/// `head`: the conversation as the lost attempt left it known; `member_shown`: whether its
/// cancellation showed the sender a member.
pub fn after_lost(head: &Head, member_shown: bool, now_ms: u64) -> BeforeQueueing {
    BeforeQueueing {
        check_member: !member_shown,
        mark_busy: !head.busy(now_ms),
    }
}

/// A send as its key item `X#` or its queued send `P#` records it, or as a request makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent<'a> {
    pub sender: &'a UserId,
    /// `message_fingerprint(sender, body)`.
    pub fingerprint: &'a str,
    pub request_id: &'a str,
}

/// What an existing send under the same `clientMsgId` means for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The same send: the original answers (`created` only for the request that made it).
    Same { created: bool },
    /// Another sender or another body: `409`.
    Conflict,
}

impl Sent<'_> {
    /// What `existing` (under the same `clientMsgId`) means for this send.
    pub fn against(&self, existing: &Sent<'_>) -> Verdict {
        if existing.sender != self.sender || existing.fingerprint != self.fingerprint {
            return Verdict::Conflict;
        }
        Verdict::Same {
            created: existing.request_id == self.request_id,
        }
    }
}

/// `busyUntil` for a conversation found contended at `now_ms`.
pub fn busy_until(now_ms: u64) -> u64 {
    now_ms + millis(BUSY_FOR)
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// A queued send (`P#`, docs/data-model.md §2.4a) as the decisions see it: the store keeps the
/// rest (the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The lower-case `clientMsgId`.
    pub key: &'a str,
    /// The request that queued it.
    pub request_id: &'a str,
    pub sender: &'a UserId,
    /// Microseconds since the epoch: the oldest is committed first.
    pub enqueued_at: u64,
    /// Milliseconds since the epoch: its request's deadline, after which no commit takes it.
    pub expires_at: u64,
}

/// The record of the last group commit (`P!`, docs/data-model.md §2.4b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCommit<'a> {
    pub last_seq: u64,
    /// The time of its messages.
    pub created_at: &'a str,
    /// Unix ms, the committer's clock.
    pub committed_at: u64,
    /// The conversation's `keyMoves` it committed under.
    pub key_moves: u64,
    /// What it committed: `(key, requestId, seq)` per send.
    pub sends: Vec<(&'a str, &'a str, u64)>,
}

impl LastCommit<'_> {
    /// The seq this commit gave the send `key` of the request `request_id`, if it did: a replay
    /// queued after the commit (another request) is not answered from it.
    pub fn seq_of(&self, key: &str, request_id: &str) -> Option<u64> {
        self.sends
            .iter()
            .find(|(k, r, _)| *k == key && *r == request_id)
            .map(|(_, _, seq)| *seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(committed_at: u64) -> LastCommit<'static> {
        LastCommit {
            last_seq: 8,
            created_at: "2026-01-01T00:00:00.000Z",
            committed_at,
            key_moves: 3,
            sends: vec![("k1", "r1", 7), ("k2", "r2", 8)],
        }
    }

    #[test]
    fn a_recent_commit_says_where_the_conversation_is() {
        let head = Head::after(&record(10_000), 14_999).expect("recent");
        assert_eq!(head.last_seq, 8);
        assert_eq!(
            head.last_message_at.as_deref(),
            Some("2026-01-01T00:00:00.000Z")
        );
        assert_eq!(head.key_moves, 3, "the commit's condition held for it");
        assert!(head.keys_moved());
    }

    #[test]
    fn a_commit_older_than_the_busy_spell_says_nothing() {
        assert_eq!(Head::after(&record(10_000), 15_000), None);
    }

    #[test]
    fn a_conversation_is_busy_until_its_mark_runs_out() {
        let head = idle(busy_until(1_000));
        assert!(head.busy(5_999));
        assert!(!head.busy(6_000));
    }

    fn idle(busy_until: u64) -> Head {
        Head {
            last_seq: 1,
            last_message_at: None,
            busy_until,
            key_moves: 0,
        }
    }

    #[test]
    fn the_first_send_to_lose_the_race_marks_the_conversation_busy() {
        let first = after_lost(&idle(0), true, 1_000);
        assert!(first.mark_busy && !first.check_member);
        let behind = after_lost(&idle(1_001), true, 1_000);
        assert!(!behind.mark_busy, "marked already");
    }

    #[test]
    fn a_send_lost_to_a_conflict_checks_its_membership_before_it_queues() {
        assert!(after_lost(&idle(0), false, 1_000).check_member);
    }

    #[test]
    fn the_same_send_again_is_the_original_and_created_only_by_its_request() {
        let u = UserId::parse("u").unwrap();
        let sent = |request_id| Sent {
            sender: &u,
            fingerprint: "f",
            request_id,
        };
        let created = Verdict::Same { created: true };
        assert_eq!(sent("r1").against(&sent("r1")), created);
        let replay = Verdict::Same { created: false };
        assert_eq!(sent("r2").against(&sent("r1")), replay);
    }

    #[test]
    fn another_body_or_sender_under_a_clientmsgid_is_a_conflict() {
        let (a, b) = (UserId::parse("a").unwrap(), UserId::parse("b").unwrap());
        let original = Sent {
            sender: &a,
            fingerprint: "f",
            request_id: "r",
        };
        let body = Sent {
            fingerprint: "g",
            ..original
        };
        let sender = Sent {
            sender: &b,
            ..original
        };
        assert_eq!(body.against(&original), Verdict::Conflict);
        assert_eq!(sender.against(&original), Verdict::Conflict);
    }

    #[test]
    fn a_commit_record_answers_only_the_request_it_committed() {
        let r = record(0);
        assert_eq!(r.seq_of("k2", "r2"), Some(8));
        assert_eq!(r.seq_of("k1", "r9"), None, "a replay by another request");
        assert_eq!(r.seq_of("k3", "r1"), None);
    }
}
