//! Message changes (docs/api.md §13, docs/data-model.md §8): `editMessage`, `deleteMessage`,
//! `addReaction` / `removeReaction`, `reactions` (who reacted) and `changes` (the change log).
//!
//! Every change is one transaction that moves the change head `H` from `changeSeq = n` to `n + 1`
//! (so `changeSeq` is gap-free: a cancelled transaction allocates nothing), records the change at
//! `H#<n + 1>` and writes what it changes, each item on condition that it is still as read. A lost
//! race reads again and decides again, within the request's deadline (then `429`).

use std::collections::{BTreeMap, BTreeSet};

use super::attrs::{get_s, n, s, Item};
use super::items::{
    from_item, message_item, to_item, ChangeItem, ChangeKeyItem, ConversationItem, LastMessage,
    ReactionsItem, ReactorItem, RECENT_DELETIONS,
};
use super::{keys, tx, ChatStore, PartitionQuery, TxOutcome};
use aws_sdk_dynamodb::types::TransactWriteItem;
use chat_domain::changes::{
    change_fingerprint, check_delete, check_edit, check_replay, edited, react, reaction_counts,
    reactor_cursor, recount, replayed_edit, ChangeKind, ChangesQuery, EditMessage, Reaction,
    ReactorsQuery, Target,
};
use chat_domain::error::ChatError;
use chat_domain::model::{ChangesPage, Message, ReactionsResult, Reactor, ReactorsPage};
use chat_domain::{ConversationId, ConversationType, UserId};

/// What a change reads first, in one BatchGetItem.
struct Read {
    conversation: ConversationItem,
    /// The newest change (None: none yet).
    head: Option<ChangeItem>,
    /// The message item (None: not in the table, i.e. archived).
    message: Option<(Message, u64)>,
    reactions: ReactionsItem,
    key: Option<ChangeKeyItem>,
    reactor: Option<ReactorItem>,
    /// Whether the caller's member item was there (a moderator need not be a member).
    member: bool,
    /// Whether the caller's peer in a direct conversation blocks it (its member item's
    /// `blocked`, docs/data-model.md §10.1): it may not edit or add reactions there.
    blocked: bool,
}

impl Read {
    fn last_change(&self) -> u64 {
        self.head.as_ref().map_or(0, |h| h.change_seq)
    }

    /// The change this one would be: the next `changeSeq` after the head as read.
    fn next_change(
        &self,
        kind: ChangeKind,
        seq: u64,
        caller: &UserId,
        reaction: Option<&Reaction>,
    ) -> ChangeItem {
        ChangeItem {
            conversation_id: self.conversation.conversation_id.clone(),
            change_seq: self.last_change() + 1,
            kind,
            seq,
            user_id: caller.clone(),
            reaction: reaction.map(|r| r.as_str().to_owned()),
            at: chat_domain::time::now_rfc3339(),
        }
    }
}

/// The condition that an item a change writes is still as read: written last by change `read`
/// (0: by none, or absent).
fn unchanged_since(
    read: u64,
) -> (
    &'static str,
    Vec<(&'static str, aws_sdk_dynamodb::types::AttributeValue)>,
) {
    if read == 0 {
        ("attribute_not_exists(changeSeq)", vec![])
    } else {
        ("changeSeq = :read", vec![(":read", n(read))])
    }
}

fn with_change_seq(mut item: Item, change_seq: u64) -> Item {
    item.insert("changeSeq".into(), n(change_seq));
    item
}

impl ChatStore {
    /// The first read of a change: the conversation, the caller's member item, the change head,
    /// the message's reaction counts, and, as asked, the message item, the idempotency key and
    /// the caller's reactions. 1 BatchGetItem (strongly consistent). Not a member: `NotFound`; a
    /// seq the conversation does not have: `MessageNotFound`. A moderator (`moderator`) need not
    /// be a member.
    #[allow(clippy::too_many_arguments)]
    async fn read_for_change(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        message: bool,
        key: Option<&str>,
        reactor: bool,
        moderator: bool,
    ) -> Result<Read, ChatError> {
        let mut wanted = vec![
            keys::conversation_key(id),
            keys::member_key(id, caller),
            keys::change_head_key(id),
            keys::reaction_counts_key(id, seq),
        ];
        if message {
            wanted.push(keys::message_key(id, seq));
        }
        if let Some(k) = key {
            wanted.push(keys::change_key_key(id, k));
        }
        if reactor {
            wanted.push(keys::reactor_key(id, seq, caller));
        }
        let found = self.batch_get(wanted, true).await?;
        let sk_of = |i: &Item| get_s(i, keys::SK).unwrap_or_default().to_owned();
        let by_sk: BTreeMap<String, Item> = found.into_iter().map(|i| (sk_of(&i), i)).collect();
        let get = |sk: &str| by_sk.get(sk).cloned();
        let member_item = by_sk.get(&keys::member_sk(caller));
        let member = member_item.is_some();
        let blocked = member_item.is_some_and(|m| m.contains_key("blocked"));
        let (Some(conversation), true) = (get(keys::CONVERSATION_SK), member || moderator) else {
            return Err(ChatError::NotFound);
        };
        let conversation: ConversationItem = from_item(conversation)?;
        if seq > conversation.last_seq {
            return Err(ChatError::MessageNotFound);
        }
        let message = get(&keys::message_sk(seq))
            .map(|i| {
                let change_seq = super::attrs::get_n(&i, "changeSeq").unwrap_or(0);
                from_item::<Message, _>(i).map(|m| (m, change_seq))
            })
            .transpose()?;
        Ok(Read {
            conversation,
            head: get(keys::CHANGE_HEAD_SK).map(from_item).transpose()?,
            message,
            reactions: get(&keys::reaction_counts_sk(seq))
                .map(from_item)
                .transpose()?
                .unwrap_or_default(),
            key: key
                .and_then(|k| get(&keys::change_key_sk(k)))
                .map(from_item)
                .transpose()?,
            reactor: get(&keys::reactor_sk(seq, caller))
                .map(from_item)
                .transpose()?,
            member,
            blocked,
        })
    }

    /// The head and the record of change `n + 1` (`n` as read), and the check that its author
    /// is still a member (a member removed while its change was in flight must not commit it):
    /// the three parts every change transaction starts with.
    fn change_parts(
        &self,
        read: &Read,
        change: &ChangeItem,
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        let id = &change.conversation_id;
        let (head, pk) = (keys::change_head_pk(id), keys::changes_pk(id));
        // The head is written by every change: as read means no change since.
        let (condition, values) = unchanged_since(read.last_change());
        let mut parts = vec![
            tx::put(
                &self.table,
                to_item(change, head, keys::CHANGE_HEAD_SK)?,
                Some(condition),
                &values,
            )?,
            // Never over a record: a head that is not where this version reads it (a direct
            // conversation's, before the layout migration, README "Upgrading") fails the change
            // instead of numbering it again.
            tx::put(
                &self.table,
                to_item(change, pk, keys::change_sk(change.change_seq))?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?,
        ];
        // A moderator who is not a member changes by its role, not by a membership. An edit
        // or an added reaction also needs the peer not to block its author (a block meanwhile
        // makes the change read again, and refuse); taking one's own back does not.
        if read.member {
            let condition = match change.kind {
                ChangeKind::Edited | ChangeKind::ReactionAdded => {
                    "attribute_exists(pk) AND attribute_not_exists(blocked)"
                }
                ChangeKind::Deleted | ChangeKind::ReactionRemoved => "attribute_exists(pk)",
            };
            parts.push(tx::check(
                &self.table,
                keys::member_key(&change.conversation_id, &change.user_id),
                condition,
                &[],
            )?);
        }
        Ok(parts)
    }

    /// The Put of a message item changed by change `change_seq`, on condition that it is still
    /// the one read (and still in the table: the archiver may have moved it since).
    fn message_part(
        &self,
        m: &Message,
        read_change: u64,
        change_seq: u64,
    ) -> Result<TransactWriteItem, ChatError> {
        let (unchanged, values) = unchanged_since(read_change);
        tx::put(
            &self.table,
            with_change_seq(message_item(m)?, change_seq),
            Some(&format!("attribute_exists(pk) AND {unchanged}")),
            &values,
        )
    }

    /// The conversation item's part of an edit or a deletion, if any: its preview, when `m` is
    /// its last message (on condition that it still is); for a deletion (`deletion`: its
    /// changeSeq and time), the seq among the recently deleted ones (on condition that they are
    /// as read), and, when an older one falls off that list, the time it did; for an edit
    /// (`edit`: its changeSeq), `editedChange`, on condition that the archiver has not taken the
    /// message meanwhile (its advance, conditioned on `editedChange` as it read it, then reads
    /// the edited message again: docs/data-model.md §8.2).
    fn conversation_part(
        &self,
        read: &Read,
        m: &Message,
        deletion: Option<(u64, &str)>,
        edit: Option<u64>,
    ) -> Result<Option<TransactWriteItem>, ChatError> {
        let last = read.conversation.last_seq == m.seq;
        let (mut sets, mut conditions) = (Vec::new(), Vec::new());
        let mut values = Vec::new();
        let mut remove = "";
        if let Some(change_seq) = edit {
            sets.push("editedChange = :edited");
            values.extend([(":edited", n(change_seq)), (":seq", n(m.seq))]);
            conditions
                .push("(attribute_not_exists(archivedThrough) OR archivedThrough < :seq)".into());
        }
        if last {
            let preview = LastMessage::of(m);
            sets.push("lastMessage.body = :body");
            if preview.truncated {
                sets.push("lastMessage.truncated = :cut");
                values.push((":cut", aws_sdk_dynamodb::types::AttributeValue::Bool(true)));
            } else {
                remove = " REMOVE lastMessage.truncated";
            }
            values.push((":body", s(preview.body)));
            if edit.is_none() {
                values.push((":seq", n(m.seq)));
            }
            conditions.push("lastSeq = :seq".to_owned());
        }
        if let Some((change_seq, at)) = deletion {
            let c = &read.conversation;
            let recent = c.deleted_seqs.iter().copied().chain([m.seq]);
            let skip = (c.deleted_seqs.len() + 1).saturating_sub(RECENT_DELETIONS);
            let list = recent.skip(skip).map(n).collect();
            sets.push("deletedSeqs = :deleted, deletedChange = :change");
            if skip > 0 {
                sets.push("deletedDroppedAt = :dropped");
                values.push((":dropped", s(at.to_owned())));
            }
            values.push((":deleted", aws_sdk_dynamodb::types::AttributeValue::L(list)));
            values.push((":change", n(change_seq)));
            conditions.push(if c.deleted_change == 0 {
                "attribute_not_exists(deletedChange)".to_owned()
            } else {
                values.push((":was", n(c.deleted_change)));
                "deletedChange = :was".to_owned()
            });
        }
        if sets.is_empty() {
            return Ok(None);
        }
        let expression = format!("SET {}{remove}", sets.join(", "));
        Ok(Some(tx::update(
            &self.table,
            keys::conversation_key(&m.conversation_id),
            &expression,
            Some(&conditions.join(" AND ")),
            &values,
        )?))
    }

    /// The Put of an edit's or a deletion's idempotency key (only if absent: two requests with
    /// one `clientChangeId` make one change).
    fn key_part(
        &self,
        id: &ConversationId,
        client_change_key: &str,
        key: &ChangeKeyItem,
    ) -> Result<TransactWriteItem, ChatError> {
        let (pk, sk) = (keys::changes_pk(id), keys::change_key_sk(client_change_key));
        tx::put(
            &self.table,
            to_item(key, pk, sk)?,
            Some("attribute_not_exists(pk)"),
            &[],
        )
    }

    /// A deletion's mark on its message's idempotency key (`X#`): a replay of the send answers
    /// the tombstone from the key alone, within the send's 2 round trips (docs/data-model.md
    /// §4.2). The key of a message not yet archived exists (the archiver moves keys only after
    /// `archivedThrough` passed their messages: one that advances meanwhile fails this part's
    /// condition, and the deletion reads again); a replay of an archived message reads its
    /// deleted mark instead (`answer_archived`).
    fn send_key_part(
        &self,
        id: &ConversationId,
        tomb: &Message,
    ) -> Result<TransactWriteItem, ChatError> {
        let key = keys::send_key(id, &tomb.client_msg_id.to_ascii_lowercase());
        let mut values = vec![(":version", n(tomb.version))];
        let expression = match &tomb.edited_at {
            Some(at) => {
                values.push((":edited", s(at.clone())));
                "SET deletedVersion = :version, editedAt = :edited"
            }
            None => "SET deletedVersion = :version",
        };
        tx::update(
            &self.table,
            key,
            expression,
            Some("attribute_exists(pk)"),
            &values,
        )
    }

    /// Whether an edit comes too late: the message is archived, or older than the archive age
    /// (it may move any moment).
    fn is_archived(&self, read: &Read, m: &Message) -> bool {
        if m.seq <= read.conversation.archived_through {
            return true;
        }
        if !self.archive_tier {
            return false;
        }
        let age = self.archive_settings.age;
        chat_domain::time::parse_rfc3339(&m.created_at)
            .is_some_and(|t| chat_domain::time::now() - t > age)
    }

    /// One change's transaction: committed (true), or lost to a concurrent change (false: read
    /// again and decide again).
    async fn commit_change(&self, parts: Vec<TransactWriteItem>) -> Result<bool, ChatError> {
        Ok(matches!(self.transact(parts).await?, TxOutcome::Committed))
    }

    /// `editMessage`. DynamoDB: 1 BatchGetItem (conversation, member, head, message, counts,
    /// key), then 1 TransactWriteItems (head, record, membership check, key, message, and the preview when it is
    /// the last message): 2 round trips, again after a lost race.
    pub async fn edit_message(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        edit: &EditMessage,
    ) -> Result<Message, ChatError> {
        let fingerprint = change_fingerprint(ChangeKind::Edited, seq, caller, &edit.body);
        let mut retry = self.retry();
        while retry.next().await {
            let read = self
                .read_for_change(
                    caller,
                    id,
                    seq,
                    true,
                    Some(&edit.client_change_key),
                    false,
                    false,
                )
                .await?;
            let Some((message, message_change)) = read.message.clone() else {
                if let Some(key) = &read.key {
                    // Archived since the edit: its replay answers as the edit did, forever
                    // (docs/api.md §4.8), from the chunk.
                    check_replay(&key.fingerprint, &fingerprint)?;
                    let archived = self
                        .archived_message(id, seq, read.conversation.archived_through)
                        .await?;
                    let answer =
                        replayed_edit(&archived, &edit.body, key.version, key.at.as_deref());
                    return Ok(read.reactions.apply(answer));
                }
                return Err(ChatError::Conflict(
                    "the message is archived and cannot be edited".into(),
                ));
            };
            if let Some(key) = &read.key {
                check_replay(&key.fingerprint, &fingerprint)?;
                let answer = replayed_edit(&message, &edit.body, key.version, key.at.as_deref());
                return Ok(read.reactions.apply(answer));
            }
            if read.blocked {
                return Err(super::blocked_by_peer());
            }
            check_edit(
                &Target {
                    caller,
                    owner: read.conversation.owner_id.as_ref(),
                    admins: &[],
                    moderator: false,
                    message: &message,
                    archived: self.is_archived(&read, &message),
                },
                &edit.body,
            )?;
            let change = read.next_change(ChangeKind::Edited, seq, caller, None);
            let after = edited(&message, &edit.body, &change.at);
            let mut parts = self.change_parts(&read, &change)?;
            parts.push(self.key_part(
                id,
                &edit.client_change_key,
                &ChangeKeyItem {
                    fingerprint: fingerprint.clone(),
                    seq,
                    version: after.version,
                    at: after.edited_at.clone(),
                    attachments: Vec::new(),
                },
            )?);
            parts.push(self.message_part(&after, message_change, change.change_seq)?);
            parts.extend(self.conversation_part(&read, &after, None, Some(change.change_seq))?);
            if self.commit_change(parts).await? {
                return Ok(read.reactions.apply(after));
            }
        }
        Err(ChatError::Throttled)
    }

    /// A message as the caller, a member, sees it (its counts or its tombstone), from the table
    /// or the archive. DynamoDB: 1 BatchGetItem (+ the chunk's GetObject when archived).
    pub(crate) async fn message_for_member(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
    ) -> Result<Message, ChatError> {
        let read = self
            .read_for_change(caller, id, seq, true, None, false, false)
            .await?;
        let message = match read.message {
            Some((m, _)) => m,
            None => {
                self.archived_message(id, seq, read.conversation.archived_through)
                    .await?
            }
        };
        Ok(read.reactions.apply(message))
    }

    /// `deleteMessage`. DynamoDB: 1 BatchGetItem (as an edit's), then 1 TransactWriteItems
    /// (head, record, membership check, key, the tombstone, the deleted mark beside it, the send's
    /// key marked deleted, the preview when it is the last message). An archived message: its chunk is read for the message (1 GetObject) and
    /// the deleted mark hides it from history (docs/data-model.md §8). Deleting a deleted
    /// message writes only its key: no change.
    pub async fn delete_message(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        client_change_key: &str,
        moderator: bool,
    ) -> Result<Message, ChatError> {
        let fingerprint = change_fingerprint(ChangeKind::Deleted, seq, caller, "");
        let mut retry = self.retry();
        while retry.next().await {
            let key = Some(client_change_key);
            let read = self
                .read_for_change(caller, id, seq, true, key, false, moderator)
                .await?;
            let (message, message_change) = match read.message.clone() {
                Some(found) => found,
                None => (
                    self.archived_message(id, seq, read.conversation.archived_through)
                        .await?,
                    0,
                ),
            };
            let message = read.reactions.apply(message);
            if let Some(key) = &read.key {
                check_replay(&key.fingerprint, &fingerprint)?;
                // A retry after a 503: the erasure, or the deletion of its files, may not have
                // happened.
                self.erase_after_deletion(id, seq).await?;
                self.erase_attachment_objects(id, &key.attachments)
                    .await
                    .map_err(|_| ChatError::Unavailable)?;
                return Ok(message);
            }
            let target = Target {
                caller,
                owner: match read.conversation.kind {
                    ConversationType::Group => read.conversation.owner_id.as_ref(),
                    ConversationType::Direct => None,
                },
                admins: &read.conversation.admin_ids,
                moderator,
                message: &message,
                archived: false,
            };
            let files: Vec<String> = message
                .attachments
                .iter()
                .map(|a| a.attachment_id.clone())
                .collect();
            let key = ChangeKeyItem {
                fingerprint: fingerprint.clone(),
                seq,
                version: 0,
                at: None,
                attachments: files.clone(),
            };
            if !check_delete(&target)? {
                // Already deleted: nothing changes, but the key is kept, so that this
                // clientChangeId never changes anything later.
                let part = self.key_part(id, client_change_key, &key)?;
                if self.commit_change(vec![part]).await? {
                    return Ok(message);
                }
                continue;
            }
            let tomb = message.tombstone();
            let change = read.next_change(ChangeKind::Deleted, seq, caller, None);
            let mut parts = self.change_parts(&read, &change)?;
            parts.push(self.key_part(id, client_change_key, &key)?);
            if read.message.is_some() {
                parts.push(self.message_part(&tomb, message_change, change.change_seq)?);
            }
            if read.message.is_some() && seq > read.conversation.archived_through {
                parts.push(self.send_key_part(id, &tomb)?);
            }
            let mark = ReactionsItem {
                counts: BTreeMap::new(),
                deleted: true,
                change_seq: change.change_seq,
            };
            parts.push(self.reactions_part(id, seq, &mark, read.reactions.change_seq)?);
            parts.extend(self.conversation_part(
                &read,
                &tomb,
                Some((change.change_seq, change.at.as_str())),
                None,
            )?);
            parts.extend(self.attachment_erasure_parts(&message)?);
            if self.commit_change(parts).await? {
                // Archived, or archived since it was read (the archiver's own erasure covers
                // an advance after this looks).
                self.erase_after_deletion(id, seq).await?;
                // Its files go with it (their records went in the transaction; a replay of this
                // deletion erases them again, from its key).
                self.erase_attachment_objects(id, &files)
                    .await
                    .map_err(|_| ChatError::Unavailable)?;
                return Ok(tomb);
            }
        }
        Err(ChatError::Throttled)
    }

    /// The Put of a message's counts (or its deleted mark), on condition that they are as read.
    fn reactions_part(
        &self,
        id: &ConversationId,
        seq: u64,
        item: &ReactionsItem,
        read_change: u64,
    ) -> Result<TransactWriteItem, ChatError> {
        let (unchanged, values) = unchanged_since(read_change);
        tx::put(
            &self.table,
            to_item(item, keys::reactions_pk(id), keys::reaction_counts_sk(seq))?,
            Some(unchanged),
            &values,
        )
    }

    /// `erase_from_archive` once the deletion has committed: the deletion happened, so a failure
    /// is never `429` (which says nothing happened) but `503`, whose retry with the same
    /// `clientChangeId` erases again.
    async fn erase_after_deletion(&self, id: &ConversationId, seq: u64) -> Result<(), ChatError> {
        self.erase_from_archive(id, seq).await.map_err(|e| match e {
            ChatError::Throttled => ChatError::Unavailable,
            other => other,
        })
    }

    /// Rewrites the chunk holding a deleted archived message with its tombstone (and those of
    /// any other message of the chunk deleted meanwhile, from their marks): the content is gone
    /// from the archive too. The chunk is put only over the version read (`put_over`), so two
    /// deletions at once never put back each other's content, and a chunk the archiver removed
    /// meanwhile is never re-created: a lost race reads the chunk and the marks again. Again
    /// while the archiver moved the boundary meanwhile (a longer chunk may have been built from
    /// the old one). S3: 1 GetObject + 1 PutObject (each race lost: 1 + 1 more); DynamoDB: 1
    /// Query of the chunk's marks (per race lost: 1 more), 2 GetItem of `archivedThrough`.
    #[cfg(feature = "archive")]
    async fn erase_from_archive(&self, id: &ConversationId, seq: u64) -> Result<(), ChatError> {
        use super::archive::{chunk_key, encode};
        let Some(archive) = self.archive.as_ref() else {
            return Ok(());
        };
        let mut through = self.archived_through(id).await?;
        for _ in 0..3 {
            let Some((key, first, last)) = chunk_key(id, seq, through) else {
                return Ok(());
            };
            let (mut retry, mut settled) = (self.retry(), false);
            while !settled && retry.next().await {
                let (chunk, marks) = tokio::try_join!(
                    archive.get_tagged(&key),
                    self.reactions_between(id, first, last)
                )?;
                // No object: not written yet, or superseded and removed (the longer one is
                // rewritten below once the boundary is read again).
                settled = match (chunk, marks) {
                    (None, _) => true,
                    (Some((chunk, etag)), marks) => match erased(chunk, &marks) {
                        Some(erased) => archive.put_over(&key, &etag, encode(&erased)?).await?,
                        None => true,
                    },
                };
            }
            if !settled {
                return Err(ChatError::Throttled);
            }
            let now = self.archived_through(id).await?;
            if now == through {
                return Ok(());
            }
            through = now;
        }
        Ok(())
    }

    #[cfg(not(feature = "archive"))]
    async fn erase_from_archive(&self, _id: &ConversationId, _seq: u64) -> Result<(), ChatError> {
        Ok(())
    }

    /// `addReaction` (`add`) / `removeReaction`. DynamoDB: 1 BatchGetItem (conversation, member,
    /// head, counts, the caller's reactions), then, unless it changes nothing, 1
    /// TransactWriteItems (head, record, membership check, the caller's reactions, the counts). The message item
    /// is neither read nor written: a reaction takes nothing of the conversation's log partition.
    pub async fn react(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        reaction: &Reaction,
        add: bool,
    ) -> Result<ReactionsResult, ChatError> {
        let mut retry = self.retry();
        while retry.next().await {
            let read = self
                .read_for_change(caller, id, seq, false, None, true, false)
                .await?;
            let result = |counts: &BTreeMap<String, u64>| ReactionsResult {
                conversation_id: id.clone(),
                seq,
                reactions: reaction_counts(counts),
            };
            if read.reactions.deleted {
                // A tombstone has no reactions (SPEC §13): none to add, and removing one the
                // caller has not changes nothing.
                if !add {
                    return Ok(result(&BTreeMap::new()));
                }
                return Err(ChatError::Conflict(
                    "the message is deleted: it takes no reactions".into(),
                ));
            }
            if read.blocked && add {
                return Err(super::blocked_by_peer());
            }
            let mine = read.reactor.as_ref().map_or(&[][..], |r| &r.reactions[..]);
            let Some(after) = react(mine, reaction, add)? else {
                return Ok(result(&read.reactions.counts));
            };
            let kind = if add {
                ChangeKind::ReactionAdded
            } else {
                ChangeKind::ReactionRemoved
            };
            let change = read.next_change(kind, seq, caller, Some(reaction));
            let mut parts = self.change_parts(&read, &change)?;
            let reactor_change = read.reactor.as_ref().map_or(0, |r| r.change_seq);
            let (unchanged, values) = unchanged_since(reactor_change);
            parts.push(if after.is_empty() {
                let key = keys::reactor_key(id, seq, caller);
                tx::delete(&self.table, key, unchanged, &values)?
            } else {
                let item = ReactorItem {
                    user_id: caller.clone(),
                    reactions: after,
                    change_seq: change.change_seq,
                };
                let (pk, sk) = (keys::reactions_pk(id), keys::reactor_sk(seq, caller));
                tx::put(
                    &self.table,
                    to_item(&item, pk, sk)?,
                    Some(unchanged),
                    &values,
                )?
            });
            let mut counts = read.reactions.counts.clone();
            recount(&mut counts, reaction, add);
            let item = ReactionsItem {
                counts,
                deleted: false,
                change_seq: change.change_seq,
            };
            parts.push(self.reactions_part(id, seq, &item, read.reactions.change_seq)?);
            if self.commit_change(parts).await? {
                return Ok(result(&item.counts));
            }
        }
        Err(ChatError::Throttled)
    }

    /// `reactions`: who reacted to a message, by user then reaction. DynamoDB: 1 BatchGetItem
    /// (conversation, member, counts), then 1 Query of the message's reactors from the cursor
    /// (more pages past 1 MB).
    pub async fn reactors(
        &self,
        caller: &UserId,
        id: &ConversationId,
        seq: u64,
        q: ReactorsQuery,
    ) -> Result<ReactorsPage, ChatError> {
        let read = self
            .read_for_change(caller, id, seq, false, None, false, false)
            .await?;
        let limit = q.limit as usize;
        let mut out: Vec<Reactor> = Vec::with_capacity(limit + 1);
        if !read.reactions.deleted {
            let prefix = keys::reactors_prefix(seq);
            let from = match &q.after {
                Some((user, _)) => format!("{prefix}{user}"),
                None => prefix.clone(),
            };
            // User ids are of `A-Za-z0-9._:@-|`: all below `~`.
            let range = Some((from, format!("{prefix}~")));
            let page = PartitionQuery {
                pk: keys::reactions_pk(id),
                range,
                ..Default::default()
            };
            self.query_each(page, |item| {
                let r: ReactorItem = from_item(item)?;
                for reaction in sorted(&r.reactions) {
                    let past_cursor = q.after.as_ref().is_none_or(|(u, last)| {
                        (&r.user_id, reaction.as_str()) > (u, last.as_str())
                    });
                    let wanted = q.reaction.as_ref().is_none_or(|w| w.as_str() == reaction);
                    if past_cursor && wanted {
                        out.push(Reactor {
                            user_id: r.user_id.clone(),
                            reaction: reaction.clone(),
                        });
                    }
                }
                Ok(out.len() <= limit)
            })
            .await?;
        }
        let next_cursor = (out.len() > limit).then(|| {
            out.truncate(limit);
            let last = &out[limit - 1];
            reactor_cursor(&last.user_id, &last.reaction)
        });
        Ok(ReactorsPage {
            reactions: out,
            next_cursor,
        })
    }

    /// `changes`: the change log after `afterChange`, each change with its message as it is now.
    /// DynamoDB: 1 BatchGetItem (conversation, member, head) and, at the same time, 1 Query of
    /// the records (`limit + 1`; small, content-free items, so a non-member costs little); then
    /// the messages and their counts (`messages_now`): 2 round trips.
    pub async fn changes(
        &self,
        caller: &UserId,
        id: &ConversationId,
        q: ChangesQuery,
    ) -> Result<ChangesPage, ChatError> {
        let wanted = vec![
            keys::conversation_key(id),
            keys::member_key(id, caller),
            keys::change_head_key(id),
        ];
        let limit = q.limit as usize;
        let mut records: Vec<ChangeItem> = Vec::with_capacity(limit + 1);
        let page = PartitionQuery {
            pk: keys::changes_pk(id),
            range: Some((
                keys::change_sk(q.after.saturating_add(1)),
                keys::LAST_CHANGE_SK.to_owned(),
            )),
            page: Some(limit as i32 + 1),
            ..Default::default()
        };
        let query = self.query_each(page, |item| {
            records.push(from_item(item)?);
            Ok(records.len() <= limit)
        });
        let (found, ()) = tokio::try_join!(self.batch_get(wanted, true), query)?;
        let sk = |i: &Item| get_s(i, keys::SK).unwrap_or_default().to_owned();
        let conversation = found.iter().find(|i| sk(i) == keys::CONVERSATION_SK);
        let member = found.iter().any(|i| sk(i) == keys::member_sk(caller));
        let (Some(conversation), true) = (conversation, member) else {
            return Err(ChatError::NotFound);
        };
        let conversation: ConversationItem = from_item(conversation.clone())?;
        let head: Option<ChangeItem> = found
            .iter()
            .find(|i| sk(i) == keys::CHANGE_HEAD_SK)
            .cloned()
            .map(from_item)
            .transpose()?;
        let has_more = records.len() > limit;
        records.truncate(limit);
        let seqs: BTreeSet<u64> = records.iter().map(|r| r.seq).collect();
        let messages = self
            .messages_now(id, &seqs, conversation.archived_through)
            .await?;
        let mut changes = Vec::with_capacity(records.len());
        for r in &records {
            let Some(m) = messages.get(&r.seq) else {
                tracing::error!(conversation = %id, seq = r.seq, "changed message in neither tier");
                return Err(ChatError::Unavailable);
            };
            changes.push(r.entry(m.clone()));
        }
        let last_change = head
            .map_or(0, |h| h.change_seq)
            .max(records.last().map_or(0, |r| r.change_seq));
        let has_more = q.has_more(has_more, last_change, records.last().map(|r| r.change_seq));
        Ok(ChangesPage {
            changes,
            last_change,
            has_more,
        })
    }

    /// Messages as they are now (their counts, or their tombstones), by seq: 1 round trip of
    /// BatchGetItem (the message items and their counts, 100 keys a call, at once); those no
    /// longer in the table from their chunks (with the archive tier: 1 GetObject per chunk).
    pub async fn messages_now(
        &self,
        id: &ConversationId,
        seqs: &BTreeSet<u64>,
        archived_through: u64,
    ) -> Result<BTreeMap<u64, Message>, ChatError> {
        let wanted: Vec<Item> = seqs
            .iter()
            .flat_map(|&seq| {
                [
                    keys::message_key(id, seq),
                    keys::reaction_counts_key(id, seq),
                ]
            })
            .collect();
        let calls = wanted
            .chunks(100)
            .map(|keys| self.batch_get(keys.to_vec(), true));
        let found: Vec<Item> = futures::future::try_join_all(calls)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let mut messages = BTreeMap::new();
        let mut counts: BTreeMap<u64, ReactionsItem> = BTreeMap::new();
        for item in found {
            let sk = get_s(&item, keys::SK).unwrap_or_default();
            if sk.starts_with("S#") {
                let m: Message = from_item(item)?;
                messages.insert(m.seq, m);
            } else if let Some(seq) = sk.strip_prefix("C#").and_then(|s| s.parse().ok()) {
                counts.insert(seq, from_item(item)?);
            }
        }
        self.fill_from_archive(&mut messages, id, seqs, archived_through)
            .await?;
        let messages = apply_reactions(messages.into_values().collect(), &counts);
        Ok(messages.into_iter().map(|m| (m.seq, m)).collect())
    }

    /// The messages of `seqs` not in `messages` (no longer in the table), from their chunks
    /// (without the archive tier compiled in, every message is in the table).
    #[cfg_attr(not(feature = "archive"), allow(unused_variables))]
    async fn fill_from_archive(
        &self,
        messages: &mut BTreeMap<u64, Message>,
        id: &ConversationId,
        seqs: &BTreeSet<u64>,
        archived_through: u64,
    ) -> Result<(), ChatError> {
        #[cfg(feature = "archive")]
        {
            let Some(archive) = self.archive.as_ref() else {
                return Ok(());
            };
            // One read per chunk the page's own seqs fall in, never the chunks between them
            // (a page may hold seq 1 and seq 900,000): the missing seqs grouped by chunk.
            let mut by_chunk: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for &s in seqs.iter().filter(|s| !messages.contains_key(s)) {
                let range = by_chunk
                    .entry(super::archive::chunk_of(s))
                    .or_insert((s, s));
                range.1 = s;
            }
            for (from, to) in by_chunk.into_values() {
                for m in self
                    .archived_messages(archive, id, from..=to, archived_through)
                    .await?
                {
                    if seqs.contains(&m.seq) {
                        messages.entry(m.seq).or_insert(m);
                    }
                }
            }
        }
        Ok(())
    }

    /// The counts of the messages `from..=to`, by seq. 1 strongly consistent Query of the
    /// conversation's reactions partition, counts only (the reactors are not read).
    pub(crate) async fn reactions_between(
        &self,
        id: &ConversationId,
        from: u64,
        to: u64,
    ) -> Result<BTreeMap<u64, ReactionsItem>, ChatError> {
        let mut out = BTreeMap::new();
        if from > to {
            return Ok(out);
        }
        let range = (keys::reaction_counts_sk(from), keys::reaction_counts_sk(to));
        let q = PartitionQuery {
            pk: keys::reactions_pk(id),
            range: Some(range),
            ..Default::default()
        };
        self.query_each(q, |item| {
            let sk = get_s(&item, keys::SK).unwrap_or_default();
            if let Some(seq) = sk.strip_prefix("C#").and_then(|s| s.parse().ok()) {
                out.insert(seq, from_item(item)?);
            }
            Ok(true)
        })
        .await?;
        Ok(out)
    }

    /// The conversation's newest `changeSeq` (0: none). 1 strongly consistent GetItem.
    pub(crate) async fn last_change(&self, id: &ConversationId) -> Result<u64, ChatError> {
        let head = self
            .item_fields(keys::change_head_key(id), Some("changeSeq"))
            .await?;
        Ok(head
            .and_then(|i| super::attrs::get_n(&i, "changeSeq"))
            .unwrap_or(0))
    }
}

/// Applies counts (and deleted marks) to messages read from either tier.
pub(crate) fn apply_reactions(
    messages: Vec<Message>,
    counts: &BTreeMap<u64, ReactionsItem>,
) -> Vec<Message> {
    messages
        .into_iter()
        .map(|m| match counts.get(&m.seq) {
            Some(c) => c.apply(m),
            None => m,
        })
        .collect()
}

/// A chunk's messages with the tombstones of those its marks say are deleted; None when none of
/// them still holds content to erase.
#[cfg(feature = "archive")]
pub(crate) fn erased(
    chunk: Vec<Message>,
    marks: &BTreeMap<u64, ReactionsItem>,
) -> Option<Vec<Message>> {
    let deleted = |m: &Message| !m.deleted && marks.get(&m.seq).is_some_and(|r| r.deleted);
    if !chunk.iter().any(deleted) {
        return None;
    }
    Some(
        chunk
            .into_iter()
            .map(|m| if deleted(&m) { m.tombstone() } else { m })
            .collect(),
    )
}

fn sorted(reactions: &[String]) -> Vec<String> {
    let mut out = reactions.to_vec();
    out.sort();
    out
}
