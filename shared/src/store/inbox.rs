//! `inbox` (docs/api.md §14): a user's conversations, newest activity first, with unread counts.

use futures::future::try_join_all;

use super::attrs::{get_n, get_s, s};
use super::items::{from_item, ConversationItem};
use super::{keys, sdk_error, ChatStore};
use crate::domain::inbox::{inbox_page, InboxPosition};
use crate::domain::model::{InboxEntry, InboxPage};
use crate::domain::read_state::unread_count;
use crate::domain::{ConversationId, ConversationType, UserId};
use crate::error::ChatError;

/// BatchGetItem takes 100 keys.
const BATCH_GET_KEYS: usize = 100;

impl ChatStore {
    /// `inbox`. DynamoDB: 1 Query of the `byMember` index (the user's memberships with their
    /// watermarks; more pages only past 1 MB, ~10,000 memberships) + ⌈memberships/100⌉
    /// BatchGetItem of the conversation items, run concurrently; then sorted and paged in memory.
    pub async fn inbox(
        &self,
        caller: &UserId,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<InboxPage, ChatError> {
        let after = cursor.map(InboxPosition::decode).transpose()?;
        let mut memberships: Vec<(ConversationId, u64)> = Vec::new();
        let mut start = None;
        loop {
            let resp = self
                .db
                .query()
                .table_name(&self.table)
                .index_name(keys::MEMBER_INDEX)
                .key_condition_expression("memberId = :u")
                .expression_attribute_values(":u", s(caller.as_str()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error("Query", e))?;
            for item in resp.items() {
                if let Some(id) = get_s(item, keys::PK).and_then(keys::conversation_id_of_pk) {
                    memberships.push((id, get_n(item, "lastReadSeq").unwrap_or(0)));
                }
            }
            match resp.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }

        let batches = memberships.chunks(BATCH_GET_KEYS).map(|chunk| {
            let keys = chunk
                .iter()
                .map(|(id, _)| keys::conversation_key(id))
                .collect();
            self.batch_get(keys, true)
        });
        let conversations = try_join_all(batches).await?;
        let read: std::collections::HashMap<&ConversationId, u64> =
            memberships.iter().map(|(id, r)| (id, *r)).collect();

        let mut entries = Vec::with_capacity(memberships.len());
        for item in conversations.into_iter().flatten() {
            let c: ConversationItem = from_item(item)?;
            let last_read_seq = read
                .get(&c.conversation_id)
                .copied()
                .unwrap_or(0)
                .min(c.last_seq);
            let position = InboxPosition {
                activity: c.activity().to_owned(),
                conversation_id: c.conversation_id.clone(),
            };
            let peer_id = match c.kind {
                ConversationType::Direct => c.direct_members.iter().find(|m| *m != caller).cloned(),
                ConversationType::Group => None,
            };
            entries.push((
                position,
                InboxEntry {
                    last_message: c.preview(),
                    conversation_id: c.conversation_id,
                    kind: c.kind,
                    title: c.title,
                    peer_id,
                    member_count: c.member_count,
                    last_seq: c.last_seq,
                    last_read_seq,
                    unread_count: unread_count(c.last_seq, last_read_seq),
                    last_message_at: c.last_message_at,
                },
            ));
        }
        let (conversations, next_cursor) = inbox_page(entries, after.as_ref(), limit as usize);
        Ok(InboxPage {
            conversations,
            next_cursor,
        })
    }
}
