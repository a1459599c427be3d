//! Inbox index: the chat table's stream → every member's inbox entry filed under its
//! conversation's activity key (docs/data-model.md §2.5). The second reader of the stream, next
//! to the relay.
//!
//! Only conversation items' records matter: a send, a group commit or the creation changes the
//! conversation's activity key (`chat_domain::inbox::activity_key`); member, message and inbox entry
//! records (this function's own writes among them) are skipped. A batch is coalesced to one move
//! per conversation, from the keys before its records to the key after its last one, and each
//! move rewrites the entries of the conversation's members as they are now
//! (`ChatStore::move_inbox_entries`). Moves are idempotent and keys never go back, so a batch
//! delivered again (after a failure, Lambda redelivers from the reported record) does no harm.
//! A big group's members have fixed big-group entries that the page places itself, so nothing
//! moves for it; a group that grows past 200 members is converted to them at its next 5-second
//! step (`ChatStore::convert_to_big_group_entries`).

use std::future::Future;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use chat_domain::events::plan::BatchFailures;
use chat_domain::inbox::{coalesce, KeyChange};
use chat_domain::{ChatError, ConversationId, ConversationType};
use chat_lambda::{batch_response, Error, EventHandler, SdkConfig};
use chat_store::items::{from_item, ConversationItem};
use chat_store::keys;
use chat_store::push::Notifier;
use chat_store::ArchiveSettings;
use chat_store::{telemetry, ChatStore, Config};
use futures::stream::{self, StreamExt};

/// Conversations moved at once.
const CONVERSATIONS_IN_FLIGHT: usize = 8;
/// How long one invocation keeps retrying throttled writes (the function times out after 60 s).
pub const BUDGET: Duration = Duration::from_secs(45);

#[derive(Clone, Debug)]
pub struct InboxIndex {
    chat: ChatStore,
    /// Opens conversations' notification windows (docs/api.md §33) when a delay queue is
    /// configured: this function already reads every conversation record, and DynamoDB Streams
    /// serves two readers per shard (this one and the relay), so no third reader is added.
    notifier: Option<Notifier>,
}

impl InboxIndex {
    pub fn new(chat: ChatStore) -> Self {
        InboxIndex {
            chat,
            notifier: None,
        }
    }

    /// This indexer, also opening notification windows through `notifier`.
    pub fn with_notifier(self, notifier: Option<Notifier>) -> Self {
        InboxIndex { notifier, ..self }
    }

    pub async fn handle(&self, event: StreamEvent) -> DynamoDbEventResponse {
        let records = &event.records;
        let mut failures = BatchFailures::default();
        let mut changes = Vec::new();
        // The archiver's work list (docs/data-model.md §7): conversations whose messages opened
        // a new bucket, with the first record of each.
        let mut listings = Vec::new();
        let listing = self.chat.has_archive_tier();
        // Per conversation, its first new message in this batch and that record.
        let mut arrived: Vec<(usize, ConversationId, u64)> = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let (old, new) = (&record.change.old_image, &record.change.new_image);
            if self.notifier.is_some() {
                if let Ok(Some((conversation, first))) = first_new_message(old, new) {
                    if !arrived.iter().any(|(_, c, _)| *c == conversation) {
                        arrived.push((i, conversation, first));
                    }
                }
            }
            if listing {
                match archive_listing(self.chat.archive_settings(), old, new) {
                    Ok(Some(entry)) => listings.push((i, entry)),
                    Ok(None) => {}
                    // Reported by key_change below, which reads the same image.
                    Err(_) => {}
                }
            }
            match key_change(i, old, new) {
                Ok(Some(change)) => changes.push(change),
                Ok(None) => {}
                Err(e) => {
                    // Retried, then sent to the on-failure destination; never skipped silently.
                    tracing::error!(error = ?e, event_id = record.event_id, "undecodable stream record");
                    failures.fail(i);
                    break;
                }
            }
        }

        let chat = self.chat.for_request();
        let moving = stream::iter(coalesce(changes))
            .map(|mv| {
                let chat = &chat;
                async move {
                    let result = if mv.convert {
                        chat.convert_to_big_group_entries(&mv).await
                    } else {
                        chat.move_inbox_entries(&mv).await
                    };
                    (mv, result)
                }
            })
            .buffer_unordered(CONVERSATIONS_IN_FLIGHT)
            .collect::<Vec<_>>();
        // Windows open alongside the moves, not after them: a notification's delay counts from
        // its message, and a big group's move (80 BatchWriteItems for 1,000 members) takes long.
        let opening = async {
            let Some(notifier) = &self.notifier else {
                return Vec::new();
            };
            stream::iter(arrived)
                .map(|(i, c, seq)| async move { (i, notifier.message_arrived(&c, seq).await) })
                .buffer_unordered(CONVERSATIONS_IN_FLIGHT)
                .collect::<Vec<_>>()
                .await
        };
        let (moved, opened) = futures::join!(moving, opening);
        let (mut moves, mut writes, mut failed) = (0, 0, 0);
        for (mv, result) in moved {
            match result {
                Ok(count) => {
                    tracing::debug!(conversation = %mv.conversation_id, ?count, "inbox entries moved");
                    moves += 1;
                    writes += (count.puts + count.deletes) as u64;
                }
                Err(e) => {
                    tracing::warn!(conversation = %mv.conversation_id, error = ?e, "moving inbox entries failed; batch will be retried");
                    failures.fail(mv.first_record);
                    failed += 1;
                }
            }
        }
        if let Some(&(first, _)) = listings.first() {
            let entries: Vec<_> = listings.iter().map(|(_, e)| e.clone()).collect();
            match chat.list_for_archiving(&entries).await {
                Ok(n) => telemetry::count("ArchiveListings", n as u64),
                Err(e) => {
                    tracing::warn!(error = ?e, "listing conversations for the archiver failed; batch will be retried");
                    failures.fail(first);
                }
            }
        }
        for (i, result) in opened {
            match result {
                Ok(true) => telemetry::count("NotifyWindowsOpened", 1),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = ?e, "opening a notification window failed; batch will be retried");
                    failures.fail(i);
                }
            }
        }
        telemetry::count("InboxMoves", moves);
        telemetry::count("InboxEntryWrites", writes);
        telemetry::count("InboxMovesFailed", failed);

        batch_response(records, failures.earliest())
    }
}

impl EventHandler for InboxIndex {
    type Event = StreamEvent;
    type Response = DynamoDbEventResponse;

    async fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, Error> {
        let chat = config.chat_store(sdk).with_budget(BUDGET);
        let notifier = config.notify.queue_url.is_some().then(|| Notifier {
            store: chat.clone(),
            sqs: config.sqs_client(sdk),
            settings: config.notify.clone(),
        });
        Ok(InboxIndex::new(chat).with_notifier(notifier))
    }

    fn handle(&self, event: StreamEvent) -> impl Future<Output = DynamoDbEventResponse> + Send {
        InboxIndex::handle(self, event)
    }
}

/// The archiver's work-list entry one stream record calls for (conversation items only).
pub fn archive_listing(
    settings: &ArchiveSettings,
    old: &serde_dynamo::Item,
    new: &serde_dynamo::Item,
) -> Result<Option<(ConversationId, u64)>, ChatError> {
    Ok(conversation_images(old, new)?
        .and_then(|(before, after)| ChatStore::archive_listing(settings, before.as_ref(), &after)))
}

/// A conversation item's record as its images before (none at its creation) and after; None for
/// every other item.
fn conversation_images(
    old: &serde_dynamo::Item,
    new: &serde_dynamo::Item,
) -> Result<Option<(Option<ConversationItem>, ConversationItem)>, ChatError> {
    let is_conversation = matches!(
        new.get(keys::SK),
        Some(serde_dynamo::AttributeValue::S(sk)) if sk == keys::CONVERSATION_SK
    );
    if !is_conversation {
        return Ok(None);
    }
    let after: ConversationItem = from_item(new.clone())?;
    let before: Option<ConversationItem> = (!old.is_empty())
        .then(|| from_item(old.clone()))
        .transpose()?;
    Ok(Some((before, after)))
}

/// A conversation record that added messages: the conversation and the first new seq (never for
/// changes, membership or creation, which leave `lastSeq` where it was).
pub fn first_new_message(
    old: &serde_dynamo::Item,
    new: &serde_dynamo::Item,
) -> Result<Option<(ConversationId, u64)>, ChatError> {
    let Some((before, after)) = conversation_images(old, new)? else {
        return Ok(None);
    };
    let before = before.map_or(0, |b| b.last_seq);
    Ok((after.last_seq > before).then(|| (after.conversation_id, before + 1)))
}

/// The activity key change one stream record stands for: conversation items only (their creation
/// has no key before).
pub fn key_change(
    record: usize,
    old: &serde_dynamo::Item,
    new: &serde_dynamo::Item,
) -> Result<Option<KeyChange>, ChatError> {
    let Some((before, after)) = conversation_images(old, new)? else {
        return Ok(None);
    };
    // Its members have big-group entries, which the page places: nothing moves.
    if after.inbox_by_read {
        return Ok(None);
    }
    // A direct conversation's two members never change, and its creation filed both entries at
    // its creation key (its `createdAt`, the member items' `inboxKey`).
    let members =
        (after.kind == ConversationType::Direct && after.direct_members.len() == 2).then(|| {
            let filed = Some(after.created_at.clone());
            let pair = after.direct_members.iter();
            pair.map(|user| (user.clone(), filed.clone())).collect()
        });
    Ok(Some(KeyChange {
        record,
        conversation_id: after.conversation_id.clone(),
        before: before.map(|b| b.activity_key()),
        after: after.activity_key(),
        convert: after.bucketed_since.is_some(),
        members,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chat_domain::UserId;

    fn conversation(last_message_at: Option<&str>) -> ConversationItem {
        let id = ConversationId::parse("d-00000000000000000000000000000001").unwrap();
        ConversationItem {
            member_count: 2,
            last_seq: u64::from(last_message_at.is_some()),
            last_message_at: last_message_at.map(str::to_owned),
            ..ConversationItem::new(&id, ConversationType::Direct, "2026-01-01T00:00:00.000Z")
        }
    }

    fn image(c: &ConversationItem) -> serde_dynamo::Item {
        c.to_item().unwrap().into()
    }

    #[test]
    fn conversation_records_are_key_changes_and_others_are_skipped() {
        let (created, sent) = (
            conversation(None),
            conversation(Some("2026-01-01T00:00:01.000Z")),
        );
        let change = key_change(3, &image(&created), &image(&sent))
            .unwrap()
            .unwrap();
        assert_eq!(change.record, 3);
        assert_eq!(change.before.as_deref(), Some("2026-01-01T00:00:00.000Z"));
        assert_eq!(change.after, "2026-01-01T00:00:01.000Z");
        let creation = key_change(0, &serde_dynamo::Item::default(), &image(&created))
            .unwrap()
            .unwrap();
        assert_eq!(creation.before, None);

        // A member's watermark, an inbox entry (this function's own write), a removal record.
        let s = |v: &str| serde_dynamo::AttributeValue::S(v.into());
        let other = serde_dynamo::Item::from(std::collections::HashMap::from([
            ("pk".to_owned(), s("I#u")),
            ("sk".to_owned(), s("A#2026-01-01T00:00:00.000Z#d-1")),
        ]));
        assert_eq!(key_change(1, &other, &other).unwrap(), None);
        assert_eq!(
            key_change(1, &image(&created), &serde_dynamo::Item::default()).unwrap(),
            None
        );
        // A malformed conversation image is an error (reported, retried), not skipped.
        let mut broken = image(&sent);
        broken.insert(
            "lastSeq".into(),
            serde_dynamo::AttributeValue::S("x".into()),
        );
        assert!(key_change(2, &image(&created), &broken).is_err());
    }

    /// A direct conversation's move names its pair, filed at its creation; a group's reads them.
    #[test]
    fn a_direct_conversations_change_names_its_members() {
        let pair = vec![UserId::parse("a").unwrap(), UserId::parse("b").unwrap()];
        let sent = ConversationItem {
            direct_members: pair.clone(),
            ..conversation(Some("2026-01-01T00:00:01.000Z"))
        };
        let change = key_change(0, &image(&conversation(None)), &image(&sent)).unwrap();
        let filed = Some("2026-01-01T00:00:00.000Z".to_owned());
        let expected: Vec<_> = pair.into_iter().map(|u| (u, filed.clone())).collect();
        assert_eq!(change.unwrap().members, Some(expected));
        let group = ConversationItem {
            kind: ConversationType::Group,
            ..sent
        };
        let change = key_change(0, &image(&conversation(None)), &image(&group)).unwrap();
        assert_eq!(change.unwrap().members, None);
    }
}
