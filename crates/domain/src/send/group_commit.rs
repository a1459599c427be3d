//! The group commit's transaction, as plain data (docs/data-model.md §3 "Send", steps 3–4): which
//! queued sends it takes, its parts (which item, what write, on what condition), and what a
//! cancellation says, read off the parts rather than off their positions. A send alone is the
//! same transaction for one send, without the queue's parts. The store turns each part into a
//! TransactWriteItems action, in this order.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use super::{busy_until, Entry, Head, MAX_BATCH, MAX_TX_ITEMS};
use crate::ids::UserId;
use crate::message::message_time;

/// The live queued sends in commit order (the oldest first, ties by key), and those whose
/// request has ended at `now_ms`, which no commit takes: indices into `queue`.
pub fn commit_order(queue: &[Entry<'_>], now_ms: u64) -> (Vec<usize>, Vec<usize>) {
    let (mut live, expired): (Vec<usize>, Vec<usize>) =
        (0..queue.len()).partition(|&i| queue[i].expires_at > now_ms);
    live.sort_by_key(|&i| (queue[i].enqueued_at, queue[i].key));
    (live, expired)
}

/// The next group commit: the first sends of `order`, as many as one transaction holds.
pub fn first_batch(order: &[usize]) -> Vec<usize> {
    order.iter().copied().take(MAX_BATCH).collect()
}

/// Items of a group commit: the conversation, the record, 3 per send, 1 per sender.
const fn items_of(sends: usize, senders: usize) -> usize {
    2 + 3 * sends + senders
}

// A full batch fits one transaction however many senders it has.
const _: () = assert!(items_of(MAX_BATCH, MAX_BATCH) <= MAX_TX_ITEMS);

/// One action of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub target: Target,
    pub write: Write,
    pub condition: Condition,
}

/// Which item a part writes. `send` is the index of the send in the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `C`.
    Conversation,
    /// `S#<seq>`.
    Message { send: usize },
    /// `X#<clientMsgId>`.
    SendKey { send: usize },
    /// `P#<clientMsgId>`.
    QueuedSend { send: usize },
    /// `M#<sender>`.
    Member { sender: UserId },
    /// `P!`.
    CommitRecord,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// The item, as built from the send (or the commit).
    Put,
    Delete,
    /// `lastSeq` to `to_seq`, `lastMessageAt` and the preview to the last message's; and
    /// `busyUntil` when given.
    AdvanceConversation {
        to_seq: u64,
        busy_until: Option<u64>,
    },
    /// `lastReadSeq` and `lastSentSeq` to the sender's newest message in the commit.
    MoveWatermark {
        to_seq: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    None,
    /// `lastSeq` and `keyMoves` are still the ones read (`Head::key_moves`: no key archived
    /// since its archived key was looked for).
    LastSeqIs {
        last_seq: u64,
        key_moves: u64,
    },
    /// A send alone: as `LastSeqIs`, and no `busyUntil` lies ahead of `now_ms` (alone only while
    /// nothing is queued, even if the conversation was read before it was marked).
    LastSeqIsAndNotBusy {
        last_seq: u64,
        key_moves: u64,
        now_ms: u64,
    },
    /// The item does not exist.
    Absent,
    /// The member item exists (the sender is a member) and is not marked `blocked` (its peer in
    /// a direct conversation blocks it: docs/data-model.md §10.1).
    MayPost,
    /// The queued send is the one read (`requestId`) and its request is live at `now_ms`.
    QueuedBy {
        request_id: String,
        now_ms: u64,
    },
}

/// A commit's transaction: its parts in order, and what it stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub parts: Vec<Part>,
    /// The seq of its first send; the others follow.
    pub first_seq: u64,
    /// The time of all its messages (never before the conversation's last one).
    pub created_at: String,
    /// When it commits (unix ms): the record's `committedAt`.
    pub committed_at: u64,
    /// The `busyUntil` it writes, if any.
    pub busy_until: Option<u64>,
    /// The conversation's `keyMoves` it commits under (its record keeps it).
    pub key_moves: u64,
}

/// The transaction of a send alone after `head` (docs/data-model.md §3 "Send", "Alone"). Its
/// parts: the conversation, the message, the key, the sender's watermark.
pub fn alone(head: &Head, sender: &UserId, now: OffsetDateTime) -> Layout {
    let mut layout = Layout::new(head, now);
    let now_ms = layout.committed_at;
    let condition = Condition::LastSeqIsAndNotBusy {
        last_seq: head.last_seq,
        key_moves: head.key_moves,
        now_ms,
    };
    layout.advance(1, None, condition);
    layout.message_and_key(0);
    layout.watermark(sender, layout.first_seq);
    layout
}

/// The transaction of a group commit of `batch` after `head` (the senders of the sends it
/// commits, in order; at least one). Its parts: the conversation, per send its message, key and
/// queued send's delete, per sender its watermark, the record.
pub fn group(head: &Head, batch: &[Entry<'_>], now: OffsetDateTime) -> Layout {
    let mut layout = Layout::new(head, now);
    let now_ms = layout.committed_at;
    // Several sends: the conversation is hot, new sends queue. One: contention is over, the mark
    // runs out by itself.
    let busy = (batch.len() > 1).then(|| busy_until(now_ms));
    let condition = Condition::LastSeqIs {
        last_seq: head.last_seq,
        key_moves: head.key_moves,
    };
    layout.advance(batch.len(), busy, condition);
    for (send, entry) in batch.iter().enumerate() {
        layout.message_and_key(send);
        layout.parts.push(Part {
            target: Target::QueuedSend { send },
            write: Write::Delete,
            condition: Condition::QueuedBy {
                request_id: entry.request_id.to_owned(),
                now_ms,
            },
        });
    }
    // One watermark per sender (a transaction touches an item once), to its newest.
    let mut newest: BTreeMap<&UserId, u64> = BTreeMap::new();
    for (entry, seq) in batch.iter().zip(layout.first_seq..) {
        newest.insert(entry.sender, seq);
    }
    for (sender, seq) in newest {
        layout.watermark(sender, seq);
    }
    layout.parts.push(Part {
        target: Target::CommitRecord,
        write: Write::Put,
        condition: Condition::None,
    });
    layout
}

impl Layout {
    fn new(head: &Head, now: OffsetDateTime) -> Layout {
        Layout {
            parts: Vec::new(),
            first_seq: head.last_seq + 1,
            created_at: message_time(crate::time::rfc3339(now), head.last_message_at.as_deref()),
            committed_at: crate::time::unix_millis(now),
            busy_until: None,
            key_moves: head.key_moves,
        }
    }

    /// The seq of the send `send` of this commit.
    pub fn seq(&self, send: usize) -> u64 {
        self.first_seq + send as u64
    }

    fn advance(&mut self, sends: usize, busy_until: Option<u64>, condition: Condition) {
        self.busy_until = busy_until;
        self.parts.push(Part {
            target: Target::Conversation,
            write: Write::AdvanceConversation {
                to_seq: self.seq(sends - 1),
                busy_until,
            },
            condition,
        });
    }

    fn message_and_key(&mut self, send: usize) {
        for target in [Target::Message { send }, Target::SendKey { send }] {
            self.parts.push(Part {
                target,
                write: Write::Put,
                condition: Condition::Absent,
            });
        }
    }

    fn watermark(&mut self, sender: &UserId, to_seq: u64) {
        self.parts.push(Part {
            target: Target::Member {
                sender: sender.clone(),
            },
            write: Write::MoveWatermark { to_seq },
            condition: Condition::MayPost,
        });
    }

    /// The parts whose condition failed, by what they are. `failed[i]`: part `i`'s condition
    /// failed (one entry per part, in order, as DynamoDB reports them).
    fn failures<'a>(&'a self, failed: &'a [bool]) -> impl Iterator<Item = (usize, &'a Target)> {
        self.parts
            .iter()
            .enumerate()
            .filter(|(i, _)| failed.get(*i).copied().unwrap_or(false))
            .map(|(i, p)| (i, &p.target))
    }

    /// What a cancelled send alone means. A cancellation reports every failed condition; the
    /// member's comes first, so a caller that is not a member learns nothing else (not even that
    /// its `clientMsgId` was sent, or is someone else's).
    pub fn alone_cancelled(&self, failed: &[bool]) -> AloneCancelled {
        let part_of = |wanted: fn(&Target) -> bool| {
            self.failures(failed)
                .find(|(_, t)| wanted(t))
                .map(|(i, _)| i)
        };
        if part_of(|t| matches!(t, Target::Member { .. })).is_some() {
            return AloneCancelled::NotMember;
        }
        if let Some(part) = part_of(|t| matches!(t, Target::SendKey { .. })) {
            return AloneCancelled::Replay { part };
        }
        match part_of(|t| matches!(t, Target::Conversation)) {
            Some(part) => AloneCancelled::Lost { part },
            None => AloneCancelled::LostUnseen,
        }
    }

    /// What a cancelled group commit of `batch` (as given to `group`) means.
    pub fn group_cancelled(&self, batch: &[Entry<'_>], failed: &[bool]) -> GroupCancelled {
        let mut drop = Vec::new();
        for (part, target) in self.failures(failed) {
            match target {
                Target::Conversation => return GroupCancelled::Moved { part },
                // Committed or dropped by someone else since it was read.
                Target::QueuedSend { .. } => return GroupCancelled::Taken,
                // The same clientMsgId was committed meanwhile (by a replay alone).
                Target::SendKey { send } => drop.push(*send),
                // No longer a member: all its sends go.
                Target::Member { sender } => {
                    drop.extend((0..batch.len()).filter(|&i| batch[i].sender == sender))
                }
                Target::Message { .. } | Target::CommitRecord => {}
            }
        }
        if drop.is_empty() {
            GroupCancelled::Taken
        } else {
            GroupCancelled::Drop(drop)
        }
    }
}

/// Why a send alone was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AloneCancelled {
    /// The sender is not a member (any more): `404`.
    NotMember,
    /// The key exists: a replay, answered from the old item of part `part`.
    Replay { part: usize },
    /// Another send took the seq: queue, from the conversation as the old item of part `part`
    /// shows it.
    Lost { part: usize },
    /// Only the message's condition failed, which cannot happen while the conversation's holds:
    /// treated as a lost race, from the conversation as read.
    LostUnseen,
}

/// Why a group commit was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupCancelled {
    /// Someone else committed first: the old item of part `part` is the conversation they left.
    Moved { part: usize },
    /// A send of the batch was committed or dropped by someone else since it was read (or no
    /// condition of ours failed): look again.
    Taken,
    /// These sends of the batch (indices) cannot be committed, ever: drop them, in this order.
    Drop(Vec<usize>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).unwrap()
    }

    fn entry<'a>(key: &'a str, sender: &'a UserId, at: u64) -> Entry<'a> {
        Entry {
            key,
            request_id: key,
            sender,
            enqueued_at: at,
            expires_at: u64::MAX,
        }
    }

    fn head(last_seq: u64) -> Head {
        Head {
            last_seq,
            last_message_at: Some("2026-01-01T00:00:00.500Z".into()),
            busy_until: 0,
            // Keys were archived twice: every commit holds only while no more were.
            key_moves: 2,
        }
    }

    /// 2026-01-01T00:00:00.000Z: before the head's last message.
    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_767_225_600).unwrap()
    }

    fn failed_at(parts: usize, at: &[usize]) -> Vec<bool> {
        (0..parts).map(|i| at.contains(&i)).collect()
    }

    #[test]
    fn the_oldest_live_send_is_committed_first_and_ended_ones_never() {
        let (u1, u2) = (user("u1"), user("u2"));
        let mut ended = entry("d", &u1, 5);
        ended.expires_at = 100;
        let queue = [
            entry("c", &u1, 30),
            entry("b", &u2, 10),
            ended,
            entry("a", &u1, 10),
        ];
        let (live, expired) = commit_order(&queue, 100);
        assert_eq!(live, [3, 1, 0], "by time, ties by key");
        assert_eq!(expired, [2], "expired at its deadline");
        assert_eq!(first_batch(&live), [3, 1, 0]);
    }

    #[test]
    fn a_batch_stops_at_24_sends_which_fit_one_transaction_whoever_sent_them() {
        let order: Vec<usize> = (0..40).collect();
        assert_eq!(first_batch(&order), (0..MAX_BATCH).collect::<Vec<_>>());
        assert!(first_batch(&[]).is_empty());
        // Distinct senders: 4 items a send, plus the conversation and the record (also checked
        // when compiling); one more send would not fit.
        assert_eq!(items_of(MAX_BATCH, MAX_BATCH), 98);
        assert!(items_of(MAX_BATCH + 1, MAX_BATCH + 1) > MAX_TX_ITEMS);
    }

    #[test]
    fn a_send_alone_moves_the_conversation_only_while_nothing_is_queued() {
        let u = user("u");
        let layout = alone(&head(7), &u, now());
        let targets: Vec<&Target> = layout.parts.iter().map(|p| &p.target).collect();
        assert_eq!(
            targets,
            [
                &Target::Conversation,
                &Target::Message { send: 0 },
                &Target::SendKey { send: 0 },
                &Target::Member { sender: u.clone() },
            ]
        );
        assert_eq!(
            layout.parts[0].write,
            Write::AdvanceConversation {
                to_seq: 8,
                busy_until: None
            }
        );
        assert_eq!(
            layout.parts[0].condition,
            Condition::LastSeqIsAndNotBusy {
                last_seq: 7,
                key_moves: 2,
                now_ms: 1_767_225_600_000
            }
        );
        assert_eq!(layout.parts[3].write, Write::MoveWatermark { to_seq: 8 });
        assert_eq!(layout.busy_until, None);
    }

    #[test]
    fn a_message_is_never_older_than_the_conversations_last() {
        let layout = alone(&head(7), &user("u"), now());
        assert_eq!(layout.created_at, "2026-01-01T00:00:00.500Z");
        let mut quiet = head(7);
        quiet.last_message_at = None;
        assert_eq!(
            alone(&quiet, &user("u"), now()).created_at,
            "2026-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn a_group_commit_takes_each_send_once_and_each_sender_once() {
        let (u1, u2) = (user("u1"), user("u2"));
        let batch = [entry("a", &u2, 1), entry("b", &u1, 2), entry("c", &u2, 3)];
        let layout = group(&head(10), &batch, now());
        let now_ms = 1_767_225_600_000;
        assert_eq!(layout.parts.len(), items_of(3, 2));
        assert_eq!(
            layout.parts[0],
            Part {
                target: Target::Conversation,
                write: Write::AdvanceConversation {
                    to_seq: 13,
                    busy_until: Some(now_ms + 5_000)
                },
                condition: Condition::LastSeqIs {
                    last_seq: 10,
                    key_moves: 2
                },
            }
        );
        assert_eq!(
            layout.parts[3],
            Part {
                target: Target::QueuedSend { send: 0 },
                write: Write::Delete,
                condition: Condition::QueuedBy {
                    request_id: "a".into(),
                    now_ms
                },
            }
        );
        // Watermarks in sender order, each to its newest seq.
        assert_eq!(layout.parts[10].target, Target::Member { sender: u1 });
        assert_eq!(layout.parts[10].write, Write::MoveWatermark { to_seq: 12 });
        assert_eq!(layout.parts[11].target, Target::Member { sender: u2 });
        assert_eq!(layout.parts[11].write, Write::MoveWatermark { to_seq: 13 });
        assert_eq!(layout.parts[12].target, Target::CommitRecord);
        assert_eq!((layout.first_seq, layout.seq(2)), (11, 13));
        assert_eq!(layout.committed_at, now_ms);
    }

    #[test]
    fn a_group_commit_of_one_send_lets_the_busy_mark_run_out() {
        let u = user("u");
        let layout = group(&head(0), &[entry("a", &u, 1)], now());
        assert_eq!(layout.busy_until, None);
        assert_eq!(
            layout.parts[0].write,
            Write::AdvanceConversation {
                to_seq: 1,
                busy_until: None
            }
        );
    }

    /// How a send alone is cancelled when the conditions of `parts` fail (0 conversation,
    /// 1 message, 2 key, 3 member).
    fn alone_failing(parts: &[usize]) -> AloneCancelled {
        alone(&head(1), &user("u"), now()).alone_cancelled(&failed_at(4, parts))
    }

    #[test]
    fn a_send_alone_of_a_non_member_learns_nothing_else() {
        assert_eq!(alone_failing(&[0, 2, 3]), AloneCancelled::NotMember);
    }

    #[test]
    fn a_send_alone_whose_key_exists_is_a_replay() {
        assert_eq!(alone_failing(&[0, 2]), AloneCancelled::Replay { part: 2 });
    }

    #[test]
    fn a_send_alone_that_lost_the_seq_queues_from_the_conversation_returned() {
        assert_eq!(alone_failing(&[0]), AloneCancelled::Lost { part: 0 });
    }

    #[test]
    fn a_send_alone_cancelled_on_its_message_alone_is_a_lost_race() {
        assert_eq!(alone_failing(&[1]), AloneCancelled::LostUnseen);
        assert_eq!(alone_failing(&[]), AloneCancelled::LostUnseen);
    }

    #[test]
    fn a_cancellation_that_gives_no_reasons_fails_no_part() {
        let u = user("u");
        let layout = alone(&head(1), &u, now());
        assert_eq!(layout.alone_cancelled(&[]), AloneCancelled::LostUnseen);
        let batch = [entry("a", &u, 1)];
        let layout = group(&head(1), &batch, now());
        assert_eq!(layout.group_cancelled(&batch, &[]), GroupCancelled::Taken);
    }

    /// How a group commit of a (u2), b (u1), c (u2) is cancelled when the conditions of `parts`
    /// fail: 0 conversation; 1–3 a, 4–6 b, 7–9 c (message, key, queued send); 10 u1; 11 u2;
    /// 12 record.
    fn group_failing(parts: &[usize]) -> GroupCancelled {
        let (u1, u2) = (user("u1"), user("u2"));
        let batch = [entry("a", &u2, 1), entry("b", &u1, 2), entry("c", &u2, 3)];
        let layout = group(&head(10), &batch, now());
        layout.group_cancelled(&batch, &failed_at(layout.parts.len(), parts))
    }

    #[test]
    fn a_group_commit_lost_to_another_commit_goes_on_from_the_conversation_returned() {
        assert_eq!(
            group_failing(&[0, 5, 11]),
            GroupCancelled::Moved { part: 0 }
        );
    }

    #[test]
    fn a_group_commit_whose_send_was_taken_meanwhile_looks_again() {
        // Even when an earlier send's key failed too.
        assert_eq!(group_failing(&[2, 6]), GroupCancelled::Taken);
    }

    #[test]
    fn a_send_whose_key_was_committed_meanwhile_is_dropped() {
        assert_eq!(group_failing(&[5]), GroupCancelled::Drop(vec![1]));
    }

    #[test]
    fn every_send_of_a_removed_member_is_dropped_after_the_key_drops() {
        assert_eq!(group_failing(&[5, 11]), GroupCancelled::Drop(vec![1, 0, 2]));
    }

    #[test]
    fn a_group_commit_cancelled_on_no_condition_of_ours_looks_again() {
        // A message's condition (cannot fail while the conversation's holds), or none reported.
        assert_eq!(group_failing(&[1, 12]), GroupCancelled::Taken);
        assert_eq!(group_failing(&[]), GroupCancelled::Taken);
    }
}
