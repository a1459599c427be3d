//! The objects the API returns (docs/api.md §5): camelCase JSON, ids as strings, seq as integers,
//! times as RFC 3339 UTC strings.

use serde::{Deserialize, Serialize};

use super::conversation::ConversationType;
use super::ids::{ConversationId, UserId};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    pub conversation_id: ConversationId,
    #[serde(rename = "type")]
    pub kind: ConversationType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub member_ids: Vec<UserId>,
    pub member_count: u32,
    pub last_seq: u64,
    pub created_at: String,
    pub last_message_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub conversation_id: ConversationId,
    pub seq: u64,
    pub client_msg_id: String,
    pub sender_id: UserId,
    pub body: String,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPage {
    pub messages: Vec<Message>,
    pub last_seq: u64,
    pub has_more: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResult {
    pub conversation_id: ConversationId,
    pub last_read_seq: u64,
    pub advanced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberReadState {
    pub user_id: UserId,
    pub last_read_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadStates {
    pub conversation_id: ConversationId,
    pub last_seq: u64,
    pub members: Vec<MemberReadState>,
}

/// The last message as the inbox shows it (body cut to its first 200 characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagePreview {
    pub seq: u64,
    pub sender_id: UserId,
    pub body: String,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxEntry {
    pub conversation_id: ConversationId,
    #[serde(rename = "type")]
    pub kind: ConversationType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_id: Option<UserId>,
    pub member_count: u32,
    pub last_seq: u64,
    pub last_read_seq: u64,
    pub unread_count: u64,
    pub last_message_at: Option<String>,
    pub last_message: Option<MessagePreview>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxPage {
    pub conversations: Vec<InboxEntry>,
    pub next_cursor: Option<String>,
}
