//! `markRead` and `readStates` (docs/api.md §12, §13): the monotonic watermark (`lastReadSeq`) of
//! each member.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::attrs::{get_n, get_s, n, s};
use super::{keys, sdk_error, ChatStore};
use chat_domain::error::ChatError;
use chat_domain::model::{MemberReadState, ReadResult, ReadStates};
use chat_domain::read_state::{effective_watermark, shown_watermark};
use chat_domain::{ConversationId, UserId};

impl ChatStore {
    /// `markRead`: the watermark becomes `max(current, min(seq, lastSeq))`.
    ///
    /// A read receipt never locks the conversation item, so a receipt storm cannot slow a busy
    /// conversation's sends: `lastSeq` is read (a strongly consistent GetItem; reads never conflict
    /// with transactions), then the member item alone is updated on condition `lastReadSeq <
    /// target`. `lastSeq` only grows, so the clamp read first still holds when the update lands.
    /// A late, older request fails the condition: nothing is written, so no event is emitted.
    /// A seq at or below a `lastSeq` this instance has already seen needs no clamp, and so no
    /// read (a lower bound of a number that only grows).
    /// The update records this request's token (`lastReadBy`), so an update whose answer was lost
    /// can tell, when sent again, whether it had been applied: `advanced` stays truthful.
    /// The update also records the connection the request named (`origin`, `readOrigin`; removed
    /// when none), which the receipt's push then skips (docs/api.md §15.4).
    /// Out of time, the request answers `503` when an attempt got no answer (it may have landed),
    /// `429` when only conflicts held it back (nothing was written).
    /// DynamoDB: 1 GetItem + 1 UpdateItem; the UpdateItem alone when the seq is known to exist.
    pub async fn mark_read(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        origin: Option<&str>,
    ) -> Result<ReadResult, ChatError> {
        let known = self.seen.last_seq(id);
        let last_seq = if seq <= known {
            known
        } else {
            self.last_seq(id).await?.ok_or(ChatError::NotFound)?
        };
        let target = seq.min(last_seq);
        let token = uuid::Uuid::new_v4().to_string();
        let result = |last_read_seq, advanced| ReadResult {
            conversation_id: id.clone(),
            last_read_seq,
            advanced,
        };
        let expression = match origin {
            Some(_) => "SET lastReadSeq = :seq, lastReadBy = :token, readOrigin = :origin",
            None => "SET lastReadSeq = :seq, lastReadBy = :token REMOVE readOrigin",
        };
        let mut retry = self.retry();
        // Whether an attempt got no answer: it may have landed.
        let mut unknown = false;
        while retry.next().await {
            let update = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(keys::member_key(id, caller)))
                .update_expression(expression)
                .condition_expression("attribute_exists(pk) AND lastReadSeq < :seq")
                .expression_attribute_values(":seq", n(target))
                .expression_attribute_values(":token", s(&token))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            let update = match origin {
                Some(origin) => update.expression_attribute_values(":origin", s(origin)),
                None => update,
            };
            let update = update.send().await;
            let err = match update {
                Ok(_) => {
                    crate::telemetry::count("ReceiptsAdvanced", 1);
                    return Ok(result(target, true));
                }
                Err(e) => e,
            };
            match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    // Not a member (no item), or the watermark is already at or past the target.
                    let item = failed.item().ok_or(ChatError::NotFound)?;
                    let current = get_n(item, "lastReadSeq").unwrap_or(0);
                    let ours = get_s(item, "lastReadBy") == Some(token.as_str());
                    return Ok(result(effective_watermark(current, seq, last_seq), ours));
                }
                // The member item is part of a send in flight (the sender's own watermark): the
                // next attempt waits a moment (Retry::next).
                Some(UpdateItemError::TransactionConflictException(_)) => {}
                // No answer: send it again; the token tells whether the first one landed.
                _ if matches!(
                    err,
                    SdkError::TimeoutError(_) | SdkError::DispatchFailure(_)
                ) =>
                {
                    unknown = true;
                }
                // After an attempt without an answer, a refusal says nothing of that attempt:
                // the outcome is still unknown (found by probing: a 429 after a landed read).
                _ => {
                    let e = sdk_error("UpdateItem", err);
                    return Err(match e {
                        ChatError::Throttled if unknown => ChatError::Unavailable,
                        e => e,
                    });
                }
            }
        }
        // Out of time: after an attempt without an answer the read may have landed, so the
        // outcome is unknown (503; found by probing: a 429 whose read had moved the watermark);
        // after conflicts only, nothing was written (429).
        Err(if unknown {
            ChatError::Unavailable
        } else {
            ChatError::Throttled
        })
    }

    /// `readStates`: every member's watermark, never above the `lastSeq` shown with it
    /// (`shown_watermark`: the reads are no snapshot). DynamoDB: 1 round trip, as `getConversation`.
    pub async fn read_states(
        &self,
        caller: &UserId,
        id: &ConversationId,
    ) -> Result<ReadStates, ChatError> {
        let (conversation, members) = self.load_for_member(caller, id).await?;
        let last_seq = conversation.last_seq;
        Ok(ReadStates {
            conversation_id: conversation.conversation_id,
            last_seq,
            members: members
                .into_iter()
                .map(|m| MemberReadState {
                    user_id: m.member_id,
                    last_read_seq: shown_watermark(m.last_read_seq, last_seq),
                })
                .collect(),
        })
    }
}
