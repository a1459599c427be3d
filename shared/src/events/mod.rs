//! Push events (SPEC §5) and how they are derived from the chat table's stream (SPEC §6).
//!
//! Every conversation-level event comes from the conversation item's own stream records: a new
//! `lastSeq` (with the message as `lastMessage`) is `message.new`, a new `membersVersion` is
//! `member.added`/`member.removed`. DynamoDB Streams keeps one item's records in order, so one
//! conversation's messages reach the relay in `seq` order. `read.updated` comes from member items.

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};

use crate::error::ChatError;
use crate::keys;
use crate::store::{ConversationItem, Item, MemberItem};

/// Conversations larger than this get the light `message.new` (no content).
pub const FULL_PUSH_MAX_MEMBERS: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "message.new", rename_all = "camelCase")]
    MessageNew {
        conversation_id: String,
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_msg_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created_at: Option<String>,
    },
    #[serde(rename = "read.updated", rename_all = "camelCase")]
    ReadUpdated {
        conversation_id: String,
        user_id: String,
        last_read_seq: u64,
    },
    #[serde(rename = "member.added", rename_all = "camelCase")]
    MemberAdded {
        conversation_id: String,
        user_ids: Vec<String>,
    },
    #[serde(rename = "member.removed", rename_all = "camelCase")]
    MemberRemoved {
        conversation_id: String,
        user_ids: Vec<String>,
    },
}

impl Event {
    pub fn conversation_id(&self) -> &str {
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
        }
    }

    /// The form pushed to a conversation of `members` members: content-free `message.new` above
    /// 200 members (clients fetch the content when they need it).
    pub fn for_audience(&self, members: usize) -> Event {
        match self {
            Event::MessageNew {
                conversation_id,
                seq,
                ..
            } if members > FULL_PUSH_MAX_MEMBERS => Event::MessageNew {
                conversation_id: conversation_id.clone(),
                seq: *seq,
                sender_id: None,
                client_msg_id: None,
                body: None,
                created_at: None,
            },
            other => other.clone(),
        }
    }
}

/// One Kinesis record: events of one conversation, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventBatch {
    pub conversation_id: String,
    pub events: Vec<Event>,
}

/// Converts a stream image (Lambda event JSON shape) into SDK attribute values.
pub fn sdk_item(image: &serde_dynamo::Item) -> Item {
    image
        .iter()
        .map(|(k, v)| (k.clone(), sdk_value(v)))
        .collect()
}

fn sdk_value(v: &serde_dynamo::AttributeValue) -> AttributeValue {
    use serde_dynamo::AttributeValue as D;
    match v {
        D::N(n) => AttributeValue::N(n.clone()),
        D::S(s) => AttributeValue::S(s.clone()),
        D::Bool(b) => AttributeValue::Bool(*b),
        D::B(b) => AttributeValue::B(b.clone().into()),
        D::Null(b) => AttributeValue::Null(*b),
        D::M(m) => AttributeValue::M(m.iter().map(|(k, v)| (k.clone(), sdk_value(v))).collect()),
        D::L(l) => AttributeValue::L(l.iter().map(sdk_value).collect()),
        D::Ss(s) => AttributeValue::Ss(s.clone()),
        D::Ns(s) => AttributeValue::Ns(s.clone()),
        D::Bs(s) => AttributeValue::Bs(s.iter().map(|b| b.clone().into()).collect()),
    }
}

/// The events one stream record of the chat table stands for (often none).
pub fn events_from_change(old: &Item, new: &Item) -> Result<Vec<Event>, ChatError> {
    let sk = new
        .get(keys::SK)
        .or_else(|| old.get(keys::SK))
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
        .unwrap_or_default();
    if sk == keys::CONVERSATION_SK && !new.is_empty() {
        let after = ConversationItem::from_item(new)?;
        let before = (!old.is_empty())
            .then(|| ConversationItem::from_item(old))
            .transpose()?;
        return Ok(conversation_events(before.as_ref(), &after));
    }
    if sk.starts_with("M#") && !old.is_empty() && !new.is_empty() {
        let (before, after) = (MemberItem::from_item(old)?, MemberItem::from_item(new)?);
        // A send moves the sender's watermark too; message.new already says so.
        let is_send = after.last_sent_seq != before.last_sent_seq;
        if after.last_read_seq > before.last_read_seq && !is_send {
            return Ok(vec![Event::ReadUpdated {
                conversation_id: after.conversation_id,
                user_id: after.user_id,
                last_read_seq: after.last_read_seq,
            }]);
        }
    }
    Ok(vec![])
}

fn conversation_events(before: Option<&ConversationItem>, after: &ConversationItem) -> Vec<Event> {
    let mut events = Vec::new();
    let (seq_before, version_before) = before.map_or((0, 0), |b| (b.last_seq, b.members_version));
    if after.last_seq > seq_before {
        if let Some(m) = after
            .last_message
            .as_ref()
            .filter(|m| m.seq == after.last_seq)
        {
            events.push(Event::MessageNew {
                conversation_id: after.conversation_id.clone(),
                seq: m.seq,
                sender_id: Some(m.sender_id.clone()),
                client_msg_id: Some(m.client_msg_id.clone()),
                body: Some(m.body.clone()),
                created_at: Some(m.created_at.clone()),
            });
        }
    }
    if after.members_version > version_before {
        if let Some(change) = &after.members_change {
            let (conversation_id, user_ids) =
                (after.conversation_id.clone(), change.user_ids.clone());
            events.push(if change.added {
                Event::MemberAdded {
                    conversation_id,
                    user_ids,
                }
            } else {
                Event::MemberRemoved {
                    conversation_id,
                    user_ids,
                }
            });
        }
    }
    events
}

/// Within one batch only the highest watermark per member and conversation matters: drops every
/// `read.updated` that a later one of the same member supersedes, keeping everything else in order.
pub fn coalesce_reads(events: Vec<Event>) -> Vec<Event> {
    use std::collections::HashMap;
    let mut best: HashMap<(String, String), (usize, u64)> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::ReadUpdated {
            conversation_id,
            user_id,
            last_read_seq,
        } = e
        {
            let entry = best
                .entry((conversation_id.clone(), user_id.clone()))
                .or_insert((i, *last_read_seq));
            if *last_read_seq >= entry.1 {
                *entry = (i, *last_read_seq);
            }
        }
    }
    events
        .into_iter()
        .enumerate()
        .filter(|(i, e)| match e {
            Event::ReadUpdated {
                conversation_id,
                user_id,
                ..
            } => best
                .get(&(conversation_id.clone(), user_id.clone()))
                .is_some_and(|(keep, _)| keep == i),
            _ => true,
        })
        .map(|(_, e)| e)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(user: &str, seq: u64) -> Event {
        Event::ReadUpdated {
            conversation_id: "c".into(),
            user_id: user.into(),
            last_read_seq: seq,
        }
    }

    fn msg(seq: u64) -> Event {
        Event::MessageNew {
            conversation_id: "c".into(),
            seq,
            sender_id: Some("u".into()),
            client_msg_id: Some("id".into()),
            body: Some("b".into()),
            created_at: Some("t".into()),
        }
    }

    #[test]
    fn wire_format_matches_spec() {
        let light = msg(42).for_audience(201);
        assert_eq!(
            serde_json::to_value(&light).unwrap(),
            serde_json::json!({"type":"message.new","conversationId":"c","seq":42})
        );
        assert_eq!(msg(42).for_audience(200), msg(42));
        assert_eq!(
            serde_json::to_value(msg(1)).unwrap(),
            serde_json::json!({"type":"message.new","conversationId":"c","seq":1,"senderId":"u","clientMsgId":"id","body":"b","createdAt":"t"})
        );
        assert_eq!(
            serde_json::to_value(read("u", 40)).unwrap(),
            serde_json::json!({"type":"read.updated","conversationId":"c","userId":"u","lastReadSeq":40})
        );
        let added = Event::MemberAdded {
            conversation_id: "c".into(),
            user_ids: vec!["a".into()],
        };
        assert_eq!(
            serde_json::to_value(&added).unwrap(),
            serde_json::json!({"type":"member.added","conversationId":"c","userIds":["a"]})
        );
        let back: Event = serde_json::from_value(serde_json::to_value(&light).unwrap()).unwrap();
        assert_eq!(back, light);
    }

    #[test]
    fn coalescing_keeps_the_highest_read_per_member() {
        let events = vec![
            read("a", 1),
            msg(5),
            read("b", 2),
            read("a", 3),
            read("a", 2),
            msg(6),
        ];
        assert_eq!(
            coalesce_reads(events),
            vec![msg(5), read("b", 2), read("a", 3), msg(6)]
        );
    }
}
