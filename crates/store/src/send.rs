//! `sendMessage` (docs/api.md §10) on DynamoDB: alone, or queued for a group commit, as
//! docs/data-model.md §3 "Send" describes (the items: §2.4–§2.4b; why `seq` stays gap-free:
//! §4.1). The decisions are `chat_domain::send`; this module makes the calls they ask for, in their
//! order, and reads the clock for them.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{
    from_item, to_item, ArchivedKeyItem, CommitRecordItem, CommittedSend, LastMessage, QueuedItem,
    SendKeyItem,
};
use super::{keys, sdk_error, tx, CancelReason, ChatStore, TxOutcome};
use crate::retry::Deadline;
use crate::telemetry;
use chat_domain::attachments::Attachment;
use chat_domain::error::ChatError;
use chat_domain::message::send_fingerprint;
use chat_domain::model::Message;
use chat_domain::requests::SendMessage;
use chat_domain::retry::jitter;
use chat_domain::send::group_commit::{
    self, AloneCancelled, Condition, GroupCancelled, Layout, Part, Target, Write,
};
use chat_domain::send::queued::{AfterCommit, Attempt, Ending, KeyMissing, Look, QueuedSend, Step};
use chat_domain::send::{after_lost, busy_until, Entry, Head, LastCommit, Sent, Verdict};
use chat_domain::{ConversationId, UserId};

/// One send request: who sends what where, and the id that tells it apart from a replay of the
/// same `clientMsgId` (another request).
struct SendRequest<'a> {
    id: &'a ConversationId,
    caller: &'a UserId,
    request: &'a SendMessage,
    fingerprint: String,
    request_id: String,
    /// Its attachments as checked (`attachments_for_send`), in the request's order.
    attachments: Vec<Attachment>,
}

/// Reads again of a send whose attachments' records changed before its commit (each change is
/// a thumbnail or a verdict, so two are the most one send can meet, short of a deletion).
const STALE_REREADS: usize = 3;

/// How a send alone ended.
enum Alone {
    Done(Message, bool),
    /// An attachment's record changed since the send read it (nothing was written): read again.
    Stale,
    /// Another send took the seq (or holds the conversation item): queue, from this head.
    /// `member`: the transaction's member condition held (its cancellation said so), so the
    /// caller needs no membership check before it queues.
    Lost {
        head: Head,
        member: bool,
    },
}

/// A send's idempotency key as stored: in the conversation (`X#`), or, once its message is
/// archived, in the archived keys' table (docs/data-model.md §2.4c).
enum StoredKey {
    Live(SendKeyItem),
    Archived(ArchivedKeyItem),
}

/// What queuing a send found.
enum Enqueued {
    /// Queued by this request (true), or a replay of it is queued, which it waits for (false).
    Queued(bool),
    /// Its message is stored, committed while another send of its `clientMsgId` (another body
    /// or sender) stood queued: the stored one decides the answer.
    Stored(StoredKey),
}

/// What one Query of the queue shows: the last group commit and the queued sends.
struct Queue {
    last_commit: Option<CommitRecordItem>,
    queued: Vec<QueuedItem>,
}

/// What a commit stores: its layout, and per send its content and its message.
struct Commit<'a> {
    id: &'a ConversationId,
    layout: &'a Layout,
    sends: Vec<&'a QueuedItem>,
    messages: Vec<Message>,
}

/// Where a step of a queued send leaves its request (one at a time, on the stack: its size does
/// not matter).
#[allow(clippy::large_enum_variant)]
enum Flow {
    /// Look again after this long.
    Wait(Duration),
    Answer((Message, bool)),
}

/// How taking a queued send out of the queue went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    Deleted,
    /// Not there (as this request wrote it): committed, or dropped by another.
    Gone,
    /// A commit holding it is in flight.
    InCommit,
}

impl ChatStore {
    /// `sendMessage`. Returns `(message, created)`.
    ///
    /// Membership comes first: a caller that is not a member gets `NotFound` before anything is
    /// written, and before anything about the conversation's sends (a `409` for a `clientMsgId`
    /// in use, a replay's `200`) can answer it.
    ///
    /// DynamoDB, first: the send limit's (`limit_send`: 1 UpdateItem; when it refuses, + 1 or 2
    /// GetItem of the send's key, live or archived, so that a replay is still answered).
    /// Alone: 1 GetItem (+ 1 GetItem of its archived key once keys of the conversation
    /// were archived) + 1 TransactWriteItems (a replay too; a replay of an archived message
    /// instead: + 1 GetItem of the caller's member item and `answer_archived`'s). Queued: (+ 1 GetItem of
    /// the caller's member item, unless its send alone has just shown it a member) (+ 1 UpdateItem
    /// for the first send to lose the race) + 1 PutItem, then per look 1 Query of the queue until
    /// its message is committed, by another (the Query shows the commit's record) or by this
    /// request (+ 1 TransactWriteItems, and a GetItem of the conversation when no recent commit
    /// says where it is).
    ///
    /// With attachments, the message carries copies of their records as read. A refused
    /// attachment (unknown, used) of a send whose key exists is a replay (its message deleted
    /// since, and its attachments with it): + 1 or 2 GetItem of the key, then the replay's answer. Alone, the
    /// transaction's claims are conditioned on the records not having gained a thumbnail or a
    /// verdict since (a recorder finds no message to copy them to before the commit): when one
    /// has, nothing is written and the send reads again (the whole again, at most
    /// `STALE_REREADS` times). Queued, the claim comes before the wait: after the commit,
    /// `refresh_attachment_copies`'s calls, only when a copy lacks a size or a verdict.
    ///
    /// A direct conversation's member whose peer blocks it is refused by the same condition as a
    /// non-member (its member item's `blocked`, docs/data-model.md §10.1); only then is its member
    /// item read to tell the two apart (`403 blocked`; a retry of its own send stored before the
    /// block is answered: `answer_blocked`).
    ///
    /// S3, with attachments: `attachments_for_send`'s; while scanning is on, + those of
    /// `untag_after_send` once the message is stored.
    pub async fn send_message(
        &self,
        caller: &UserId,
        id: &ConversationId,
        request: &SendMessage,
    ) -> Result<(Message, bool), ChatError> {
        match self.send_as_member(caller, id, request).await {
            Err(ChatError::NotFound) if id.is_direct() => {
                let member = self
                    .item_fields(keys::member_key(id, caller), Some("blocked"))
                    .await?;
                match member {
                    Some(m) if m.contains_key("blocked") => {
                        self.answer_blocked(SendRequest::new(caller, id, request))
                            .await
                    }
                    _ => Err(ChatError::NotFound),
                }
            }
            Err(ChatError::Blocked(_)) => {
                self.answer_blocked(SendRequest::new(caller, id, request))
                    .await
            }
            Ok(sent) => {
                self.untag_after_send(&sent.0).await?;
                Ok(sent)
            }
            refused => refused,
        }
    }

    /// A send refused because the peer blocks its sender (`403 blocked`), unless it is a retry
    /// of the caller's own send stored before the block: a retry learns its outcome (docs/api.md
    /// §2), and a member is hidden nothing. DynamoDB: `stored_key`'s (+ with attachments,
    /// `head_with_attachments`' BatchGetItem, for the replay's copies of them).
    async fn answer_blocked(
        &self,
        mut send: SendRequest<'_>,
    ) -> Result<(Message, bool), ChatError> {
        let Some(key) = self.stored_key(&send).await? else {
            return Err(super::blocked_by_peer());
        };
        if !send.request.attachments.is_empty() {
            // A message deleted since took its attachments with it: its tombstone has none.
            let _ = self.head_with_attachments(&mut send).await;
        }
        match self.replay(key, &send).await {
            Err(ChatError::Conflict(_)) => Err(super::blocked_by_peer()),
            answered => answered,
        }
    }

    async fn send_as_member(
        &self,
        caller: &UserId,
        id: &ConversationId,
        request: &SendMessage,
    ) -> Result<(Message, bool), ChatError> {
        let mut send = SendRequest::new(caller, id, request);
        // The sender's rate limit (docs/api.md §24), before anything is written. A retry of a
        // send already stored (after a 503, say) is not refused: it learns its outcome. That
        // costs a read only when the limit refuses.
        if let Err(limited) = self.limit_send(caller).await {
            let refused = matches!(limited, ChatError::RateLimited { .. });
            // A key that cannot be read (or not now: `may_look_up_refused`) leaves the refusal
            // standing: nothing was done.
            if !refused
                || !self.may_look_up_refused(caller)
                || !matches!(self.stored_key(&send).await, Ok(Some(_)))
            {
                return Err(limited);
            }
        }
        // Reads only so far: one that gets no answer leaves nothing done (a 429, not a 503).
        let head = if !request.attachments.is_empty() {
            match self.head_with_attachments(&mut send).await {
                Ok(head) => Some(head),
                // A refused attachment of a send already stored (its message deleted since,
                // and its attachments with it): a retry learns its outcome, as any replay.
                Err(e @ ChatError::InvalidRequest(_)) => match self.stored_key(&send).await {
                    Ok(Some(key)) => return self.replay(key, &send).await,
                    _ => return Err(e),
                },
                Err(e) => return Err(super::nothing_done(e)),
            }
        } else if self.seen.busy(id, now_ms()) {
            // Sends were queued a moment ago (this instance saw it): queue up, no read needed.
            None
        } else {
            let head = self.head(id).await.map_err(super::nothing_done)?;
            Some(head.ok_or(ChatError::NotFound)?)
        };
        // Slow mode (docs/api.md §25), by the rules `head` read (or this instance read last):
        // the sender's slot for this period, given back when the send stores nothing. A retry
        // of a stored `clientMsgId` is answered, as for the rate limit.
        let claim = match self
            .claim_slow_mode(id, caller, &request.client_msg_key)
            .await
        {
            Ok(claim) => claim,
            Err(e @ ChatError::SlowMode { .. }) => {
                if !self.may_look_up_refused(caller)
                    || !matches!(self.stored_key(&send).await, Ok(Some(_)))
                {
                    return Err(e);
                }
                None
            }
            Err(e) => return Err(e),
        };
        let mut sent = self.send_from(&send, head).await;
        // An attachment's record changed between the read and the commit: read again.
        for _ in 0..STALE_REREADS {
            if !matches!(sent, Ok(None)) {
                break;
            }
            sent = match self.head_with_attachments(&mut send).await {
                Ok(head) => self.send_from(&send, Some(head)).await,
                Err(e) => Err(super::nothing_done(e)),
            };
        }
        // Still changing after those reads: nothing was stored.
        let sent = sent.and_then(|sent| sent.ok_or(ChatError::Throttled));
        if let Some(claim) = claim {
            let stored_nothing = match &sent {
                Ok((_, created)) => !created,
                Err(e) => *e != ChatError::Unavailable,
            };
            if stored_nothing {
                self.release_slow_mode(id, caller, claim).await;
            }
        }
        sent
    }

    /// The send from the conversation's `head` (None: queue up at once); None: an attachment's
    /// record changed since `head` was read with it, and nothing was written (read again).
    async fn send_from(
        &self,
        send: &SendRequest<'_>,
        head: Option<Head>,
    ) -> Result<Option<(Message, bool)>, ChatError> {
        let (id, request) = (send.id, send.request);
        let Some(head) = head else {
            self.require_member(send).await?;
            return self.send_queued(send).await.map(Some);
        };

        // Read after the head: the commit's condition on `keyMoves` then proves no key moved
        // out since this read found none (docs/data-model.md §4.2).
        if head.keys_moved() {
            if let Some(key) = self.archived_key(id, &request.client_msg_key).await? {
                self.require_member(send).await?;
                return self.answer_archived(key, send).await.map(Some);
            }
        }
        if head.busy(now_ms()) {
            self.require_member(send).await?;
            return self.send_queued(send).await.map(Some);
        }
        match self.send_alone(send, &head).await? {
            Alone::Done(message, created) => Ok(Some((message, created))),
            Alone::Stale => Ok(None),
            Alone::Lost { head, member } => {
                let before = after_lost(&head, member, now_ms());
                if before.check_member {
                    self.require_member(send).await?;
                }
                if before.mark_busy {
                    self.mark_busy(id).await;
                }
                self.send_queued(send).await.map(Some)
            }
        }
    }

    /// Only a member may mark a conversation busy or queue a send: a non-member's queued send
    /// (up to 16 KiB) would wait there until a commit took it, and that commit would be
    /// cancelled for it. Checked before, not in the enqueue's transaction: a ConditionCheck on
    /// the member item would double the enqueue's write units and conflict with the commits that
    /// move that member's watermark. A member removed between this check and its enqueue is
    /// still dropped at commit (its watermark's condition). DynamoDB: 1 strongly consistent
    /// GetItem.
    async fn require_member(&self, send: &SendRequest<'_>) -> Result<(), ChatError> {
        self.require_member_of(send.id, send.caller).await
    }

    /// Whether `user` is a member of `id` (else `NotFound`) whose peer does not block it (else
    /// `Blocked`: a member, whom nothing may be hidden from). DynamoDB: 1 strongly consistent
    /// GetItem.
    pub(crate) async fn require_member_of(
        &self,
        id: &ConversationId,
        user: &UserId,
    ) -> Result<(), ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(id, user)))
            .consistent_read(true)
            .projection_expression("pk, blocked")
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        match out.item {
            Some(m) if m.contains_key("blocked") => Err(super::blocked_by_peer()),
            Some(_) => Ok(()),
            None => Err(ChatError::NotFound),
        }
    }

    /// The first send to lose the race for a conversation marks it busy, so that new sends
    /// queue behind it instead of racing the group commit (and winning: their transactions are
    /// smaller, and a commit that keeps losing starves the queue). Best effort: a failure only
    /// means someone else's write got there first. DynamoDB: 1 UpdateItem.
    async fn mark_busy(&self, id: &ConversationId) {
        let until = busy_until(now_ms());
        let condition =
            "attribute_exists(pk) AND (attribute_not_exists(busyUntil) OR busyUntil < :busy)";
        let marked = self
            .conversation_update(id, "SET busyUntil = :busy", condition)
            .expression_attribute_values(":busy", n(until))
            .send()
            .await;
        if let Err(e) = marked {
            tracing::debug!(error = %e, "conversation not marked busy");
        }
        self.seen.saw_busy(id, until);
    }

    /// `lastSeq`, `lastMessageAt` and `busyUntil` of a conversation (None: no such
    /// conversation), and its slow-mode rules, which it remembers (`slow_rules`). DynamoDB: 1 strongly consistent GetItem.
    async fn head(&self, id: &ConversationId) -> Result<Option<Head>, ChatError> {
        let fields =
            "lastSeq, lastMessageAt, busyUntil, keyMoves, slowModeSeconds, ownerId, adminIds";
        let item = self.conversation_fields(id, Some(fields)).await?;
        let head = item.as_ref().and_then(head_of);
        if let Some(item) = &item {
            self.slow_rules.saw(id, super::roles::SlowRule::of(item));
        }
        if let Some(h) = &head {
            self.seen.saw_busy(id, h.busy_until);
        }
        Ok(head)
    }

    /// The head and, in the same read, the send's attachment records, checked: the read a send
    /// without attachments makes (1 GetItem) becomes 1 BatchGetItem, so attachments add no round
    /// trip to DynamoDB (+ S3: `attachments_for_send`). A bad attachment is answered only to a
    /// member (membership first, as every send): + 1 GetItem then.
    async fn head_with_attachments(&self, send: &mut SendRequest<'_>) -> Result<Head, ChatError> {
        let ids = &send.request.attachments;
        let mut wanted = vec![keys::conversation_key(send.id)];
        wanted.extend(ChatStore::attachment_keys(ids));
        let found = self.batch_get(wanted, true).await?;
        let is_head = |i: &Item| get_s(i, keys::SK) == Some(keys::CONVERSATION_SK);
        let item = found.iter().find(|i| is_head(i));
        if let Some(item) = item {
            self.slow_rules
                .saw(send.id, super::roles::SlowRule::of(item));
        }
        let head = item.and_then(head_of).ok_or(ChatError::NotFound)?;
        self.seen.saw_busy(send.id, head.busy_until);
        let key = &send.request.client_msg_key;
        match self
            .attachments_for_send(ids, found, send.id, send.caller, key)
            .await
        {
            Ok(attachments) => send.attachments = attachments,
            Err(e) => {
                self.require_member(send).await?;
                return Err(e);
            }
        }
        Ok(head)
    }

    /// A queued send's claim of its attachments, before it is enqueued (a group commit does not
    /// carry them). DynamoDB: 1 TransactWriteItems, none without attachments.
    async fn claim_for_queue(&self, send: &SendRequest<'_>) -> Result<(), ChatError> {
        let ids = &send.request.attachments;
        if ids.is_empty() {
            return Ok(());
        }
        // No condition on the copies: a queued send's message gets what its records gained
        // after its commit (`refresh_attachment_copies`).
        let claims = self.claim_items(ids, &send.request.client_msg_key, &[])?;
        match self.transact(claims).await? {
            TxOutcome::Committed => Ok(()),
            TxOutcome::Conflict => Err(ChatError::Throttled),
            TxOutcome::Cancelled(reasons) => Err(claim_refused(ids, &reasons)),
        }
    }

    /// The send in one transaction of its own (`group_commit::alone`), with its attachments'
    /// claims after the layout's parts. DynamoDB: 1 TransactWriteItems.
    async fn send_alone(&self, send: &SendRequest<'_>, head: &Head) -> Result<Alone, ChatError> {
        let layout = group_commit::alone(head, send.caller, chat_domain::time::now());
        // Never queued: no queue times.
        let content = send.content(0, 0);
        let mut commit = Commit::new(send.id, &layout, vec![&content]);
        let mut actions = self.transact_items(&commit)?;
        let ids = &send.request.attachments;
        actions.extend(self.claim_items(ids, &send.request.client_msg_key, &send.attachments)?);
        let mut reasons = match self.transact(actions).await? {
            TxOutcome::Committed => {
                committed_metrics(1);
                return Ok(Alone::Done(commit.messages.remove(0), true));
            }
            // Lost to another transaction: no condition was evaluated.
            TxOutcome::Conflict => {
                let head = head.clone();
                return Ok(Alone::Lost {
                    head,
                    member: false,
                });
            }
            TxOutcome::Cancelled(reasons) => reasons,
        };
        let claims = reasons.split_off(layout.parts.len().min(reasons.len()));
        if claims.iter().any(CancelReason::failed_condition) {
            // A record that gained a thumbnail or a verdict since it was read: read again.
            let key = send.request.client_msg_key.as_str();
            let changed = |r: &CancelReason| {
                r.item
                    .as_ref()
                    .is_some_and(|i| get_s(i, "usedBy").is_none_or(|k| k == key))
            };
            if claims.iter().filter(|r| r.failed_condition()).all(changed) {
                return Ok(Alone::Stale);
            }
            // Another message took an attachment meanwhile (its record said unused).
            return Err(claim_refused(ids, &claims));
        }
        let old_item = |part: usize| reasons.get(part).and_then(|r| r.item.clone());
        match layout.alone_cancelled(&failed(&reasons)) {
            AloneCancelled::NotMember => Err(ChatError::NotFound),
            AloneCancelled::Replay { part } => {
                let original = old_item(part)
                    .ok_or_else(|| ChatError::internal("no item for a failed key"))?;
                let (message, created) =
                    answer(SendKeyItem::from_stored(original, send.caller)?, send)?;
                Ok(Alone::Done(message, created))
            }
            AloneCancelled::Lost { part } => match old_item(part).as_ref().and_then(head_of) {
                Some(head) => Ok(Alone::Lost { head, member: true }),
                None => Err(ChatError::NotFound),
            },
            AloneCancelled::LostUnseen => {
                let head = head.clone();
                Ok(Alone::Lost { head, member: true })
            }
        }
    }

    /// A commit's parts as TransactWriteItems actions, in order.
    fn transact_items(&self, commit: &Commit<'_>) -> Result<Vec<TransactWriteItem>, ChatError> {
        let parts = commit.layout.parts.iter();
        parts.map(|part| self.transact_item(commit, part)).collect()
    }

    /// One part: the key and content of its item from the commit, its condition as an
    /// expression.
    fn transact_item(
        &self,
        commit: &Commit<'_>,
        part: &Part,
    ) -> Result<TransactWriteItem, ChatError> {
        let (condition, mut values) = condition(&part.condition);
        let pk = || keys::conversation_pk(commit.id);
        let table = &self.table;
        match (&part.target, &part.write) {
            (Target::Conversation, Write::AdvanceConversation { busy_until, .. }) => {
                let last = commit.messages.last().ok_or_else(malformed)?;
                let origin = commit.sends.last().and_then(|p| p.origin.as_deref());
                let expression = advance(last, origin, *busy_until, &mut values)?;
                let key = keys::conversation_key(commit.id);
                tx::update(table, key, &expression, condition, &values)
            }
            (Target::Message { send }, Write::Put) => {
                let item = super::items::message_item(&commit.messages[*send])?;
                tx::put(table, item, condition, &values)
            }
            (Target::SendKey { send }, Write::Put) => {
                let sk = keys::send_key_sk(&commit.sends[*send].client_msg_key);
                let item = to_item(&commit.key_item(*send), pk(), sk)?;
                tx::put(table, item, condition, &values)
            }
            (Target::QueuedSend { send }, Write::Delete) => {
                let sk = keys::queued_sk(&commit.sends[*send].client_msg_key);
                let condition = condition.ok_or_else(malformed)?;
                tx::delete(table, keys::key(pk(), sk), condition, &values)
            }
            (Target::Member { sender }, Write::MoveWatermark { to_seq }) => {
                // Its watermark and last sent seq to its newest message, while it is a member;
                // in a group, also when it sent (`lastSentAt`): slow mode, once on, counts the
                // messages sent before it was (docs/api.md §25).
                values.push((":next", n(*to_seq)));
                let expression = if commit.id.is_direct() {
                    "SET lastReadSeq = :next, lastSentSeq = :next"
                } else {
                    let newest = commit.messages.iter().find(|m| m.seq == *to_seq);
                    let sent_at = newest
                        .and_then(|m| chat_domain::time::parse_rfc3339(&m.created_at))
                        .map_or_else(now_ms, chat_domain::time::unix_millis);
                    values.push((":sentAt", n(sent_at)));
                    "SET lastReadSeq = :next, lastSentSeq = :next, lastSentAt = :sentAt"
                };
                let key = keys::member_key(commit.id, sender);
                tx::update(table, key, expression, condition, &values)
            }
            (Target::CommitRecord, Write::Put) => {
                let item = to_item(&commit.record(), pk(), keys::COMMIT_RECORD_SK)?;
                tx::put(table, item, condition, &values)
            }
            (target, write) => Err(ChatError::internal(format!(
                "no such part of a commit: {write:?} of {target:?}"
            ))),
        }
    }

    /// The queued send: queues, then waits for its message to be committed, by another request
    /// or by this one. Every way out without the message withdraws this request's queued send
    /// first (`withdraw`): a `429` must mean that nothing happens later either. DynamoDB: 1
    /// strongly consistent GetItem (its key: a retry of a committed send is answered from it), 1
    /// PutItem, then `await_commit`'s calls (+ `withdraw`'s when it ends without its message).
    async fn send_queued(&self, send: &SendRequest<'_>) -> Result<(Message, bool), ChatError> {
        let deadline = self.deadline();
        // A retry of a send already committed (a client that timed out resends it): its queued
        // send is gone, so the put below would queue it again, and the commit that takes it would
        // be cancelled for its key (found by probing: every send of a hot group sent three times
        // at once cost 20 times the writes of the sends alone, and requests starved).
        // (An archived key is found at commit, as for any queued send: `archived_in`.)
        if let Some(key) = self.live_key(send).await? {
            return self.replay(StoredKey::Live(key), send).await;
        }
        self.claim_for_queue(send).await?;
        let enqueued = match self.enqueue(send, deadline).await? {
            Enqueued::Queued(mine) => mine,
            Enqueued::Stored(key) => return self.replay(key, send).await,
        };
        let key = &send.request.client_msg_key;
        let mut queued = QueuedSend::new(key, &send.request_id, enqueued);
        match self.await_commit(send, &mut queued, deadline).await {
            Err(e) => match queued.ending() {
                Ending::Withdraw => self.withdraw(send, e).await,
                // Waiting on a replay's queued send (another request of the same `clientMsgId`):
                // that one may still be committed, so the outcome is unknown, not "nothing".
                Ending::GiveUp if e == ChatError::Throttled => Err(ChatError::Unavailable),
                Ending::GiveUp => Err(e),
            },
            Ok((mut message, created)) => {
                // Stored: a copy left without what its record gained (the record and the stable
                // link have it) is no reason to answer an error.
                if let Err(e) = self.refresh_attachment_copies(&mut message).await {
                    tracing::warn!(error = %e, "attachment copies not refreshed after a queued send");
                }
                Ok((message, created))
            }
        }
    }

    /// Looks at the queue and does what `queued` decides, until its message is committed or
    /// the deadline passes (`Throttled`). DynamoDB: per look 1 strongly consistent Query (+ the
    /// step's calls, `take_step`).
    async fn await_commit(
        &self,
        send: &SendRequest<'_>,
        queued: &mut QueuedSend,
        deadline: Deadline,
    ) -> Result<(Message, bool), ChatError> {
        let started = Instant::now();
        // How long to wait before looking again (none: look now).
        let mut wait: Option<Duration> = None;
        loop {
            if let Some(w) = wait.take() {
                if !deadline.sleep(jitter(w, w * 5 / 4)).await {
                    return Err(ChatError::Throttled);
                }
            }
            let asked = Instant::now();
            let queue = match self.queue(send.id).await {
                Ok(q) => q,
                // The partition's read throughput ran out: look again shortly.
                Err(ChatError::Throttled) => {
                    wait = Some(queued.read_throttled());
                    continue;
                }
                Err(e) => return Err(e),
            };
            let entries: Vec<Entry> = queue.queued.iter().map(entry).collect();
            let step = queued.look(&Look {
                queue: &entries,
                last_commit: queue.last_commit.as_ref().map(last_commit_of),
                now_ms: now_ms(),
                waited: started.elapsed(),
                round_trip: asked.elapsed(),
            });
            match self
                .take_step(send, queued, step, &queue.queued, deadline)
                .await?
            {
                Flow::Wait(d) => wait = Some(d),
                Flow::Answer(answer) => {
                    let waited_ms = started.elapsed().as_millis() as u64;
                    tracing::debug!(waited_ms, "queued send answered");
                    return Ok(answer);
                }
            }
        }
    }

    /// Does what one step of a queued send says, with `queue` the queued sends it looked at.
    /// DynamoDB: none to wait or to answer from the record; 1 GetItem of its key (+ 1 PutItem
    /// when it sends the message itself); 1 DeleteItem + 1 PutItem to take over a replay's
    /// ended send; a commit's calls (`commit_queued`).
    async fn take_step(
        &self,
        send: &SendRequest<'_>,
        queued: &mut QueuedSend,
        step: Step,
        queue: &[QueuedItem],
        deadline: Deadline,
    ) -> Result<Flow, ChatError> {
        let wait = match step {
            Step::Wait(d) => d,
            Step::Answered { seq, created_at } => {
                return Ok(Flow::Answer((send.message(seq, created_at), true)))
            }
            Step::ReadKey => match self.stored_key(send).await? {
                Some(key) => return self.replay(key, send).await.map(Flow::Answer),
                None => match queued.key_missing() {
                    KeyMissing::SendItself => return self.requeue(send, queued, deadline).await,
                    KeyMissing::Dropped => return Err(ChatError::NotFound),
                },
            },
            Step::SendItself { drop } => {
                self.drop_queued(&queue[drop]).await?;
                return self.requeue(send, queued, deadline).await;
            }
            // Its own deadline passed meanwhile.
            Step::Withdraw => return Err(ChatError::Throttled),
            Step::Commit {
                batch,
                expired,
                head,
            } => {
                let batch: Vec<&QueuedItem> = batch.iter().map(|&i| &queue[i]).collect();
                let expired: Vec<&QueuedItem> = expired.iter().map(|&i| &queue[i]).collect();
                let (attempt, mut messages) =
                    self.commit_queued(send.id, head, &expired, &batch).await?;
                tracing::debug!(size = batch.len(), ?attempt, "group commit");
                match queued.after_commit(attempt) {
                    AfterCommit::Mine { index, created } => {
                        return Ok(Flow::Answer((messages.swap_remove(index), created)))
                    }
                    AfterCommit::Wait(d) => d,
                }
            }
        };
        Ok(Flow::Wait(wait))
    }

    /// Queues this request's send again (a replay whose original is gone) and looks at once; or
    /// answers from its stored key, when `enqueue` found one. DynamoDB: 1 PutItem (`enqueue`).
    async fn requeue(
        &self,
        send: &SendRequest<'_>,
        queued: &mut QueuedSend,
        deadline: Deadline,
    ) -> Result<Flow, ChatError> {
        match self.enqueue(send, deadline).await? {
            Enqueued::Queued(mine) => {
                queued.enqueued(mine);
                Ok(Flow::Wait(Duration::ZERO))
            }
            Enqueued::Stored(key) => self.replay(key, send).await.map(Flow::Answer),
        }
    }

    /// Queues the send: a put of `P#<clientMsgId>` on condition it is absent. Returns whether
    /// this request wrote it; false when a replay of the same send is already queued (then this
    /// request waits for that one). Another send of the same `clientMsgId` queued (another body
    /// or sender) is no answer yet: the message stored decides (the other one is then dropped),
    /// and while none is, this request tries again until that one is committed (a conflict) or
    /// dropped. DynamoDB: 1 PutItem (more after a throttle or a conflict; + 1-2 GetItem of the
    /// key per other send found).
    async fn enqueue(
        &self,
        send: &SendRequest<'_>,
        deadline: Deadline,
    ) -> Result<Enqueued, ChatError> {
        let now = chat_domain::time::now();
        let expires_at =
            chat_domain::time::unix_millis(now) + deadline.remaining().as_millis() as u64;
        let item = send.content(chat_domain::time::unix_micros(now), expires_at);
        let item = to_item(
            &item,
            keys::conversation_pk(send.id),
            keys::queued_sk(&item.client_msg_key),
        )?;
        use aws_sdk_dynamodb::operation::put_item::PutItemError;
        let mut retry = self.retry();
        let mut in_a_commit = false;
        while retry.next().await {
            // Its replay's queued send was in a commit: once that one landed, its key answers
            // (a put now would queue a send already stored).
            if in_a_commit {
                if let Some(key) = self.stored_key(send).await? {
                    return Ok(Enqueued::Stored(key));
                }
            }
            let put = self
                .db
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item.clone()))
                .condition_expression("attribute_not_exists(pk)")
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let err = match put {
                Ok(_) => return Ok(Enqueued::Queued(true)),
                Err(e) => e,
            };
            match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => {
                    let existing: QueuedItem = from_item(e.item().cloned().unwrap_or_default())?;
                    let queued = sent(
                        &existing.sender_id,
                        &existing.fingerprint,
                        &existing.request_id,
                    );
                    match send.sent().against(&queued) {
                        // This request waits for that one.
                        Verdict::Same { .. } => return Ok(Enqueued::Queued(false)),
                        Verdict::Conflict => {
                            if let Some(key) = self.stored_key(send).await? {
                                return Ok(Enqueued::Stored(key));
                            }
                        }
                    }
                }
                // A replay of this send is being committed right now (its queued send is in the
                // transaction): a moment later it is either committed (its key answers) or
                // queued again.
                Some(PutItemError::TransactionConflictException(_)) => in_a_commit = true,
                // The partition's throughput ran out (after the SDK's own retries): nothing was
                // written; again after a backoff, within the deadline.
                _ if super::throttled(&err) => {}
                _ => return Err(sdk_error("PutItem", err)),
            }
        }
        Err(ChatError::Throttled)
    }

    /// The last group commit's record and the queued sends of a conversation. DynamoDB: 1
    /// strongly consistent Query (more pages only past 1 MB: bodies are at most 16 KiB, so 60
    /// queued sends or more; a send on a later page must still find itself there).
    async fn queue(&self, id: &ConversationId) -> Result<Queue, ChatError> {
        let range = (keys::COMMIT_RECORD_SK.into(), keys::QUEUED_END_SK.into());
        let items = self.conversation_range(id, range, None).await?;
        let mut queue = Queue {
            last_commit: None,
            queued: Vec::new(),
        };
        for item in items {
            if get_s(&item, keys::SK) == Some(keys::COMMIT_RECORD_SK) {
                queue.last_commit = Some(from_item(item)?);
            } else {
                queue.queued.push(from_item(item)?);
            }
        }
        Ok(queue)
    }

    /// One group commit of `batch` after `head` (None: read it first), once the sends whose
    /// request has ended (`expired`) are out of the queue: no commit takes them (their
    /// condition). Returns the attempt, and the messages when it committed. DynamoDB: 1
    /// DeleteItem per expired send (+ 1 GetItem of the conversation) (+ 1 BatchGetItem of the
    /// batch's archived keys once keys of the conversation were archived) + 1
    /// TransactWriteItems (+ 1 DeleteItem per send it finds can never be committed).
    async fn commit_queued(
        &self,
        id: &ConversationId,
        head: Option<Head>,
        expired: &[&QueuedItem],
        batch: &[&QueuedItem],
    ) -> Result<(Attempt, Vec<Message>), ChatError> {
        for p in expired {
            self.drop_queued(p).await?;
        }
        let head = match head {
            Some(h) => h,
            None => self.head(id).await?.ok_or(ChatError::NotFound)?,
        };
        if batch.is_empty() {
            return Ok((Attempt::Taken, Vec::new()));
        }
        // Read after the head (from the record, the conversation or a failed condition), so the
        // condition on `keyMoves` proves no key of the batch moved out since (§4.2).
        if head.keys_moved() {
            let archived = self.archived_in(id, batch).await?;
            if archived.contains(&true) {
                for (p, _) in batch.iter().zip(&archived).filter(|(_, a)| **a) {
                    self.drop_queued(p).await?;
                }
                return Ok((Attempt::Dropped, Vec::new()));
            }
        }
        let entries: Vec<Entry> = batch.iter().map(|p| entry(p)).collect();
        let layout = group_commit::group(&head, &entries, chat_domain::time::now());
        let commit = Commit::new(id, &layout, batch.to_vec());
        let reasons = match self.transact(self.transact_items(&commit)?).await? {
            TxOutcome::Committed => {
                committed_metrics(batch.len());
                if let Some(until) = layout.busy_until {
                    self.seen.saw_busy(id, until);
                }
                let sends = batch.len();
                return Ok((Attempt::Committed { sends }, commit.messages));
            }
            TxOutcome::Conflict => return Ok((Attempt::Conflict, Vec::new())),
            TxOutcome::Cancelled(reasons) => reasons,
        };
        let attempt = match layout.group_cancelled(&entries, &failed(&reasons)) {
            GroupCancelled::Moved { part } => {
                let returned = reasons.get(part).and_then(|r| r.item.as_ref());
                Attempt::Moved(returned.and_then(head_of))
            }
            GroupCancelled::Taken => Attempt::Taken,
            GroupCancelled::Drop(sends) => {
                for i in sends {
                    self.drop_queued(batch[i]).await?;
                }
                Attempt::Dropped
            }
        };
        Ok((attempt, Vec::new()))
    }

    /// Takes a send out of the queue without committing it. DynamoDB: 1 DeleteItem.
    async fn drop_queued(&self, p: &QueuedItem) -> Result<Dropped, ChatError> {
        self.delete_queued(&p.conversation_id, &p.client_msg_key, &p.request_id)
            .await
    }

    /// Deletes the queued send `client_msg_key` if `request_id` queued it. DynamoDB: 1
    /// DeleteItem.
    async fn delete_queued(
        &self,
        id: &ConversationId,
        client_msg_key: &str,
        request_id: &str,
    ) -> Result<Dropped, ChatError> {
        let deleted = self
            .db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(
                keys::conversation_pk(id),
                keys::queued_sk(client_msg_key),
            )))
            .condition_expression("requestId = :rid")
            .expression_attribute_values(":rid", s(request_id))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(Dropped::Deleted),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(Dropped::Gone),
            Err(e) if e.code() == Some("TransactionConflictException") => Ok(Dropped::InCommit),
            Err(e) => Err(sdk_error("DeleteItem", e)),
        }
    }

    /// This request ends without its message (`err`: its deadline passed, or a failure): its
    /// queued send is withdrawn, so that no later commit takes it, and then `err` is the answer
    /// (nothing happened); or a commit took it meanwhile, and its message is the answer. While a
    /// commit holding it is in flight, this waits for the outcome; when that cannot be known in
    /// time (DynamoDB does not answer), the answer is `Unavailable` (the outcome is unknown).
    /// DynamoDB: 1 DeleteItem (+ 1 GetItem when it was gone; more while a commit holds it).
    async fn withdraw(
        &self,
        send: &SendRequest<'_>,
        err: ChatError,
    ) -> Result<(Message, bool), ChatError> {
        let settle = Deadline::after(super::SETTLE_TIME);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dropped = self
                .delete_queued(send.id, &send.request.client_msg_key, &send.request_id)
                .await;
            match dropped {
                Ok(Dropped::Deleted) => {
                    telemetry::count("SendsGivenUp", 1);
                    return Err(err);
                }
                // Committed (its key is there), or dropped as its sender's (no key).
                Ok(Dropped::Gone) => {
                    return match self.stored_key(send).await {
                        Ok(Some(key)) => self.replay(key, send).await,
                        Ok(None) => Err(err),
                        Err(_) => Err(ChatError::Unavailable),
                    }
                }
                Ok(Dropped::InCommit) | Err(_) => {
                    if !settle.sleep(chat_domain::retry::backoff(attempt + 1)).await {
                        return Err(ChatError::Unavailable);
                    }
                }
            }
        }
    }

    /// The send's idempotency key, if its message exists: its `X#`, else its archived key. One
    /// after the other: the archiver puts the archived key before it deletes the `X#`, so a key
    /// missing from both reads never existed. DynamoDB: 1 or 2 strongly consistent GetItem.
    async fn stored_key(&self, send: &SendRequest<'_>) -> Result<Option<StoredKey>, ChatError> {
        if let Some(live) = self.live_key(send).await? {
            return Ok(Some(StoredKey::Live(live)));
        }
        let archived = self.archived_key(send.id, &send.request.client_msg_key);
        Ok(archived.await?.map(StoredKey::Archived))
    }

    /// The send's key in the conversation, if its message is stored there. DynamoDB: 1 strongly
    /// consistent GetItem.
    async fn live_key(&self, send: &SendRequest<'_>) -> Result<Option<SendKeyItem>, ChatError> {
        let key = keys::send_key(send.id, &send.request.client_msg_key);
        match self.item_fields(key, None).await? {
            Some(item) => Ok(Some(SendKeyItem::from_stored(item, send.caller)?)),
            None => Ok(None),
        }
    }

    /// The archived key of `client_msg_key`, if its message is archived. DynamoDB: 1 strongly
    /// consistent GetItem.
    async fn archived_key(
        &self,
        id: &ConversationId,
        client_msg_key: &str,
    ) -> Result<Option<ArchivedKeyItem>, ChatError> {
        let key = keys::archived_send_key(id, client_msg_key);
        let item = self.item_in(&self.keys_table, key, None).await?;
        item.as_ref().map(ArchivedKeyItem::from_item).transpose()
    }

    /// Which of `batch` have an archived key: replays of archived messages, never to be
    /// committed again. DynamoDB: 1 strongly consistent BatchGetItem (a batch is ≤ 24 keys).
    async fn archived_in(
        &self,
        id: &ConversationId,
        batch: &[&QueuedItem],
    ) -> Result<Vec<bool>, ChatError> {
        let wanted: Vec<Item> = batch
            .iter()
            .map(|p| keys::archived_send_key(id, &p.client_msg_key))
            .collect();
        let deadline = self.deadline();
        let found = super::batch_get(&self.db, &self.keys_table, wanted.clone(), true, deadline);
        let found = found.await?;
        let pk_of = |i: &Item| get_s(i, keys::ARCHIVED_KEY).map(str::to_owned);
        let found: Vec<String> = found.iter().filter_map(pk_of).collect();
        Ok(wanted
            .iter()
            .map(|w| pk_of(w).is_some_and(|pk| found.contains(&pk)))
            .collect())
    }

    /// The answer for a send whose key exists (`answer`, `answer_archived`): the message as
    /// sent, or its tombstone once deleted (the content is gone, docs/api.md §19, and the
    /// replay's own body must not bring it back; an edit since does not change the answer, §10).
    async fn replay(
        &self,
        key: StoredKey,
        send: &SendRequest<'_>,
    ) -> Result<(Message, bool), ChatError> {
        match key {
            // The deletion marked the key itself: no read.
            StoredKey::Live(key) => answer(key, send),
            StoredKey::Archived(key) => self.answer_archived(key, send).await,
        }
    }

    /// The answer for a send whose message is archived: a conflict for another body or sender
    /// (the key's fingerprint), else the original from its chunk, with the replay's body (the
    /// same, by the fingerprint; an edit since changed the archived one), or its tombstone when
    /// its deleted mark says so. Never `created`: its request is long over. DynamoDB: 1 GetItem
    /// (`archivedThrough`), 1 BatchGetItem (the message, gone, and its mark); S3: 1 GetObject.
    async fn answer_archived(
        &self,
        key: ArchivedKeyItem,
        send: &SendRequest<'_>,
    ) -> Result<(Message, bool), ChatError> {
        if !key.made_by(&send.fingerprint) {
            return Err(conflict());
        }
        let seqs = std::collections::BTreeSet::from([key.seq]);
        // (`archivedThrough` is read on the way: 0 says it is not known yet.)
        let now = self.messages_now(send.id, &seqs, 0).await?;
        let Some(original) = now.get(&key.seq) else {
            return Err(ChatError::internal(format!(
                "archived message {} not found",
                key.seq
            )));
        };
        if original.deleted {
            return Ok((original.clone(), false));
        }
        let mut message = Message::new(
            send.id.clone(),
            key.seq,
            original.client_msg_id.clone(),
            send.caller.clone(),
            send.request.body.clone(),
            original.created_at.clone(),
        );
        // The same ids as the original (its fingerprint says so), as checked for this request:
        // archived, its files stay (docs/api.md §34).
        message.attachments = send.attachments.clone();
        Ok((message, false))
    }
}

impl<'a> SendRequest<'a> {
    fn new(caller: &'a UserId, id: &'a ConversationId, request: &'a SendMessage) -> Self {
        SendRequest {
            id,
            caller,
            request,
            fingerprint: send_fingerprint(caller, &request.body, &request.attachments),
            request_id: uuid::Uuid::new_v4().to_string(),
            attachments: Vec::new(),
        }
    }

    /// The send as a queued send (`P#`) of a request whose deadline is `expires_at` (unix ms):
    /// also what a commit of it, alone or in a group, stores.
    fn content(&self, enqueued_at: u64, expires_at: u64) -> QueuedItem {
        QueuedItem {
            conversation_id: self.id.clone(),
            client_msg_key: self.request.client_msg_key.clone(),
            client_msg_id: self.request.client_msg_id.clone(),
            sender_id: self.caller.clone(),
            body: self.request.body.clone(),
            fingerprint: self.fingerprint.clone(),
            request_id: self.request_id.clone(),
            enqueued_at,
            expires_at,
            attachments: self.attachments.clone(),
            origin: self.request.origin.clone(),
        }
    }

    fn sent(&self) -> Sent<'_> {
        sent(self.caller, &self.fingerprint, &self.request_id)
    }

    /// Its message, committed at `seq` at `created_at`.
    fn message(&self, seq: u64, created_at: String) -> Message {
        let mut m = Message::new(
            self.id.clone(),
            seq,
            self.request.client_msg_id.clone(),
            self.caller.clone(),
            self.request.body.clone(),
            created_at,
        );
        m.attachments = self.attachments.clone();
        m
    }
}

impl<'a> Commit<'a> {
    fn new(id: &'a ConversationId, layout: &'a Layout, sends: Vec<&'a QueuedItem>) -> Self {
        let messages = sends
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut m = Message::new(
                    id.clone(),
                    layout.seq(i),
                    p.client_msg_id.clone(),
                    p.sender_id.clone(),
                    p.body.clone(),
                    layout.created_at.clone(),
                );
                m.attachments = p.attachments.clone();
                m
            })
            .collect();
        Commit {
            id,
            layout,
            sends,
            messages,
        }
    }

    /// The idempotency key of send `i` (`requestId`: the request that queued it).
    fn key_item(&self, i: usize) -> SendKeyItem {
        let (p, m) = (self.sends[i], &self.messages[i]);
        SendKeyItem {
            conversation_id: self.id.clone(),
            seq: m.seq,
            client_msg_id: p.client_msg_id.clone(),
            sender_id: p.sender_id.clone(),
            fingerprint: p.fingerprint.clone(),
            created_at: m.created_at.clone(),
            request_id: p.request_id.clone(),
            deleted_version: None,
            edited_at: None,
        }
    }

    /// The record `P!` of this commit.
    fn record(&self) -> CommitRecordItem {
        let sends = self.sends.iter().zip(&self.messages);
        CommitRecordItem {
            last_seq: self.messages.last().map_or(0, |m| m.seq),
            created_at: self.layout.created_at.clone(),
            committed_at: self.layout.committed_at,
            key_moves: self.layout.key_moves,
            sends: sends
                .map(|(p, m)| CommittedSend {
                    client_msg_key: p.client_msg_key.clone(),
                    seq: m.seq,
                    request_id: p.request_id.clone(),
                })
                .collect(),
        }
    }
}

/// The wall clock, unix ms: read here, passed to the decisions.
fn now_ms() -> u64 {
    chat_domain::time::unix_millis(chat_domain::time::now())
}

/// The conversation item (as read, or as a failed condition returned it) as a head.
fn head_of(item: &Item) -> Option<Head> {
    Some(Head {
        last_seq: get_n(item, "lastSeq")?,
        last_message_at: get_s(item, "lastMessageAt").map(str::to_owned),
        busy_until: get_n(item, "busyUntil").unwrap_or(0),
        key_moves: get_n(item, "keyMoves").unwrap_or(0),
    })
}

fn sent<'a>(sender: &'a UserId, fingerprint: &'a str, request_id: &'a str) -> Sent<'a> {
    Sent {
        sender,
        fingerprint,
        request_id,
    }
}

fn entry(p: &QueuedItem) -> Entry<'_> {
    Entry {
        key: &p.client_msg_key,
        request_id: &p.request_id,
        sender: &p.sender_id,
        enqueued_at: p.enqueued_at,
        expires_at: p.expires_at,
    }
}

fn last_commit_of(r: &CommitRecordItem) -> LastCommit<'_> {
    LastCommit {
        last_seq: r.last_seq,
        created_at: &r.created_at,
        committed_at: r.committed_at,
        key_moves: r.key_moves,
        sends: r
            .sends
            .iter()
            .map(|c| (c.client_msg_key.as_str(), c.request_id.as_str(), c.seq))
            .collect(),
    }
}

/// Per part of a cancelled transaction, whether its condition failed.
fn failed(reasons: &[CancelReason]) -> Vec<bool> {
    reasons.iter().map(CancelReason::failed_condition).collect()
}

type Values = Vec<(&'static str, AttributeValue)>;

/// A part's condition as a condition expression and its values.
fn condition(c: &Condition) -> (Option<&'static str>, Values) {
    match c {
        Condition::None => (None, vec![]),
        Condition::LastSeqIs {
            last_seq,
            key_moves,
        } => head_is(*last_seq, *key_moves, None),
        Condition::LastSeqIsAndNotBusy {
            last_seq,
            key_moves,
            now_ms,
        } => head_is(*last_seq, *key_moves, Some(*now_ms)),
        Condition::Absent => (Some("attribute_not_exists(pk)"), vec![]),
        Condition::MayPost => (
            Some("attribute_exists(pk) AND attribute_not_exists(blocked)"),
            vec![],
        ),
        Condition::QueuedBy { request_id, now_ms } => (
            Some("requestId = :rid AND expiresAt > :now"),
            vec![(":rid", s(request_id)), (":now", n(*now_ms))],
        ),
    }
}

/// The condition of a commit on the conversation item: `lastSeq` and `keyMoves` as read (an
/// absent `keyMoves` is 0), and, for a send alone, no `busyUntil` ahead of `now_ms`.
fn head_is(last_seq: u64, key_moves: u64, now_ms: Option<u64>) -> (Option<&'static str>, Values) {
    let mut values = vec![(":seen", n(last_seq))];
    let expression = match (key_moves, now_ms) {
        (0, None) => "lastSeq = :seen AND attribute_not_exists(keyMoves)",
        (0, Some(_)) => {
            "lastSeq = :seen AND attribute_not_exists(keyMoves) \
             AND (attribute_not_exists(busyUntil) OR busyUntil < :now)"
        }
        (_, None) => "lastSeq = :seen AND keyMoves = :moves",
        (_, Some(_)) => {
            "lastSeq = :seen AND keyMoves = :moves \
             AND (attribute_not_exists(busyUntil) OR busyUntil < :now)"
        }
    };
    if key_moves > 0 {
        values.push((":moves", n(key_moves)));
    }
    if let Some(now) = now_ms {
        values.push((":now", n(now)));
    }
    (Some(expression), values)
}

/// The update of the conversation item to its new last message `last`, sent from the connection
/// `origin` (and `busyUntil`).
fn advance(
    last: &Message,
    origin: Option<&str>,
    busy_until: Option<u64>,
    values: &mut Values,
) -> Result<String, ChatError> {
    let preview = LastMessage {
        origin: origin.map(str::to_owned),
        ..LastMessage::of(last)
    };
    let preview = serde_dynamo::to_attribute_value(preview).map_err(ChatError::internal)?;
    values.extend([
        (":next", n(last.seq)),
        (":at", s(&last.created_at)),
        (":message", preview),
    ]);
    let mut expression =
        "SET lastSeq = :next, lastMessageAt = :at, lastMessage = :message".to_owned();
    if let Some(until) = busy_until {
        values.push((":busy", n(until)));
        expression.push_str(", busyUntil = :busy");
    }
    Ok(expression)
}

fn malformed() -> ChatError {
    ChatError::internal("a commit part without what it needs")
}

/// Messages sent, and how many one commit carried (1: alone; more: a group commit).
fn committed_metrics(messages: usize) {
    telemetry::count("MessagesSent", messages as u64);
    telemetry::metric("CommitBatchSize", messages as f64, "Count");
}

/// The answer for a send whose key exists: the original message when sender and body match (and
/// `created` only for the request that created it), otherwise a conflict.
fn answer(key: SendKeyItem, send: &SendRequest<'_>) -> Result<(Message, bool), ChatError> {
    let original = sent(&key.sender_id, &key.fingerprint, &key.request_id);
    let Verdict::Same { created } = send.sent().against(&original) else {
        return Err(conflict());
    };
    let mut message = Message::new(
        key.conversation_id,
        key.seq,
        key.client_msg_id,
        key.sender_id,
        send.request.body.clone(),
        key.created_at,
    );
    if let Some(version) = key.deleted_version {
        // Deleted since (its deletion marked the key): the tombstone, as history shows it.
        message.body.clear();
        message.version = version;
        message.deleted = true;
        message.edited_at = key.edited_at;
        return Ok((message, created));
    }
    // The same ids as the original (its fingerprint says so), as checked for this request.
    message.attachments = send.attachments.clone();
    Ok((message, created))
}

/// The 400 of a claim refused: the first attachment another message used meanwhile.
fn claim_refused(ids: &[String], reasons: &[CancelReason]) -> ChatError {
    let i = reasons.iter().position(CancelReason::failed_condition);
    let id = i.and_then(|i| ids.get(i)).map_or("?", String::as_str);
    ChatError::invalid(format!(
        "attachment `{id}` is already used by another message"
    ))
}

fn conflict() -> ChatError {
    ChatError::Conflict(
        "clientMsgId was already used for a different message in this conversation".into(),
    )
}
