//! The objects the API returns (docs/api.md §5): camelCase JSON, ids as strings, seq as integers,
//! times as RFC 3339 UTC strings.

use serde::{Deserialize, Serialize};

use super::attachments::Attachment;
use super::changes::ChangeKind;
use super::conversation::ConversationType;
use super::ids::{ConversationId, UserId};
use super::notify::NotificationSettings;

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
    /// The newest `changeSeq` (0: none).
    pub last_change: u64,
    /// The caller's notification settings (`getConversation`; absent where the answer is not the
    /// caller's view, e.g. creation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notifications: Option<NotificationSettings>,
    /// A group's admins (docs/api.md §26; absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admins: Vec<UserId>,
    /// A group's slow mode in seconds (docs/api.md §25; absent when off).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slow_mode_seconds: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// 1 = never edited, +1 per edit (and for the deletion).
    #[serde(default = "first_version")]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<String>,
    /// A tombstone: `body` is empty and there are no reactions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// Counts per reaction (docs/api.md §13), absent when none. Kept beside the message, never in
    /// its item: filled in when the message is read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reactions: Vec<ReactionCount>,
    /// Files sent with it (docs/api.md §34), absent when none; their URLs are signed on read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

fn first_version() -> u64 {
    1
}

impl Message {
    /// A message as sent: version 1, no change yet.
    pub fn new(
        conversation_id: ConversationId,
        seq: u64,
        client_msg_id: String,
        sender_id: UserId,
        body: String,
        created_at: String,
    ) -> Message {
        Message {
            conversation_id,
            seq,
            client_msg_id,
            sender_id,
            body,
            created_at,
            version: 1,
            edited_at: None,
            deleted: false,
            reactions: Vec::new(),
            attachments: Vec::new(),
        }
    }

    /// The message once deleted: its seq and identity stay, its content goes.
    pub fn tombstone(&self) -> Message {
        Message {
            body: String::new(),
            version: self.version + 1,
            deleted: true,
            reactions: Vec::new(),
            attachments: Vec::new(),
            ..self.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactionCount {
    pub reaction: String,
    pub count: u64,
}

/// One entry of a conversation's change log, with the message as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeEntry {
    pub change_seq: u64,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    pub seq: u64,
    pub user_id: UserId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reaction: Option<String>,
    pub at: String,
    pub message: Message,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangesPage {
    pub changes: Vec<ChangeEntry>,
    pub last_change: u64,
    pub has_more: bool,
}

/// The answer of adding or removing a reaction: the message's counts after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactionsResult {
    pub conversation_id: ConversationId,
    pub seq: u64,
    pub reactions: Vec<ReactionCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reactor {
    pub user_id: UserId,
    pub reaction: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactorsPage {
    pub reactions: Vec<Reactor>,
    pub next_cursor: Option<String>,
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
    pub last_change: u64,
    /// The caller's notification settings of it.
    pub notifications: NotificationSettings,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxPage {
    pub conversations: Vec<InboxEntry>,
    pub next_cursor: Option<String>,
}
