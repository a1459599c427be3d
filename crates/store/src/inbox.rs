//! `inbox` (docs/api.md §14) and the per-user inbox index it reads (docs/data-model.md §2.5).
//!
//! Each member has one entry per conversation, `pk = I#<userId>, sk = A#<activityKey>#<id>`. The
//! conversation's creation and `addMembers` file new members' entries in their transactions,
//! `removeMember` deletes the target's, and the `inbox-index` function moves every member's entry
//! when a conversation's activity key changes (`move_inbox_entries`, from the table's stream). A
//! member of a big group has a fixed big-group entry instead (`G#<id>`), which the page places by
//! the group's exact activity (`convert_to_big_group_entries` for a group that grew big). A page
//! reads the next entries, then the conversations and the caller's memberships themselves,
//! strongly consistently: the index only says where to look and in which order.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{DeleteRequest, PutRequest, TransactWriteItem, WriteRequest};
use futures::future::{try_join, try_join_all};

use super::attrs::{get_s, s};
use super::items::{from_item, ConversationItem, InboxEntryItem, MemberItem};
use super::{keys, sdk_error, tx, ChatStore};
use chat_domain::error::ChatError;
use chat_domain::inbox::{
    big_group_verdict, entry_verdict, with_big_groups, ConversationMove, InboxPosition,
    PageCandidate, PageWalk, Verdict, WalkedEntry,
};
use chat_domain::model::{InboxEntry, InboxPage};
use chat_domain::read_state::unread_count;
use chat_domain::{ConversationId, ConversationType, UserId};

/// BatchGetItem takes 100 keys.
const BATCH_GET_KEYS: usize = 100;
/// BatchWriteItem takes 25 requests.
const BATCH_WRITE_REQUESTS: usize = 25;
/// BatchWriteItem calls of one move in flight at once (a 1,000-member group's move is 80 calls).
const WRITES_IN_FLIGHT: usize = 4;

/// What one move wrote (for the indexer's logs and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveCount {
    pub members: usize,
    pub puts: usize,
    pub deletes: usize,
}

impl ChatStore {
    /// `inbox`. DynamoDB, whatever the number of memberships: 1 strongly consistent Query of the
    /// caller's index (the next `limit` + 1 entries) and, at the same time, 1 of its big-group
    /// entries (`big_groups`), then the conversation items, the caller's member items and the
    /// change heads of the page's entries and big groups, strongly consistent, at once: 1 Query
    /// per direct conversation, 1 BatchGetItem for the groups (more, concurrently, above 33;
    /// `read_entries_items`). When at most one BatchGetItem did, entries found stale (the caller
    /// was removed, or left over from an earlier membership, a move or a conversion) are deleted
    /// with 1 BatchWriteItem: 3 round trips at most. Only when copies (a move between its put and its delete)
    /// or entries that are not shown took places among those entries does the page read on (the
    /// next entries, then their conversations) until it holds `limit` conversations or the index
    /// ends (`PageWalk`, at most `PAGE_QUERIES` Queries and `PAGE_ROUNDS` rounds of reads).
    pub async fn inbox(
        &self,
        caller: &UserId,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<InboxPage, ChatError> {
        let after = cursor.map(InboxPosition::decode).transpose()?;
        let mut walk = PageWalk::new(limit as usize, after.clone());
        let mut conversations: HashMap<ConversationId, ConversationItem> = HashMap::new();
        let mut walked = Vec::new();
        let mut stale: Vec<InboxPosition> = Vec::new();
        // The caller's big groups (read with the first index read), their items with the first
        // round's.
        let mut big: Option<Vec<ConversationId>> = None;
        let mut big_items = None;
        // Some round read its conversations with more than one BatchGetItem.
        let mut split = false;
        while !walk.done() {
            while let Some((n, below)) = walk.to_read() {
                let (found, more) = match big {
                    Some(_) => self.inbox_entries(caller, n, below.as_ref()).await?,
                    None => {
                        let (found, groups) = try_join(
                            self.inbox_entries(caller, n, below.as_ref()),
                            self.big_groups(caller),
                        )
                        .await?;
                        big = Some(groups);
                        found
                    }
                };
                walk.read(found, more);
            }
            let covered = walk.cover();
            if covered.is_empty() {
                break;
            }
            // Entries come newest first: a conversation's first one is its newest; a lower one is
            // a copy a move has not deleted yet.
            let (firsts, copies): (Vec<WalkedEntry>, Vec<WalkedEntry>) =
                covered.into_iter().partition(|e| e.first);
            let big_now = match big_items {
                None => big.clone().unwrap_or_default(),
                Some(_) => Vec::new(),
            };
            let ids: Vec<ConversationId> = firsts
                .iter()
                .map(|e| e.position.conversation_id.clone())
                .chain(big_now)
                .collect();
            let (members, heads, calls) = self
                .read_entries_items(caller, &ids, &mut conversations)
                .await?;
            split |= calls > 1;

            // A lower copy goes once its conversation exists (while a group is being created, a
            // retried creation's entries can be the lower ones).
            stale.extend(
                copies
                    .into_iter()
                    .filter(|e| conversations.contains_key(&e.position.conversation_id))
                    .map(|e| e.position),
            );
            let bigs = big.as_deref().unwrap_or_default();
            let shown = Self::judge_entries(
                caller,
                firsts,
                (&conversations, bigs),
                (&members, &heads),
                &mut walked,
                &mut stale,
            );
            walk.shown(shown);
            big_items.get_or_insert((members, heads));
        }
        let bigs = match big {
            Some(b) => b,
            None => self.big_groups(caller).await?,
        };
        let (members, heads) = match big_items {
            Some(read) => read,
            None => {
                let (m, h, _) = self
                    .read_entries_items(caller, &bigs, &mut conversations)
                    .await?;
                (m, h)
            }
        };
        let (big_shown, big_stale) =
            Self::judge_big_groups(caller, &bigs, &conversations, (&members, &heads));
        if !split && (!stale.is_empty() || !big_stale.is_empty()) {
            self.delete_stale_entries(caller, &stale, &big_stale).await;
        }
        let (conversations, next) = with_big_groups(
            limit as usize,
            walked,
            walk.cursor().cloned(),
            big_shown,
            after.as_ref(),
        );
        Ok(InboxPage {
            conversations,
            next_cursor: next.as_ref().map(InboxPosition::encode),
        })
    }

    /// The caller's big groups (`G#` entries, docs/data-model.md §2.5). DynamoDB: 1 strongly
    /// consistent Query (another per 1 MB: 10,000 groups).
    async fn big_groups(&self, caller: &UserId) -> Result<Vec<ConversationId>, ChatError> {
        let mut groups = Vec::new();
        let mut start = None;
        loop {
            let found = self
                .db
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND begins_with(sk, :big)")
                .expression_attribute_values(":pk", s(keys::inbox_pk(caller)))
                .expression_attribute_values(":big", s(keys::BIG_GROUP_PREFIX))
                .projection_expression("sk")
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| sdk_error("Query", e))?;
            groups.extend(found.items().iter().filter_map(|i| {
                get_s(i, keys::SK)?
                    .strip_prefix(keys::BIG_GROUP_PREFIX)
                    .and_then(ConversationId::parse)
            }));
            match found.last_evaluated_key {
                Some(k) => start = Some(k),
                None => return Ok(groups),
            }
        }
    }

    /// The caller's big groups a page may show, at their exact activity, and those it is no
    /// longer a member of. No I/O.
    fn judge_big_groups(
        caller: &UserId,
        bigs: &[ConversationId],
        conversations: &HashMap<ConversationId, ConversationItem>,
        (members, heads): (
            &HashMap<ConversationId, MemberItem>,
            &HashMap<ConversationId, u64>,
        ),
    ) -> (Vec<PageCandidate<InboxEntry>>, Vec<ConversationId>) {
        let (mut shown, mut stale) = (Vec::new(), Vec::new());
        for id in bigs {
            let (c, m) = (conversations.get(id), members.get(id));
            let removed = c.is_some_and(|c| c.removed_last(caller));
            match (big_group_verdict(c.is_some(), m.is_some(), removed), c, m) {
                (Verdict::Show, Some(c), Some(m)) => {
                    let last_change = heads.get(id).copied().unwrap_or(0);
                    let (at, entry) = entry(caller, c, m, last_change);
                    shown.push(PageCandidate {
                        paging: at.clone(),
                        shown_at: at,
                        entry,
                    });
                }
                (Verdict::Stale, _, _) => stale.push(id.clone()),
                _ => {}
            }
        }
        (shown, stale)
    }

    /// A round's reads for `inbox`: the conversation items of its entries (into
    /// `conversations`, kept across rounds), the caller's member items and the conversations'
    /// `lastChange` (from their change heads) (returned), strongly consistent, concurrently: a
    /// direct conversation's three in 1 Query of its log partition (`keys::DIRECT_HEAD_RANGE`:
    /// the two members and the head beside the conversation item, about 1 KB, 1 read unit), a
    /// group's in 1 BatchGetItem per 33 groups (3 read units each); and how many BatchGetItems.
    async fn read_entries_items(
        &self,
        caller: &UserId,
        ids: &[ConversationId],
        conversations: &mut HashMap<ConversationId, ConversationItem>,
    ) -> Result<
        (
            HashMap<ConversationId, MemberItem>,
            HashMap<ConversationId, u64>,
            usize,
        ),
        ChatError,
    > {
        let (direct, groups): (Vec<&ConversationId>, Vec<&ConversationId>) = ids
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .partition(|id| id.is_direct());
        let wanted: Vec<_> = groups
            .into_iter()
            .flat_map(|id| {
                [
                    keys::conversation_key(id),
                    keys::member_key(id, caller),
                    keys::change_head_key(id),
                ]
            })
            .collect();
        let calls = wanted.len().div_ceil(BATCH_GET_KEYS);
        let batches = try_join_all(
            wanted
                .chunks(BATCH_GET_KEYS)
                .map(|chunk| self.batch_get(chunk.to_vec(), true)),
        );
        let (first, end) = keys::DIRECT_HEAD_RANGE;
        let heads = try_join_all(direct.into_iter().map(|id| {
            self.query_partition(
                keys::conversation_pk(id),
                Some((first.to_owned(), end.to_owned())),
                None,
            )
        }));
        let (batches, heads) = try_join(batches, heads).await?;
        let mine = keys::member_sk(caller);
        let mut members: HashMap<ConversationId, MemberItem> = HashMap::new();
        let mut changes: HashMap<ConversationId, u64> = HashMap::new();
        for item in batches.into_iter().chain(heads).flatten() {
            match get_s(&item, keys::SK) {
                Some(keys::CONVERSATION_SK) => {
                    let c: ConversationItem = from_item(item)?;
                    conversations.insert(c.conversation_id.clone(), c);
                }
                Some(keys::CHANGE_HEAD_SK) => {
                    let h: crate::items::ChangeItem = from_item(item)?;
                    changes.insert(h.conversation_id, h.change_seq);
                }
                // A direct conversation's Query reads its peer's member item too.
                Some(sk) if sk == mine => {
                    let m: MemberItem = from_item(item)?;
                    members.insert(m.conversation_id.clone(), m);
                }
                _ => {}
            }
        }
        Ok((members, changes, calls))
    }

    /// Sorts a round's first entries by their verdict: shown ones into `entries`, stale ones
    /// into `stale`; returns how many are shown. An entry of a conversation the caller also has a
    /// big-group entry of (`bigs`) is left from before the indexer converted it: stale. No I/O.
    fn judge_entries(
        caller: &UserId,
        firsts: Vec<WalkedEntry>,
        (conversations, bigs): (
            &HashMap<ConversationId, ConversationItem>,
            &[ConversationId],
        ),
        (members, heads): (
            &HashMap<ConversationId, MemberItem>,
            &HashMap<ConversationId, u64>,
        ),
        entries: &mut Vec<PageCandidate<InboxEntry>>,
        stale: &mut Vec<InboxPosition>,
    ) -> usize {
        let mut shown = 0;
        for e in firsts {
            let p = e.position;
            let c = conversations.get(&p.conversation_id);
            let m = members.get(&p.conversation_id);
            let verdict = if bigs.contains(&p.conversation_id) && c.is_some() {
                Verdict::Stale
            } else {
                entry_verdict(
                    &p.key,
                    c.is_some(),
                    m.map(|m| m.inbox_key.as_deref()),
                    c.is_some_and(|c| c.removed_last(caller)),
                )
            };
            match (verdict, c, m) {
                (Verdict::Show, Some(c), Some(m)) => {
                    let last_change = heads.get(&p.conversation_id).copied().unwrap_or(0);
                    let (at, entry) = entry(caller, c, m, last_change);
                    entries.push(PageCandidate {
                        paging: p,
                        shown_at: at,
                        entry,
                    });
                    shown += 1;
                }
                (Verdict::Stale, _, _) => stale.push(p),
                _ => {}
            }
        }
        shown
    }

    /// The caller's next `n` index entries, newest first, below `below` (or from the top); and
    /// whether the index may hold more below them. DynamoDB: 1 strongly consistent Query.
    async fn inbox_entries(
        &self,
        caller: &UserId,
        n: usize,
        below: Option<&InboxPosition>,
    ) -> Result<(Vec<InboxPosition>, bool), ChatError> {
        let query = self
            .db
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .scan_index_forward(false)
            .limit(n as i32)
            .expression_attribute_values(":pk", s(keys::inbox_pk(caller)));
        let query = match below {
            Some(p) => query
                .key_condition_expression("pk = :pk AND sk < :after")
                .expression_attribute_values(":after", s(keys::inbox_sk(p))),
            None => query
                .key_condition_expression("pk = :pk AND begins_with(sk, :entry)")
                .expression_attribute_values(":entry", s(keys::INBOX_ENTRY_PREFIX)),
        };
        let found = query.send().await.map_err(|e| sdk_error("Query", e))?;
        let more = found.last_evaluated_key().is_some();
        let entries = found
            .items()
            .iter()
            .filter_map(|i| get_s(i, keys::SK).and_then(keys::inbox_position_of_sk))
            .collect();
        Ok((entries, more))
    }

    /// Best effort, one attempt: an entry that stays is skipped again by the next page.
    async fn delete_stale_entries(
        &self,
        caller: &UserId,
        stale: &[InboxPosition],
        big: &[ConversationId],
    ) {
        let requests = stale
            .iter()
            .map(|p| keys::inbox_entry_key(caller, p))
            .chain(big.iter().map(|id| keys::big_group_key(caller, id)))
            .take(BATCH_WRITE_REQUESTS)
            .map(delete_request)
            .collect::<Result<Vec<_>, _>>();
        let sent = match requests {
            Ok(r) => self
                .db
                .batch_write_item()
                .request_items(&self.table, r)
                .send()
                .await
                .map_err(|e| sdk_error("BatchWriteItem", e)),
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "deleting stale inbox entries failed");
        }
    }

    /// A transaction part filing `user`'s inbox entry at `position`, or its big-group entry
    /// (`big`: a member of a group that has had more than 200 members).
    pub(super) fn put_inbox_entry(
        &self,
        user: &UserId,
        position: &InboxPosition,
        big: bool,
    ) -> Result<TransactWriteItem, ChatError> {
        let item = if big {
            InboxEntryItem::big_group(user, &position.conversation_id)?
        } else {
            InboxEntryItem::to_item(user, position)?
        };
        tx::put(&self.table, item, None, &[])
    }

    /// The current members of a conversation, each with the key its inbox entry was filed under
    /// when it joined. DynamoDB: 1 strongly consistent Query of the member partition (more pages
    /// only past 1 MB, about 2,000 members).
    pub async fn member_inbox_keys(
        &self,
        id: &ConversationId,
    ) -> Result<Vec<(UserId, Option<String>)>, ChatError> {
        self.member_items(id, Some("memberId, inboxKey"))
            .await?
            .iter()
            .map(|item| {
                let user = get_s(item, "memberId")
                    .and_then(UserId::parse)
                    .ok_or_else(|| ChatError::internal("member item without memberId"))?;
                Ok((user, get_s(item, "inboxKey").map(str::to_owned)))
            })
            .collect()
    }

    /// The indexer's move of one conversation: every current member's entry to `mv.to`, new
    /// entries first and then the old ones away. Idempotent, so a redelivered batch does it again
    /// harmlessly. DynamoDB: `member_inbox_keys` (none when the move names its members: a direct
    /// conversation), then BatchWriteItem of 25 (a 1:1 message: 1 of 2 puts, then 1 of 2
    /// deletes: 4 write units), unprocessed items retried until the deadline.
    pub async fn move_inbox_entries(&self, mv: &ConversationMove) -> Result<MoveCount, ChatError> {
        let members = match &mv.members {
            Some(members) => members.clone(),
            None => self.member_inbox_keys(&mv.conversation_id).await?,
        };
        let (mut puts, mut deletes) = (Vec::new(), Vec::new());
        let mut count = MoveCount {
            members: members.len(),
            ..MoveCount::default()
        };
        for (user, joined) in &members {
            let Some(m) = mv.for_member(joined.as_deref()) else {
                continue;
            };
            let at = |key: &str| InboxPosition {
                key: key.to_owned(),
                conversation_id: mv.conversation_id.clone(),
            };
            puts.push(put_request(InboxEntryItem::to_item(user, &at(&m.put))?)?);
            for key in &m.deletes {
                deletes.push(delete_request(keys::inbox_entry_key(user, &at(key)))?);
            }
        }
        count.puts = puts.len();
        count.deletes = deletes.len();
        self.batch_write(puts).await?;
        self.batch_write(deletes).await?;
        Ok(count)
    }

    /// The indexer's conversion of a group that grew past 200 members (`mv.convert`): each member
    /// without a big-group entry gets one, then its moving entry is deleted wherever it can be;
    /// once every member read has one, the conversation item says so (`inboxByRead`), and its
    /// later records move nothing and read nothing. Idempotent. DynamoDB: the members' Query,
    /// BatchWriteItem of 25 (puts, then deletes), 1 UpdateItem of the conversation item (again
    /// while a send's transaction holds it).
    pub async fn convert_to_big_group_entries(
        &self,
        mv: &ConversationMove,
    ) -> Result<MoveCount, ChatError> {
        let id = &mv.conversation_id;
        let members = self
            .member_items(id, Some("conversationId, memberId, inboxKey, inboxBig"))
            .await?;
        let (mut puts, mut deletes) = (Vec::new(), Vec::new());
        for item in &members {
            let m: MemberItem = from_item(item.clone())?;
            if m.inbox_big {
                continue;
            }
            puts.push(put_request(InboxEntryItem::big_group(&m.member_id, id)?)?);
            for key in mv.conversion_deletes(m.inbox_key.as_deref()) {
                let at = InboxPosition {
                    key,
                    conversation_id: id.clone(),
                };
                deletes.push(delete_request(keys::inbox_entry_key(&m.member_id, &at))?);
            }
        }
        let count = MoveCount {
            members: members.len(),
            puts: puts.len(),
            deletes: deletes.len(),
        };
        self.batch_write(puts).await?;
        self.batch_write(deletes).await?;
        let update = self
            .conversation_update(id, "SET inboxByRead = :yes", "attribute_exists(pk)")
            .expression_attribute_values(
                ":yes",
                aws_sdk_dynamodb::types::AttributeValue::Bool(true),
            );
        let mut retry = self.retry();
        while retry.next().await {
            match update.clone().send().await {
                Ok(_) => return Ok(count),
                Err(e)
                    if super::throttled(&e) || e.code() == Some("TransactionConflictException") => {
                }
                Err(e) => return Err(sdk_error("UpdateItem", e)),
            }
        }
        Err(ChatError::Throttled)
    }

    /// BatchWriteItem calls of 25, a few at a time, each retrying its unprocessed items.
    pub(super) async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<(), ChatError> {
        self.batch_write_to(&self.table, requests).await
    }

    /// As `batch_write`, to the table `table`.
    pub(super) async fn batch_write_to(
        &self,
        table: &str,
        requests: Vec<WriteRequest>,
    ) -> Result<(), ChatError> {
        for wave in requests.chunks(BATCH_WRITE_REQUESTS * WRITES_IN_FLIGHT) {
            let calls = wave
                .chunks(BATCH_WRITE_REQUESTS)
                .map(|c| self.batch_write_call(table, c.to_vec()));
            try_join_all(calls).await?;
        }
        Ok(())
    }

    async fn batch_write_call(
        &self,
        table: &str,
        requests: Vec<WriteRequest>,
    ) -> Result<(), ChatError> {
        let mut pending = requests;
        let mut retry = self.retry();
        while retry.next().await {
            if pending.is_empty() {
                return Ok(());
            }
            let resp = self
                .db
                .batch_write_item()
                .request_items(table, std::mem::take(&mut pending))
                .send()
                .await
                .map_err(|e| sdk_error("BatchWriteItem", e))?;
            if let Some(mut unprocessed) = resp.unprocessed_items {
                pending = unprocessed.remove(table).unwrap_or_default();
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(ChatError::Throttled)
        }
    }
}

/// A BatchWriteItem entry putting `item` (for `batch_write`).
pub(super) fn put_request(item: super::Item) -> Result<WriteRequest, ChatError> {
    let put = PutRequest::builder()
        .set_item(Some(item))
        .build()
        .map_err(ChatError::internal)?;
    Ok(WriteRequest::builder().put_request(put).build())
}

/// A BatchWriteItem entry deleting the item at `key`.
pub(super) fn delete_request(key: super::Item) -> Result<WriteRequest, ChatError> {
    let delete = DeleteRequest::builder()
        .set_key(Some(key))
        .build()
        .map_err(ChatError::internal)?;
    Ok(WriteRequest::builder().delete_request(delete).build())
}

/// One conversation as the caller's inbox shows it: counts from the two strongly consistent
/// reads, so `unreadCount` is exact right after a read or a send.
fn entry(
    caller: &UserId,
    c: &ConversationItem,
    m: &MemberItem,
    last_change: u64,
) -> (InboxPosition, InboxEntry) {
    let last_read_seq = m.last_read_seq.min(c.last_seq);
    let peer_id = match c.kind {
        ConversationType::Direct => c.direct_members.iter().find(|u| *u != caller).cloned(),
        ConversationType::Group => None,
    };
    (
        InboxPosition {
            key: c.activity().to_owned(),
            conversation_id: c.conversation_id.clone(),
        },
        InboxEntry {
            last_message: c.preview(),
            conversation_id: c.conversation_id.clone(),
            kind: c.kind,
            title: c.title.clone(),
            peer_id,
            member_count: c.member_count,
            last_seq: c.last_seq,
            last_read_seq,
            unread_count: unread_count(c.last_seq, last_read_seq),
            last_message_at: c.last_message_at.clone(),
            last_change,
            notifications: m.notifications.clone().unwrap_or_default(),
        },
    )
}
