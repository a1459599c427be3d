//! Events from the chat table's stream (the outbox, docs/event-pipeline.md).
//!
//! Every conversation-level event comes from the conversation item's own stream records: a new
//! `lastSeq` is `message.new` for every seq it passed, a new `membersVersion` is
//! `member.added`/`member.removed`. DynamoDB Streams keeps one item's records in order, so one
//! conversation's messages reach the relay in `seq` order. `read.updated` comes from member items.
//!
//! The conversation item carries only the last message's preview, and a group commit moves
//! `lastSeq` by several at once, so a record may say that messages exist without carrying their
//! content: those `message.new` come out light, and `Change::fill` asks the relay to read their
//! content from the table (conversations above 200 members are pushed light anyway).
//!
//! Changes (edits, deletions, reactions) come from the change head `H` (`pk = H#…`): each of its
//! new versions is one change, in `changeSeq` order; the relay reads the message as it is now.

use serde_dynamo::{AttributeValue, Item};

use crate::items::{from_item, ChangeItem, ConversationItem, MembersChangeKind};
use crate::keys;
use crate::MemberItem;
use chat_domain::error::ChatError;
use chat_domain::events::{ChangeEvent, Event, FULL_PUSH_MAX_MEMBERS};

/// What one stream record stands for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub events: Vec<Event>,
    /// The light `message.new` and the change events among `events` are to get their content
    /// (the message as it is now) from the table.
    pub fill: bool,
}

/// The events one stream record (its old and new images) stands for; often none.
pub fn events_from_change(old: &Item, new: &Item) -> Result<Change, ChatError> {
    let sk = match new.get(keys::SK).or_else(|| old.get(keys::SK)) {
        Some(AttributeValue::S(sk)) => sk.as_str(),
        _ => "",
    };
    if sk == keys::CONVERSATION_SK && !new.is_empty() {
        let after: ConversationItem = from_item(new.clone())?;
        let before: Option<ConversationItem> = (!old.is_empty())
            .then(|| from_item(old.clone()))
            .transpose()?;
        return Ok(conversation_events(before.as_ref(), &after));
    }
    if sk == keys::CHANGE_HEAD_SK && !new.is_empty() {
        return change_events(old, new);
    }
    if sk.starts_with(keys::MEMBER_SK_PREFIX) && !old.is_empty() && !new.is_empty() {
        let (before, after): (MemberItem, MemberItem) =
            (from_item(old.clone())?, from_item(new.clone())?);
        // A send moves the sender's watermark too; message.new already says so.
        let is_send = after.last_sent_seq != before.last_sent_seq;
        if after.last_read_seq > before.last_read_seq && !is_send {
            return Ok(Change {
                events: vec![Event::ReadUpdated {
                    conversation_id: after.conversation_id,
                    user_id: after.member_id,
                    last_read_seq: after.last_read_seq,
                    origin: after.read_origin,
                }],
                fill: false,
            });
        }
    }
    Ok(Change::default())
}

/// A new change head is one change (each change moves it by one, and the stream keeps one item's
/// records in order): its event, without the message, which the relay reads (`fill`).
fn change_events(old: &Item, new: &Item) -> Result<Change, ChatError> {
    let after: ChangeItem = from_item(new.clone())?;
    let before = (!old.is_empty())
        .then(|| from_item::<ChangeItem, _>(old.clone()))
        .transpose()?;
    if before.is_some_and(|b| b.change_seq >= after.change_seq) {
        return Ok(Change::default());
    }
    let kind = after.kind;
    Ok(Change {
        events: vec![Event::change(kind, ChangeEvent::of(after))],
        fill: true,
    })
}

fn conversation_events(before: Option<&ConversationItem>, after: &ConversationItem) -> Change {
    let mut events = Vec::new();
    let (seq_before, version_before) = before.map_or((0, 0), |b| (b.last_seq, b.members_version));
    let newest = after
        .last_message
        .as_ref()
        .filter(|m| m.seq == after.last_seq);
    // (A message with attachments is not complete in the preview, which leaves them out: the
    // relay reads it, as a message whose preview was cut.)
    let last = newest.and_then(|m| m.complete(&after.conversation_id));
    let mut light = false;
    for seq in seq_before + 1..=after.last_seq {
        events.push(match &last {
            Some(m) if m.seq == seq => {
                let origin = newest.and_then(|n| n.origin.clone());
                Event::message_new(m).from_origin(origin)
            }
            _ => {
                light = true;
                Event::light(&after.conversation_id, seq)
            }
        });
    }
    if after.members_version > version_before {
        if let Some(change) = &after.members_change {
            let (conversation_id, user_ids) =
                (after.conversation_id.clone(), change.user_ids.clone());
            events.push(match change.kind {
                MembersChangeKind::Added => Event::MemberAdded {
                    conversation_id,
                    user_ids,
                },
                MembersChangeKind::Removed => Event::MemberRemoved {
                    conversation_id,
                    user_ids,
                },
            });
        }
    }
    Change {
        events,
        fill: light && after.member_count as usize <= FULL_PUSH_MAX_MEMBERS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::items::{LastMessage, MembersChange};
    use chat_domain::events::fixtures::{conversation, user};

    fn image<T: serde::Serialize>(value: &T, sk: &str) -> Item {
        let mut item: Item = serde_dynamo::to_item(value).unwrap();
        item.insert("pk".into(), AttributeValue::S("C#x".into()));
        item.insert("sk".into(), AttributeValue::S(sk.into()));
        item
    }

    fn group(last_seq: u64, members_version: u64) -> ConversationItem {
        ConversationItem {
            title: Some("T".into()),
            owner_id: Some(user("o")),
            member_count: 3,
            last_seq,
            last_message: (last_seq > 0).then(|| LastMessage {
                seq: last_seq,
                client_msg_id: "id".into(),
                sender_id: user("u"),
                body: "b".into(),
                created_at: "t".into(),
                truncated: false,
                has_attachments: false,
                origin: None,
            }),
            members_version,
            members_change: (members_version > 0).then(|| MembersChange {
                kind: MembersChangeKind::Added,
                user_ids: vec![user("n")],
            }),
            ..ConversationItem::new(
                &conversation(),
                chat_domain::ConversationType::Group,
                "2026-01-01T00:00:00.000Z",
            )
        }
    }

    #[test]
    fn a_send_is_message_new_and_a_membership_change_is_member_added() {
        let change =
            events_from_change(&image(&group(1, 0), "C"), &image(&group(2, 0), "C")).unwrap();
        assert_eq!(change.events, vec![chat_domain::events::fixtures::msg(2)]);
        assert!(!change.fill);
        let change =
            events_from_change(&image(&group(2, 0), "C"), &image(&group(2, 1), "C")).unwrap();
        assert_eq!(
            change.events,
            vec![Event::MemberAdded {
                conversation_id: conversation(),
                user_ids: vec![user("n")]
            }]
        );
        // Creation (no old image) of an empty conversation: nothing to push.
        assert!(
            events_from_change(&Item::default(), &image(&group(0, 0), "C"))
                .unwrap()
                .events
                .is_empty()
        );
    }

    #[test]
    fn a_group_commit_is_every_seq_in_order_the_earlier_ones_to_fill() {
        let change =
            events_from_change(&image(&group(3, 0), "C"), &image(&group(6, 0), "C")).unwrap();
        assert_eq!(
            change.events,
            vec![
                Event::light(&conversation(), 4),
                Event::light(&conversation(), 5),
                chat_domain::events::fixtures::msg(6)
            ]
        );
        assert!(change.fill);
        // Above 200 members the light form is what gets pushed: nothing to read.
        let (mut before, mut after) = (group(3, 0), group(6, 0));
        before.member_count = 500;
        after.member_count = 500;
        let change = events_from_change(&image(&before, "C"), &image(&after, "C")).unwrap();
        assert_eq!(change.events.len(), 3);
        assert!(!change.fill);
        // A cut preview is not the message: its content is read too.
        let mut long = group(7, 0);
        long.last_message.as_mut().unwrap().truncated = true;
        let change = events_from_change(&image(&group(6, 0), "C"), &image(&long, "C")).unwrap();
        assert_eq!(change.events, vec![Event::light(&conversation(), 7)]);
        assert!(change.fill);
    }

    #[test]
    fn a_message_with_attachments_is_read_for_its_push() {
        // Its preview carries no attachments: the relay reads the message (docs/api.md §34).
        let mut with = group(2, 0);
        with.last_message.as_mut().unwrap().has_attachments = true;
        let change = events_from_change(&image(&group(1, 0), "C"), &image(&with, "C")).unwrap();
        assert_eq!(change.events, vec![Event::light(&conversation(), 2)]);
        assert!(
            change.fill,
            "filled from the message item, attachments included"
        );
    }

    #[test]
    fn a_watermark_move_is_read_updated_unless_it_is_a_send() {
        let member = |read, sent| MemberItem {
            conversation_id: conversation(),
            member_id: user("m"),
            last_read_seq: read,
            last_sent_seq: sent,
            joined_at: None,
            create_fp: None,
            inbox_key: None,
            inbox_big: false,
            blocked: false,
            notifications: None,
            read_origin: None,
        };
        let (old, read) = (image(&member(1, 0), "M#m"), image(&member(3, 0), "M#m"));
        assert_eq!(
            events_from_change(&old, &read).unwrap().events,
            vec![chat_domain::events::fixtures::read("m", 3)]
        );
        let sent = image(&member(4, 4), "M#m");
        assert!(events_from_change(&old, &sent).unwrap().events.is_empty());
        let message = image(&group(1, 0), "S#00000000000000000001");
        assert!(events_from_change(&Item::default(), &message)
            .unwrap()
            .events
            .is_empty());
    }
}
