//! `markRead` and `readStates` (docs/api.md §12, §13): the monotonic watermark (`lastReadSeq`) of each
//! member.

use super::attrs::{get_n, n};
use super::{keys, reason_failed, tx, ChatStore, TxOutcome};
use crate::domain::model::{MemberReadState, ReadResult, ReadStates};
use crate::domain::{ConversationId, UserId};
use crate::error::ChatError;
use crate::retry::Retry;

const READ_CONVERSATION: usize = 0;
const READ_MEMBER: usize = 1;

impl ChatStore {
    /// `markRead`: the watermark becomes `max(current, min(seq, lastSeq))`.
    ///
    /// One transaction: a condition check `lastSeq >= seq` on the conversation and the member's
    /// update `lastReadSeq = seq` on condition `lastReadSeq < seq`. Either condition failing returns
    /// the item as it was, which is all that is needed to answer: a late, older request changes
    /// nothing (and so emits no event), a seq beyond `lastSeq` is retried once clamped to it.
    /// DynamoDB: 1 TransactWriteItems (2 when the seq had to be clamped; GetItem + UpdateItem
    /// instead when the conversation item is contended, see `mark_read_plain`).
    pub async fn mark_read(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
    ) -> Result<ReadResult, ChatError> {
        let result = |last_read_seq, advanced| ReadResult {
            conversation_id: id.clone(),
            last_read_seq,
            advanced,
        };
        let mut target = seq;
        let mut retry = Retry::new();
        while retry.next().await {
            let parts = vec![
                tx::check(
                    &self.table,
                    keys::conversation_key(id),
                    "lastSeq >= :seq",
                    &[(":seq", n(target))],
                )?,
                tx::update(
                    &self.table,
                    keys::member_key(id, caller),
                    "SET lastReadSeq = :seq",
                    Some("attribute_exists(pk) AND lastReadSeq < :seq"),
                    &[(":seq", n(target))],
                )?,
            ];
            let reasons = match self.transact(parts).await? {
                TxOutcome::Committed => return Ok(result(target, true)),
                // A hot conversation item (sends, other receipts): stop competing for it.
                TxOutcome::Contended => return self.mark_read_plain(caller, id, target).await,
                TxOutcome::Cancelled(reasons) => reasons,
            };
            if let Some(member) = reason_failed(&reasons, READ_MEMBER) {
                // Not a member (no item), or the watermark is already at or past `target`.
                let current = member
                    .item
                    .as_ref()
                    .and_then(|i| get_n(i, "lastReadSeq"))
                    .ok_or(ChatError::NotFound)?;
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

    /// The same effect without a transaction, for a contended conversation item: a strongly
    /// consistent read of `lastSeq`, then a plain conditional update of the member's watermark.
    /// `lastSeq` only grows, so the clamp read first still holds when the update lands.
    /// DynamoDB: 1 GetItem + 1 UpdateItem.
    pub async fn mark_read_plain(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
    ) -> Result<ReadResult, ChatError> {
        let last_seq = self.last_seq(id).await?.ok_or(ChatError::NotFound)?;
        let target = seq.min(last_seq);
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(id, caller)))
            .update_expression("SET lastReadSeq = :seq")
            .condition_expression("attribute_exists(pk) AND lastReadSeq < :seq")
            .expression_attribute_values(":seq", n(target))
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await;
        let result = |last_read_seq, advanced| ReadResult {
            conversation_id: id.clone(),
            last_read_seq,
            advanced,
        };
        match update {
            Ok(_) => Ok(result(target, true)),
            Err(e) => {
                use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
                match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                        let current = failed
                            .item()
                            .and_then(|i| get_n(i, "lastReadSeq"))
                            .ok_or(ChatError::NotFound)?;
                        Ok(result(current, false))
                    }
                    _ => Err(super::sdk_error("UpdateItem", e)),
                }
            }
        }
    }

    /// `readStates`: every member's watermark. DynamoDB: 1 Query.
    pub async fn read_states(
        &self,
        caller: &UserId,
        id: &ConversationId,
    ) -> Result<ReadStates, ChatError> {
        let (conversation, members) = self.load_for_member(caller, id).await?;
        Ok(ReadStates {
            conversation_id: conversation.conversation_id,
            last_seq: conversation.last_seq,
            members: members
                .into_iter()
                .map(|m| MemberReadState {
                    user_id: m.member_id,
                    last_read_seq: m.last_read_seq,
                })
                .collect(),
        })
    }
}
