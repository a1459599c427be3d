//! `history` (docs/api.md §11), and reading committed messages back for the relay.

use super::attrs::{get_s, s, Item};
use super::items::{from_item, ConversationItem, MessageItem};
use super::{keys, sdk_error, ChatStore};
use crate::api::requests::{HistoryCursor, HistoryQuery};
use crate::domain::model::{HistoryPage, Message};
use crate::domain::{ConversationId, UserId};
use crate::error::ChatError;

impl ChatStore {
    /// `history`. DynamoDB: a BatchGetItem of the conversation (for `lastSeq`) and the caller's
    /// member item, then the Query of the page (more pages only when the page's messages pass
    /// 1 MB). One after the other: a caller that is not a member makes nothing read but those
    /// two small items (run at once, a non-member could have 100 messages read per request).
    pub async fn history(
        &self,
        caller: &UserId,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<HistoryPage, ChatError> {
        let wanted = vec![keys::conversation_key(id), keys::member_key(id, caller)];
        let found = self.batch_get(wanted, true).await?;
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
        let (mut messages, has_more) = self.query_messages(id, q).await?;
        // A message committed between the two reads is in the page but not in the lastSeq read
        // before it. Report the larger.
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

    /// Messages `from..=to` of a conversation, in seq order (those that exist). DynamoDB: 1
    /// strongly consistent Query (more pages past 1 MB).
    pub async fn messages_between(
        &self,
        id: &ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<Message>, ChatError> {
        let range = (keys::message_sk(from), keys::message_sk(to));
        self.conversation_range(id, range, None)
            .await?
            .into_iter()
            .map(|item| Ok(from_item::<MessageItem, _>(item)?.into_message()))
            .collect()
    }
}
