//! Push events (docs/api.md §15): their wire format, how they come from the chat table's stream
//! (`chat_store::stream`), and the pure planning steps of the relay and the fanout (`plan`, the fanout's
//! per-connection failure policy in `policy`, what a redelivered record still has to reach in
//! `redelivery`).

pub mod plan;
pub mod policy;
pub mod redelivery;

use serde::{Deserialize, Serialize};

use crate::attachments::Attachment;
use crate::changes::{ChangeKind, ChangeRecord};
use crate::model::Message;
use crate::{ConversationId, UserId};

/// How far apart two writers' clocks may be (Lambda hosts keep NTP time to milliseconds).
const CLOCK_SKEW: time::Duration = time::Duration::seconds(5);

/// Conversations larger than this get the light `message.new` (no content).
pub const FULL_PUSH_MAX_MEMBERS: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "message.new", rename_all = "camelCase")]
    MessageNew {
        conversation_id: ConversationId,
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_id: Option<UserId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_msg_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created_at: Option<String>,
        /// The message's `version` as sent (1; docs/api.md §18: the message object carries it
        /// everywhere, so a full push too).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<u64>,
        /// When it was last edited, for a message edited before its push was made (the relay
        /// reads a message as it is then: its `version` and body say so too).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edited_at: Option<String>,
        /// Its attachments' records as sent; the fanout signs their URLs for the frame
        /// (`attachments_mut`), as every read of the message does.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<Attachment>,
        /// The sender's connection that sent it (`X-Connection-Id`), which the push skips:
        /// carried in the Kinesis record, never in a frame (`Event::frame`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<String>,
    },
    #[serde(rename = "read.updated", rename_all = "camelCase")]
    ReadUpdated {
        conversation_id: ConversationId,
        user_id: UserId,
        last_read_seq: u64,
        /// The reader's connection that read (`X-Connection-Id`), as for `message.new`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<String>,
    },
    #[serde(rename = "member.added", rename_all = "camelCase")]
    MemberAdded {
        conversation_id: ConversationId,
        user_ids: Vec<UserId>,
    },
    #[serde(rename = "member.removed", rename_all = "camelCase")]
    MemberRemoved {
        conversation_id: ConversationId,
        user_ids: Vec<UserId>,
    },
    #[serde(rename = "message.edited")]
    MessageEdited(ChangeEvent),
    #[serde(rename = "message.deleted")]
    MessageDeleted(ChangeEvent),
    #[serde(rename = "reaction.added")]
    ReactionAdded(ChangeEvent),
    #[serde(rename = "reaction.removed")]
    ReactionRemoved(ChangeEvent),
}

/// A change to a message (docs/api.md §15.2): which one (`changeSeq`, gap-free per conversation)
/// and, in the full form, who made it and the message as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeEvent {
    pub conversation_id: ConversationId,
    pub change_seq: u64,
    pub seq: u64,
    /// None: the light form `{type, conversationId, changeSeq, seq}`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub full: Option<ChangeDetail>,
}

/// What the full form of a change event adds to the light one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeDetail {
    pub user_id: UserId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction: Option<String>,
    pub at: String,
    /// Read by the relay (absent when it could not be read, e.g. archived).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}

impl ChangeEvent {
    /// A change as recorded, its message still to be read.
    pub fn of(r: ChangeRecord) -> ChangeEvent {
        ChangeEvent {
            conversation_id: r.conversation_id,
            change_seq: r.change_seq,
            seq: r.seq,
            full: Some(ChangeDetail {
                user_id: r.user_id,
                reaction: r.reaction,
                at: r.at,
                message: None,
            }),
        }
    }

    /// The light form.
    pub fn light(&self) -> ChangeEvent {
        ChangeEvent {
            full: None,
            ..self.clone()
        }
    }
}

impl Event {
    pub fn conversation_id(&self) -> &ConversationId {
        match self {
            Event::MessageNew {
                conversation_id, ..
            }
            | Event::ReadUpdated {
                conversation_id, ..
            }
            | Event::MemberAdded {
                conversation_id, ..
            }
            | Event::MemberRemoved {
                conversation_id, ..
            } => conversation_id,
            Event::MessageEdited(c)
            | Event::MessageDeleted(c)
            | Event::ReactionAdded(c)
            | Event::ReactionRemoved(c) => &c.conversation_id,
        }
    }

    /// A change event of `kind`.
    pub fn change(kind: ChangeKind, event: ChangeEvent) -> Event {
        match kind {
            ChangeKind::Edited => Event::MessageEdited(event),
            ChangeKind::Deleted => Event::MessageDeleted(event),
            ChangeKind::ReactionAdded => Event::ReactionAdded(event),
            ChangeKind::ReactionRemoved => Event::ReactionRemoved(event),
        }
    }

    /// The change a change event stands for.
    pub fn as_change(&self) -> Option<(ChangeKind, &ChangeEvent)> {
        match self {
            Event::MessageEdited(c) => Some((ChangeKind::Edited, c)),
            Event::MessageDeleted(c) => Some((ChangeKind::Deleted, c)),
            Event::ReactionAdded(c) => Some((ChangeKind::ReactionAdded, c)),
            Event::ReactionRemoved(c) => Some((ChangeKind::ReactionRemoved, c)),
            _ => None,
        }
    }

    fn change_mut(&mut self) -> Option<&mut ChangeEvent> {
        match self {
            Event::MessageEdited(c)
            | Event::MessageDeleted(c)
            | Event::ReactionAdded(c)
            | Event::ReactionRemoved(c) => Some(c),
            _ => None,
        }
    }

    /// A full change event whose message is still to be read (the relay reads it).
    pub fn lacks_message(&self) -> bool {
        self.as_change()
            .and_then(|(_, c)| c.full.as_ref())
            .is_some_and(|d| d.message.is_none())
    }

    /// Gives a full change event its message as it is now (with its attachments, whose URLs the
    /// fanout signs for each frame: `attachments_mut`).
    pub fn set_message(&mut self, message: Message) {
        if let Some(d) = self.change_mut().and_then(|c| c.full.as_mut()) {
            d.message = Some(message);
        }
    }

    /// The attachments this event's message carries (a full `message.new`'s, a full change's
    /// message's), whose URLs the fanout signs for its frames (docs/api.md §34: fresh on every
    /// read, a push included).
    pub fn attachments_mut(&mut self) -> Option<&mut Vec<Attachment>> {
        let list = match self {
            Event::MessageNew { attachments, .. } => attachments,
            other => {
                &mut other
                    .change_mut()?
                    .full
                    .as_mut()?
                    .message
                    .as_mut()?
                    .attachments
            }
        };
        (!list.is_empty()).then_some(list)
    }

    /// `message.new` with the message's content, its attachments' records included (the
    /// fanout signs their URLs).
    pub fn message_new(m: &Message) -> Event {
        Event::MessageNew {
            conversation_id: m.conversation_id.clone(),
            seq: m.seq,
            sender_id: Some(m.sender_id.clone()),
            client_msg_id: Some(m.client_msg_id.clone()),
            body: Some(m.body.clone()),
            created_at: Some(m.created_at.clone()),
            version: Some(m.version),
            edited_at: m.edited_at.clone(),
            attachments: m.attachments.clone(),
            origin: None,
        }
    }

    /// The same event, sent from the connection `origin` (`message.new` and `read.updated`
    /// only; a light `message.new` names no sender, so it reaches its sender's connections all:
    /// the fanout decides on the event as relayed, before a big group's push goes light).
    pub fn from_origin(mut self, from: Option<String>) -> Event {
        match &mut self {
            Event::MessageNew {
                sender_id: Some(_),
                origin,
                ..
            }
            | Event::ReadUpdated { origin, .. } => *origin = from,
            _ => {}
        }
        self
    }

    /// Whether this event came from `user`'s connection `connection` (its push skips that one:
    /// docs/api.md §15.4). Only a user's own connection counts, so a request naming someone
    /// else's connection changes nothing for them.
    pub fn is_from(&self, user: &UserId, connection: &str) -> bool {
        match self {
            Event::MessageNew {
                sender_id: Some(actor),
                origin: Some(origin),
                ..
            }
            | Event::ReadUpdated {
                user_id: actor,
                origin: Some(origin),
                ..
            } => actor == user && origin == connection,
            _ => false,
        }
    }

    /// What a client is sent: the event without `origin`.
    pub fn frame(&self) -> Event {
        self.clone().from_origin(None)
    }

    /// The light `message.new`: that message `seq` exists, without its content.
    pub fn light(conversation_id: &ConversationId, seq: u64) -> Event {
        Event::MessageNew {
            conversation_id: conversation_id.clone(),
            seq,
            sender_id: None,
            client_msg_id: None,
            body: None,
            created_at: None,
            version: None,
            edited_at: None,
            attachments: Vec::new(),
            origin: None,
        }
    }

    /// A light `message.new` (no content).
    pub fn is_light(&self) -> bool {
        matches!(self, Event::MessageNew { body: None, .. })
    }

    /// This event without the content of a message deleted since it was relayed (`deleted`:
    /// the conversation's recently deleted seqs): its light form, whose client fetches the
    /// message, now a tombstone.
    pub fn without_deleted(&self, deleted: &[u64]) -> Event {
        match self {
            Event::MessageNew {
                conversation_id,
                seq,
                body: Some(_),
                ..
            } if deleted.contains(seq) => Event::light(conversation_id, *seq),
            other => match other.as_change() {
                Some((kind, c))
                    if deleted.contains(&c.seq)
                        && c.full
                            .as_ref()
                            .and_then(|d| d.message.as_ref())
                            .is_some_and(|m| !m.deleted) =>
                {
                    Event::change(kind, c.light())
                }
                _ => other.clone(),
            },
        }
    }

    /// The seq whose content this event carries and when that content was read at the
    /// earliest (a message's `createdAt`; a change's `at`, before the relay read the message),
    /// None for an event without content.
    fn content(&self) -> Option<(u64, &str)> {
        match self {
            Event::MessageNew {
                seq,
                body: Some(_),
                created_at,
                ..
            } => Some((*seq, created_at.as_deref().unwrap_or(""))),
            other => {
                let (_, c) = other.as_change()?;
                let d = c.full.as_ref()?;
                d.message.as_ref().filter(|m| !m.deleted)?;
                Some((c.seq, d.at.as_str()))
            }
        }
    }

    /// Whether it carries a message's content (which a deletion since must withhold).
    pub fn has_content(&self) -> bool {
        self.content().is_some()
    }

    /// The seq of this event's content if a deletion the conversation no longer lists may have
    /// erased it: the recent list (`deleted`) holds every deletion after `dropped_at` (when the
    /// last one fell off it), so only content read no later than that (plus `CLOCK_SKEW` between
    /// writers' clocks; an unreadable time counts as old) needs its message looked at.
    pub fn content_to_check(&self, deleted: &[u64], dropped_at: Option<&str>) -> Option<u64> {
        let dropped = crate::time::parse_rfc3339(dropped_at?)?;
        let (seq, read_at) = self.content()?;
        if deleted.contains(&seq) {
            return None;
        }
        let fresh = crate::time::parse_rfc3339(read_at).is_some_and(|t| t > dropped + CLOCK_SKEW);
        (!fresh).then_some(seq)
    }

    /// The form pushed to a conversation of `members` members: content-free `message.new` and
    /// change events above 200 members (clients fetch the content when they need it).
    pub fn for_audience(&self, members: usize) -> Event {
        match self {
            Event::MessageNew {
                conversation_id,
                seq,
                ..
            } if members > FULL_PUSH_MAX_MEMBERS => Event::light(conversation_id, *seq),
            other if members > FULL_PUSH_MAX_MEMBERS => match other.as_change() {
                Some((kind, c)) => Event::change(kind, c.light()),
                None => other.clone(),
            },
            other => other.clone(),
        }
    }
}

/// The answer to a client's `{"action":"hello"}`: `{"type":"hello","connectionId":…,"userId":…}`,
/// its connection's own id (for `X-Connection-Id`, docs/api.md §15.4) and whose it is (None: the
/// connection is no longer registered).
pub fn hello_frame(connection: &str, user: Option<&UserId>) -> String {
    let mut frame = serde_json::json!({"type": "hello", "connectionId": connection});
    if let Some(user) = user {
        frame["userId"] = serde_json::json!(user);
    }
    frame.to_string()
}

/// One Kinesis record: events of one conversation, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventBatch {
    pub conversation_id: ConversationId,
    pub events: Vec<Event>,
}

/// Events of one conversation for tests (here and in the store's stream decoding).
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures {
    use super::*;

    pub const C: &str = "g-0000000000000000000000000000000c";

    pub fn conversation() -> ConversationId {
        ConversationId::parse(C).unwrap()
    }

    pub fn user(u: &str) -> UserId {
        UserId::parse(u).unwrap()
    }

    pub fn read(u: &str, seq: u64) -> Event {
        Event::ReadUpdated {
            conversation_id: conversation(),
            user_id: user(u),
            last_read_seq: seq,
            origin: None,
        }
    }

    pub fn msg(seq: u64) -> Event {
        Event::MessageNew {
            conversation_id: conversation(),
            seq,
            sender_id: Some(user("u")),
            client_msg_id: Some("id".into()),
            body: Some("b".into()),
            created_at: Some("t".into()),
            version: Some(1),
            edited_at: None,
            attachments: Vec::new(),
            origin: None,
        }
    }
}

#[cfg(test)]
mod tests {

    /// A message with attachments is pushed in full with their records (SPEC §14: "wherever it
    /// appears (history, push, changes)"), and so are its changes; the fanout signs the URLs.
    #[test]
    fn a_message_with_attachments_is_pushed_with_them() {
        let id = ConversationId::parse(&format!("d-{}", "1".repeat(32))).unwrap();
        let sender = UserId::parse("alice").unwrap();
        let mut m = Message::new(id, 4, "c".into(), sender, String::new(), "t".into());
        assert_eq!(Event::message_new(&m).attachments_mut(), None);
        m.attachments
            .push(crate::attachments::Attachment::fixture("a"));
        let mut new = Event::message_new(&m);
        assert!(!new.is_light());
        assert_eq!(new.attachments_mut().map(|a| a.len()), Some(1));
        assert!(serde_json::to_string(&new)
            .unwrap()
            .contains(r#""attachments":[{"#));
        assert_eq!(
            new.for_audience(201).attachments_mut(),
            None,
            "light above 200"
        );
        let mut edited = Event::change(ChangeKind::Edited, ChangeEvent::of(record(4)));
        edited.set_message(m.clone());
        assert!(!edited.lacks_message());
        assert_eq!(edited.attachments_mut().map(|a| a.len()), Some(1));
    }

    use super::fixtures::*;
    use super::*;

    /// The relay reads a message as it is when it pushes it: one edited before is pushed with
    /// its edit's `editedAt` beside its `version` (found by probing: version 2 came without it).
    #[test]
    fn a_message_edited_before_its_push_carries_its_edit_time() {
        let mut m = Message::new(
            conversation(),
            1,
            "id".into(),
            user("u"),
            "b".into(),
            "t".into(),
        );
        m.body = "edited".into();
        m.version = 2;
        m.edited_at = Some("2026-12-07T10:00:00.000Z".into());
        let frame = serde_json::to_value(Event::message_new(&m).frame()).unwrap();
        assert_eq!(frame["body"], "edited");
        assert_eq!(frame["version"], 2);
        assert_eq!(frame["editedAt"], "2026-12-07T10:00:00.000Z");
        let sent = Message::new(
            conversation(),
            1,
            "id".into(),
            user("u"),
            "b".into(),
            "t".into(),
        );
        let frame = serde_json::to_value(Event::message_new(&sent).frame()).unwrap();
        assert!(frame.get("editedAt").is_none(), "{frame}");
    }

    /// Change 3: `u` added 👍 to message `seq`.
    fn record(seq: u64) -> ChangeRecord {
        ChangeRecord {
            conversation_id: conversation(),
            change_seq: 3,
            kind: ChangeKind::ReactionAdded,
            seq,
            user_id: user("u"),
            reaction: Some("👍".into()),
            at: "t".into(),
        }
    }

    #[test]
    fn wire_format_matches_spec() {
        let light = msg(42).for_audience(201);
        assert_eq!(
            serde_json::to_value(&light).unwrap(),
            serde_json::json!({"type":"message.new","conversationId":C,"seq":42})
        );
        assert_eq!(msg(42).for_audience(200), msg(42));
        assert_eq!(
            serde_json::to_value(msg(1)).unwrap(),
            serde_json::json!({"type":"message.new","conversationId":C,"seq":1,"senderId":"u","clientMsgId":"id","body":"b","createdAt":"t","version":1})
        );
        assert_eq!(
            serde_json::to_value(read("u", 40)).unwrap(),
            serde_json::json!({"type":"read.updated","conversationId":C,"userId":"u","lastReadSeq":40})
        );
        let added = Event::MemberAdded {
            conversation_id: conversation(),
            user_ids: vec![user("a")],
        };
        assert_eq!(
            serde_json::to_value(&added).unwrap(),
            serde_json::json!({"type":"member.added","conversationId":C,"userIds":["a"]})
        );
        let back: Event = serde_json::from_value(serde_json::to_value(&light).unwrap()).unwrap();
        assert_eq!(back, light);
        let change = ChangeEvent::of(record(42));
        let added = Event::change(ChangeKind::ReactionAdded, change);
        assert_eq!(
            serde_json::to_value(&added).unwrap(),
            serde_json::json!({"type":"reaction.added","conversationId":C,"changeSeq":3,"seq":42,"userId":"u","reaction":"👍","at":"t"})
        );
        assert_eq!(
            serde_json::to_value(added.for_audience(201)).unwrap(),
            serde_json::json!({"type":"reaction.added","conversationId":C,"changeSeq":3,"seq":42})
        );
        assert_eq!(added.for_audience(200), added);
        // Content deleted after the event was relayed is withheld: the light form.
        assert_eq!(
            msg(42).without_deleted(&[42]),
            Event::light(&conversation(), 42)
        );
        assert_eq!(msg(42).without_deleted(&[41]), msg(42));
        let mut edited = Event::change(
            ChangeKind::Edited,
            ChangeEvent::of(ChangeRecord {
                kind: ChangeKind::Edited,
                reaction: None,
                ..record(42)
            }),
        );
        edited.set_message(crate::model::Message::new(
            conversation(),
            42,
            "id".into(),
            user("u"),
            "text".into(),
            "t".into(),
        ));
        let light = edited.without_deleted(&[42]);
        assert_eq!(serde_json::to_value(&light).unwrap()["changeSeq"], 3);
        assert!(!light.lacks_message() && light.as_change().unwrap().1.full.is_none());
        assert_eq!(edited.without_deleted(&[7]), edited);
        let back: Event = serde_json::from_value(serde_json::to_value(&added).unwrap()).unwrap();
        assert_eq!(back, added);
    }

    /// An event's origin travels in the record, is never in a frame, and marks only its own
    /// actor's connection.
    #[test]
    fn an_origin_marks_its_actors_connection_and_is_never_pushed() {
        let (u, other) = (user("u"), user("v"));
        let sent = msg(42).from_origin(Some("c1=".into()));
        assert!(sent.is_from(&u, "c1="));
        assert!(!sent.is_from(&u, "c2="), "another connection of the sender");
        assert!(
            !sent.is_from(&other, "c1="),
            "someone else's connection of that name"
        );
        assert!(!msg(42).is_from(&u, "c1="), "no origin");
        let record = serde_json::to_value(&sent).unwrap();
        assert_eq!(record["origin"], "c1=");
        let back: Event = serde_json::from_value(record).unwrap();
        assert_eq!(back, sent, "carried in the Kinesis record");
        assert_eq!(sent.frame(), msg(42));
        assert_eq!(
            serde_json::to_value(sent.frame()).unwrap().get("origin"),
            None
        );
        let light = Event::light(&conversation(), 42).from_origin(Some("c1=".into()));
        assert!(!light.is_from(&u, "c1="), "a light message names no sender");
        let receipt = read("u", 40).from_origin(Some("c1=".into()));
        assert!(receipt.is_from(&u, "c1=") && !receipt.is_from(&other, "c1="));
        assert_eq!(receipt.frame(), read("u", 40));
        assert!(!receipt.for_audience(1_000).frame().is_from(&u, "c1="));
    }

    /// Only content read before the newest deletion that fell off the recent list (or within
    /// the clock skew of it) is looked at; content of a listed seq is already withheld.
    #[test]
    fn content_is_checked_only_when_a_dropped_deletion_may_have_erased_it() {
        let at = |created: &str| match msg(42) {
            Event::MessageNew {
                conversation_id,
                seq,
                sender_id,
                client_msg_id,
                body,
                version,
                attachments,
                ..
            } => Event::MessageNew {
                conversation_id,
                seq,
                sender_id,
                client_msg_id,
                body,
                created_at: Some(created.into()),
                version,
                edited_at: None,
                attachments,
                origin: None,
            },
            _ => unreachable!(),
        };
        let dropped = Some("2026-12-03T10:00:00Z");
        let old = at("2026-12-03T09:59:00Z");
        assert_eq!(old.content_to_check(&[], dropped), Some(42));
        assert_eq!(old.content_to_check(&[42], dropped), None, "listed");
        assert_eq!(old.content_to_check(&[], None), None, "nothing dropped");
        let skewed = at("2026-12-03T10:00:04Z");
        assert_eq!(skewed.content_to_check(&[], dropped), Some(42));
        let fresh = at("2026-12-03T10:00:06Z");
        assert_eq!(fresh.content_to_check(&[], dropped), None);
        assert_eq!(
            at("t").content_to_check(&[], dropped),
            Some(42),
            "unreadable"
        );
        let light = Event::light(&conversation(), 42);
        assert_eq!(light.content_to_check(&[], dropped), None, "no content");
        let change = Event::change(ChangeKind::ReactionAdded, ChangeEvent::of(record(42)));
        assert_eq!(change.content_to_check(&[], dropped), None, "no message");
    }

    /// What the fanout may push without the conversation's deleted seqs: events without content.
    #[test]
    fn only_messages_and_changes_with_their_message_have_content() {
        assert!(msg(1).has_content());
        assert!(!Event::light(&conversation(), 1).has_content());
        assert!(!read("u", 1).has_content());
        let light_change = Event::change(ChangeKind::ReactionAdded, ChangeEvent::of(record(1)));
        assert!(!light_change.has_content(), "a change without its message");
    }
}
