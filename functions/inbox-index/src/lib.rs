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
//!
//! An attachment record that DynamoDB's TTL removes was never used by a message (a send's claim
//! takes its TTL away): its upload and thumbnail are deleted (`expired_upload`), whatever tags
//! they carry (a refused send takes the upload's "unattached" tag away before it is refused; a
//! thumbnail never has it), so that an upload never sent goes within about a day either way.

use std::future::Future;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::{Event as StreamEvent, EventRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use chat_domain::attachments::AttachmentRecord;
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
        // Uploads never sent, whose records' TTL ran out, with their record.
        let mut expired = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let uploads = self.chat.attachments_bucket().is_some();
            if let Some(upload) = expired_upload(record).filter(|_| uploads) {
                expired.push((i, upload));
                continue;
            }
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
        let dropping = stream::iter(expired)
            .map(|(i, (id, attachment))| {
                let chat = &chat;
                async move { (i, chat.delete_expired_upload(&id, &attachment).await) }
            })
            .buffer_unordered(CONVERSATIONS_IN_FLIGHT)
            .collect::<Vec<_>>();
        let (moved, opened, dropped) = futures::join!(moving, opening, dropping);
        for (i, result) in dropped {
            match result {
                Ok(()) => telemetry::count("ExpiredUploadsDeleted", 1),
                Err(e) => {
                    tracing::warn!(error = ?e, "deleting an upload never sent failed; batch will be retried");
                    failures.fail(i);
                }
            }
        }
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

/// An attachment record removed by DynamoDB's TTL (its own deletion, not a request's: a
/// deleted message's records go with it, and its objects are the deletion's to remove), never
/// used by a message: its conversation and attachment id.
pub fn expired_upload(record: &EventRecord) -> Option<(ConversationId, String)> {
    let by_ttl = record
        .user_identity
        .as_ref()
        .is_some_and(|u| u.type_ == "Service" && u.principal_id == "dynamodb.amazonaws.com");
    let old = &record.change.old_image;
    let is_attachment = matches!(
        old.get(keys::PK),
        Some(serde_dynamo::AttributeValue::S(pk)) if pk.starts_with("A#")
    );
    if record.event_name != "REMOVE" || !by_ttl || !is_attachment {
        return None;
    }
    let upload: AttachmentRecord = from_item(old.clone()).ok()?;
    upload
        .used_by
        .is_none()
        .then_some((upload.conversation_id, upload.attachment_id))
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

    #[test]
    fn only_an_unused_attachment_record_removed_by_its_ttl_is_an_expired_upload() {
        let upload = |used_by: Option<&str>| {
            let mut item = serde_dynamo::Item::from(std::collections::HashMap::from([
                (
                    "pk".to_owned(),
                    serde_dynamo::AttributeValue::S("A#x1".into()),
                ),
                ("sk".to_owned(), serde_dynamo::AttributeValue::S("A".into())),
            ]));
            let record = AttachmentRecord {
                attachment_id: "x1".into(),
                conversation_id: ConversationId::parse("d-00000000000000000000000000000001")
                    .unwrap(),
                owner_id: UserId::parse("u1").unwrap(),
                file_name: "a.png".into(),
                content_type: "image/png".into(),
                size: 1,
                created_at: "2026-01-01T00:00:00.000Z".into(),
                used_by: used_by.map(str::to_owned),
                width: None,
                height: None,
                scan: None,
            };
            let fields: serde_dynamo::Item = serde_dynamo::to_item(&record).unwrap();
            for (k, v) in fields.into_inner() {
                item.insert(k, v);
            }
            item
        };
        let removal = |old: serde_dynamo::Item, by_ttl: bool| {
            let mut r = EventRecord::default();
            r.event_name = "REMOVE".into();
            r.change.old_image = old;
            if by_ttl {
                let mut who = aws_lambda_events::event::dynamodb::UserIdentity::default();
                who.type_ = "Service".into();
                who.principal_id = "dynamodb.amazonaws.com".into();
                r.user_identity = Some(who);
            }
            r
        };
        let expired = expired_upload(&removal(upload(None), true));
        assert_eq!(expired.map(|(_, a)| a), Some("x1".to_owned()));
        assert_eq!(expired_upload(&removal(upload(Some("K#1")), true)), None);
        assert_eq!(expired_upload(&removal(upload(None), false)), None);
    }

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
