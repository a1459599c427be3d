//! Sending (gap-free `seq`, idempotent by `clientMsgId`) and reading history.

use aws_sdk_dynamodb::types::AttributeValue;

use super::attrs::{get_n, get_s, n, req_n, req_s, s, Item};
use super::items::{message_from_map, message_to_map};
use super::{reason_failed, sdk_error, tx, ChatStore, ConversationItem, TxOutcome};
use crate::domain::{is_conversation_id, message_fingerprint};
use crate::error::ChatError;
use crate::identity::UserId;
use crate::keys;
use crate::model::{HistoryPage, Message};
use crate::requests::{HistoryCursor, HistoryQuery, SendMessage};
use crate::retry::Retry;

/// Positions of the parts of the send transaction (their cancellation reasons come in this order).
const SEND_CONVERSATION: usize = 0;
const SEND_KEY: usize = 2;
const SEND_MEMBER: usize = 3;

impl ChatStore {
    /// `POST /conversations/{id}/messages`. Returns `(message, created)`.
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
        id: &str,
        request: &SendMessage,
    ) -> Result<(Message, bool), ChatError> {
        if !is_conversation_id(id) {
            return Err(ChatError::NotFound);
        }
        let fingerprint = message_fingerprint(caller.as_str(), &request.body);
        let mut seen = self.last_seq(id).await?.ok_or(ChatError::NotFound)?;

        let mut retry = Retry::new();
        while retry.next().await {
            let message = Message {
                conversation_id: id.to_owned(),
                seq: seen + 1,
                client_msg_id: request.client_msg_id.clone(),
                sender_id: caller.to_string(),
                body: request.body.clone(),
                created_at: crate::time::now_rfc3339(),
            };
            let pk = keys::conversation_pk(id);
            let mut message_item = message_to_map(&message);
            message_item.extend(Self::key(pk.clone(), keys::message_sk(message.seq)));
            message_item.insert("conversationId".into(), s(id));
            let mut key_item = Self::key(pk, keys::client_msg_sk(&request.client_msg_key));
            key_item.insert("conversationId".into(), s(id));
            key_item.insert("seq".into(), n(message.seq));
            key_item.insert("clientMsgId".into(), s(&message.client_msg_id));
            key_item.insert("senderId".into(), s(caller.as_str()));
            key_item.insert("fingerprint".into(), s(&fingerprint));
            key_item.insert("createdAt".into(), s(&message.created_at));
            let parts = vec![
                tx::update(
                    &self.table,
                    self.conversation_key(id),
                    "SET lastSeq = :next, lastMessageAt = :at, lastMessage = :message",
                    Some("lastSeq = :seen"),
                    &[
                        (":next", n(message.seq)),
                        (":at", s(&message.created_at)),
                        (":message", AttributeValue::M(message_to_map(&message))),
                        (":seen", n(seen)),
                    ],
                )?,
                tx::put(
                    &self.table,
                    message_item,
                    Some("attribute_not_exists(pk)"),
                    &[],
                )?,
                tx::put(&self.table, key_item, Some("attribute_not_exists(pk)"), &[])?,
                tx::update(
                    &self.table,
                    self.member_key(id, caller.as_str()),
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
                    .as_ref()
                    .ok_or_else(|| ChatError::internal("no item for a failed key"))?;
                return replay(id, original, caller, &request.body, &fingerprint)
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

    /// `GET /conversations/{id}/messages`. DynamoDB: 2 calls run concurrently: a BatchGetItem of the
    /// conversation (for `lastSeq`) and the caller's member item, and the Query of the page (more
    /// pages only when the page's messages pass 1 MB).
    pub async fn history(
        &self,
        caller: &UserId,
        id: &str,
        q: HistoryQuery,
    ) -> Result<HistoryPage, ChatError> {
        if !is_conversation_id(id) {
            return Err(ChatError::NotFound);
        }
        let keys = vec![
            self.conversation_key(id),
            self.member_key(id, caller.as_str()),
        ];
        let (found, page) = futures::join!(self.batch_get(keys, true), self.query_messages(id, q));
        let found = found?;
        let conversation = found
            .iter()
            .find(|i| get_s(i, keys::SK) == Some(keys::CONVERSATION_SK))
            .map(ConversationItem::from_item)
            .transpose()?;
        let is_member = found
            .iter()
            .any(|i| get_s(i, keys::SK).is_some_and(|sk| sk.starts_with("M#")));
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
        id: &str,
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
            .iter()
            .map(|i| message_from_map(id, i))
            .collect::<Result<_, _>>()?;
        Ok((messages, has_more))
    }
}

/// The answer to a resent `clientMsgId`: the original message when sender and body match,
/// otherwise a conflict.
fn replay(
    id: &str,
    original: &Item,
    caller: &UserId,
    body: &str,
    fingerprint: &str,
) -> Result<Message, ChatError> {
    let same = get_s(original, "senderId") == Some(caller.as_str())
        && get_s(original, "fingerprint") == Some(fingerprint);
    if !same {
        return Err(ChatError::Conflict(
            "clientMsgId was already used for a different message in this conversation".into(),
        ));
    }
    Ok(Message {
        conversation_id: id.to_owned(),
        seq: req_n(original, "seq")?,
        client_msg_id: req_s(original, "clientMsgId")?,
        sender_id: caller.to_string(),
        body: body.to_owned(),
        created_at: req_s(original, "createdAt")?,
    })
}
