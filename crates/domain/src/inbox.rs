//! The inbox (docs/api.md §14, docs/data-model.md §2.5): each member's conversations filed by
//! activity in a per-user index, an opaque cursor, and the rules that keep the index exact enough:
//!
//! - **Activity key**: where a conversation's entries are filed. Its activity (newest message,
//!   else creation) exactly; for a group that has had more than 200 members, rounded down to a
//!   5-second step, so that its thousand entries move at most once per 5 s. It never goes back.
//! - **Moves**: the indexer files every member's entry under the new key when the key changes;
//!   which old keys an entry can sit at follows from the stream records alone (`ConversationMove`).
//! - **Which entries count**: an entry is shown only when the member item read with it says the
//!   reader is a member, and that it was filed during this membership (`entry_verdict`).
//! - **A full page**: copies (a move between its put and its delete) and entries not shown take
//!   no place in a page; it reads on until it holds `limit` conversations or the index ends
//!   (`PageWalk`).
//! - **Big groups are read, not moved**: a member of a group that has had more than 200 members
//!   has a fixed big-group entry instead of a moving one (a message would move a thousand
//!   entries); every page reads the caller's big groups and places them by their exact activity
//!   among the index's entries (`with_big_groups`).

use std::collections::{BTreeSet, HashSet, VecDeque};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use time::OffsetDateTime;

use super::ids::{ConversationId, UserId};
use crate::error::ChatError;

/// Groups above this many members get 5-second activity keys (and keep them: `bucketed_since`).
pub const BUCKETED_ABOVE_MEMBERS: usize = 200;
/// The step of a bucketed activity key, in milliseconds.
pub const BUCKET_MILLIS: i128 = 5_000;

/// A conversation's activity: the time of its newest message, or its creation time while it has
/// none; the later of the two, since the first message's time comes from another server's clock
/// and may be a little before the creation time. RFC 3339 fixed width: sorts as time.
pub fn activity<'a>(created_at: &'a str, last_message_at: Option<&'a str>) -> &'a str {
    match last_message_at {
        Some(m) if m > created_at => m,
        _ => created_at,
    }
}

/// Whether a group of this many members files its entries under 5-second keys from now on.
pub fn bucketed(member_count: usize) -> bool {
    member_count > BUCKETED_ABOVE_MEMBERS
}

/// The key a conversation's inbox entries are filed under. `bucketed_since` is the activity key the
/// conversation had when it first got more than 200 members: from then on the key is the activity
/// rounded down to 5 seconds, but never below that. So the key never goes back, whether members
/// come or go, and a big group's entries move at most once per 5 seconds.
pub fn activity_key(activity: &str, bucketed_since: Option<&str>) -> String {
    match bucketed_since {
        None => activity.to_owned(),
        Some(floor) => {
            let step = bucket_start(activity);
            if step.as_str() > floor {
                step
            } else {
                floor.to_owned()
            }
        }
    }
}

/// The start of the 5-second step an RFC 3339 time falls in (a malformed time is kept as is).
fn bucket_start(t: &str) -> String {
    let Some(parsed) = crate::time::parse_rfc3339(t) else {
        return t.to_owned();
    };
    let ms = parsed.unix_timestamp_nanos() / 1_000_000;
    let start = ms - ms.rem_euclid(BUCKET_MILLIS);
    match OffsetDateTime::from_unix_timestamp_nanos(start * 1_000_000) {
        Ok(s) => crate::time::rfc3339(s),
        Err(_) => t.to_owned(),
    }
}

/// A place in a user's inbox index: an activity key and the conversation (ties broken by id, so
/// positions never coincide). A cursor is the position of the last index entry a page read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InboxPosition {
    /// RFC 3339, fixed width: sorts as time.
    pub key: String,
    pub conversation_id: ConversationId,
}

/// How long after its page a move still counts as one its walk may not have seen: a move is
/// stamped (`movedAt`) before its entry is written, so a page that ran just after the stamp may
/// have read the entry at its old place; and two instances' clocks differ by milliseconds.
pub const MOVE_MARGIN_MS: u64 = 10_000;

/// How long a chain of moves keeps the origin it started from. A walk that moved on within this
/// time meets every conversation that moved past it: its entry, however often it moved since,
/// still says it came from below.
pub const MOVE_CHAIN_MS: u64 = 15 * 60 * 1000;

/// Where a conversation's entry was before its current chain of moves (`key`), and when that
/// chain started (`since`, unix ms). Each moved entry carries its chain's origin, so an entry that
/// moved up past a walk and then again (above the walk by then) still says it came from below;
/// a walk's cursor keeps the conversations it showed while their chains run (`next_cursor`), so
/// one it showed is never shown again as a mover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveOrigin {
    pub key: String,
    pub since: u64,
}

impl MoveOrigin {
    /// The origin of a move at `now` away from the key `left`, whose entry carried `previous` (its
    /// own move's origin; None: it never moved, or its stamp is unknown): the chain goes on
    /// while it is younger than `MOVE_CHAIN_MS`; else a new one starts here, from `left`. A fixed
    /// span, not a sliding one: a cursor can then tell how long a conversation it showed may
    /// come back as a mover.
    pub fn of_move(previous: Option<MoveOrigin>, left: &str, now: u64) -> MoveOrigin {
        match previous {
            Some(p) if now.saturating_sub(p.since) < MOVE_CHAIN_MS && p.key.as_str() <= left => p,
            _ => MoveOrigin {
                key: left.to_owned(),
                since: now,
            },
        }
    }

    /// The origin stamped on the entry of a member filed at `joined` when it joined, whose move
    /// leaves `lowest` (its lowest old key): never below where its own entry started.
    pub fn for_member(&self, joined: Option<&str>, lowest: &str) -> String {
        let start = joined.unwrap_or("").max(self.key.as_str());
        start.min(lowest).to_owned()
    }
}

/// The cursor of a page (opaque to clients): where the walk stopped, when it read the index
/// there (`read_at`, unix ms), and the conversations it has shown that moved within
/// `MOVE_MARGIN_MS` of that, with when (`shown`). A conversation whose entry moved up from below `position`
/// after `read_at` was never met by the walk: the next page shows it (`shows_mover`). A cursor of
/// an older version has no `read_at` (no movers shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxCursor {
    pub position: InboxPosition,
    pub read_at: Option<u64>,
    pub shown: Vec<(ConversationId, u64)>,
}

impl InboxCursor {
    pub fn encode(&self) -> String {
        let p = &self.position;
        let json = match self.read_at {
            None => serde_json::json!([p.key, p.conversation_id]),
            Some(t) => serde_json::json!([p.key, p.conversation_id, t, self.shown]),
        };
        URL_SAFE_NO_PAD.encode(json.to_string())
    }

    pub fn decode(cursor: &str) -> Result<InboxCursor, ChatError> {
        let bad = || ChatError::invalid("query parameter `cursor` is malformed");
        let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
        let parts: Vec<serde_json::Value> = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        let text = |i: usize| parts.get(i).and_then(serde_json::Value::as_str);
        let (Some(key), Some(id)) = (text(0), text(1)) else {
            return Err(bad());
        };
        if crate::time::parse_rfc3339(key).is_none() {
            return Err(bad());
        }
        let position = InboxPosition {
            key: key.to_owned(),
            conversation_id: ConversationId::parse(id).ok_or_else(bad)?,
        };
        let (read_at, shown) = match parts.len() {
            2 => (None, Vec::new()),
            4 => {
                let t = parts[2].as_u64().ok_or_else(bad)?;
                let ids = parts[3].as_array().ok_or_else(bad)?;
                let shown = ids
                    .iter()
                    .map(|v| {
                        let id = v.get(0)?.as_str().and_then(ConversationId::parse)?;
                        Some((id, v.get(1)?.as_u64()?))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?;
                (Some(t), shown)
            }
            _ => return Err(bad()),
        };
        Ok(InboxCursor {
            position,
            read_at,
            shown,
        })
    }

    /// Whether the next page shows, as a conversation its walk has not met, the entry at
    /// `position` (above this cursor) that the indexer moved at `moved_at` (unix ms) from
    /// `moved_from` (the key it was at): it moved after this cursor's page read the index (within
    /// the margin), from a place that page had not reached, and that page did not show it.
    pub fn shows_mover(&self, position: &InboxPosition, moved_at: u64, moved_from: &str) -> bool {
        let Some(read_at) = self.read_at else {
            return false;
        };
        let from = InboxPosition {
            key: moved_from.to_owned(),
            conversation_id: position.conversation_id.clone(),
        };
        *position > self.position
            && moved_at > read_at.saturating_sub(MOVE_MARGIN_MS)
            && from < self.position
            && !self.hides(&position.conversation_id)
    }

    /// Whether the next page leaves out an entry below this cursor: its conversation was shown
    /// (a move's old copy, not deleted yet, or a mover shown on an earlier page).
    pub fn hides(&self, id: &ConversationId) -> bool {
        self.shown.iter().any(|(shown, _)| shown == id)
    }
}

/// Newest activity first (then by id, descending, as the index orders equal keys).
pub fn newest_first<T>(mut entries: Vec<(InboxPosition, T)>) -> Vec<T> {
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    entries.into_iter().map(|(_, t)| t).collect()
}

/// Index reads of one page at most (in the normal case 1; more only when copies or entries that
/// are not shown fill the first read), and rounds of conversation reads at most (normally 1).
pub const PAGE_QUERIES: usize = 6;
pub const PAGE_ROUNDS: usize = 4;

/// One index entry of a page's walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkedEntry {
    pub position: InboxPosition,
    /// Its conversation's first (so newest) entry in this walk; a later one is a copy that a move
    /// has not deleted yet, never shown.
    pub first: bool,
}

/// The walk of the caller's inbox index for one page, as a plan for the store: read entries
/// (`to_read`, `read`), cover some of them (`cover`: their conversations are read and judged),
/// say how many of those were shown (`shown`), until the page holds `limit` conversations or the
/// index ends (`done`). A page is full whenever that many conversations are in the index:
/// copies (a move between its put and its delete: both entries exist) and entries not shown take
/// no place in it. Normally that is one read of `limit + 1` entries and one round.
///
/// The cursor (`cursor`) is the position of the last entry covered, shown or not, when at least
/// one entry follows it.
#[derive(Debug)]
pub struct PageWalk {
    limit: usize,
    shown: usize,
    /// Read, not covered yet, in index order (newest first).
    pending: VecDeque<WalkedEntry>,
    /// Conversations of the entries read so far.
    met: HashSet<ConversationId>,
    /// Where the next read starts: below this position (None: at the top of the index).
    read_below: Option<InboxPosition>,
    covered_to: Option<InboxPosition>,
    index_ended: bool,
    queries: usize,
    rounds: usize,
}

impl PageWalk {
    /// A page of `limit` conversations below `after` (the request's cursor).
    pub fn new(limit: usize, after: Option<InboxPosition>) -> PageWalk {
        PageWalk {
            limit,
            shown: 0,
            pending: VecDeque::new(),
            met: HashSet::new(),
            read_below: after.clone(),
            covered_to: after,
            index_ended: false,
            queries: 0,
            rounds: 0,
        }
    }

    fn needed(&self) -> usize {
        self.limit.saturating_sub(self.shown)
    }

    /// Where the page's last conversation (the last first entry it still needs) is in `pending`.
    fn last_needed(&self) -> Result<usize, usize> {
        let mut firsts = 0;
        for (i, e) in self.pending.iter().enumerate() {
            firsts += usize::from(e.first);
            if e.first && firsts == self.needed() {
                return Ok(i);
            }
        }
        Err(firsts)
    }

    /// The next index read: how many entries, below which position (None: from the top). None
    /// when what was read suffices: the conversations the page still needs and one entry more,
    /// so that it knows whether more follow.
    pub fn to_read(&self) -> Option<(usize, Option<InboxPosition>)> {
        if self.index_ended || self.queries >= PAGE_QUERIES || self.done() {
            return None;
        }
        let n = match self.last_needed() {
            Ok(i) if self.pending.len() > i + 1 => return None,
            Ok(_) => 1,
            Err(firsts) => self.needed() - firsts + 1,
        };
        Some((n, self.read_below.clone()))
    }

    /// What an index read returned, in index order; `more`: the index may hold entries below
    /// them (DynamoDB's `LastEvaluatedKey`).
    pub fn read(&mut self, entries: Vec<InboxPosition>, more: bool) {
        self.queries += 1;
        if let Some(last) = entries.last() {
            self.read_below = Some(last.clone());
        }
        self.index_ended = !more || entries.is_empty();
        for position in entries {
            let first = self.met.insert(position.conversation_id.clone());
            self.pending.push_back(WalkedEntry { position, first });
        }
    }

    /// The entries this round covers: as many conversations as the page still needs, with the
    /// copies among them.
    pub fn cover(&mut self) -> Vec<WalkedEntry> {
        if self.done() {
            return Vec::new();
        }
        self.rounds += 1;
        let take = match self.last_needed() {
            Ok(i) => i + 1,
            Err(_) => self.pending.len(),
        };
        let covered: Vec<WalkedEntry> = self.pending.drain(..take).collect();
        if let Some(last) = covered.last() {
            self.covered_to = Some(last.position.clone());
        }
        covered
    }

    /// How many conversations of the last `cover` the page shows.
    pub fn shown(&mut self, n: usize) {
        self.shown += n;
    }

    /// Nothing more to do: the page is full, or the walk has covered the whole index, or it has
    /// used its reads.
    pub fn done(&self) -> bool {
        self.shown >= self.limit
            || (self.pending.is_empty() && (self.index_ended || self.queries >= PAGE_QUERIES))
            || self.rounds >= PAGE_ROUNDS
    }

    /// The next page's cursor: the last entry covered, when entries may follow it.
    pub fn cursor(&self) -> Option<&InboxPosition> {
        let more = !self.pending.is_empty() || !self.index_ended;
        more.then_some(self.covered_to.as_ref()).flatten()
    }
}

/// What an inbox page does with one index entry, given what the strongly consistent reads of the
/// page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Show,
    /// Not shown; left alone (its conversation is still being created, or the reader was removed
    /// between the page's two reads).
    Skip,
    /// Not shown, and never will be: the reader is not a member, or the entry was filed during an
    /// earlier membership. The page may delete it.
    Stale,
}

/// The rule for one index entry filed under `entry_key`:
/// - `conversation`: the conversation item exists (a group's is written last, at its creation);
/// - `member`: the reader's member item, if any, with the key its entry was filed under when it
///   joined (absent on members from before the index);
/// - `removed_last`: the conversation's latest membership change removed the reader, so the
///   conversation item was read after a removal that the member read did not see yet.
pub fn entry_verdict(
    entry_key: &str,
    conversation: bool,
    member: Option<Option<&str>>,
    removed_last: bool,
) -> Verdict {
    if !conversation {
        return Verdict::Skip;
    }
    match member {
        None => Verdict::Stale,
        // Entries only move up from where the join filed them: one below is from before.
        Some(Some(joined)) if entry_key < joined => Verdict::Stale,
        Some(_) if removed_last => Verdict::Skip,
        Some(_) => Verdict::Show,
    }
}

/// What an inbox page does with one of the caller's big-group entries (which say "a member of this
/// group", with no position): shown while the reader is a member; stale once it is not.
pub fn big_group_verdict(conversation: bool, member: bool, removed_last: bool) -> Verdict {
    match (conversation, member) {
        (false, _) => Verdict::Skip,
        (true, false) => Verdict::Stale,
        (true, true) if removed_last => Verdict::Skip,
        (true, true) => Verdict::Show,
    }
}

/// One conversation a page may show: where it is for paging (an index entry's position, or a big
/// group's exact activity) and for display (its exact activity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCandidate<T> {
    pub paging: InboxPosition,
    pub shown_at: InboxPosition,
    pub entry: T,
}

/// A page of `limit` from the index walk's conversations (`walked`, covered down to the walk's
/// `walk_cursor`, None when the index ended there) and the caller's big groups (`big`, at their
/// exact activity), below the request's cursor `after`. A big group belongs to this page when it
/// lies above where the walk stopped (below it, a later page meets it); a conversation met both
/// ways counts once, as a big group. When more than `limit` qualify, the lowest wait for the next
/// page, whose cursor is then the last shown. Returns the page, newest activity first, and the
/// next cursor.
pub fn with_big_groups<T>(
    limit: usize,
    walked: Vec<PageCandidate<T>>,
    walk_cursor: Option<InboxPosition>,
    big: Vec<PageCandidate<T>>,
    after: Option<&InboxPosition>,
) -> (Vec<T>, Option<InboxPosition>) {
    let big: Vec<PageCandidate<T>> = big
        .into_iter()
        .filter(|b| after.is_none_or(|a| b.paging < *a))
        .filter(|b| walk_cursor.as_ref().is_none_or(|w| b.paging > *w))
        .collect();
    let bigs: HashSet<ConversationId> = big
        .iter()
        .map(|b| b.paging.conversation_id.clone())
        .collect();
    let mut all: Vec<PageCandidate<T>> = walked
        .into_iter()
        .filter(|w| !bigs.contains(&w.paging.conversation_id))
        .chain(big)
        .collect();
    all.sort_by(|a, b| b.paging.cmp(&a.paging));
    let cursor = if all.len() > limit {
        all.truncate(limit);
        all.last().map(|c| c.paging.clone())
    } else {
        walk_cursor
    };
    let page = newest_first(all.into_iter().map(|c| (c.shown_at, c.entry)).collect());
    (page, cursor)
}

/// One conversation's change of activity key over a batch of its stream records, for the indexer:
/// move every current member's entry to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationMove {
    pub conversation_id: ConversationId,
    /// The keys before each record of the batch. An entry of a member who was a member before the
    /// batch is at one of them: normally the first (the previous batch moved it there); when a
    /// batch is delivered again after a partial failure, the entries of conversations that had
    /// succeeded are already further on, at the key before a later record (or at `to`).
    pub from: BTreeSet<String>,
    pub to: String,
    /// The first record of the batch this conversation's change comes from (what to report when
    /// the move fails: Lambda delivers it and everything after it again).
    pub first_record: usize,
    /// A group that has had more than 200 members and whose members do not all have big-group
    /// entries yet: instead of moving entries, give each member without one its big-group
    /// entry and delete its moving entry wherever it can be (`conversion_deletes`).
    pub convert: bool,
    /// The members with the keys their entries were filed under when they joined, when the
    /// records tell them: a direct conversation's pair, both filed at its creation, never
    /// changing (so its move reads nothing). None: the move reads them.
    pub members: Option<Vec<(UserId, Option<String>)>>,
}

impl ConversationMove {
    /// Where the moving entry of a member who joined at `joined` can be when its group is
    /// converted to big-group entries: any key of the batch at or above `joined`, or `joined`
    /// itself (it never moved). Deleting an absent entry is harmless, and happens once per member.
    pub fn conversion_deletes(&self, joined: Option<&str>) -> Vec<String> {
        let joined = joined.unwrap_or("");
        let mut keys: BTreeSet<&str> = self
            .from
            .iter()
            .chain(std::iter::once(&self.to))
            .map(String::as_str)
            .filter(|k| *k >= joined)
            .collect();
        if !joined.is_empty() {
            keys.insert(joined);
        }
        keys.into_iter().map(str::to_owned).collect()
    }
}

/// What the indexer writes for one member: the new entry first, then the old ones away (a reader
/// between the two sees the conversation twice, which a page dedupes, rather than not at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMove {
    pub put: String,
    pub deletes: Vec<String>,
}

impl ConversationMove {
    /// Nothing to move: the key did not change (or only the creation was seen, whose transaction
    /// filed every entry).
    pub fn is_noop(&self) -> bool {
        self.from.iter().all(|k| k.as_str() >= self.to.as_str())
    }

    /// The writes for a current member whose entry was filed under `joined` when it joined (None
    /// for members from before the index). A member who joined during or after this batch has
    /// its entry at its join key (or further on, if a redelivered batch already moved it), never
    /// below; one who joined at or after `to` needs nothing.
    pub fn for_member(&self, joined: Option<&str>) -> Option<MemberMove> {
        let joined = joined.unwrap_or("");
        let to = self.to.as_str();
        if joined >= to {
            return None;
        }
        let mut deletes: BTreeSet<&str> = self
            .from
            .iter()
            .map(String::as_str)
            .filter(|k| *k < to && *k >= joined)
            .collect();
        if self
            .from
            .first()
            .is_some_and(|first| joined >= first.as_str())
        {
            deletes.insert(joined);
        }
        Some(MemberMove {
            put: self.to.clone(),
            deletes: deletes.into_iter().map(str::to_owned).collect(),
        })
    }
}

/// One stream record of a conversation item, for `coalesce`: the keys before and after it (no
/// key before: the record is the conversation's creation); `convert`: the group is big and its
/// members' entries are not all big-group entries yet (`ConversationMove::convert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChange {
    pub record: usize,
    pub conversation_id: ConversationId,
    pub before: Option<String>,
    pub after: String,
    pub convert: bool,
    /// The members with the keys their entries were filed under when they joined, when the
    /// record tells them: a direct conversation's pair, both filed at its creation, never
    /// changing (so its move reads nothing). None: read them.
    pub members: Option<Vec<(UserId, Option<String>)>>,
}

/// Coalesces a batch's key changes into one move per conversation (from the keys before each of
/// its records to the key after its last one), in order of first appearance; conversations whose
/// key did not change are left out.
pub fn coalesce(changes: impl IntoIterator<Item = KeyChange>) -> Vec<ConversationMove> {
    let mut moves: Vec<ConversationMove> = Vec::new();
    for c in changes {
        let at = match moves
            .iter()
            .position(|m| m.conversation_id == c.conversation_id)
        {
            Some(i) => i,
            None => {
                moves.push(ConversationMove {
                    conversation_id: c.conversation_id.clone(),
                    from: BTreeSet::new(),
                    to: c.after.clone(),
                    first_record: c.record,
                    convert: c.convert,
                    members: None,
                });
                moves.len() - 1
            }
        };
        let m = &mut moves[at];
        m.from.extend(c.before);
        m.to = c.after;
        m.convert = c.convert;
        m.members = c.members;
    }
    moves.retain(|m| !m.is_noop());
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_moves_keeps_its_origin_for_its_span_then_starts_again() {
        let t = |s: &str| format!("2026-01-01T00:{s}Z");
        // First move: a chain starts at the key left.
        let first = MoveOrigin::of_move(None, &t("00:00.000"), 1_000);
        assert_eq!(first.key, t("00:00.000"));
        assert_eq!(first.since, 1_000);
        // Moved again within the span: the origin stays below, however often.
        let second = MoveOrigin::of_move(Some(first.clone()), &t("00:05.000"), 60_000);
        assert_eq!(second, first);
        let last = 1_000 + MOVE_CHAIN_MS - 1;
        assert_eq!(
            MoveOrigin::of_move(Some(second.clone()), &t("10:00.000"), last),
            first
        );
        // Past the span (fixed, from its start, not from the last move): a new chain.
        let after = MoveOrigin::of_move(Some(second), &t("14:00.000"), last + 1);
        assert_eq!(after.key, t("14:00.000"));
        assert_eq!(after.since, last + 1);
        // An origin above the key left is no origin of it (a stamp from elsewhere): new chain.
        let odd = MoveOrigin {
            key: t("20:00.000"),
            since: 1_000,
        };
        assert_eq!(
            MoveOrigin::of_move(Some(odd), &t("05:00.000"), 2_000).key,
            t("05:00.000")
        );
    }

    #[test]
    fn a_members_origin_is_never_below_where_its_entry_started() {
        let t = |s: &str| format!("2026-01-01T00:{s}Z");
        let origin = MoveOrigin {
            key: t("01:00.000"),
            since: 0,
        };
        // A member from before the chain: the chain's origin.
        assert_eq!(origin.for_member(None, &t("05:00.000")), t("01:00.000"));
        assert_eq!(
            origin.for_member(Some(&t("00:30.000")), &t("05:00.000")),
            t("01:00.000")
        );
        // One who joined during it: where it joined.
        assert_eq!(
            origin.for_member(Some(&t("03:00.000")), &t("05:00.000")),
            t("03:00.000")
        );
        // Never above the lowest key its move leaves.
        assert_eq!(
            origin.for_member(Some(&t("06:00.000")), &t("05:00.000")),
            t("05:00.000")
        );
    }

    fn id(n: u32) -> ConversationId {
        ConversationId::parse(&format!("g-{n:032x}")).unwrap()
    }

    fn t(s: &str) -> String {
        format!("2026-01-01T00:00:{s}Z")
    }

    #[test]
    fn cursors_carry_the_walks_read_time_and_read_the_older_form() {
        let position = InboxPosition {
            key: t("05.000"),
            conversation_id: id(7),
        };
        let old = InboxCursor {
            position: position.clone(),
            read_at: None,
            shown: Vec::new(),
        };
        assert_eq!(InboxCursor::decode(&old.encode()).unwrap(), old);
        // The older version's cursor is the position alone.
        assert_eq!(old.encode(), {
            let json = serde_json::json!([position.key, position.conversation_id]);
            URL_SAFE_NO_PAD.encode(json.to_string())
        });
        let new = InboxCursor {
            position,
            read_at: Some(1_700_000_000_123),
            shown: vec![(id(1), 1_700_000_000_100), (id(2), 1_700_000_000_000)],
        };
        assert_eq!(InboxCursor::decode(&new.encode()).unwrap(), new);
        for bad in [
            r#"["2026-01-01T00:00:05.000Z"]"#,
            r#"["2026-01-01T00:00:05.000Z","g-1",1,[]]"#,
            r#"["2026-01-01T00:00:05.000Z","g-00000000000000000000000000000001",1]"#,
            r#"["2026-01-01T00:00:05.000Z","g-00000000000000000000000000000001","1",[]]"#,
            r#"["2026-01-01T00:00:05.000Z","g-00000000000000000000000000000001",1,["x"]]"#,
            r#"["2026-01-01T00:00:05.000Z","g-00000000000000000000000000000001",1,[["x",1]]]"#,
            r#"["2026-01-01T00:00:05.000Z","g-00000000000000000000000000000001",1,[["g-00000000000000000000000000000002"]]]"#,
            r#"{"key":1}"#,
        ] {
            assert!(
                InboxCursor::decode(&URL_SAFE_NO_PAD.encode(bad)).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_next_page_shows_a_conversation_that_moved_past_the_walk_unseen() {
        let read_at = 1_000_000;
        let cursor = InboxCursor {
            position: InboxPosition {
                key: t("05.000"),
                conversation_id: id(5),
            },
            read_at: Some(read_at),
            shown: vec![(id(9), read_at - 1)],
        };
        let at = |key: &str, n: u32| InboxPosition {
            key: key.to_owned(),
            conversation_id: id(n),
        };
        // From below the cursor to above it, after the page read: the walk never met it.
        assert!(cursor.shows_mover(&at(&t("09.000"), 1), read_at + 1, &t("01.000")));
        // Within the margin before the read (its stamp came before its write).
        assert!(cursor.shows_mover(&at(&t("09.000"), 1), read_at - 5_000, &t("01.000")));
        // Long before the read: the page saw it where it is now.
        assert!(!cursor.shows_mover(&at(&t("09.000"), 1), read_at - 60_000, &t("01.000")));
        // From above the cursor: a page of the walk met it there.
        assert!(!cursor.shows_mover(&at(&t("09.000"), 1), read_at + 1, &t("06.000")));
        // From the cursor's own place: that page covered it.
        assert!(!cursor.shows_mover(&at(&t("09.000"), 5), read_at + 1, &t("05.000")));
        // Shown by the walk already.
        assert!(!cursor.shows_mover(&at(&t("09.000"), 9), read_at + 1, &t("01.000")));
        assert!(cursor.hides(&id(9)) && !cursor.hides(&id(1)));
        // Still below the cursor: the walk meets it there.
        assert!(!cursor.shows_mover(&at(&t("04.000"), 1), read_at + 1, &t("01.000")));
        // A cursor of the older version shows no movers.
        let old = InboxCursor {
            read_at: None,
            ..cursor.clone()
        };
        assert!(!old.shows_mover(&at(&t("09.000"), 1), read_at + 1, &t("01.000")));
    }

    #[test]
    fn activity_is_the_later_of_creation_and_last_message() {
        assert_eq!(
            activity("2026-01-01T00:00:01.000Z", None),
            "2026-01-01T00:00:01.000Z"
        );
        let (created, first) = ("2026-01-01T00:00:01.000Z", "2026-01-01T00:00:00.990Z");
        assert_eq!(
            activity(created, Some(first)),
            created,
            "a clock slightly behind"
        );
        assert_eq!(
            activity(created, Some("2026-01-01T00:00:02.000Z")),
            "2026-01-01T00:00:02.000Z"
        );
    }

    #[test]
    fn bucketed_keys_step_by_five_seconds_and_never_go_back() {
        assert_eq!(activity_key(&t("07.123"), None), t("07.123"));
        assert_eq!(bucket_start(&t("07.123")), t("05.000"));
        assert_eq!(bucket_start(&t("05.000")), t("05.000"));
        assert_eq!(bucket_start("2026-01-01T00:00:59.999Z"), t("55.000"));
        assert_eq!(bucket_start("not a time"), "not a time");
        // Bucketed since 07.123 (the exact key when it grew past 200 members): the key stays
        // there until the activity reaches the next step.
        let floor = t("07.123");
        assert_eq!(activity_key(&t("07.123"), Some(&floor)), floor);
        assert_eq!(activity_key(&t("09.999"), Some(&floor)), floor);
        assert_eq!(activity_key(&t("10.001"), Some(&floor)), t("10.000"));
        assert_eq!(activity_key(&t("14.999"), Some(&floor)), t("10.000"));
        // Monotonic: over a sequence of growing activities (and the switch to bucketing between
        // two of them), the key never decreases.
        let mut previous = String::new();
        for ms in (0..20_000).step_by(137) {
            let a = crate::time::rfc3339(
                OffsetDateTime::from_unix_timestamp_nanos(
                    1_767_225_600_000_000_000 + ms * 1_000_000,
                )
                .unwrap(),
            );
            let key = if ms < 8_000 {
                activity_key(&a, None)
            } else {
                activity_key(&a, Some("2026-01-01T00:00:07.946Z"))
            };
            assert!(key >= previous, "{key} < {previous}");
            previous = key;
        }
        assert!(bucketed(201) && !bucketed(200));
    }

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        let c = InboxCursor {
            position: InboxPosition {
                key: t("01.000"),
                conversation_id: id(7),
            },
            read_at: None,
            shown: Vec::new(),
        };
        assert_eq!(InboxCursor::decode(&c.encode()).unwrap(), c);
        assert!(InboxCursor::decode("!!!").is_err());
        assert!(InboxCursor::decode(&URL_SAFE_NO_PAD.encode("[1,2]")).is_err());
        let not_a_time = URL_SAFE_NO_PAD.encode(format!(r#"["x","{}"]"#, id(1)));
        assert!(InboxCursor::decode(&not_a_time).is_err());
    }

    #[test]
    fn pages_are_newest_first_with_ties_by_id() {
        let pos = |s: &str, n| InboxPosition {
            key: t(s),
            conversation_id: id(n),
        };
        let order = newest_first(vec![
            (pos("01.000", 1), 1),
            (pos("03.000", 2), 2),
            (pos("01.000", 3), 3),
        ]);
        assert_eq!(order, vec![2, 3, 1]);
    }

    #[test]
    fn entries_count_only_for_the_current_membership() {
        let (k1, k2) = (t("01.000"), t("02.000"));
        let (k1, k2) = (k1.as_str(), k2.as_str());
        // (entry's key, conversation item found, membership (filed under), removal seen, verdict)
        let cases = [
            (k2, true, Some(Some(k1)), false, Verdict::Show),
            (k1, true, Some(Some(k1)), false, Verdict::Show),
            (k2, true, Some(None), false, Verdict::Show),
            // Removed: never shown, the entry may go.
            (k2, true, None, false, Verdict::Stale),
            // Filed during an earlier membership (below where the current one started).
            (k1, true, Some(Some(k2)), false, Verdict::Stale),
            // The conversation item saw the reader's removal that the member read missed.
            (k2, true, Some(Some(k1)), true, Verdict::Skip),
            // A group still being created: its item is written last; keep the entry.
            (k2, false, None, false, Verdict::Skip),
        ];
        for (i, (key, found, member, removed, verdict)) in cases.into_iter().enumerate() {
            assert_eq!(
                entry_verdict(key, found, member, removed),
                verdict,
                "case {i}"
            );
        }
    }

    /// One page over an index held in memory (newest first, as the Query reads it), showing the
    /// conversations `shows` accepts: (shown conversations, cursor, Queries, rounds).
    fn page(
        index: &[InboxPosition],
        limit: usize,
        after: Option<InboxPosition>,
        shows: impl Fn(&InboxPosition) -> bool,
    ) -> (Vec<ConversationId>, Option<InboxPosition>, usize, usize) {
        let mut walk = PageWalk::new(limit, after);
        let (mut shown, mut queries, mut rounds) = (vec![], 0, 0);
        while !walk.done() {
            while let Some((n, below)) = walk.to_read() {
                queries += 1;
                let rest: Vec<_> = index
                    .iter()
                    .filter(|p| below.as_ref().is_none_or(|b| *p < b))
                    .cloned()
                    .collect();
                let more = rest.len() > n; // DynamoDB: LastEvaluatedKey when Limit stopped it
                walk.read(rest.into_iter().take(n).collect(), more);
            }
            let covered = walk.cover();
            if covered.is_empty() {
                break;
            }
            rounds += 1;
            let n = covered.len();
            let firsts: Vec<_> = covered.into_iter().filter(|e| e.first).collect();
            assert!(n >= firsts.len());
            let before = shown.len();
            shown.extend(
                firsts
                    .into_iter()
                    .filter(|e| shows(&e.position))
                    .map(|e| e.position.conversation_id),
            );
            walk.shown(shown.len() - before);
        }
        (shown, walk.cursor().cloned(), queries, rounds)
    }

    fn at(key: &str, n: u32) -> InboxPosition {
        InboxPosition {
            key: t(key),
            conversation_id: id(n),
        }
    }

    fn sorted(mut index: Vec<InboxPosition>) -> Vec<InboxPosition> {
        index.sort_by(|a, b| b.cmp(a));
        index
    }

    fn candidate(key: &str, n: u32) -> PageCandidate<u32> {
        PageCandidate {
            paging: at(key, n),
            shown_at: at(key, n),
            entry: n,
        }
    }

    #[test]
    fn big_group_entries_show_while_the_reader_is_a_member() {
        assert_eq!(big_group_verdict(true, true, false), Verdict::Show);
        assert_eq!(big_group_verdict(true, false, false), Verdict::Stale);
        assert_eq!(big_group_verdict(true, false, true), Verdict::Stale);
        assert_eq!(big_group_verdict(true, true, true), Verdict::Skip);
        assert_eq!(big_group_verdict(false, true, false), Verdict::Skip);
        assert_eq!(big_group_verdict(false, false, false), Verdict::Skip);
    }

    #[test]
    fn big_groups_take_their_place_by_activity_and_every_conversation_is_paged_once() {
        // An index of 20 conversations (ids 0..20, one a second) and 5 big groups at times in
        // between, one of which also still has an index entry (before its conversion).
        let index: Vec<PageCandidate<u32>> = (0..20)
            .map(|i| candidate(&t(&format!("{i:02}.000")), i))
            .collect();
        let big: Vec<PageCandidate<u32>> = [
            (100, "03.500"),
            (101, "09.500"),
            (102, "09.700"),
            (103, "19.500"),
            (7, "07.900"),
        ]
        .into_iter()
        .map(|(n, k)| candidate(&t(k), n))
        .collect();
        for limit in [1usize, 3, 7, 25, 30] {
            let mut seen: Vec<u32> = Vec::new();
            let mut after: Option<InboxPosition> = None;
            for _ in 0..100 {
                // The walk: the next `limit` index entries below the cursor (as PageWalk covers
                // them), and its cursor when entries follow.
                let below: Vec<PageCandidate<u32>> = {
                    let mut v: Vec<_> = index
                        .iter()
                        .filter(|c| after.as_ref().is_none_or(|a| c.paging < *a))
                        .cloned()
                        .collect();
                    v.sort_by(|a, b| b.paging.cmp(&a.paging));
                    v
                };
                let walked: Vec<_> = below.iter().take(limit).cloned().collect();
                let walk_cursor =
                    (below.len() > limit).then(|| walked.last().unwrap().paging.clone());
                let (page, cursor) =
                    with_big_groups(limit, walked, walk_cursor, big.clone(), after.as_ref());
                assert!(page.len() <= limit, "{limit}: {page:?}");
                seen.extend(page);
                match cursor {
                    Some(c) => after = Some(c),
                    None => break,
                }
            }
            let mut expected: Vec<u32> = (0..20).chain(100..104).collect();
            let mut got = seen.clone();
            got.sort_unstable();
            expected.sort_unstable();
            assert_eq!(got, expected, "limit {limit}: each once ({seen:?})");
            // And in order of activity across pages: 19, 103 (19.5), 18, …
            let order: Vec<u32> = {
                let mut all: Vec<PageCandidate<u32>> = index
                    .iter()
                    .filter(|c| c.entry != 7)
                    .cloned()
                    .chain(big.iter().cloned())
                    .collect();
                all.sort_by(|a, b| b.paging.cmp(&a.paging));
                all.into_iter().map(|c| c.entry).collect()
            };
            assert_eq!(seen, order, "limit {limit}");
        }
    }

    #[test]
    fn a_page_is_one_read_of_limit_plus_one_when_nothing_is_moving() {
        let index = sorted((1..=7).map(|n| at(&format!("{n:02}.000"), n)).collect());
        let (shown, cursor, queries, rounds) = page(&index, 3, None, |_| true);
        assert_eq!(shown, [id(7), id(6), id(5)]);
        assert_eq!(cursor, Some(at("05.000", 5)));
        assert_eq!((queries, rounds), (1, 1));
        // The last page: exactly what is left, no cursor, still one read.
        let (shown, cursor, queries, _) = page(&index, 3, Some(at("02.000", 2)), |_| true);
        assert_eq!((shown, cursor, queries), (vec![id(1)], None, 1));
        let (shown, cursor, _, _) = page(&index, 7, None, |_| true);
        assert_eq!((shown.len(), cursor), (7, None), "exactly limit: no cursor");
    }

    #[test]
    fn moves_caught_between_their_put_and_their_delete_do_not_shorten_a_page() {
        // Seven direct conversations created at 01..07, then each got its first message at 11..17;
        // the indexer has put the new entries of the two newest, not yet deleted their old ones,
        // and not reached the others (issue: a page of 3 came back with 2).
        let mut index: Vec<_> = (1..=7).map(|n| at(&format!("{n:02}.000"), n)).collect();
        index.extend([at("16.000", 6), at("17.000", 7)]);
        let index = sorted(index);
        let (shown, cursor, queries, rounds) = page(&index, 3, None, |_| true);
        assert_eq!(shown, [id(7), id(6), id(5)], "a full page");
        assert_eq!(
            (queries, rounds),
            (2, 1),
            "one more read for the two copies"
        );
        assert_eq!(cursor, Some(at("05.000", 5)));

        // The next page starts right after the last conversation shown.
        let (next, cursor, _, _) = page(&index, 3, Some(at("05.000", 5)), |_| true);
        assert_eq!(
            (next, cursor),
            (vec![id(4), id(3), id(2)], Some(at("02.000", 2)))
        );
    }

    #[test]
    fn entries_not_shown_take_no_place_and_every_conversation_is_walked_once() {
        // 40 conversations; every third one is being moved (its old entry is still there, below
        // the new one); every fifth one is not shown (a removed member's entry left behind, a
        // group still being created).
        let mut index: Vec<_> = (1..=40).map(|n| at(&format!("{n:02}.{n:03}"), n)).collect();
        index.extend(
            (1..=40)
                .filter(|n: &u32| n.is_multiple_of(3))
                .map(|n| at(&format!("{n:02}.000"), n)),
        );
        let index = sorted(index);
        let shows = |p: &InboxPosition| {
            let n = u32::from_str_radix(&p.conversation_id.as_str()[2..], 16).unwrap();
            !n.is_multiple_of(5)
        };
        for limit in [1, 2, 3, 7, 50] {
            let (mut all, mut cursor) = (vec![], None);
            loop {
                let (shown, next, queries, rounds) = page(&index, limit, cursor, shows);
                assert!(queries <= PAGE_QUERIES && rounds <= PAGE_ROUNDS);
                if next.is_some() {
                    assert_eq!(shown.len(), limit, "a page is full while more follow");
                }
                all.extend(shown);
                match next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            // Every conversation, newest first. A copy that a page boundary separates from its
            // conversation's entry is shown once more, on the next page (documented: only in
            // the moment between a move's put and its delete).
            let expected: Vec<_> = (1..=40)
                .rev()
                .filter(|n: &u32| !n.is_multiple_of(5))
                .map(id)
                .collect();
            let mut once = all.clone();
            let mut met = HashSet::new();
            once.retain(|c| met.insert(c.clone()));
            assert_eq!(
                once, expected,
                "limit {limit}: every conversation, in order"
            );
            assert!(
                all.iter()
                    .filter(|c| all.iter().filter(|d| d == c).count() > 1)
                    .all(|c| {
                        let n = u32::from_str_radix(&c.as_str()[2..], 16).unwrap();
                        n.is_multiple_of(3)
                    }),
                "limit {limit}: only a conversation being moved can be met twice"
            );
        }
    }

    #[test]
    fn a_page_of_nothing_shown_stops_after_its_bounded_reads_with_a_cursor() {
        let index = sorted(
            (1..=500)
                .map(|n| at(&format!("{:02}.{:03}", n / 1000, n), n))
                .collect(),
        );
        let (shown, cursor, queries, rounds) = page(&index, 20, None, |_| false);
        assert!(shown.is_empty());
        assert!(queries <= PAGE_QUERIES && rounds <= PAGE_ROUNDS);
        assert!(
            cursor.is_some(),
            "the next page goes on from where this one stopped"
        );
    }

    fn change(record: usize, n: u32, before: Option<&str>, after: &str) -> KeyChange {
        KeyChange {
            record,
            conversation_id: id(n),
            before: before.map(t),
            after: t(after),
            convert: false,
            members: None,
        }
    }

    #[test]
    fn a_conversion_deletes_wherever_a_moving_entry_can_be() {
        let mut changes = vec![
            change(0, 1, Some("05.000"), "10.000"),
            change(1, 1, Some("10.000"), "15.000"),
        ];
        changes[1].convert = true;
        let mv = coalesce(changes).remove(0);
        assert!(mv.convert, "the last record says");
        // A member from before the index, one filed at 05, one that joined at 12 (between the
        // batch's keys), one that joined after the batch's last key.
        assert_eq!(
            mv.conversion_deletes(None),
            [t("05.000"), t("10.000"), t("15.000")]
        );
        assert_eq!(
            mv.conversion_deletes(Some(&t("05.000"))),
            [t("05.000"), t("10.000"), t("15.000")]
        );
        assert_eq!(
            mv.conversion_deletes(Some(&t("12.000"))),
            [t("12.000"), t("15.000")]
        );
        assert_eq!(mv.conversion_deletes(Some(&t("16.000"))), [t("16.000")]);
    }

    #[test]
    fn a_batch_coalesces_to_one_move_per_conversation() {
        let moves = coalesce(vec![
            change(0, 1, Some("01.000"), "02.000"),
            change(1, 2, Some("05.000"), "05.000"), // a read receipt or a membership change
            change(2, 3, None, "07.000"),           // a creation
            change(3, 1, Some("02.000"), "03.000"),
            change(4, 3, Some("07.000"), "08.000"),
        ]);
        assert_eq!(moves.len(), 2);
        assert_eq!(moves[0].conversation_id, id(1));
        assert_eq!(moves[0].from, BTreeSet::from([t("01.000"), t("02.000")]));
        assert_eq!(
            (moves[0].to.clone(), moves[0].first_record),
            (t("03.000"), 0)
        );
        assert_eq!(moves[1].from, BTreeSet::from([t("07.000")]));
        assert_eq!(
            (moves[1].to.clone(), moves[1].first_record),
            (t("08.000"), 2)
        );
        assert!(
            coalesce(vec![change(0, 1, None, "01.000")]).is_empty(),
            "creation only"
        );
    }

    #[test]
    fn a_member_moves_from_wherever_its_entry_can_be() {
        let mv = coalesce(vec![change(0, 1, Some("01.000"), "02.000")]).remove(0);
        // A 1:1 message: one delete and one put per member, 4 write units for two members.
        let long_time = MemberMove {
            put: t("02.000"),
            deletes: vec![t("01.000")],
        };
        assert_eq!(mv.for_member(Some(&t("00.000"))), Some(long_time.clone()));
        assert_eq!(mv.for_member(None), Some(long_time.clone()));
        assert_eq!(mv.for_member(Some(&t("01.000"))), Some(long_time));
        // Joined after the batch's first record (at 01.500): its entry is there.
        assert_eq!(
            mv.for_member(Some(&t("01.500"))),
            Some(MemberMove {
                put: t("02.000"),
                deletes: vec![t("01.500")]
            })
        );
        // Joined at or after the new key: already filed there or further on.
        assert_eq!(mv.for_member(Some(&t("02.000"))), None);
        assert_eq!(mv.for_member(Some(&t("03.000"))), None);

        // Three messages in one batch: the entry is at the first key, or (a redelivery after
        // a partial failure) at a later one; every candidate goes, so no copy is left behind.
        let mv = coalesce(vec![
            change(0, 1, Some("01.000"), "02.000"),
            change(1, 1, Some("02.000"), "03.000"),
            change(2, 1, Some("03.000"), "04.000"),
        ])
        .remove(0);
        let m = mv.for_member(Some(&t("00.000"))).unwrap();
        assert_eq!(m.deletes, vec![t("01.000"), t("02.000"), t("03.000")]);
        assert!(
            2 * (1 + m.deletes.len()) <= 4 * 3,
            "never more than 4 write units per 1:1 message"
        );
        // Joined between the second and third message: the earlier keys were never its.
        let m = mv.for_member(Some(&t("02.500"))).unwrap();
        assert_eq!(m.deletes, vec![t("02.500"), t("03.000")]);
    }
}
