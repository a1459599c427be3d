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

use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{DeleteRequest, PutRequest, TransactWriteItem, WriteRequest};
use futures::future::{try_join, try_join_all};

use super::attrs::Item;
use super::attrs::{get_n, get_s, n, s};
use super::items::{from_item, ConversationItem, InboxEntryItem, MemberItem, MoveStamp};
use super::{keys, sdk_error, tx, ChatStore};
use chat_domain::error::ChatError;
use chat_domain::inbox::{
    big_group_verdict, entry_verdict, with_big_groups, ConversationMove, InboxCursor,
    InboxPosition, MoveOrigin, PageCandidate, PageWalk, Verdict, WalkedEntry, MOVE_CHAIN_MS,
    MOVE_MARGIN_MS,
};
use chat_domain::model::{InboxEntry, InboxPage};
use chat_domain::read_state::unread_count;
use chat_domain::{ConversationId, ConversationType, UserId};

/// An index entry's attributes set by the indexer's move: when (unix ms), from which key and
/// since when its chain of moves runs (`MoveOrigin`, docs/data-model.md §2.5); short, since a
/// page reads 21 entries in one 4 KB read unit.
pub(crate) const MOVED_AT: &str = "mt";
pub(crate) const MOVED_FROM: &str = "mf";
pub(crate) const MOVES_SINCE: &str = "ms";
/// How far back (ms) the movers' Query looks for entries filed since its walk's last page read:
/// the indexer's lag, with room for its retries.
const MOVER_WINDOW_MS: u64 = 15 * 60 * 1000;
/// Conversations a cursor names at most (`next_cursor`): about 60 bytes each.
const MAX_SHOWN_IN_CURSOR: usize = 64;
/// Entries the movers' Query reads at most (those filed in the window above the cursor).
const MOVER_SCAN: i32 = 200;

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
        let read_at = chat_domain::time::unix_millis(chat_domain::time::now());
        let cursor = cursor.map(InboxCursor::decode).transpose()?;
        let after = cursor.as_ref().map(|c| c.position.clone());
        let mut walk = PageWalk::new(limit as usize, after.clone());
        // Since when the chain of moves of each moved entry the page read runs (`MoveOrigin`;
        // its move time on entries stamped before chains), by conversation.
        let mut moves_since: HashMap<ConversationId, u64> = HashMap::new();
        // Conversations that moved up past the walk since its last page (read with the first
        // index read, their items with the first round's).
        let mut movers: Option<Vec<InboxPosition>> = None;
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
                    Some(_) => {
                        self.inbox_entries(caller, n, below.as_ref(), &mut moves_since)
                            .await?
                    }
                    None => {
                        let (found, groups, moved) = tokio::try_join!(
                            self.inbox_entries(caller, n, below.as_ref(), &mut moves_since),
                            self.big_groups(caller),
                            self.inbox_movers(caller, cursor.as_ref()),
                        )?;
                        big = Some(groups);
                        movers = Some(noting(moved, &mut moves_since));
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
            // a copy a move has not deleted yet. An entry of a conversation shown above the walk
            // (a mover, now or on an earlier page) is such a copy too: left out, left alone.
            let above: Vec<&ConversationId> = movers
                .iter()
                .flatten()
                .map(|m| &m.conversation_id)
                .collect();
            let (firsts, copies): (Vec<WalkedEntry>, Vec<WalkedEntry>) = covered
                .into_iter()
                .filter(|e| {
                    let id = &e.position.conversation_id;
                    !above.contains(&id) && !cursor.as_ref().is_some_and(|c| c.hides(id))
                })
                .partition(|e| e.first);
            let big_now = match big_items {
                None => big
                    .iter()
                    .flatten()
                    .chain(movers.iter().flatten().map(|m| &m.conversation_id))
                    .cloned()
                    .collect(),
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
        let movers = match movers {
            Some(m) => m,
            None => {
                let moved = self.inbox_movers(caller, cursor.as_ref()).await?;
                noting(moved, &mut moves_since)
            }
        };
        let (members, heads) = match big_items {
            Some(read) => read,
            None => {
                let ids: Vec<ConversationId> = bigs
                    .iter()
                    .chain(movers.iter().map(|m| &m.conversation_id))
                    .cloned()
                    .collect();
                let (m, h, _) = self
                    .read_entries_items(caller, &ids, &mut conversations)
                    .await?;
                (m, h)
            }
        };
        // The movers are shown above the walk (their entries are above its cursor), unless
        // judged otherwise as any entry is.
        let moved = movers
            .into_iter()
            .map(|position| WalkedEntry {
                position,
                first: true,
            })
            .collect();
        Self::judge_entries(
            caller,
            moved,
            (&conversations, &bigs),
            (&members, &heads),
            &mut walked,
            &mut stale,
        );
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
        let next = next_cursor(cursor.as_ref(), next, read_at, &conversations, &moves_since);
        Ok(InboxPage {
            conversations,
            next_cursor: next.as_ref().map(InboxCursor::encode),
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
    /// whether the index may hold more below them; since when each moved one's chain of moves
    /// runs, into `moves_since`. DynamoDB: 1 strongly consistent Query.
    async fn inbox_entries(
        &self,
        caller: &UserId,
        n: usize,
        below: Option<&InboxPosition>,
        moves_since: &mut HashMap<ConversationId, u64>,
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
        let mut entries = Vec::new();
        for item in found.items() {
            let Some(p) = get_s(item, keys::SK).and_then(keys::inbox_position_of_sk) else {
                continue;
            };
            if let Some(at) = get_n(item, MOVES_SINCE).or_else(|| get_n(item, MOVED_AT)) {
                moves_since.entry(p.conversation_id.clone()).or_insert(at);
            }
            entries.push(p);
        }
        Ok((entries, more))
    }

    /// The entries the indexer moved up past the walk of `cursor` since its page read the index,
    /// from where the walk had not reached, that its pages did not show
    /// (`InboxCursor::shows_mover`), with since when each one's chain of moves runs. None
    /// without such a cursor. DynamoDB: 1 strongly consistent Query of the entries above the
    /// cursor filed in the last `MOVER_WINDOW_MS` (a mover's key is its newest message's time: at
    /// most the indexer's lag before its move), only the moved ones returned.
    async fn inbox_movers(
        &self,
        caller: &UserId,
        cursor: Option<&InboxCursor>,
    ) -> Result<Vec<(InboxPosition, u64)>, ChatError> {
        let Some((c, read_at)) = cursor.and_then(|c| Some((c, c.read_at?))) else {
            return Ok(Vec::new());
        };
        let recent = time_key(read_at.saturating_sub(MOVER_WINDOW_MS));
        let from = keys::inbox_sk(&c.position).max(format!("{}{recent}", keys::INBOX_ENTRY_PREFIX));
        let found = self
            .db
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :end")
            .filter_expression("#at > :since")
            .expression_attribute_names("#at", MOVED_AT)
            .expression_attribute_values(":pk", s(keys::inbox_pk(caller)))
            .expression_attribute_values(":from", s(from))
            // Moving entries only: the big-group entries (`G#…`) sort after them.
            .expression_attribute_values(":end", s(keys::INBOX_ENTRIES_END))
            .expression_attribute_values(":since", n(read_at.saturating_sub(MOVE_MARGIN_MS)))
            .limit(MOVER_SCAN)
            .send()
            .await
            .map_err(|e| sdk_error("Query", e))?;
        // One per conversation, its newest entry: during a move both its new entry and the one
        // it leaves exist, and within a chain both name the origin below the walk (found by
        // probing: a group moved twice in quick succession came twice on one page).
        let mut movers: HashMap<ConversationId, (InboxPosition, u64)> = HashMap::new();
        for i in found.items() {
            let Some(p) = get_s(i, keys::SK).and_then(keys::inbox_position_of_sk) else {
                continue;
            };
            let (Some(at), Some(from)) = (get_n(i, MOVED_AT), get_s(i, MOVED_FROM)) else {
                continue;
            };
            if c.shows_mover(&p, at, from) {
                let since = get_n(i, MOVES_SINCE).unwrap_or(at);
                match movers.get(&p.conversation_id) {
                    Some((newer, _)) if *newer > p => {}
                    _ => {
                        movers.insert(p.conversation_id.clone(), (p, since));
                    }
                }
            }
        }
        Ok(movers.into_values().collect())
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
    /// entries first and then the old ones away, each stamped with its chain of moves' origin
    /// (`MoveOrigin`, from the entry it leaves). Idempotent, so a redelivered batch does it again
    /// harmlessly. DynamoDB: `member_inbox_keys` (none when the move names its members: a direct
    /// conversation); `previous_origin`'s eventually consistent GetItem (0.5 read units); then
    /// BatchWriteItem of 25 (a 1:1 message: 1 of 2 puts, then 1 of 2 deletes: 4 write units),
    /// unprocessed items retried until the deadline.
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
        let previous = self.previous_origin(mv, &members).await?;
        let now = chat_domain::time::unix_millis(chat_domain::time::now());
        let origin = mv
            .from
            .first()
            .map(|left| MoveOrigin::of_move(previous, left, now));
        for (user, joined) in &members {
            let Some(m) = mv.for_member(joined.as_deref()) else {
                continue;
            };
            let at = |key: &str| InboxPosition {
                key: key.to_owned(),
                conversation_id: mv.conversation_id.clone(),
            };
            // Stamped with the lowest place it can have been at since its chain started (where a
            // walk could have missed it).
            let stamp = m
                .deletes
                .first()
                .zip(origin.as_ref())
                .map(|(lowest, origin)| MoveStamp {
                    at: now,
                    from: origin.for_member(joined.as_deref(), lowest),
                    since: origin.since,
                });
            puts.push(put_request(InboxEntryItem::moved(
                user,
                &at(&m.put),
                stamp.as_ref(),
            )?)?);
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

    /// The origin stamped on the entry this move leaves (`mv.from`'s first key), read from the
    /// member who has been one longest (the first to join: its entry follows every move). None
    /// when that entry was never moved (or never stamped with one). DynamoDB: 1 eventually
    /// consistent GetItem (an entry is written once and never changed, so any copy read is
    /// exact); only when it finds none (not copied there yet, or a batch delivered again after
    /// its move), 1 strongly consistent GetItem at once of that member's entry at each key the
    /// move knows, `mv.to` included (a redelivered move's own stamp).
    async fn previous_origin(
        &self,
        mv: &ConversationMove,
        members: &[(UserId, Option<String>)],
    ) -> Result<Option<MoveOrigin>, ChatError> {
        let Some((user, _)) = members.iter().min_by(|a, b| a.1.cmp(&b.1)) else {
            return Ok(None);
        };
        let key = |k: &String| {
            keys::inbox_entry_key(
                user,
                &InboxPosition {
                    key: k.clone(),
                    conversation_id: mv.conversation_id.clone(),
                },
            )
        };
        let origin = |item: &Item| from_item::<InboxEntryItem, _>(item.clone()).map(|e| e.origin());
        let get = |k: &String, consistent: bool| {
            self.db
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key(k)))
                .consistent_read(consistent)
                .send()
        };
        let Some(left) = mv.from.first() else {
            return Ok(None);
        };
        let found = get(left, false)
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        if let Some(item) = found.item() {
            return origin(item);
        }
        let everywhere = mv.from.iter().chain([&mv.to]).map(|k| get(k, true));
        let found = try_join_all(everywhere)
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        // The lowest found: the entry this member's last move left behind (the keys in order).
        match found.iter().find_map(|f| f.item()) {
            Some(item) => origin(item),
            None => Ok(None),
        }
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
/// The activity key of a time (unix ms).
fn time_key(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .map(chat_domain::time::rfc3339)
        .unwrap_or_default()
}

/// The movers to show, with since when each one's chain of moves runs noted in `moves_since`.
fn noting(
    moved: Vec<(InboxPosition, u64)>,
    moves_since: &mut HashMap<ConversationId, u64>,
) -> Vec<InboxPosition> {
    moved
        .into_iter()
        .map(|(p, at)| {
            moves_since.insert(p.conversation_id.clone(), at);
            p
        })
        .collect()
}

/// The next page's cursor, from the position `with_big_groups` gave (`next`): read at
/// `read_at`, with what the walk has shown (before, and on `page`) whose chain of moves may
/// still run (`MOVE_CHAIN_MS`, and the margin): those may still come up as movers. A position
/// above the request's cursor means movers filled the page: the walk then stays where it was, as
/// of the same read.
fn next_cursor(
    cursor: Option<&InboxCursor>,
    next: Option<InboxPosition>,
    read_at: u64,
    page: &[InboxEntry],
    moves_since: &HashMap<ConversationId, u64>,
) -> Option<InboxCursor> {
    let next = next?;
    let on_page = page.iter().filter_map(|e| {
        let at = moves_since.get(&e.conversation_id)?;
        Some((e.conversation_id.clone(), *at))
    });
    let before = cursor
        .map(|c| c.shown.iter().cloned())
        .into_iter()
        .flatten();
    let shown: BTreeSet<(ConversationId, u64)> = before.chain(on_page).collect();
    let overflow = cursor.filter(|c| next > c.position);
    let (position, read_at) = match overflow {
        Some(c) => (c.position.clone(), c.read_at.unwrap_or(read_at)),
        None => (next, read_at),
    };
    // A conversation shown may come up as a mover while its chain of moves runs: kept as long.
    let since = read_at.saturating_sub(MOVE_CHAIN_MS + MOVE_MARGIN_MS);
    let mut shown: Vec<(ConversationId, u64)> =
        shown.into_iter().filter(|(_, at)| *at > since).collect();
    // The latest moves first, as many as keep the cursor within a few KB of URL: a conversation
    // left out could at worst be shown twice, never skipped.
    shown.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    shown.truncate(MAX_SHOWN_IN_CURSOR);
    Some(InboxCursor {
        position,
        read_at: Some(read_at),
        shown,
    })
}

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
