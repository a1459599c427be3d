//! Read state: the monotonic watermark (`lastReadSeq`) of each member.

use super::attrs::get_n;
use super::{reason_failed, tx, ChatStore, TxOutcome};
use crate::domain::is_conversation_id;
use crate::error::ChatError;
use crate::identity::UserId;
use crate::model::{MemberReadState, ReadResult, ReadStates};
use crate::retry::{pause, MAX_ATTEMPTS};

const READ_CONVERSATION: usize = 0;
const READ_MEMBER: usize = 1;

impl ChatStore {
    /// `POST /conversations/{id}/read`: the watermark becomes `max(current, min(seq, lastSeq))`.
    ///
    /// One transaction: a condition check `lastSeq >= seq` on the conversation and the member's
    /// update `lastReadSeq = seq` on condition `lastReadSeq < seq`. Either condition failing returns
    /// the item as it was, which is all that is needed to answer: a late, older request changes
    /// nothing (and so emits no event), a seq beyond `lastSeq` is retried once clamped to it.
    /// DynamoDB: 1 TransactWriteItems (2 when the seq had to be clamped).
    pub async fn mark_read(
        &self,
        caller: &UserId,
        id: &str,
        seq: u64,
    ) -> Result<ReadResult, ChatError> {
        if !is_conversation_id(id) {
            return Err(ChatError::NotFound);
        }
        let result = |last_read_seq, advanced| ReadResult {
            conversation_id: id.to_owned(),
            last_read_seq,
            advanced,
        };
        let mut target = seq;
        for attempt in 1..=MAX_ATTEMPTS {
            pause(attempt).await;
            let parts = vec![
                tx::check(
                    &self.table,
                    self.conversation_key(id),
                    "lastSeq >= :seq",
                    &[(":seq", super::attrs::n(target))],
                )?,
                tx::update(
                    &self.table,
                    self.member_key(id, caller.as_str()),
                    "SET lastReadSeq = :seq",
                    Some("attribute_exists(pk) AND lastReadSeq < :seq"),
                    &[(":seq", super::attrs::n(target))],
                )?,
            ];
            let reasons = match self.transact(parts).await? {
                TxOutcome::Committed => return Ok(result(target, true)),
                TxOutcome::Contended => continue,
                TxOutcome::Cancelled(reasons) => reasons,
            };
            if let Some(member) = reason_failed(&reasons, READ_MEMBER) {
                // Not a member (no item), or the watermark is already at or past `target`.
                let current = member
                    .item
                    .as_ref()
                    .and_then(|i| get_n(i, "lastReadSeq"))
                    .ok_or(ChatError::NotFound)?;
                if reason_failed(&reasons, READ_CONVERSATION).is_some_and(|c| c.item.is_none()) {
                    return Err(ChatError::NotFound);
                }
                return Ok(result(current, false));
            }
            let conversation = reason_failed(&reasons, READ_CONVERSATION).ok_or_else(|| {
                ChatError::internal("read transaction cancelled without a failed condition")
            })?;
            let last_seq = conversation
                .item
                .as_ref()
                .and_then(|i| get_n(i, "lastSeq"))
                .ok_or(ChatError::NotFound)?;
            // Beyond lastSeq: clamp. The member condition held, so the watermark is below target.
            target = last_seq;
        }
        Err(ChatError::Throttled)
    }

    /// `GET /conversations/{id}/reads`: every member's watermark. DynamoDB: 1 Query.
    pub async fn read_states(&self, caller: &UserId, id: &str) -> Result<ReadStates, ChatError> {
        let (conversation, members) = self
            .load_conversation(id)
            .await?
            .ok_or(ChatError::NotFound)?;
        if !members.iter().any(|m| m.user_id == caller.as_str()) {
            return Err(ChatError::NotFound);
        }
        Ok(ReadStates {
            conversation_id: conversation.conversation_id,
            last_seq: conversation.last_seq,
            members: members
                .into_iter()
                .map(|m| MemberReadState {
                    user_id: m.user_id,
                    last_read_seq: m.last_read_seq,
                })
                .collect(),
        })
    }
}
