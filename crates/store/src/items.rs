//! The chat table's items (docs/data-model.md) as Rust structs, mapped to and from DynamoDB
//! attribute maps by `serde_dynamo`: the attribute names are the camelCase field names.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::attrs::{self, Item};
use super::keys;
use chat_domain::changes::reaction_counts;
use chat_domain::error::ChatError;
use chat_domain::inbox::{self, InboxPosition, MoveOrigin};
use chat_domain::message::{fingerprint_prefix, preview};
use chat_domain::model::{Conversation, Message, MessagePreview};
use chat_domain::notify::{NotificationSettings, Platform};
use chat_domain::{ConversationId, ConversationType, UserId};

/// A struct as an item with the given key.
pub fn to_item<T: Serialize>(
    value: &T,
    pk: String,
    sk: impl Into<String>,
) -> Result<Item, ChatError> {
    let mut item: Item = serde_dynamo::to_item(value).map_err(ChatError::internal)?;
    item.extend(keys::key(pk, sk));
    Ok(item)
}

/// An item (from a read, a cancellation reason or a stream image) as a struct.
pub fn from_item<T: DeserializeOwned, I: Into<serde_dynamo::Item>>(
    item: I,
) -> Result<T, ChatError> {
    serde_dynamo::from_item(item).map_err(|e| ChatError::internal(format!("malformed item: {e}")))
}

/// `sk = C`: the conversation and its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConversationItem {
    pub conversation_id: ConversationId,
    #[serde(rename = "type")]
    pub kind: ConversationType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<UserId>,
    /// Direct conversations only: the two users, so the inbox can name the peer without a lookup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub direct_members: Vec<UserId>,
    pub member_count: u32,
    pub last_seq: u64,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message_at: Option<String>,
    /// The last message with its body cut to the inbox preview, so this hot item stays small
    /// (cheap to write on every send and to read for every inbox entry). The relay turns its
    /// changes into `message.new` events in `seq` order (the stream orders records per item).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message: Option<LastMessage>,
    /// Bumped by every membership change; `members_change` says what changed.
    #[serde(default)]
    pub members_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members_change: Option<MembersChange>,
    /// Set once, when the group first has more than 200 members: the activity key it had then.
    /// From then on its inbox entries are filed under 5-second keys, never below this one
    /// (`chat_domain::inbox::activity_key`), so they move at most once per 5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucketed_since: Option<String>,
    /// Every member has a big-group entry (`G#`) and none is moved any more: set at the creation
    /// of a group of more than 200, or by the indexer once it has given every member of a group
    /// that grew past 200 its big-group entry (docs/data-model.md §2.5).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inbox_by_read: bool,
    /// Every message up to this seq is in the archive tier (S3), and may be gone from this table
    /// (docs/data-model.md §7). Only the archiver moves it, only forward, contiguously; 0 (absent)
    /// while nothing is archived.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub archived_through: u64,
    /// The seqs of the conversation's latest deletions (at most `RECENT_DELETIONS`, newest
    /// last), and the change that deleted the last of them: the fanout withholds their content
    /// from events relayed before the deletion (docs/data-model.md §8.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_seqs: Vec<u64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deleted_change: u64,
    /// When a deletion last pushed an older one off `deleted_seqs`: every deletion after it is
    /// listed, so the fanout looks up the message only for content read before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_dropped_at: Option<String>,
    /// Groups: the admins (docs/api.md §24), who manage it with the owner
    /// (`chat_domain::conversation::is_manager`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_ids: Vec<UserId>,
    /// Bumped by every ban: an add conditions on it, so a ban that lands after the add read the
    /// bans cancels the add (docs/data-model.md §10.2).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ban_version: u64,
    /// A group's slow mode (docs/api.md §25): members other than the managers send at most once
    /// per this many seconds (0, absent: off).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slow_mode_seconds: u64,
}

/// How many deleted seqs a conversation item remembers for the fanout: an event waits in the
/// pipeline seconds, and a conversation deletes far fewer messages than this meanwhile.
pub const RECENT_DELETIONS: usize = 10;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MembersChangeKind {
    Added,
    Removed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MembersChange {
    pub kind: MembersChangeKind,
    pub user_ids: Vec<UserId>,
}

impl ConversationItem {
    /// A conversation just created, with no member and no message yet.
    pub fn new(id: &ConversationId, kind: ConversationType, now: &str) -> Self {
        ConversationItem {
            conversation_id: id.clone(),
            kind,
            title: None,
            owner_id: None,
            direct_members: vec![],
            member_count: 0,
            last_seq: 0,
            created_at: now.to_owned(),
            last_message_at: None,
            last_message: None,
            members_version: 0,
            members_change: None,
            bucketed_since: None,
            inbox_by_read: false,
            archived_through: 0,
            deleted_seqs: vec![],
            deleted_change: 0,
            deleted_dropped_at: None,
            admin_ids: vec![],
            ban_version: 0,
            slow_mode_seconds: 0,
        }
    }

    pub fn to_item(&self) -> Result<Item, ChatError> {
        to_item(
            self,
            keys::conversation_pk(&self.conversation_id),
            keys::CONVERSATION_SK,
        )
    }

    /// Newest activity (its last message, else its creation), for inbox order.
    pub fn activity(&self) -> &str {
        inbox::activity(&self.created_at, self.last_message_at.as_deref())
    }

    /// The key its members' inbox entries are filed under (docs/data-model.md §2.5).
    pub fn activity_key(&self) -> String {
        inbox::activity_key(self.activity(), self.bucketed_since.as_deref())
    }

    /// Whether the latest membership change removed `user`.
    pub fn removed_last(&self, user: &UserId) -> bool {
        self.members_change
            .as_ref()
            .is_some_and(|c| c.kind == MembersChangeKind::Removed && c.user_ids.contains(user))
    }

    pub fn to_conversation(&self, member_ids: Vec<UserId>, last_change: u64) -> Conversation {
        Conversation {
            conversation_id: self.conversation_id.clone(),
            kind: self.kind,
            title: self.title.clone(),
            member_count: self.member_count,
            member_ids,
            last_seq: self.last_seq,
            created_at: self.created_at.clone(),
            last_message_at: self.last_message_at.clone(),
            last_change,
            admins: self.admin_ids.clone(),
            slow_mode_seconds: self.slow_mode_seconds,
            // A new member's settings; getConversation shows the caller's own.
            notifications: Some(NotificationSettings::default()),
        }
    }

    pub fn preview(&self) -> Option<MessagePreview> {
        self.last_message.as_ref().map(|m| MessagePreview {
            seq: m.seq,
            sender_id: m.sender_id.clone(),
            body: m.body.clone(),
            created_at: m.created_at.clone(),
        })
    }
}

/// `pk = M#<conversationId>[#<shard>], sk = M#<userId>`: a member and its read watermark, in one
/// of the conversation's member partitions (`keys::members_pk`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberItem {
    pub conversation_id: ConversationId,
    pub member_id: UserId,
    #[serde(default)]
    pub last_read_seq: u64,
    /// The seq of this member's latest send (the send also moved `last_read_seq` to it): lets the
    /// relay tell a read from a send.
    #[serde(default)]
    pub last_sent_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at: Option<String>,
    /// Group members written at creation: the fingerprint of the creating request, so that the
    /// same request retried rewrites them harmlessly and another one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_fp: Option<String>,
    /// The activity key this member's inbox entry was filed under when it joined: its entry is
    /// there or further on, never below (an entry below is left from an earlier membership).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_key: Option<String>,
    /// This membership has a big-group entry (`G#`): its group had more than 200 members when it
    /// joined, or the indexer has converted its moving entry since.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inbox_big: bool,
    /// Direct conversations: the peer blocks this member, whose sends the transaction's condition
    /// then refuses (docs/data-model.md §10.1). Written by the block and by the creation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// This member's notification settings of the conversation (`setNotifications`; absent: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<NotificationSettings>,
    /// The connection the latest `markRead` named (`X-Connection-Id`): its receipt's push skips
    /// it (docs/api.md §15.4). Absent when that request named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_origin: Option<String>,
}

impl MemberItem {
    /// A member joining now, its inbox entry filed under `inbox_key`.
    pub fn new(
        conversation_id: &ConversationId,
        user: &UserId,
        last_read_seq: u64,
        now: &str,
        inbox_key: &str,
    ) -> Self {
        MemberItem {
            conversation_id: conversation_id.clone(),
            member_id: user.clone(),
            last_read_seq,
            last_sent_seq: 0,
            joined_at: Some(now.to_owned()),
            create_fp: None,
            inbox_key: Some(inbox_key.to_owned()),
            inbox_big: false,
            blocked: false,
            notifications: None,
            read_origin: None,
        }
    }

    pub fn to_item(&self) -> Result<Item, ChatError> {
        to_item(
            self,
            keys::members_pk(&self.conversation_id, &self.member_id),
            keys::member_sk(&self.member_id),
        )
    }
}

/// `pk = B#<blocker>, sk = B#<blocked>`: one user blocks another (docs/data-model.md §10.1). A
/// notifier asks "does member M block sender S" with one GetItem of this key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockItem {
    pub user_id: UserId,
    pub created_at: String,
}

/// `pk = BN#<conversationId>, sk = U#<userId>`: a user banned from a group (§10.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BanItem {
    pub user_id: UserId,
    pub banned_by: UserId,
    pub created_at: String,
}

/// `pk = RP#open, sk = O#<createdAt>#<reportId>`: an open report with its snapshot of the
/// message, deleted by the table's TTL (`ttl`, unix seconds) 30 days after (§10.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportItem {
    pub report_id: String,
    pub conversation_id: ConversationId,
    pub seq: u64,
    pub reporter_id: UserId,
    pub reason: chat_domain::safety::ReportReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub created_at: String,
    /// The message as it was when reported: kept even if it is edited or deleted since.
    pub message: Message,
    pub ttl: i64,
}

/// `pk = SU#<userId>, sk = SU`: a suspended user (§10.4), read by every request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SuspensionItem {
    pub user_id: UserId,
    pub suspended_by: UserId,
    pub created_at: String,
}

/// `pk = I#<userId>, sk = A#<activityKey>#<conversationId>`: one conversation in a user's inbox
/// index (the key says where; the id is repeated as an attribute for readers of the raw table).
/// An entry the indexer moved says when (unix ms), and its chain of moves' origin: the key it
/// came from (`mf`) and since when its chain runs (`ms`, `MoveOrigin`): a walk of the inbox
/// whose cursor it passed meets it there (`InboxCursor::shows_mover`). Written once, never
/// updated (a move puts a new entry), so any read of it, eventually consistent too, is exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxEntryItem {
    pub conversation_id: ConversationId,
    #[serde(rename = "mt", default, skip_serializing_if = "Option::is_none")]
    pub moved_at: Option<u64>,
    #[serde(rename = "mf", default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// None on entries moved before chains were stamped: their origin is `mf`, a chain of one.
    #[serde(rename = "ms", default, skip_serializing_if = "Option::is_none")]
    pub moves_since: Option<u64>,
}

/// What a moved entry is stamped with: when it moved, and its origin as seen by its member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveStamp {
    pub at: u64,
    pub from: String,
    pub since: u64,
}

impl InboxEntryItem {
    pub fn to_item(user: &UserId, position: &InboxPosition) -> Result<Item, ChatError> {
        Self::moved(user, position, None)
    }

    /// The entry at `position`, moved there as `stamp` says.
    pub fn moved(
        user: &UserId,
        position: &InboxPosition,
        stamp: Option<&MoveStamp>,
    ) -> Result<Item, ChatError> {
        to_item(
            &InboxEntryItem {
                conversation_id: position.conversation_id.clone(),
                moved_at: stamp.map(|m| m.at),
                moved_from: stamp.map(|m| m.from.clone()),
                moves_since: stamp.map(|m| m.since),
            },
            keys::inbox_pk(user),
            keys::inbox_sk(position),
        )
    }

    /// The origin of the chain of moves this entry is part of, if it was moved.
    pub fn origin(&self) -> Option<MoveOrigin> {
        Some(MoveOrigin {
            key: self.moved_from.clone()?,
            since: self.moves_since.or(self.moved_at)?,
        })
    }

    /// `user`'s big-group entry of `id` (`I#<userId>`, `G#<id>`): a member of a group that has
    /// had more than 200 members, placed by the page itself (docs/data-model.md §2.5).
    pub fn big_group(user: &UserId, id: &ConversationId) -> Result<Item, ChatError> {
        to_item(
            &InboxEntryItem {
                conversation_id: id.clone(),
                moved_at: None,
                moved_from: None,
                moves_since: None,
            },
            keys::inbox_pk(user),
            keys::big_group_sk(id),
        )
    }
}

/// The conversation's `lastMessage`: the message with its body cut to the first 200 characters
/// (`truncated` says whether that cut anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastMessage {
    pub seq: u64,
    pub client_msg_id: String,
    pub sender_id: UserId,
    pub body: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The message has attachments, which the preview leaves out: its push is light (their URLs
    /// are signed per read, docs/api.md §34).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub has_attachments: bool,
    /// The connection its send named (`X-Connection-Id`): its push skips it (docs/api.md
    /// §15.4). Only the conversation's newest message carries one, so a message pushed from
    /// anything else (a group commit's earlier ones) reaches that connection too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

impl LastMessage {
    pub fn of(m: &Message) -> Self {
        let cut = preview(&m.body);
        LastMessage {
            seq: m.seq,
            client_msg_id: m.client_msg_id.clone(),
            sender_id: m.sender_id.clone(),
            body: cut.to_owned(),
            created_at: m.created_at.clone(),
            truncated: cut.len() < m.body.len(),
            has_attachments: !m.attachments.is_empty(),
            origin: None,
        }
    }

    /// The whole message, when the preview is all of it (no cut, no attachments).
    pub fn complete(&self, conversation_id: &ConversationId) -> Option<Message> {
        (!self.truncated && !self.has_attachments).then(|| {
            Message::new(
                conversation_id.clone(),
                self.seq,
                self.client_msg_id.clone(),
                self.sender_id.clone(),
                self.body.clone(),
                self.created_at.clone(),
            )
        })
    }
}

/// `sk = S#<seq>`: one message, stored as the API shows it (`Message`, the same attributes).
pub fn message_item(m: &Message) -> Result<Item, ChatError> {
    let mut item = to_item(
        m,
        keys::conversation_pk(&m.conversation_id),
        keys::message_sk(m.seq),
    )?;
    // Counts live beside the message (`ReactionsItem`); version 1 is the default, not stored, so
    // a message as sent keeps its size.
    item.remove("reactions");
    if m.version == 1 {
        item.remove("version");
    }
    Ok(item)
}

/// `pk = H#<conversationId>`: the change head (`sk = H`, the newest change, so that its stream
/// records are the conversation's changes in `changeSeq` order) and each change's record
/// (`sk = H#<changeSeq>`), both a `ChangeRecord`.
pub use chat_domain::changes::ChangeRecord as ChangeItem;

/// `pk = H#<conversationId>, sk = K#<clientChangeId>`: an edit's or a deletion's idempotency
/// key, kept forever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeKeyItem {
    pub fingerprint: String,
    pub seq: u64,
    /// An edit's: the version it made and when, so that a replay answers as the edit did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// A deletion's: the attachments of the message it deleted, whose records went in its
    /// transaction, so that a replay (after a `503`) deletes their objects again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<String>,
}

/// `pk = RX#<conversationId>, sk = C#<seq>`: a message's reaction counts, or (`deleted`) the mark
/// that it was deleted, which history applies to an archived copy too. `changeSeq` is the change
/// that wrote it last: a change writes it on condition that it is still the one read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactionsItem {
    #[serde(default)]
    pub counts: std::collections::BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    #[serde(default)]
    pub change_seq: u64,
}

impl ReactionsItem {
    /// The message as the API shows it: its counts, or its tombstone.
    pub fn apply(&self, m: Message) -> Message {
        if self.deleted && !m.deleted {
            return m.tombstone();
        }
        if m.deleted {
            return m;
        }
        Message {
            reactions: reaction_counts(&self.counts),
            ..m
        }
    }
}

/// `pk = RX#<conversationId>, sk = U#<seq>#<userId>`: one member's reactions to one message, in
/// the order added (at most 20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReactorItem {
    pub user_id: UserId,
    pub reactions: Vec<String>,
    #[serde(default)]
    pub change_seq: u64,
}

/// `sk = X#<clientMsgId>`: the idempotency key of a send, until its message is archived
/// (`ArchivedKeyItem` then). Enough to answer a replay without reading the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendKeyItem {
    pub conversation_id: ConversationId,
    pub seq: u64,
    pub client_msg_id: String,
    pub sender_id: UserId,
    pub fingerprint: String,
    pub created_at: String,
    /// The request that created the message: it answers `201`, every other request with this
    /// `clientMsgId` `200` (or `409`).
    #[serde(default)]
    pub request_id: String,
    /// Set by the message's deletion, in its transaction: the tombstone's version, and the
    /// message's `editedAt` if it was edited. A replay then answers the tombstone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<String>,
}

impl SendKeyItem {
    /// A stored key item, as the send wrote it, or as the archiver of 2026-12-01 left it in the
    /// table (`CompactKeyItem`, no longer written). A compact item names no sender: its
    /// fingerprint covers the sender, so it can only match a send by `caller`, who is then its
    /// sender.
    pub fn from_stored(item: Item, caller: &UserId) -> Result<SendKeyItem, ChatError> {
        if item.contains_key("seq") {
            return from_item(item);
        }
        let text = |name: &str| attrs::get_s(&item, name).unwrap_or_default().to_owned();
        let (pk, sk) = (text(keys::PK), text(keys::SK));
        let conversation_id = keys::conversation_id_of_pk(&pk)
            .ok_or_else(|| ChatError::internal(format!("malformed key item {pk}")))?;
        let compact: CompactKeyItem = from_item(item)?;
        Ok(SendKeyItem {
            conversation_id,
            seq: compact.q,
            client_msg_id: compact
                .c
                .unwrap_or_else(|| sk.trim_start_matches("X#").to_owned()),
            sender_id: caller.clone(),
            fingerprint: compact.f,
            created_at: compact.t,
            request_id: String::new(),
            deleted_version: None,
            edited_at: None,
        })
    }
}

/// `sk = X#<clientMsgId>` as the archiver of 2026-12-01 rewrote the key of an archived message
/// in place (one-letter attributes, 240 billed bytes): read still, so that a stack that archived
/// with it keeps answering those replays; written no more (`ArchivedKeyItem` instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactKeyItem {
    /// seq
    pub q: u64,
    /// `message_fingerprint(sender, body)`
    pub f: String,
    /// createdAt
    pub t: String,
    /// clientMsgId, when it is not the key's lower-case form
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c: Option<String>,
}

/// `ArchivedKeysTable`, `k = <archived_key_id>`: the idempotency key of a send once its message
/// is archived (docs/data-model.md §2.4c), kept forever in its stead. The least that answers a
/// replay: the seq (the original is read from its chunk) and 64 bits of the fingerprint (another
/// body or sender is a `409` without that read; the `clientMsgId` already matched). 36–38 bytes,
/// 136–138 billed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedKeyItem {
    pub seq: u64,
    /// `fingerprint_prefix` of the send's fingerprint.
    pub fingerprint: Vec<u8>,
}

impl ArchivedKeyItem {
    /// The archived key of `message`, sent with `fingerprint` (its key item's: an edited
    /// message's body is no longer the one sent).
    pub fn of(message: &Message, fingerprint: &str) -> ArchivedKeyItem {
        ArchivedKeyItem {
            seq: message.seq,
            fingerprint: fingerprint_prefix(fingerprint),
        }
    }

    pub fn to_item(&self, id: &ConversationId, client_msg_key: &str) -> Item {
        let mut item = keys::archived_send_key(id, client_msg_key);
        item.insert("q".into(), attrs::n(self.seq));
        let prefix = Blob::new(self.fingerprint.clone());
        item.insert("f".into(), AttributeValue::B(prefix));
        item
    }

    pub fn from_item(item: &Item) -> Result<ArchivedKeyItem, ChatError> {
        let seq = attrs::get_n(item, "q");
        let fingerprint = item.get("f").and_then(|f| f.as_b().ok());
        match (seq, fingerprint) {
            (Some(seq), Some(f)) => Ok(ArchivedKeyItem {
                seq,
                fingerprint: f.as_ref().to_vec(),
            }),
            _ => Err(ChatError::internal("malformed archived key")),
        }
    }

    /// Whether the send of `fingerprint` is the one that made this key.
    pub fn made_by(&self, fingerprint: &str) -> bool {
        fingerprint_prefix(fingerprint) == self.fingerprint
    }
}

/// `sk = P#<clientMsgId>`: a send waiting to be committed with others (a group commit), written
/// only when the conversation item is contended. Whoever commits next gives it its seq and
/// deletes it in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedItem {
    pub conversation_id: ConversationId,
    /// Lower-case `clientMsgId`: the key of this item and of the `X#` item it becomes.
    pub client_msg_key: String,
    pub client_msg_id: String,
    pub sender_id: UserId,
    pub body: String,
    pub fingerprint: String,
    /// The request that wrote it (see `SendKeyItem::request_id`).
    pub request_id: String,
    /// Microseconds since the epoch on the sender's clock: commits take the oldest first.
    pub enqueued_at: u64,
    /// Milliseconds since the epoch on the sender's clock: its request's deadline. No commit
    /// takes it later (the commit's condition), so a request that ended without an answer of
    /// its message (a 429, a crash) never has it committed weeks after. Absent: expired.
    #[serde(default)]
    pub expires_at: u64,
    /// Its attachments (claimed before it was queued), as its message carries them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<chat_domain::attachments::Attachment>,
    /// The connection its request named (`X-Connection-Id`), for its message's push.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// `sk = P!`: the last group commit of a conversation, which sends it committed and at which
/// seqs. It sorts just before the queued sends, so the one Query a queued send makes to see the
/// queue also tells it that its send was committed (its queued item gone, its key here), with
/// no further read. Overwritten by every group commit, in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitRecordItem {
    /// `lastSeq` after the commit.
    pub last_seq: u64,
    /// The time of every message of the commit (and the conversation's `lastMessageAt`).
    pub created_at: String,
    /// When it was committed (unix ms, the committer's clock).
    pub committed_at: u64,
    /// The conversation's `keyMoves` it committed under (absent: 0).
    #[serde(default)]
    pub key_moves: u64,
    pub sends: Vec<CommittedSend>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommittedSend {
    pub client_msg_key: String,
    pub seq: u64,
    /// The request whose queued item was committed (`QueuedItem::request_id`).
    pub request_id: String,
}

impl CommitRecordItem {
    /// The seq this commit gave the send of `request_id` under `client_msg_key`, if it did.
    pub fn seq_of(&self, client_msg_key: &str, request_id: &str) -> Option<u64> {
        self.sends
            .iter()
            .find(|s| s.client_msg_key == client_msg_key && s.request_id == request_id)
            .map(|s| s.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_compacted_by_the_archiver_of_2026_12_01_still_answers_its_sender() {
        let id = ConversationId::direct(&UserId::parse("a").unwrap(), &UserId::parse("b").unwrap());
        let key = "6f1c2c1e-0000-4000-8000-00000000000a";
        let compact = CompactKeyItem {
            q: 7,
            f: "0123456789abcdef0123456789abcdef".into(),
            t: "2026-01-01T00:00:00.000Z".into(),
            c: Some(key.to_ascii_uppercase()),
        };
        let item = to_item(&compact, keys::conversation_pk(&id), keys::send_key_sk(key)).unwrap();
        let caller = UserId::parse("a").unwrap();
        let read = SendKeyItem::from_stored(item, &caller).unwrap();
        assert_eq!(
            read,
            SendKeyItem {
                conversation_id: id,
                seq: 7,
                client_msg_id: key.to_ascii_uppercase(),
                sender_id: caller,
                fingerprint: compact.f,
                created_at: compact.t,
                request_id: String::new(),
                deleted_version: None,
                edited_at: None,
            }
        );
    }

    #[test]
    fn a_commit_record_answers_only_the_request_it_committed() {
        let record = CommitRecordItem {
            last_seq: 8,
            created_at: "2026-01-01T00:00:00.000Z".into(),
            committed_at: 1,
            key_moves: 0,
            sends: vec![
                CommittedSend {
                    client_msg_key: "k1".into(),
                    seq: 7,
                    request_id: "r1".into(),
                },
                CommittedSend {
                    client_msg_key: "k2".into(),
                    seq: 8,
                    request_id: "r2".into(),
                },
            ],
        };
        assert_eq!(record.seq_of("k2", "r2"), Some(8));
        assert_eq!(record.seq_of("k1", "r1"), Some(7));
        // The same clientMsgId sent again by another request (a replay after the commit).
        assert_eq!(record.seq_of("k1", "r9"), None);
        assert_eq!(record.seq_of("k3", "r1"), None);
        let item = to_item(&record, "C#x".into(), keys::COMMIT_RECORD_SK).unwrap();
        assert_eq!(from_item::<CommitRecordItem, _>(item).unwrap(), record);
    }

    fn conversation() -> ConversationItem {
        ConversationItem {
            conversation_id: ConversationId::parse("g-00000000000000000000000000000001").unwrap(),
            kind: ConversationType::Group,
            title: Some("Team".into()),
            owner_id: UserId::parse("u1"),
            direct_members: vec![],
            member_count: 3,
            last_seq: 7,
            created_at: "2026-01-01T00:00:00.000Z".into(),
            last_message_at: Some("2026-01-01T00:00:01.000Z".into()),
            last_message: Some(LastMessage {
                seq: 7,
                client_msg_id: "6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f".into(),
                sender_id: UserId::parse("u2").unwrap(),
                body: "hi".into(),
                created_at: "2026-01-01T00:00:01.000Z".into(),
                truncated: false,
                has_attachments: false,
                origin: None,
            }),
            members_version: 2,
            members_change: Some(MembersChange {
                kind: MembersChangeKind::Removed,
                user_ids: vec![UserId::parse("u3").unwrap()],
            }),
            bucketed_since: None,
            inbox_by_read: false,
            archived_through: 0,
            deleted_seqs: vec![],
            deleted_change: 0,
            deleted_dropped_at: None,
            admin_ids: vec![],
            ban_version: 0,
            slow_mode_seconds: 0,
        }
    }

    #[test]
    fn conversation_item_roundtrip_and_attribute_names() {
        let c = conversation();
        let item = c.to_item().unwrap();
        assert_eq!(
            item["pk"].as_s().unwrap(),
            "C#g-00000000000000000000000000000001"
        );
        assert_eq!(item["sk"].as_s().unwrap(), "C");
        assert_eq!(item["type"].as_s().unwrap(), "group");
        assert_eq!(item["lastSeq"].as_n().unwrap(), "7");
        assert_eq!(
            item["membersChange"].as_m().unwrap()["kind"]
                .as_s()
                .unwrap(),
            "removed"
        );
        assert!(!item.contains_key("directMembers"));
        assert_eq!(from_item::<ConversationItem, _>(item).unwrap(), c);
    }

    #[test]
    fn last_message_keeps_the_preview_and_says_when_it_cut() {
        let id = ConversationId::parse("g-00000000000000000000000000000001").unwrap();
        let m = |body: &str| {
            Message::new(
                id.clone(),
                3,
                "c".into(),
                UserId::parse("u").unwrap(),
                body.into(),
                "t".into(),
            )
        };
        let short = LastMessage::of(&m("hello"));
        assert!(!short.truncated);
        assert_eq!(short.complete(&id), Some(m("hello")));
        let long = LastMessage::of(&m(&"長".repeat(300)));
        assert!(long.truncated);
        assert_eq!(long.body.chars().count(), 200);
        assert_eq!(long.complete(&id), None);
        let item: Item = serde_dynamo::to_item(&short).unwrap();
        assert!(!item.contains_key("truncated"), "absent when false");
        assert!(!item.contains_key("hasAttachments"), "absent when false");
        // The preview leaves attachments out: it is not the message.
        let mut with = m("look");
        with.attachments
            .push(chat_domain::attachments::Attachment::fixture("a"));
        let attached = LastMessage::of(&with);
        assert!(attached.has_attachments && !attached.truncated);
        assert_eq!(attached.complete(&id), None);
    }

    #[test]
    fn corrupt_items_are_internal_errors() {
        let mut item = conversation().to_item().unwrap();
        item.insert("conversationId".into(), super::super::attrs::s("nope"));
        assert_eq!(
            from_item::<ConversationItem, _>(item).unwrap_err().status(),
            500
        );
    }
}

/// `pk = DEV#<userId>, sk = D#<deviceId>`: one of a user's devices (at most 10), with its SNS
/// platform endpoint where deployed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceItem {
    pub user_id: UserId,
    pub device_id: String,
    pub platform: Platform,
    pub token: String,
    pub registered_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_arn: Option<String>,
}

impl DeviceItem {
    pub fn to_item(&self) -> Result<Item, ChatError> {
        to_item(
            self,
            keys::devices_pk(&self.user_id),
            keys::device_sk(&self.device_id),
        )
    }
}

/// `pk = TOK#<sha256 of platform and token>, sk = T`: which user's device holds a token, so that a
/// token registered by another user moves to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOwnerItem {
    pub user_id: UserId,
    pub device_id: String,
    /// Bumped by every registration of the token, which is conditioned on the one it read: of
    /// two registrations at once, one commits and the other reads again (and moves the token
    /// from the first). 0: an item from before it was kept.
    #[serde(default)]
    pub holder_version: u64,
}
