//! `sendMessage` (gap-free `seq`, idempotent by `clientMsgId`) and `history` (docs/api.md §10, §11).

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{from_item, ConversationItem, MessageItem, SendKeyItem, StoredMessage};
use super::{keys, reason_failed, sdk_error, tx, ChatStore, TxOutcome};
use crate::api::requests::{HistoryCursor, HistoryQuery, SendMessage};
use crate::domain::message::message_fingerprint;
use crate::domain::model::{HistoryPage, Message};
use crate::domain::{ConversationId, UserId};
use crate::error::ChatError;
use crate::retry::Retry;

/// Positions of the parts of the send transaction (their cancellation reasons come in this order).
const SEND_CONVERSATION: usize = 0;
const SEND_KEY: usize = 2;
const SEND_MEMBER: usize = 3;

impl ChatStore {
    /// `sendMessage`. Returns `(message, created)`.
    ///
    /// One transaction does it all, so it happens entirely or not at all:
    /// 0. the conversation: `lastSeq` from N to N+1 on condition `lastSeq = N` (the gap-free seq),
    ///    with the message as `lastMessage` (inbox preview and the ordered event source);
    /// 1. the message item `S#N+1`;
    /// 2. the idempotency key `X#clientMsgId`, only if absent (holds forever);
    /// 3. the sender's member item: the watermark to N+1, on condition it exists (membership).
    ///
    /// DynamoDB: 1 GetItem + 1 TransactWriteItems when uncontended; a lost race retries the
    /// transaction alone, with the `lastSeq` its cancellation returned.
    pub async fn send_message(
        &self,
        caller: &UserId,
        id: &ConversationId,
        request: &SendMessage,
    ) -> Result<(Message, bool), ChatError> {
        let fingerprint = message_fingerprint(caller, &request.body);
        let mut seen = self.last_seq(id).await?.ok_or(ChatError::NotFound)?;

        let mut retry = Retry::new();
        while retry.next().await {
            let message = Message {
                conversation_id: id.clone(),
                seq: seen + 1,
                client_msg_id: request.client_msg_id.clone(),
                sender_id: caller.clone(),
                body: request.body.clone(),
                created_at: crate::time::now_rfc3339(),
            };
            let send_key = SendKeyItem {
                conversation_id: id.clone(),
                seq: message.seq,
                client_msg_id: message.client_msg_id.clone(),
                sender_id: caller.clone(),
                fingerprint: fingerprint.clone(),
                created_at: message.created_at.clone(),
            };
            let last_message =
                serde_dynamo::to_attribute_value(StoredMessage::from_message(&message))
                    .map_err(ChatError::internal)?;
            let parts = vec![
                tx::update(
                    &self.table,
                    keys::conversation_key(id),
                    "SET lastSeq = :next, lastMessageAt = :at, lastMessage = :message",
                    Some("lastSeq = :seen"),
                    &[
                        (":next", n(message.seq)),
                        (":at", s(&message.created_at)),
                        (":message", last_message),
                        (":seen", n(seen)),
                    ],
                )?,
                tx::put(
                    &self.table,
                    MessageItem::new(&message).to_item()?,
                    Some("attribute_not_exists(pk)"),
                    &[],
                )?,
                tx::put(
                    &self.table,
                    super::items::to_item(
                        &send_key,
                        keys::conversation_pk(id),
                        keys::send_key_sk(&request.client_msg_key),
                    )?,
                    Some("attribute_not_exists(pk)"),
                    &[],
                )?,
                tx::update(
                    &self.table,
                    keys::member_key(id, caller),
                    "SET lastReadSeq = :next, lastSentSeq = :next",
                    Some("attribute_exists(pk)"),
                    &[(":next", n(message.seq))],
                )?,
            ];
            let reasons = match self.transact(parts).await? {
                TxOutcome::Committed => return Ok((message, true)),
                TxOutcome::Contended => continue,
                TxOutcome::Cancelled(reasons) => reasons,
            };
            if reason_failed(&reasons, SEND_MEMBER).is_some() {
                return Err(ChatError::NotFound);
            }
            if let Some(r) = reason_failed(&reasons, SEND_KEY) {
                let original = r
                    .item
                    .clone()
                    .ok_or_else(|| ChatError::internal("no item for a failed key"))?;
                return replay(from_item(original)?, caller, &request.body, &fingerprint)
                    .map(|m| (m, false));
            }
            match reason_failed(&reasons, SEND_CONVERSATION).and_then(|r| r.item.as_ref()) {
                // Another message took seq N+1: try N+2 with the lastSeq DynamoDB just returned.
                Some(item) => seen = get_n(item, "lastSeq").unwrap_or(seen + 1),
                None => return Err(ChatError::NotFound),
            }
        }
        Err(ChatError::Throttled)
    }

    /// `history`. DynamoDB: 2 calls run concurrently: a BatchGetItem of the
    /// conversation (for `lastSeq`) and the caller's member item, and the Query of the page (more
    /// pages only when the page's messages pass 1 MB).
    pub async fn history(
        &self,
        caller: &UserId,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<HistoryPage, ChatError> {
        let wanted = vec![keys::conversation_key(id), keys::member_key(id, caller)];
        let (found, page) =
            futures::join!(self.batch_get(wanted, true), self.query_messages(id, q));
        let found = found?;
        let conversation: Option<ConversationItem> = found
            .iter()
            .find(|i| get_s(i, keys::SK) == Some(keys::CONVERSATION_SK))
            .cloned()
            .map(from_item)
            .transpose()?;
        let is_member = found
            .iter()
            .any(|i| get_s(i, keys::SK).is_some_and(|sk| sk.starts_with(keys::MEMBER_SK_PREFIX)));
        let (Some(conversation), true) = (conversation, is_member) else {
            return Err(ChatError::NotFound);
        };
        let (mut messages, has_more) = page?;
        // The two reads run concurrently: a message committed between them can be in the page but
        // not yet in the conversation item's lastSeq. Report the larger.
        let last_seq = conversation
            .last_seq
            .max(messages.iter().map(|m| m.seq).max().unwrap_or(0));
        messages.sort_by_key(|m| m.seq);
        Ok(HistoryPage {
            messages,
            last_seq,
            has_more,
        })
    }

    /// One page of messages in the direction of travel, and whether more exist beyond it.
    async fn query_messages(
        &self,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<(Vec<Message>, bool), ChatError> {
        let limit = q.limit as usize;
        let (from, to, forward) = match q.cursor {
            HistoryCursor::Newest => (
                keys::FIRST_MESSAGE_SK.to_owned(),
                keys::LAST_MESSAGE_SK.to_owned(),
                false,
            ),
            HistoryCursor::Before(b) if b <= 1 => return Ok((vec![], false)),
            HistoryCursor::Before(b) => (
                keys::FIRST_MESSAGE_SK.to_owned(),
                keys::message_sk(b - 1),
                false,
            ),
            HistoryCursor::After(a) if a == u64::MAX => return Ok((vec![], false)),
            HistoryCursor::After(a) => (
                keys::message_sk(a + 1),
                keys::LAST_MESSAGE_SK.to_owned(),
                true,
            ),
        };
        let mut items: Vec<Item> = Vec::with_capacity(limit + 1);
        let mut start = None;
        loop {
            // One more than the page tells whether there is more.
            let want = limit + 1 - items.len();
            let resp = self
                .db
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
                .expression_attribute_values(":pk", s(keys::conversation_pk(id)))
                .expression_attribute_values(":from", s(&from))
                .expression_attribute_values(":to", s(&to))
                .scan_index_forward(forward)
                .limit(want as i32)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error("Query", e))?;
            items.extend(resp.items.unwrap_or_default());
            match resp.last_evaluated_key {
                Some(k) if !k.is_empty() && items.len() <= limit => start = Some(k),
                _ => break,
            }
        }
        let has_more = items.len() > limit;
        items.truncate(limit);
        let messages = items
            .into_iter()
            .map(|i| from_item::<MessageItem, _>(i).map(MessageItem::into_message))
            .collect::<Result<_, _>>()?;
        Ok((messages, has_more))
    }
}

/// The answer to a resent `clientMsgId`: the original message when sender and body match,
/// otherwise a conflict.
fn replay(
    original: SendKeyItem,
    caller: &UserId,
    body: &str,
    fingerprint: &str,
) -> Result<Message, ChatError> {
    if &original.sender_id != caller || original.fingerprint != fingerprint {
        return Err(ChatError::Conflict(
            "clientMsgId was already used for a different message in this conversation".into(),
        ));
    }
    Ok(Message {
        conversation_id: original.conversation_id,
        seq: original.seq,
        client_msg_id: original.client_msg_id,
        sender_id: original.sender_id,
        body: body.to_owned(),
        created_at: original.created_at,
    })
}
