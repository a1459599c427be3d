//! `sendMessage` (docs/api.md §10): a gap-free `seq`, idempotent by `clientMsgId` forever, under
//! any concurrency (docs/data-model.md §4).
//!
//! **Alone** (the common case): one transaction moves the conversation's `lastSeq` from N to N+1
//! on condition `lastSeq = N`, puts the message `S#N+1` and the idempotency key `X#<clientMsgId>`
//! (only if absent), and moves the sender's watermark on condition it is a member.
//!
//! **Combined** (a hot conversation): a send that lost that race joins the conversation's pending
//! set (`P#<clientMsgId>`, a conditional put) and from then on every pending sender works for all
//! of them: it reads the pending set, oldest first, and commits up to 24 of them in one
//! transaction — consecutive seqs, their messages and keys, the pending items deleted, each
//! sender's watermark, a record of what it committed (`P!`) — on the same `lastSeq = N`
//! condition. One commit serves many senders, so throughput grows with contention instead of
//! collapsing, and old sends go first. Each request answers as soon as its own message is
//! committed, by itself or by another: the one Query that shows it the queue also shows it the
//! last commit's record.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{
    from_item, to_item, CommitRecordItem, CommittedSend, LastMessage, MessageItem, PendingItem,
    SendKeyItem,
};
use super::{keys, reason_failed, sdk_error, tx, ChatStore, TxOutcome};
use crate::api::requests::SendMessage;
use crate::domain::message::{message_fingerprint, message_time};
use crate::domain::model::Message;
use crate::domain::{ConversationId, UserId};
use crate::error::ChatError;
use crate::retry::jitter;
use crate::telemetry;

/// Parts of the transaction of a send alone, in order (cancellation reasons come in this order).
const ALONE_CONVERSATION: usize = 0;
const ALONE_KEY: usize = 2;
const ALONE_MEMBER: usize = 3;

/// Sends per group commit: each takes its message, its key and its pending item, plus one
/// watermark per sender, the conversation item and the commit record: 2 + 4 × 24 ≤ 100 items
/// per transaction.
const MAX_BATCH: usize = 24;
const MAX_TX_ITEMS: usize = 100;

/// What the conversation item says right now, for the next commit.
#[derive(Debug, Clone)]
struct Head {
    last_seq: u64,
    last_message_at: Option<String>,
    /// Until when (unix ms) group commits said sends were queued.
    busy_until: u64,
}

impl Batch {
    fn name(&self) -> &'static str {
        match self {
            Batch::Committed(_) => "committed",
            Batch::Progressed(_) => "progressed",
            Batch::Drop(_) => "drop",
            Batch::Conflict => "conflict",
        }
    }
}

/// What one Query of the queue shows: the last group commit and the sends still pending.
struct Queue {
    last_commit: Option<CommitRecordItem>,
    pending: Vec<PendingItem>,
}

impl Head {
    /// The conversation item as the last group commit left it. Exact while the conversation is
    /// busy (sends alone are refused then, so only group commits move `lastSeq`); after a quiet
    /// spell a send alone may have moved on, and a commit from this head fails on its condition,
    /// which returns the current head.
    fn after(commit: &CommitRecordItem) -> Option<Head> {
        let now = crate::time::unix_millis(crate::time::now());
        (commit.committed_at + BUSY_FOR.as_millis() as u64 > now).then(|| Head {
            last_seq: commit.last_seq,
            last_message_at: Some(commit.created_at.clone()),
            busy_until: 0,
        })
    }

    /// From the conversation item (as read, or as a failed condition returned it).
    fn of(item: &Item) -> Option<Head> {
        Some(Head {
            last_seq: get_n(item, "lastSeq")?,
            last_message_at: get_s(item, "lastMessageAt").map(str::to_owned),
            busy_until: get_n(item, "busyUntil").unwrap_or(0),
        })
    }

    /// Sends are queued: a new one joins the queue rather than racing it.
    fn busy(&self) -> bool {
        self.busy_until > crate::time::unix_millis(crate::time::now())
    }
}

/// How long after a group commit new sends queue up rather than try alone.
const BUSY_FOR: Duration = Duration::from_secs(5);

/// How a commit treats the conversation's `busyUntil`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Busy {
    /// A send alone: only while nothing is queued.
    Refuse,
    /// A group commit of several sends: the conversation is hot, new sends queue for `BUSY_FOR`.
    Extend,
    /// A group commit of one send: contention is over, the mark runs out by itself.
    Leave,
}

/// The least time a queued send waits before it looks again whether it was committed: about one
/// commit (more when the database answers slowly), during which more sends queue up for the next.
const GATHER: Duration = Duration::from_millis(20);
/// How long the oldest pending send may sit still (no commit at all: every commit takes it)
/// before the next request in the queue commits it; the one after that waits twice as long, and
/// so on. Its request is normally committing it; this is for one that ended (a crash, a timeout).
const TAKE_OVER_AFTER: Duration = Duration::from_millis(1000);

/// One send request.
struct Send<'a> {
    id: &'a ConversationId,
    caller: &'a UserId,
    request: &'a SendMessage,
    fingerprint: String,
    /// Tells this request apart from a replay of the same `clientMsgId`.
    request_id: String,
}

enum Alone {
    Done(Message, bool),
    /// Another send took the seq (or holds the conversation item): combine, from this head.
    /// `member`: the transaction's member condition held (its cancellation said so), so the
    /// caller needs no membership check before it queues.
    Lost {
        head: Head,
        member: bool,
    },
}

/// How a group commit attempt ended.
enum Batch {
    /// Committed: the messages, in batch order.
    Committed(Vec<Message>),
    /// Someone else committed first (the head they left, when the cancellation carried it): read
    /// again and go on at once.
    Progressed(Option<Head>),
    /// These pending sends cannot be committed (their sender is no longer a member, or their
    /// `clientMsgId` was meanwhile committed by a replay): take them out of the set.
    Drop(Vec<PendingItem>),
    /// An item was in another transaction: go on after a short pause.
    Conflict,
}

impl ChatStore {
    /// `sendMessage`. Returns `(message, created)`.
    ///
    /// Membership comes first: a caller that is not a member gets `NotFound` before anything is
    /// written, and before anything about the conversation's sends (a `409` for a `clientMsgId`
    /// in use, a replay's `200`) can answer it.
    ///
    /// DynamoDB, alone: 1 GetItem + 1 TransactWriteItems (a replay too). Combined: (+ 1 GetItem of
    /// the caller's member item, unless its send alone has just shown it a member) (+ 1 UpdateItem
    /// for the first send to lose the race) + 1 PutItem, then per look 1 Query of the queue until
    /// its message is committed, by another (the Query shows the commit's record) or by this
    /// request (+ 1 TransactWriteItems, and a GetItem of the conversation when no recent commit
    /// says where it is).
    pub async fn send_message(
        &self,
        caller: &UserId,
        id: &ConversationId,
        request: &SendMessage,
    ) -> Result<(Message, bool), ChatError> {
        let send = Send {
            id,
            caller,
            request,
            fingerprint: message_fingerprint(caller, &request.body),
            request_id: uuid::Uuid::new_v4().to_string(),
        };
        // Sends were queued a moment ago (this instance saw it): queue up, no read needed.
        if self
            .seen
            .busy(id, crate::time::unix_millis(crate::time::now()))
        {
            self.require_member(&send).await?;
            return self.send_combined(&send, None).await;
        }
        let head = self.head(id).await?.ok_or(ChatError::NotFound)?;
        if head.busy() {
            self.require_member(&send).await?;
            return self.send_combined(&send, Some(head)).await;
        }
        match self.send_alone(&send, &head).await? {
            Alone::Done(message, created) => Ok((message, created)),
            Alone::Lost { head, member } => {
                if !member {
                    self.require_member(&send).await?;
                }
                if !head.busy() {
                    self.mark_busy(id).await;
                }
                self.send_combined(&send, Some(head)).await
            }
        }
    }

    /// Only a member may mark a conversation busy or join its queue: a non-member's pending
    /// send (up to 16 KiB) would wait there until a commit took it, and that commit would be
    /// cancelled for it. Checked before, not in the enqueue's transaction: a ConditionCheck on
    /// the member item would double the enqueue's write units and conflict with the commits that
    /// move that member's watermark. A member removed between this check and its enqueue is
    /// still dropped at commit (its watermark's condition). DynamoDB: 1 strongly consistent
    /// GetItem.
    async fn require_member(&self, send: &Send<'_>) -> Result<(), ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(send.id, send.caller)))
            .consistent_read(true)
            .projection_expression("pk")
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        out.item.map(|_| ()).ok_or(ChatError::NotFound)
    }

    /// The first send to lose the race for a conversation says it is busy, so that new sends
    /// queue behind it instead of racing the group commit (and winning: their transactions are
    /// smaller, and a commit that keeps losing starves the queue). Best effort: a failure only
    /// means someone else's write got there first. DynamoDB: 1 UpdateItem.
    async fn mark_busy(&self, id: &ConversationId) {
        let until = crate::time::unix_millis(crate::time::now()) + BUSY_FOR.as_millis() as u64;
        let marked = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::conversation_key(id)))
            .update_expression("SET busyUntil = :busy")
            .condition_expression(
                "attribute_exists(pk) AND (attribute_not_exists(busyUntil) OR busyUntil < :busy)",
            )
            .expression_attribute_values(":busy", n(until))
            .send()
            .await;
        if let Err(e) = marked {
            tracing::debug!(error = %e, "conversation not marked busy");
        }
        self.seen.saw_busy(id, until);
    }

    /// `lastSeq` and `lastMessageAt` of a conversation (None: no such conversation). 1 strongly
    /// consistent GetItem.
    async fn head(&self, id: &ConversationId) -> Result<Option<Head>, ChatError> {
        let item = self
            .conversation_fields(id, Some("lastSeq, lastMessageAt, busyUntil"))
            .await?;
        let head = item.as_ref().and_then(Head::of);
        if let Some(h) = &head {
            self.seen.saw_busy(id, h.busy_until);
        }
        Ok(head)
    }

    async fn send_alone(&self, send: &Send<'_>, head: &Head) -> Result<Alone, ChatError> {
        let message = Message {
            conversation_id: send.id.clone(),
            seq: head.last_seq + 1,
            client_msg_id: send.request.client_msg_id.clone(),
            sender_id: send.caller.clone(),
            body: send.request.body.clone(),
            created_at: message_time(crate::time::now_rfc3339(), head.last_message_at.as_deref()),
        };
        let key = SendKeyItem {
            conversation_id: send.id.clone(),
            seq: message.seq,
            client_msg_id: message.client_msg_id.clone(),
            sender_id: send.caller.clone(),
            fingerprint: send.fingerprint.clone(),
            created_at: message.created_at.clone(),
            request_id: send.request_id.clone(),
        };
        let parts = vec![
            self.advance_conversation(send.id, head.last_seq, &message, Busy::Refuse)?,
            tx::put(
                &self.table,
                MessageItem::new(&message).to_item()?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?,
            tx::put(
                &self.table,
                to_item(
                    &key,
                    keys::conversation_pk(send.id),
                    keys::send_key_sk(&send.request.client_msg_key),
                )?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?,
            self.sender_watermark(send.id, send.caller, message.seq)?,
        ];
        let reasons = match self.transact(parts).await? {
            TxOutcome::Committed => {
                committed_metrics(1);
                return Ok(Alone::Done(message, true));
            }
            // Lost to another transaction: no condition was evaluated.
            TxOutcome::Conflict => {
                return Ok(Alone::Lost {
                    head: head.clone(),
                    member: false,
                })
            }
            TxOutcome::Cancelled(reasons) => reasons,
        };
        // A cancellation reports every failed condition. Not a member (any more): nothing else
        // is answered, not even that this clientMsgId was sent (a removed member's replay) or is
        // someone else's (409).
        if reason_failed(&reasons, ALONE_MEMBER).is_some() {
            return Err(ChatError::NotFound);
        }
        if let Some(r) = reason_failed(&reasons, ALONE_KEY) {
            let original = r
                .item
                .clone()
                .ok_or_else(|| ChatError::internal("no item for a failed key"))?;
            let (message, created) = answer(from_item(original)?, send)?;
            return Ok(Alone::Done(message, created));
        }
        match reason_failed(&reasons, ALONE_CONVERSATION) {
            Some(r) => match r.item.as_ref().and_then(Head::of) {
                Some(newer) => Ok(Alone::Lost {
                    head: newer,
                    member: true,
                }),
                None => Err(ChatError::NotFound),
            },
            // Only the message item's condition failed: a seq taken without moving lastSeq
            // cannot happen; treat it as a lost race and let the combined path read again.
            None => Ok(Alone::Lost {
                head: head.clone(),
                member: true,
            }),
        }
    }

    /// The conversation item's part of a commit: `lastSeq` from `seen` to `last.seq`, the last
    /// message's preview, its time.
    fn advance_conversation(
        &self,
        id: &ConversationId,
        seen: u64,
        last: &Message,
        busy: Busy,
    ) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, ChatError> {
        let preview =
            serde_dynamo::to_attribute_value(LastMessage::of(last)).map_err(ChatError::internal)?;
        let now = crate::time::unix_millis(crate::time::now());
        let mut values = vec![
            (":next", n(last.seq)),
            (":at", s(&last.created_at)),
            (":message", preview),
            (":seen", n(seen)),
        ];
        const SET: &str = "SET lastSeq = :next, lastMessageAt = :at, lastMessage = :message";
        let (expression, condition) = match busy {
            // While sends are queued, the conversation says so: new sends queue up behind them
            // instead of racing them for the item (and winning: their transactions are smaller).
            Busy::Extend => {
                values.push((":busy", n(now + BUSY_FOR.as_millis() as u64)));
                (format!("{SET}, busyUntil = :busy"), "lastSeq = :seen")
            }
            Busy::Leave => (SET.to_owned(), "lastSeq = :seen"),
            // Alone only while nothing is queued, even if this request read the item before.
            Busy::Refuse => {
                values.push((":now", n(now)));
                (
                    SET.to_owned(),
                    "lastSeq = :seen AND (attribute_not_exists(busyUntil) OR busyUntil < :now)",
                )
            }
        };
        tx::update(
            &self.table,
            keys::conversation_key(id),
            &expression,
            Some(condition),
            &values,
        )
    }

    /// A sender's part of a commit: its watermark (and last sent seq) to its newest message, on
    /// condition it is (still) a member.
    fn sender_watermark(
        &self,
        id: &ConversationId,
        sender: &UserId,
        seq: u64,
    ) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, ChatError> {
        tx::update(
            &self.table,
            keys::member_key(id, sender),
            "SET lastReadSeq = :next, lastSentSeq = :next",
            Some("attribute_exists(pk)"),
            &[(":next", n(seq))],
        )
    }

    /// The queued send: joins the queue, then waits for its message to be committed, by another
    /// request or by this one. Every way out without the message withdraws this request's
    /// pending send first (`withdraw`): a `429` must mean that nothing happens later either.
    async fn send_combined(
        &self,
        send: &Send<'_>,
        head: Option<Head>,
    ) -> Result<(Message, bool), ChatError> {
        let deadline = self.deadline();
        let mut enqueued = self.enqueue(send, deadline).await?;
        match self.await_commit(send, head, &mut enqueued, deadline).await {
            Err(e) if enqueued => self.withdraw(send, e).await,
            // Waiting on a replay's pending send (another request of the same `clientMsgId`):
            // that one may still be committed, so the outcome is unknown, not "nothing".
            Err(ChatError::Throttled) => Err(ChatError::Unavailable),
            other => other,
        }
    }

    async fn await_commit(
        &self,
        send: &Send<'_>,
        mut head: Option<Head>,
        enqueued: &mut bool,
        deadline: crate::retry::Deadline,
    ) -> Result<(Message, bool), ChatError> {
        let started = Instant::now();
        // How long to wait before looking again (none: look now, at the queue first).
        let mut wait: Option<Duration> = None;
        // The oldest pending send when this request last looked, and since when.
        let mut oldest_seen: Option<(String, Instant)> = None;
        // Whether `head` comes from the conversation item as it was a moment ago.
        let mut just_read = false;
        loop {
            let fresh = std::mem::take(&mut just_read);
            if let Some(w) = wait.take() {
                if !deadline.sleep(jitter(w, w * 5 / 4)).await {
                    return Err(ChatError::Throttled);
                }
            }
            let asked = Instant::now();
            let Queue {
                last_commit,
                pending,
            } = match self.queue(send.id).await {
                Ok(q) => q,
                // The partition's read throughput ran out: look again shortly.
                Err(ChatError::Throttled) => {
                    wait = Some(GATHER);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let (queue, expired) = live(pending, crate::time::unix_millis(crate::time::now()));
            // A commit is about two such round trips (this Query, then the transaction): waits
            // and patience scale with them. Looking again sooner costs calls; later, latency (a
            // committed send's request sleeps on, and while the next committer sleeps nothing
            // commits).
            let round_trip = asked.elapsed();
            let commit_time = GATHER.max(round_trip * 2);
            let mine = &send.request.client_msg_key;
            if let Some(p) = expired.iter().find(|p| &p.client_msg_key == mine) {
                if *enqueued {
                    return Err(ChatError::Throttled); // its own deadline passed meanwhile
                }
                // The request of the send this replay waited for has ended: it sends it now.
                self.drop_pending(p).await?;
                *enqueued = self.enqueue(send, deadline).await?;
                wait = Some(Duration::ZERO);
                continue;
            }
            let Some(position) = queue.iter().position(|p| &p.client_msg_key == mine) else {
                // No longer pending: the last commit took it (its record says at which seq),
                // or an earlier one did, or it was dropped (its sender is no longer a member):
                // its key says which.
                if let Some(message) = last_commit
                    .as_ref()
                    .filter(|_| *enqueued)
                    .and_then(|c| committed_by(c, send))
                {
                    tracing::debug!(
                        waited_ms = started.elapsed().as_millis() as u64,
                        "committed by another"
                    );
                    return Ok((message, true));
                }
                match self.send_key(send).await? {
                    Some(key) => return answer(key, send),
                    // A replay whose original withdrew (its request answered 429 or ended):
                    // this request sends it now.
                    None if !*enqueued => {
                        *enqueued = self.enqueue(send, deadline).await?;
                        wait = Some(Duration::ZERO);
                        continue;
                    }
                    // Dropped: its sender is no longer a member.
                    None => return Err(ChatError::NotFound),
                }
            };
            // The request of the oldest pending send commits, for up to 24, at once; the others
            // wait about one commit per batch ahead of them (and queue up meanwhile, for the
            // next commit), and take over only when the oldest has not moved for a while (its
            // request may have ended).
            let oldest = queue[0].client_msg_key.clone();
            // Staggered, so that one request takes over, not all of them.
            let patience = TAKE_OVER_AFTER.max(round_trip * 8) * position.max(1) as u32;
            let stalled = match &oldest_seen {
                Some((key, since)) if *key == oldest => since.elapsed() > patience,
                _ => {
                    oldest_seen = Some((oldest, Instant::now()));
                    false
                }
            };
            if position > 0 && !stalled {
                // Commits ahead of it: the one under way (it may be in it), plus one per full
                // batch beyond that.
                wait = Some(commit_time * ((position / MAX_BATCH) as u32).max(1));
                continue;
            }
            // Sends whose request has ended are never committed (their condition): out of the
            // queue with them, by whoever commits.
            for p in &expired {
                self.drop_pending(p).await?;
            }
            let batch = first_batch(queue);
            // Other commits have likely moved the conversation on since this request last read
            // it: a fresh read is cheaper than a transaction bound to fail on a stale lastSeq.
            let known = head
                .take()
                .filter(|_| fresh)
                .or_else(|| last_commit.as_ref().and_then(Head::after));
            let current = match known {
                Some(h) => h,
                None => self.head(send.id).await?.ok_or(ChatError::NotFound)?,
            };
            let created = batch
                .get(position)
                .is_some_and(|p| p.request_id == send.request_id);
            let size = batch.len();
            let outcome = self.commit_batch(&current, batch).await?;
            tracing::debug!(
                position,
                size,
                stalled,
                outcome = outcome.name(),
                waited_ms = started.elapsed().as_millis() as u64,
                "group commit"
            );
            match outcome {
                Batch::Committed(mut messages) if position < messages.len() => {
                    return Ok((messages.swap_remove(position), created))
                }
                Batch::Committed(_) => wait = Some(commit_time),
                // Someone committed first, maybe this very send: look at once.
                Batch::Progressed(next) => {
                    head = next;
                    just_read = true;
                    wait = Some(Duration::ZERO);
                }
                Batch::Drop(items) => {
                    for p in items {
                        self.drop_pending(&p).await?;
                    }
                    wait = Some(Duration::ZERO);
                }
                // Another commit is in flight, likely with this send in it: give it time.
                Batch::Conflict => wait = Some(commit_time),
            }
        }
    }

    /// Joins the pending set: a put of `P#<clientMsgId>` on condition it is absent. Returns
    /// whether this request wrote it; false when a replay of the same send is already pending
    /// (then this request waits for that one). DynamoDB: 1 PutItem.
    async fn enqueue(
        &self,
        send: &Send<'_>,
        deadline: crate::retry::Deadline,
    ) -> Result<bool, ChatError> {
        let now_ms = crate::time::unix_millis(crate::time::now());
        let item = PendingItem {
            conversation_id: send.id.clone(),
            client_msg_key: send.request.client_msg_key.clone(),
            client_msg_id: send.request.client_msg_id.clone(),
            sender_id: send.caller.clone(),
            body: send.request.body.clone(),
            fingerprint: send.fingerprint.clone(),
            request_id: send.request_id.clone(),
            enqueued_at: crate::time::unix_micros(crate::time::now()),
            expires_at: now_ms + deadline.remaining().as_millis() as u64,
        };
        let item = to_item(
            &item,
            keys::conversation_pk(send.id),
            keys::pending_sk(&item.client_msg_key),
        )?;
        use aws_sdk_dynamodb::operation::put_item::PutItemError;
        let mut retry = self.retry();
        while retry.next().await {
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
                Ok(_) => return Ok(true),
                Err(e) => e,
            };
            match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => {
                    let existing: PendingItem = from_item(e.item().cloned().unwrap_or_default())?;
                    if existing.sender_id != *send.caller
                        || existing.fingerprint != send.fingerprint
                    {
                        return Err(conflict());
                    }
                    return Ok(false);
                }
                // A replay of this send is being committed right now (its pending item is in the
                // transaction): a moment later it is either committed (its key answers) or
                // pending again.
                Some(PutItemError::TransactionConflictException(_)) => {}
                // The partition's throughput ran out (after the SDK's own retries): nothing was
                // written; again after a backoff, within the deadline.
                _ if super::throttled(&err) => {}
                _ => return Err(sdk_error("PutItem", err)),
            }
        }
        Err(ChatError::Throttled)
    }

    /// The last group commit's record and the pending sends of a conversation. DynamoDB: 1
    /// strongly consistent Query (more pages only past 1 MB: bodies are at most 16 KiB, so 60
    /// pending sends or more; a send on a later page must still find itself there).
    async fn queue(&self, id: &ConversationId) -> Result<Queue, ChatError> {
        let range = (keys::COMMIT_RECORD_SK.into(), keys::PENDING_END_SK.into());
        let items = self.conversation_range(id, range, None).await?;
        let mut queue = Queue {
            last_commit: None,
            pending: Vec::new(),
        };
        for item in items {
            if get_s(&item, keys::SK) == Some(keys::COMMIT_RECORD_SK) {
                queue.last_commit = Some(from_item(item)?);
            } else {
                queue.pending.push(from_item(item)?);
            }
        }
        Ok(queue)
    }

    /// One group commit of `batch` after `head`, in one transaction.
    async fn commit_batch(&self, head: &Head, batch: Vec<PendingItem>) -> Result<Batch, ChatError> {
        let Some(first) = batch.first() else {
            return Ok(Batch::Progressed(None));
        };
        let id = first.conversation_id.clone();
        let now_ms = crate::time::unix_millis(crate::time::now());
        let at = message_time(crate::time::now_rfc3339(), head.last_message_at.as_deref());
        let messages: Vec<Message> = batch
            .iter()
            .zip(head.last_seq + 1..)
            .map(|(p, seq)| Message {
                conversation_id: id.clone(),
                seq,
                client_msg_id: p.client_msg_id.clone(),
                sender_id: p.sender_id.clone(),
                body: p.body.clone(),
                created_at: at.clone(),
            })
            .collect();
        let last = messages.last().expect("a batch is never empty");
        let busy = if batch.len() > 1 {
            Busy::Extend
        } else {
            Busy::Leave
        };
        let mut parts = vec![self.advance_conversation(&id, head.last_seq, last, busy)?];
        // Per send: its message, its key, its pending item gone (on condition it is the one read).
        for (p, m) in batch.iter().zip(&messages) {
            let key = SendKeyItem {
                conversation_id: id.clone(),
                seq: m.seq,
                client_msg_id: p.client_msg_id.clone(),
                sender_id: p.sender_id.clone(),
                fingerprint: p.fingerprint.clone(),
                created_at: m.created_at.clone(),
                request_id: p.request_id.clone(),
            };
            let pk = keys::conversation_pk(&id);
            parts.push(tx::put(
                &self.table,
                MessageItem::new(m).to_item()?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?);
            parts.push(tx::put(
                &self.table,
                to_item(&key, pk.clone(), keys::send_key_sk(&p.client_msg_key))?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?);
            parts.push(tx::delete(
                &self.table,
                keys::key(pk, keys::pending_sk(&p.client_msg_key)),
                "requestId = :rid AND expiresAt > :now",
                &[(":rid", s(&p.request_id)), (":now", n(now_ms))],
            )?);
        }
        // Per sender: one watermark update (a transaction touches an item once), to its newest.
        let mut newest: BTreeMap<&UserId, u64> = BTreeMap::new();
        for m in &messages {
            newest.insert(&m.sender_id, m.seq);
        }
        let senders: Vec<&UserId> = newest.keys().copied().collect();
        for (sender, seq) in &newest {
            parts.push(self.sender_watermark(&id, sender, *seq)?);
        }
        let record = CommitRecordItem {
            last_seq: last.seq,
            created_at: at.clone(),
            committed_at: now_ms,
            sends: batch
                .iter()
                .zip(&messages)
                .map(|(p, m)| CommittedSend {
                    client_msg_key: p.client_msg_key.clone(),
                    seq: m.seq,
                    request_id: p.request_id.clone(),
                })
                .collect(),
        };
        parts.push(tx::put(
            &self.table,
            to_item(&record, keys::conversation_pk(&id), keys::COMMIT_RECORD_SK)?,
            None,
            &[],
        )?);
        let reasons = match self.transact(parts).await? {
            TxOutcome::Committed => {
                committed_metrics(messages.len());
                if busy == Busy::Extend {
                    self.seen
                        .saw_busy(&id, now_ms + BUSY_FOR.as_millis() as u64);
                }
                return Ok(Batch::Committed(messages));
            }
            TxOutcome::Conflict => return Ok(Batch::Conflict),
            TxOutcome::Cancelled(reasons) => reasons,
        };
        let failed = |i: usize| reason_failed(&reasons, i).is_some();
        if let Some(r) = reason_failed(&reasons, 0) {
            return Ok(Batch::Progressed(r.item.as_ref().and_then(Head::of)));
        }
        let mut drop = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let (key, pending) = (2 + 3 * i, 3 + 3 * i);
            if failed(pending) {
                // Committed or dropped by someone else since we read it.
                return Ok(Batch::Progressed(None));
            }
            if failed(key) {
                drop.push(p.clone());
            }
        }
        let member_parts = 1 + 3 * batch.len();
        for (j, sender) in senders.iter().enumerate() {
            if failed(member_parts + j) {
                drop.extend(batch.iter().filter(|p| &&p.sender_id == sender).cloned());
            }
        }
        Ok(if drop.is_empty() {
            Batch::Progressed(None)
        } else {
            Batch::Drop(drop)
        })
    }

    /// Takes a send out of the pending set without committing it. DynamoDB: 1 DeleteItem.
    async fn drop_pending(&self, p: &PendingItem) -> Result<Dropped, ChatError> {
        self.delete_pending(&p.conversation_id, &p.client_msg_key, &p.request_id)
            .await
    }

    async fn delete_pending(
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
                keys::pending_sk(client_msg_key),
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
    /// pending send is withdrawn, so that no later commit takes it, and then `err` is the answer
    /// (nothing happened); or a commit took it meanwhile, and its message is the answer. While a
    /// commit holding it is in flight, this waits for the outcome; when that cannot be known in
    /// time (DynamoDB does not answer), the answer is `Unavailable` (the outcome is unknown).
    /// DynamoDB: 1 DeleteItem (+ 1 GetItem when it was gone; more while a commit holds it).
    async fn withdraw(
        &self,
        send: &Send<'_>,
        err: ChatError,
    ) -> Result<(Message, bool), ChatError> {
        let settle = crate::retry::Deadline::after(super::SETTLE_TIME);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dropped = self
                .delete_pending(send.id, &send.request.client_msg_key, &send.request_id)
                .await;
            match dropped {
                Ok(Dropped::Deleted) => {
                    telemetry::count("SendsGivenUp", 1);
                    return Err(err);
                }
                // Committed (its key is there), or dropped as its sender's (no key).
                Ok(Dropped::Gone) => {
                    return match self.send_key(send).await {
                        Ok(Some(key)) => answer(key, send),
                        Ok(None) => Err(err),
                        Err(_) => Err(ChatError::Unavailable),
                    }
                }
                Ok(Dropped::InCommit) | Err(_) => {
                    if !settle.sleep(crate::retry::backoff(attempt + 1)).await {
                        return Err(ChatError::Unavailable);
                    }
                }
            }
        }
    }

    async fn send_key(&self, send: &Send<'_>) -> Result<Option<SendKeyItem>, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(
                keys::conversation_pk(send.id),
                keys::send_key_sk(&send.request.client_msg_key),
            )))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        out.item.map(from_item).transpose()
    }
}

/// Messages sent, and how many one commit carried (1: alone; more: a group commit).
fn committed_metrics(messages: usize) {
    telemetry::count("MessagesSent", messages as u64);
    telemetry::metric("CommitBatchSize", messages as f64, "Count");
}

/// The message of `send` if `commit` committed this very request's pending item.
fn committed_by(commit: &CommitRecordItem, send: &Send<'_>) -> Option<Message> {
    let seq = commit.seq_of(&send.request.client_msg_key, &send.request_id)?;
    Some(Message {
        conversation_id: send.id.clone(),
        seq,
        client_msg_id: send.request.client_msg_id.clone(),
        sender_id: send.caller.clone(),
        body: send.request.body.clone(),
        created_at: commit.created_at.clone(),
    })
}

/// The answer for a send whose key exists: the original message when sender and body match (and
/// `created` only for the request that created it), otherwise a conflict.
fn answer(key: SendKeyItem, send: &Send<'_>) -> Result<(Message, bool), ChatError> {
    if key.sender_id != *send.caller || key.fingerprint != send.fingerprint {
        return Err(conflict());
    }
    let created = key.request_id == send.request_id;
    Ok((
        Message {
            conversation_id: key.conversation_id,
            seq: key.seq,
            client_msg_id: key.client_msg_id,
            sender_id: key.sender_id,
            body: send.request.body.clone(),
            created_at: key.created_at,
        },
        created,
    ))
}

fn conflict() -> ChatError {
    ChatError::Conflict(
        "clientMsgId was already used for a different message in this conversation".into(),
    )
}

/// How taking a send out of the pending set went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    Deleted,
    /// Not there (as this request wrote it): committed, or dropped by another.
    Gone,
    /// A commit holding it is in flight.
    InCommit,
}

/// The pending sends a commit may take, in commit order, and those whose request has ended
/// (`expires_at` passed at `now_ms`), which no commit takes.
fn live(pending: Vec<PendingItem>, now_ms: u64) -> (Vec<PendingItem>, Vec<PendingItem>) {
    let (live, expired) = pending.into_iter().partition(|p| p.expires_at > now_ms);
    (in_commit_order(live), expired)
}

/// The pending sends in the order they are committed: the oldest first.
fn in_commit_order(mut pending: Vec<PendingItem>) -> Vec<PendingItem> {
    pending.sort_by(|a, b| {
        (a.enqueued_at, &a.client_msg_key).cmp(&(b.enqueued_at, &b.client_msg_key))
    });
    pending
}

/// The next group commit: the first sends of the queue, as many as one transaction holds.
fn first_batch(queue: Vec<PendingItem>) -> Vec<PendingItem> {
    let mut batch: Vec<PendingItem> = Vec::new();
    let mut senders: Vec<UserId> = Vec::new();
    for p in queue {
        let new_sender = !senders.contains(&p.sender_id);
        // The conversation, the commit record, 3 per send, 1 per sender.
        let items = 2 + 3 * (batch.len() + 1) + senders.len() + usize::from(new_sender);
        if batch.len() == MAX_BATCH || items > MAX_TX_ITEMS {
            break;
        }
        if new_sender {
            senders.push(p.sender_id.clone());
        }
        batch.push(p);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(key: &str, sender: &str, at: u64) -> PendingItem {
        PendingItem {
            conversation_id: ConversationId::parse("g-00000000000000000000000000000001").unwrap(),
            client_msg_key: key.into(),
            client_msg_id: key.into(),
            sender_id: UserId::parse(sender).unwrap(),
            body: "b".into(),
            fingerprint: "f".into(),
            request_id: key.into(),
            enqueued_at: at,
            expires_at: u64::MAX,
        }
    }

    #[test]
    fn batches_take_the_oldest_first() {
        let batch = first_batch(in_commit_order(vec![
            pending("c", "u1", 30),
            pending("a", "u2", 10),
            pending("b", "u1", 20),
        ]));
        let keys: Vec<&str> = batch.iter().map(|p| p.client_msg_key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    #[test]
    fn batches_fit_one_transaction() {
        // Distinct senders: 4 items each, plus the conversation.
        let many: Vec<PendingItem> = (0..40)
            .map(|i| pending(&format!("k{i:02}"), &format!("u{i}"), i))
            .collect();
        let batch = first_batch(many);
        assert_eq!(batch.len(), MAX_BATCH);
        assert!(2 + 4 * batch.len() <= MAX_TX_ITEMS, "2 + 4 per send fits");
        // One sender: 3 items each, still at most 24 per commit.
        let one: Vec<PendingItem> = (0..40)
            .map(|i| pending(&format!("k{i:02}"), "u", i))
            .collect();
        assert_eq!(first_batch(one).len(), MAX_BATCH);
        assert!(first_batch(vec![]).is_empty());
    }
}
