//! The chat table's items and their mapping to the API model (docs/data-model.md).

use super::attrs::{get_list_s, get_map, get_n, get_s, list_s, n, req_n, req_s, s, Item};
use crate::error::ChatError;
use crate::keys;
use crate::model::{Conversation, ConversationType, Message, MessagePreview};

/// `sk = C`: the conversation and its counters.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationItem {
    pub conversation_id: String,
    pub kind: ConversationType,
    pub title: Option<String>,
    pub owner_id: Option<String>,
    /// Direct conversations only: the two users, so the inbox can name the peer without a lookup.
    pub direct_members: Vec<String>,
    pub member_count: u32,
    pub last_seq: u64,
    pub created_at: String,
    pub last_message_at: Option<String>,
    /// The whole last message: the inbox previews it and the relay turns its changes into
    /// `message.new` events in `seq` order (the stream orders records per item).
    pub last_message: Option<Message>,
    /// Bumped by every membership change; `members_change` says what changed.
    pub members_version: u64,
    pub members_change: Option<MembersChange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembersChange {
    pub added: bool,
    pub user_ids: Vec<String>,
}

impl ConversationItem {
    pub fn from_item(item: &Item) -> Result<Self, ChatError> {
        let conversation_id = req_s(item, "conversationId")?;
        let kind = ConversationType::parse(&req_s(item, "type")?)
            .ok_or_else(|| ChatError::internal("conversation item has an unknown type"))?;
        let last_message = get_map(item, "lastMessage")
            .map(|m| message_from_map(&conversation_id, m))
            .transpose()?;
        let members_change = get_map(item, "membersChange").map(|m| MembersChange {
            added: get_s(m, "kind") == Some("added"),
            user_ids: get_list_s(m, "userIds"),
        });
        Ok(ConversationItem {
            kind,
            title: get_s(item, "title").map(str::to_owned),
            owner_id: get_s(item, "ownerId").map(str::to_owned),
            direct_members: get_list_s(item, "directMembers"),
            member_count: req_n(item, "memberCount")? as u32,
            last_seq: req_n(item, "lastSeq")?,
            created_at: req_s(item, "createdAt")?,
            last_message_at: get_s(item, "lastMessageAt").map(str::to_owned),
            last_message,
            members_version: get_n(item, "membersVersion").unwrap_or(0),
            members_change,
            conversation_id,
        })
    }

    /// A new conversation item (no messages yet).
    pub fn to_item(&self) -> Item {
        let mut item = super::ChatStore::key(
            keys::conversation_pk(&self.conversation_id),
            keys::CONVERSATION_SK,
        );
        item.insert("conversationId".into(), s(&self.conversation_id));
        item.insert("type".into(), s(self.kind.as_str()));
        if let Some(t) = &self.title {
            item.insert("title".into(), s(t));
        }
        if let Some(o) = &self.owner_id {
            item.insert("ownerId".into(), s(o));
        }
        if !self.direct_members.is_empty() {
            item.insert(
                "directMembers".into(),
                list_s(self.direct_members.iter().map(String::as_str)),
            );
        }
        item.insert("memberCount".into(), n(self.member_count.into()));
        item.insert("lastSeq".into(), n(self.last_seq));
        item.insert("createdAt".into(), s(&self.created_at));
        item.insert("membersVersion".into(), n(self.members_version));
        item
    }

    /// Newest activity, for inbox order.
    pub fn activity(&self) -> &str {
        self.last_message_at.as_deref().unwrap_or(&self.created_at)
    }

    pub fn to_conversation(&self, member_ids: Vec<String>) -> Conversation {
        Conversation {
            conversation_id: self.conversation_id.clone(),
            kind: self.kind,
            title: self.title.clone(),
            member_count: self.member_count,
            member_ids,
            last_seq: self.last_seq,
            created_at: self.created_at.clone(),
            last_message_at: self.last_message_at.clone(),
        }
    }

    pub fn preview(&self) -> Option<MessagePreview> {
        self.last_message.as_ref().map(|m| MessagePreview {
            seq: m.seq,
            sender_id: m.sender_id.clone(),
            body: crate::domain::preview(&m.body),
            created_at: m.created_at.clone(),
        })
    }
}

/// `sk = M#<userId>`: a member and its read watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberItem {
    pub conversation_id: String,
    pub user_id: String,
    pub last_read_seq: u64,
    /// The seq of this member's latest send (the send also moved `last_read_seq` to it): lets the
    /// relay tell a read from a send.
    pub last_sent_seq: u64,
}

impl MemberItem {
    pub fn from_item(item: &Item) -> Result<Self, ChatError> {
        Ok(MemberItem {
            conversation_id: req_s(item, "conversationId")?,
            user_id: req_s(item, keys::MEMBER_INDEX_KEY)?,
            last_read_seq: get_n(item, "lastReadSeq").unwrap_or(0),
            last_sent_seq: get_n(item, "lastSentSeq").unwrap_or(0),
        })
    }
}

/// Message fields stored in a message item (`sk = S#<seq>`) and as `lastMessage`.
pub fn message_to_map(m: &Message) -> Item {
    Item::from([
        ("seq".into(), n(m.seq)),
        ("clientMsgId".into(), s(&m.client_msg_id)),
        ("senderId".into(), s(&m.sender_id)),
        ("body".into(), s(&m.body)),
        ("createdAt".into(), s(&m.created_at)),
    ])
}

pub fn message_from_map(conversation_id: &str, item: &Item) -> Result<Message, ChatError> {
    Ok(Message {
        conversation_id: conversation_id.to_owned(),
        seq: req_n(item, "seq")?,
        client_msg_id: req_s(item, "clientMsgId")?,
        sender_id: req_s(item, "senderId")?,
        body: req_s(item, "body")?,
        created_at: req_s(item, "createdAt")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_item_roundtrip() {
        let c = ConversationItem {
            conversation_id: "g-00000000000000000000000000000001".into(),
            kind: ConversationType::Group,
            title: Some("Team".into()),
            owner_id: Some("u1".into()),
            direct_members: vec![],
            member_count: 3,
            last_seq: 0,
            created_at: "2026-01-01T00:00:00.000Z".into(),
            last_message_at: None,
            last_message: None,
            members_version: 0,
            members_change: None,
        };
        assert_eq!(ConversationItem::from_item(&c.to_item()).unwrap(), c);
    }
}
