//! Conversations and membership: `createConversation` (direct, group), `getConversation`,
//! `addMembers`, `removeMember` (docs/api.md §6–§9).

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::attrs::{get_s, n, s};
use super::items::{from_item, ConversationItem, MemberItem, MembersChange, MembersChangeKind};
use super::{keys, reason_failed, tx, ChatStore, TxOutcome};
use chat_domain::conversation::{
    check_membership_change, check_removal, group_fingerprint, group_members, joining_watermark,
    members_to_add,
};
use chat_domain::error::ChatError;
use chat_domain::inbox::{bucketed, InboxPosition};
use chat_domain::model::Conversation;
use chat_domain::{ConversationId, ConversationType, UserId};

/// New members per transaction: each is a member item and its inbox entry, next to the
/// conversation item (TransactWriteItems takes 100 items).
const MEMBERS_PER_TX: usize = 49;

fn members_change(
    kind: MembersChangeKind,
    user_ids: &[&UserId],
) -> Result<AttributeValue, ChatError> {
    let change = MembersChange {
        kind,
        user_ids: user_ids.iter().map(|u| (*u).clone()).collect(),
    };
    serde_dynamo::to_attribute_value(change).map_err(ChatError::internal)
}

/// Where `conversation`'s inbox entries are filed now.
fn filed_at(conversation: &ConversationItem) -> InboxPosition {
    InboxPosition {
        key: conversation.activity_key(),
        conversation_id: conversation.conversation_id.clone(),
    }
}

fn sorted_ids<'a>(users: impl IntoIterator<Item = &'a UserId>) -> Vec<UserId> {
    let mut ids: Vec<UserId> = users.into_iter().cloned().collect();
    ids.sort();
    ids
}

/// What the fanout needs of a conversation for each batch: who is in it (`membersVersion`,
/// bumped by every membership change) and which content it must not push (docs/data-model.md
/// §8.4): the recently deleted seqs, and when an older deletion last fell off that list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushState {
    pub members_version: u64,
    pub deleted: Vec<u64>,
    pub deleted_dropped_at: Option<String>,
}

impl ChatStore {
    /// Runs one transaction, retrying while it loses to concurrent transactions.
    async fn transact_retrying(
        &self,
        parts: Vec<TransactWriteItem>,
    ) -> Result<TxOutcome, ChatError> {
        let mut retry = self.retry();
        while retry.next().await {
            match self.transact(parts.clone()).await? {
                TxOutcome::Conflict => continue,
                done => return Ok(done),
            }
        }
        Err(ChatError::Throttled)
    }

    /// A conversation and all its members. DynamoDB: 1 strongly consistent GetItem of the
    /// conversation and, at the same time, 1 strongly consistent Query of its member partition
    /// (1,000 members are about 0.5 MB, one page).
    pub async fn load_conversation(
        &self,
        id: &ConversationId,
    ) -> Result<Option<(ConversationItem, Vec<MemberItem>)>, ChatError> {
        let (conversation, members) = tokio::try_join!(
            self.conversation_fields(id, None),
            self.member_items(id, None)
        )?;
        let Some(conversation) = conversation else {
            return Ok(None);
        };
        let members = members
            .into_iter()
            .map(from_item)
            .collect::<Result<_, _>>()?;
        Ok(Some((from_item(conversation)?, members)))
    }

    /// The conversation's `lastSeq` (None: no such conversation). 1 strongly consistent GetItem.
    pub(super) async fn last_seq(&self, id: &ConversationId) -> Result<Option<u64>, ChatError> {
        let item = self.conversation_fields(id, Some("lastSeq")).await?;
        let last_seq = item.and_then(|i| super::attrs::get_n(&i, "lastSeq"));
        if let Some(n) = last_seq {
            self.seen.saw(id, n);
        }
        Ok(last_seq)
    }

    /// When the conversation's newest message was sent, in unix ms (None: no such conversation
    /// or no message). 1 strongly consistent GetItem.
    pub async fn last_message_at_ms(&self, id: &ConversationId) -> Result<Option<u64>, ChatError> {
        let item = self.conversation_fields(id, Some("lastMessageAt")).await?;
        let at = item.as_ref().and_then(|i| get_s(i, "lastMessageAt"));
        Ok(at
            .and_then(chat_domain::time::parse_rfc3339)
            .map(chat_domain::time::unix_millis))
    }

    /// What the fanout reads of a conversation for each batch (None: no such conversation).
    /// 1 strongly consistent GetItem.
    pub async fn push_state(&self, id: &ConversationId) -> Result<Option<PushState>, ChatError> {
        let fields = Some("membersVersion, deletedSeqs, deletedDroppedAt, pk");
        let Some(item) = self.conversation_fields(id, fields).await? else {
            return Ok(None);
        };
        let deleted = match item.get("deletedSeqs") {
            Some(aws_sdk_dynamodb::types::AttributeValue::L(list)) => list
                .iter()
                .filter_map(|v| v.as_n().ok()?.parse().ok())
                .collect(),
            _ => Vec::new(),
        };
        Ok(Some(PushState {
            members_version: super::attrs::get_n(&item, "membersVersion").unwrap_or(0),
            deleted,
            deleted_dropped_at: get_s(&item, "deletedDroppedAt").map(str::to_owned),
        }))
    }

    /// Which of `seqs` are deleted, or no longer in the table (archived: counted as deleted, so
    /// their content is withheld and the client fetches it). 1 round trip of strongly
    /// consistent BatchGetItem (100 keys a call, at once); only the fanout's rare check of
    /// content read before a deletion it no longer lists.
    pub async fn deleted_among(
        &self,
        id: &ConversationId,
        seqs: &BTreeSet<u64>,
    ) -> Result<BTreeSet<u64>, ChatError> {
        let keys: Vec<_> = seqs.iter().map(|&seq| keys::message_key(id, seq)).collect();
        let calls = keys.chunks(100).map(|k| self.batch_get(k.to_vec(), true));
        let mut gone = seqs.clone();
        for item in futures::future::try_join_all(calls)
            .await?
            .into_iter()
            .flatten()
        {
            let m: chat_domain::model::Message = from_item(item)?;
            if !m.deleted {
                gone.remove(&m.seq);
            }
        }
        Ok(gone)
    }

    pub async fn members_version(&self, id: &ConversationId) -> Result<Option<u64>, ChatError> {
        let item = self
            .conversation_fields(id, Some("membersVersion, pk"))
            .await?;
        Ok(item.map(|i| super::attrs::get_n(&i, "membersVersion").unwrap_or(0)))
    }

    /// The member ids, and the `membersVersion` read right after them (None: no such
    /// conversation): the ids are exactly that version's members if the version read before them
    /// is the same, since every membership change bumps it. DynamoDB: 1 strongly consistent Query
    /// of the member partition (more past 1 MB), only the ids projected, then `members_version`.
    pub async fn member_ids(
        &self,
        id: &ConversationId,
    ) -> Result<Option<(u64, Vec<UserId>)>, ChatError> {
        let members = self
            .member_items(id, Some("memberId"))
            .await?
            .iter()
            .filter_map(|item| get_s(item, "memberId").and_then(UserId::parse))
            .collect();
        Ok(self.members_version(id).await?.map(|v| (v, members)))
    }

    /// The peers of `user`'s `limit` most recently active direct conversations (presence pushes).
    /// DynamoDB: 1 Query of the inbox index (ids only, newest first) + ⌈directs/100⌉
    /// BatchGetItem of their conversation items.
    pub async fn direct_peers(&self, user: &UserId, limit: i32) -> Result<Vec<UserId>, ChatError> {
        let out = self
            .db
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :a)")
            .expression_attribute_values(":pk", s(keys::inbox_pk(user)))
            .expression_attribute_values(":a", s(keys::INBOX_ENTRY_PREFIX))
            .scan_index_forward(false)
            .limit(limit)
            .projection_expression("conversationId")
            .send()
            .await
            .map_err(|e| super::sdk_error("Query", e))?;
        let keys: Vec<_> = out
            .items()
            .iter()
            .filter_map(|i| get_s(i, "conversationId"))
            .filter(|c| c.starts_with("d-"))
            .filter_map(ConversationId::parse)
            .map(|c| keys::conversation_key(&c))
            .collect();
        let mut peers = Vec::new();
        for chunk in keys.chunks(100) {
            for item in self.batch_get(chunk.to_vec(), false).await? {
                let members = item.get("directMembers").and_then(|v| v.as_l().ok());
                for m in members.into_iter().flatten() {
                    let peer = m.as_s().ok().and_then(|p| UserId::parse(p));
                    if let Some(peer) = peer.filter(|p| p != user && !peers.contains(p)) {
                        peers.push(peer);
                    }
                }
            }
        }
        Ok(peers)
    }

    /// Whether `user` is a member of `id` now (None: it is not) and, if so, whether its peer
    /// blocks it (a direct conversation's `blocked`, docs/data-model.md §10.1). 1 strongly
    /// consistent GetItem of the member item.
    pub async fn member_blocked(
        &self,
        id: &ConversationId,
        user: &UserId,
    ) -> Result<Option<bool>, ChatError> {
        let item = self
            .item_fields(keys::member_key(id, user), Some("pk, blocked"))
            .await?;
        Ok(item.map(|m| m.contains_key("blocked")))
    }

    /// A conversation and its members, if `caller` is one of them; otherwise `NotFound` (no hint
    /// that it exists). 1 Query.
    pub(super) async fn load_for_member(
        &self,
        caller: &UserId,
        id: &ConversationId,
    ) -> Result<(ConversationItem, Vec<MemberItem>), ChatError> {
        match self.load_conversation(id).await? {
            Some((c, members)) if members.iter().any(|m| &m.member_id == caller) => {
                Ok((c, members))
            }
            _ => Err(ChatError::NotFound),
        }
    }

    /// `getConversation`: 1 round trip (`load_conversation`: a GetItem and a Query per member
    /// partition, at once, with the GetItem of the change head for `lastChange`).
    pub async fn get_conversation(
        &self,
        caller: &UserId,
        id: &ConversationId,
    ) -> Result<Conversation, ChatError> {
        let ((conversation, members), last_change) =
            tokio::try_join!(self.load_for_member(caller, id), self.last_change(id))?;
        let ids = sorted_ids(members.iter().map(|m| &m.member_id));
        let mine = members.iter().find(|m| &m.member_id == caller);
        Ok(Conversation {
            notifications: Some(
                mine.and_then(|m| m.notifications.clone())
                    .unwrap_or_default(),
            ),
            ..conversation.to_conversation(ids, last_change)
        })
    }

    /// `createConversation` (direct). The id is derived from the pair and the conversation item is
    /// put only if absent, so simultaneous creations make one conversation; both inbox entries are
    /// written with it, so it is in both inboxes at once. Returns `(conversation, created)`.
    /// DynamoDB: 1 BatchGetItem (the two block items) + 1 TransactWriteItems (+1 Query when it
    /// already exists).
    pub async fn create_direct(
        &self,
        caller: &UserId,
        peer: &UserId,
    ) -> Result<(Conversation, bool), ChatError> {
        let id = ConversationId::direct(caller, peer);
        let pair = sorted_ids([caller, peer]);
        let mut retry = self.retry();
        while retry.next().await {
            // Who blocks whom, read first: a peer who blocks the caller refuses it (`403`), even
            // an existing conversation; the transaction checks the blocks are still as read (a
            // block meanwhile marks a member item only once the conversation exists).
            let blocks = self.blocks_among(&[(peer, caller), (caller, peer)]).await?;
            let blocks_of = |a: &UserId| blocks.iter().any(|(blocker, _)| blocker == a);
            if blocks_of(peer) {
                return Err(ChatError::Blocked(format!("user {peer} has blocked you")));
            }
            let now = chat_domain::time::now_rfc3339();
            let conversation = ConversationItem {
                direct_members: pair.clone(),
                member_count: 2,
                ..ConversationItem::new(&id, ConversationType::Direct, &now)
            };
            let filed = filed_at(&conversation);
            let mut parts = vec![tx::put(
                &self.table,
                conversation.to_item()?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?];
            for (blocker, blocked) in [(peer, caller), (caller, peer)] {
                let state = if blocks_of(blocker) {
                    "attribute_exists(pk)"
                } else {
                    "attribute_not_exists(pk)"
                };
                let key = keys::block_key(blocker, blocked);
                parts.push(tx::check(&self.table, key, state, &[])?);
            }
            for user in &pair {
                let member = MemberItem {
                    // Its peer blocks it: its sends are refused (`MayPost`).
                    blocked: user != caller && blocks_of(caller),
                    ..MemberItem::new(&id, user, 0, &now, &filed.key)
                };
                parts.push(tx::put(&self.table, member.to_item()?, None, &[])?);
                parts.push(self.put_inbox_entry(user, &filed, false)?);
            }
            match self.transact(parts).await? {
                TxOutcome::Committed => return Ok((conversation.to_conversation(pair, 0), true)),
                TxOutcome::Cancelled(r) if reason_failed(&r, 0).is_some() => {
                    return Ok((self.get_conversation(caller, &id).await?, false));
                }
                // A block or an unblock meanwhile (or a conflict): read them again.
                _ => {}
            }
        }
        Err(ChatError::Throttled)
    }

    /// `createConversation` (group). Members and their inbox entries are written first, in
    /// transactions of 49 that each check the conversation item is still absent; the conversation
    /// item, put last, is the commit point (until then nothing of the group is visible: the inbox
    /// skips entries whose conversation item is missing). A retry with the same `clientRequestId`
    /// lands on the same id and returns the existing group. Nobody who blocks the creator is
    /// added (`403 blocked`). DynamoDB: per chunk of 49 members 1 BatchGetItem (their blocks of
    /// the creator) + 1 TransactWriteItems (1 each for groups of up to 49), +1 Query when it
    /// already exists.
    pub async fn create_group(
        &self,
        caller: &UserId,
        title: &str,
        others: &[UserId],
        client_request_id: Option<&str>,
    ) -> Result<(Conversation, bool), ChatError> {
        let id = ConversationId::group(caller, client_request_id);
        let all = group_members(caller, others)?;
        let fingerprint = group_fingerprint(title, &all);
        let now = chat_domain::time::now_rfc3339();
        let conversation = ConversationItem {
            title: Some(title.to_owned()),
            owner_id: Some(caller.clone()),
            member_count: all.len() as u32,
            bucketed_since: bucketed(all.len()).then(|| now.clone()),
            // Big from the start: every member gets a big-group entry, none a moving one.
            inbox_by_read: bucketed(all.len()),
            ..ConversationItem::new(&id, ConversationType::Group, &now)
        };
        let filed = filed_at(&conversation);
        let chunks: Vec<&[UserId]> = all.chunks(MEMBERS_PER_TX).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let others: Vec<&UserId> = chunk.iter().filter(|u| *u != caller).collect();
            self.check_not_blocked_by(caller, &others).await?;
            let absent = "attribute_not_exists(pk)";
            let mut parts = vec![if i + 1 == chunks.len() {
                tx::put(&self.table, conversation.to_item()?, Some(absent), &[])?
            } else {
                tx::check(&self.table, keys::conversation_key(&id), absent, &[])?
            }];
            for user in chunk.iter() {
                // While a large group is still being written, a concurrent request with the same
                // request id and the same content rewrites the same members harmlessly (nobody
                // can have read the group yet); different content is a conflict. Once the group
                // exists, its request id just returns it.
                let member = MemberItem {
                    create_fp: Some(fingerprint.clone()),
                    inbox_big: conversation.inbox_by_read,
                    ..MemberItem::new(&id, user, 0, &now, &filed.key)
                };
                parts.push(tx::put(
                    &self.table,
                    member.to_item()?,
                    Some("attribute_not_exists(pk) OR createFp = :fp"),
                    &[(":fp", s(&fingerprint))],
                )?);
                parts.push(self.put_inbox_entry(user, &filed, member.inbox_big)?);
            }
            match self.transact_retrying(parts).await? {
                TxOutcome::Committed => {}
                TxOutcome::Cancelled(r) if reason_failed(&r, 0).is_some() => {
                    return Ok((self.get_conversation(caller, &id).await?, false));
                }
                _ => {
                    return Err(ChatError::Conflict(
                        "clientRequestId was already used for a different group".into(),
                    ))
                }
            }
        }
        Ok((conversation.to_conversation(sorted_ids(&all), 0), true))
    }

    /// `addMembers`. Each transaction of up to 49 new members raises `memberCount` on condition
    /// that it and `lastSeq` are what was read, so the 1,000 bound holds under concurrent adds and
    /// each new member starts exactly at `lastSeq`; the same condition makes the activity key read
    /// the current one, under which the new members' inbox entries are filed. A transaction that
    /// loses to a send gets the conversation as it now is from its cancellation and is tried again
    /// at once from it, so a busy conversation (a commit every few ms) is joined too. A banned
    /// user (`403 forbidden`) or one who blocks the caller (`403 blocked`) refuses the whole add
    /// (docs/api.md §27, §28). DynamoDB per round: `load_conversation` + 1 BatchGetItem (the new
    /// members' bans and their blocks of the caller) + 1 TransactWriteItems; after a lost race, the transaction alone
    /// (membership unchanged) or the whole round again.
    pub async fn add_members(
        &self,
        caller: &UserId,
        id: &ConversationId,
        users: &[UserId],
    ) -> Result<Conversation, ChatError> {
        let mut retry = self.retry();
        let (first, last_change) =
            tokio::try_join!(self.load_for_member(caller, id), self.last_change(id))?;
        let mut known = Some(first);
        let mut attempt = retry.next().await;
        while attempt {
            let (conversation, members) = match known.take() {
                Some(read) => read,
                None => self.load_for_member(caller, id).await?,
            };
            check_membership_change(conversation.kind)?;
            let existing: Vec<&str> = members.iter().map(|m| m.member_id.as_str()).collect();
            let new = members_to_add(&existing, users)?;
            let mut ids = sorted_ids(members.iter().map(|m| &m.member_id));
            // The caller's own settings, as getConversation shows them.
            let notifications = members
                .iter()
                .find(|m| &m.member_id == caller)
                .and_then(|m| m.notifications.clone())
                .unwrap_or_default();
            let answer = |c: &ConversationItem, ids| Conversation {
                notifications: Some(notifications.clone()),
                ..c.to_conversation(ids, last_change)
            };
            if new.is_empty() {
                return Ok(answer(&conversation, ids));
            }
            let chunk = &new[..new.len().min(MEMBERS_PER_TX)];
            // Read after the conversation, whose `banVersion` the transaction conditions on: a
            // ban that lands between this read and the commit cancels the commit.
            self.check_admission(caller, id, chunk).await?;
            let parts = self.add_members_parts(&conversation, members.len(), chunk)?;
            attempt = match self.transact(parts).await? {
                TxOutcome::Committed if chunk.len() == new.len() => {
                    ids.extend(chunk.iter().map(|u| (*u).clone()));
                    ids.sort();
                    let mut done = answer(&conversation, ids);
                    done.member_count = (members.len() + chunk.len()) as u32;
                    return Ok(done);
                }
                // Progress: on to the next chunk.
                TxOutcome::Committed => retry.next_now(),
                TxOutcome::Cancelled(reasons) => {
                    let now = reason_failed(&reasons, 0).and_then(|r| r.item.clone());
                    match now.map(from_item::<ConversationItem, _>).transpose()? {
                        // Only lastSeq (a send) or banVersion moved (a ban of a non-member, read
                        // again before the next try): the members read still are the members.
                        Some(now) if now.members_version == conversation.members_version => {
                            known = Some((now, members));
                            retry.next_now()
                        }
                        // Another add or a removal (or the new user joined meanwhile): someone
                        // made progress, so read again at once.
                        _ => retry.next_now(),
                    }
                }
                // A commit is in flight on the conversation item: wait, then try what was read
                // (if the commit landed, the cancellation says so).
                TxOutcome::Conflict => {
                    known = Some((conversation, members));
                    retry.next().await
                }
            };
        }
        Err(ChatError::Throttled)
    }

    /// One round of `add_members`: the conversation item's update, conditioned on what was read,
    /// then each new member's item and inbox entry.
    fn add_members_parts(
        &self,
        conversation: &ConversationItem,
        count: usize,
        chunk: &[&UserId],
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        let id = &conversation.conversation_id;
        let now = chat_domain::time::now_rfc3339();
        let mut expression = "SET memberCount = memberCount + :k, membersVersion = membersVersion + :one, membersChange = :change".to_owned();
        let mut values = vec![
            (":k", n(chunk.len() as u64)),
            (":one", n(1)),
            (":change", members_change(MembersChangeKind::Added, chunk)?),
            (":seen", n(conversation.last_seq)),
            (":count", n(count as u64)),
        ];
        let mut grown = conversation.clone();
        if grown.bucketed_since.is_none() && bucketed(count + chunk.len()) {
            // From now on its entries move in 5-second steps, starting from today's key
            // (so nothing moves now; docs/data-model.md §2.5).
            let since = grown.activity_key();
            expression.push_str(", bucketedSince = :since");
            values.push((":since", s(&since)));
            grown.bucketed_since = Some(since);
        }
        let filed = filed_at(&grown);
        let (bans, v) = ban_version_is(conversation.ban_version);
        values.extend(v);
        let condition = format!("lastSeq = :seen AND memberCount = :count AND {bans}");
        let mut parts = vec![tx::update(
            &self.table,
            keys::conversation_key(id),
            &expression,
            Some(&condition),
            &values,
        )?];
        let watermark = joining_watermark(conversation.last_seq);
        for user in chunk {
            // Joining a big group: a big-group entry (the members from before it grew get theirs
            // from the indexer).
            let member = MemberItem {
                inbox_big: grown.bucketed_since.is_some(),
                ..MemberItem::new(id, user, watermark, &now, &filed.key)
            };
            parts.push(tx::put(
                &self.table,
                member.to_item()?,
                Some("attribute_not_exists(pk)"),
                &[],
            )?);
            parts.push(self.put_inbox_entry(user, &filed, member.inbox_big)?);
        }
        Ok(parts)
    }

    /// `removeMember`: a member may remove itself, the owner anyone. The target's inbox entry is
    /// deleted where the conversation's key says it is; if the indexer had not moved it there yet,
    /// the entry left behind is never shown (no member item) and the next inbox page that meets it
    /// deletes it. DynamoDB: 1 BatchGetItem (conversation, caller, target) + 1 TransactWriteItems
    /// (both again when the conversation's admins changed meanwhile).
    pub async fn remove_member(
        &self,
        caller: &UserId,
        id: &ConversationId,
        target: &UserId,
    ) -> Result<(), ChatError> {
        let mut retry = self.retry();
        while retry.next_now() {
            let (conversation, target_member) = self.read_membership(caller, id, target).await?;
            check_membership_change(conversation.kind)?;
            check_removal(
                caller,
                target,
                conversation.owner_id.as_ref(),
                &conversation.admin_ids,
            )?;
            if !target_member {
                return Err(ChatError::NotFound);
            }
            let parts = self.removal_parts(&conversation, target, false)?;
            match self.transact_retrying(parts).await? {
                TxOutcome::Committed => return Ok(()),
                // The conversation changed since the read (its admins): read it again.
                TxOutcome::Cancelled(reasons) if super::reason_failed(&reasons, 1).is_some() => {}
                // Removed meanwhile by someone else.
                _ => return Err(ChatError::NotFound),
            }
        }
        Err(ChatError::Throttled)
    }

    /// The conversation (the caller must be a member: else `NotFound`) and whether `target` is a
    /// member. 1 strongly consistent BatchGetItem.
    pub(super) async fn read_membership(
        &self,
        caller: &UserId,
        id: &ConversationId,
        target: &UserId,
    ) -> Result<(ConversationItem, bool), ChatError> {
        let mut wanted = vec![keys::conversation_key(id), keys::member_key(id, caller)];
        if target != caller {
            // BatchGetItem refuses duplicate keys.
            wanted.push(keys::member_key(id, target));
        }
        let found = self.batch_get(wanted, true).await?;
        let has = |sk: &str| found.iter().find(|i| get_s(i, keys::SK) == Some(sk));
        let conversation = has(keys::CONVERSATION_SK).cloned();
        match (conversation, has(&keys::member_sk(caller))) {
            (Some(c), Some(_)) => Ok((from_item(c)?, has(&keys::member_sk(target)).is_some())),
            _ => Err(ChatError::NotFound),
        }
    }

    /// A member's removal: its member item, the conversation's count, version and change, its
    /// inbox entry where the conversation's key says it is. A ban (`ban`) also bumps
    /// `banVersion`, on condition that it is still the one read (docs/data-model.md §10.2).
    pub(super) fn removal_parts(
        &self,
        conversation: &ConversationItem,
        target: &UserId,
        ban: bool,
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        let id = &conversation.conversation_id;
        let mut expression = "SET memberCount = memberCount - :one, membersVersion = membersVersion + :one, membersChange = :change".to_owned();
        let mut condition = "attribute_exists(pk)".to_owned();
        let mut values = vec![
            (":one", n(1)),
            (
                ":change",
                members_change(MembersChangeKind::Removed, &[target])?,
            ),
        ];
        // An admin who leaves or is banned is an admin no more (re-added, a plain member), on
        // condition that the admins are as read (a concurrent addAdmin reads them again).
        // Not an admin as read: still none (a grant racing this removal reads again instead of
        // leaving an outsider an admin; found by probing).
        if !conversation.admin_ids.contains(target) {
            condition.push_str(" AND NOT contains(adminIds, :target)");
            values.push((":target", s(target.as_str())));
        } else {
            let was = serde_dynamo::to_attribute_value(&conversation.admin_ids)
                .map_err(ChatError::internal)?;
            let left: Vec<&UserId> = conversation
                .admin_ids
                .iter()
                .filter(|a| *a != target)
                .collect();
            condition.push_str(" AND adminIds = :admins");
            values.push((":admins", was));
            if left.is_empty() {
                expression.push_str(" REMOVE adminIds");
            } else {
                let now = serde_dynamo::to_attribute_value(&left).map_err(ChatError::internal)?;
                expression.push_str(", adminIds = :left");
                values.push((":left", now));
            }
        }
        if ban {
            let (version, v) = ban_version_is(conversation.ban_version);
            condition = format!("{condition} AND {version}");
            values.extend(v);
            expression.push_str(" ADD banVersion :one");
        }
        let mut parts = vec![
            tx::delete(
                &self.table,
                keys::member_key(id, target),
                "attribute_exists(pk)",
                &[],
            )?,
            tx::update(
                &self.table,
                keys::conversation_key(id),
                &expression,
                Some(&condition),
                &values,
            )?,
            tx::delete_unconditionally(
                &self.table,
                keys::inbox_entry_key(target, &filed_at(conversation)),
            )?,
        ];
        if conversation.bucketed_since.is_some() {
            parts.push(tx::delete_unconditionally(
                &self.table,
                keys::big_group_key(target, id),
            )?);
        }
        Ok(parts)
    }
}

/// The condition that a conversation's `banVersion` is still `version` (absent: 0).
pub(super) fn ban_version_is(version: u64) -> (&'static str, Vec<(&'static str, AttributeValue)>) {
    if version == 0 {
        ("attribute_not_exists(banVersion)", vec![])
    } else {
        ("banVersion = :bans", vec![(":bans", n(version))])
    }
}
