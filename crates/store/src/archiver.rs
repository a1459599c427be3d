//! The archiver (docs/data-model.md §7 "Tiers"): moves messages older than the archive age from
//! the table to the archive bucket, chunk by chunk, and the work list that tells it which
//! conversations have such messages without ever scanning the table.
//!
//! One conversation, one chunk at a time (`archive_conversation`), in this order:
//!
//! 1. **Read**: `lastSeq` and `archivedThrough = A` (GetItem of `C`), the messages after `A` that
//!    are older than the cutoff, up to the end of `A + 1`'s chunk (Query of `S#…`, stopping at
//!    the first that is not due), and, when `A` is inside that chunk, the chunk's archived part
//!    (S3 GetObject of `first-A`).
//! 2. **Put** the chunk `first..=last` under its own key (S3 PutObject). The same key always holds
//!    the same messages, so two archivers writing it write the same thing.
//! 3. **Verify**: read it back (S3 GetObject) and compare, message by message.
//! 4. **Advance** `archivedThrough` from `A` to `last` (UpdateItem of `C`, on condition it is
//!    still `A`: one archiver wins, in seq order, with no gap; a loser deletes its object unless
//!    it is the winner's, and stops).
//! 5. **Trim**: per archived message, its key item rewritten compact (`ArchivedKeyItem`), then
//!    its message item deleted (BatchWriteItem of 25; puts before deletes, so a message item
//!    still there means its key may still be to compact), paced so that the conversation's
//!    sends keep most of its partition (`ArchiveSettings::trim_units_per_second`).
//! 6. **Drop** the superseded partial chunk `first-A` (S3 DeleteObject).
//!
//! Stopped after any step, every message is readable from one tier or both: a message item is
//! deleted only after step 4, which comes after the chunk holding it was read back; history
//! reads a seq from the table when it is there and from the chunk `archivedThrough` names when
//! it is not. The next run goes on from what it finds: items at or below `A` still in the table
//! (a run stopped in step 5) are trimmed, and an unreferenced object is never read.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use time::OffsetDateTime;

#[cfg(feature = "archive")]
use super::archive;
use super::attrs::{get_n, get_s, n, Item};
use super::inbox::{delete_request, put_request};
use super::items::{from_item, ArchivedKeyItem, ConversationItem, SendKeyItem};
#[cfg(feature = "archive")]
use super::PartitionQuery;
use super::{keys, sdk_error, ChatStore};
use crate::retry::Deadline;
use crate::telemetry;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::WriteRequest;
use chat_domain::error::ChatError;
use chat_domain::message::send_fingerprint;
use chat_domain::model::Message;
use chat_domain::ConversationId;

/// How old a message is when it moves, and how the work list is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveSettings {
    /// Messages older than this move (template `ArchiveAfterDays`; locally
    /// `CHAT_ARCHIVE_AFTER_SECONDS`).
    pub age: Duration,
    /// The width of one work-list bucket, in seconds: a conversation is listed at most once per
    /// bucket, and a bucket is worked once all its messages are older than the age (so a
    /// message stays at most `age + bucket + one run interval`).
    pub bucket_seconds: u64,
    /// Partitions per bucket, so that listing stays under a partition's write limit.
    pub shards: u64,
    /// The write units a second the trim (step 5) may spend on one conversation's log partition,
    /// whose 1,000 its sends need too: a chunk's trim is about 2,000 units, which unpaced would
    /// take the whole partition for 2 s and throttle a busy conversation's sends.
    pub trim_units_per_second: u64,
}

impl ArchiveSettings {
    pub const AWS: ArchiveSettings = ArchiveSettings {
        age: Duration::from_secs(90 * 86_400),
        bucket_seconds: 3_600,
        shards: 32,
        trim_units_per_second: 250,
    };

    /// The bucket a message created at `created_at` (RFC 3339) is listed in.
    pub fn bucket_of(&self, created_at: &str) -> Option<u64> {
        let t = chat_domain::time::parse_rfc3339(created_at)?;
        u64::try_from(t.unix_timestamp())
            .ok()
            .map(|s| s / self.bucket_seconds.max(1))
    }

    /// Whether a listing of `bucket`, made at `now_s` (unix seconds), may come after the
    /// archiver's walk went past that bucket: the walk works a bucket once its end is older than
    /// the age, so only a listing that lags its bucket's start by the age or more, less one
    /// bucket for the two clocks, can (an indexer that falls that far behind its stream). Such
    /// a listing is also put on the late list (`list_for_archiving`).
    pub fn is_late(&self, bucket: u64, now_s: u64) -> bool {
        let width = self.bucket_seconds.max(1);
        bucket
            .saturating_mul(width)
            .saturating_add(self.age.as_secs())
            <= now_s
    }

    fn shard_of(&self, id: &ConversationId) -> u64 {
        // Ids are `d-`/`g-` + 32 hex digits of a hash or a random UUID: evenly spread.
        u64::from_str_radix(&id.as_str()[2..6], 16).unwrap_or(0) % self.shards.max(1)
    }
}

/// Where a test stops the archiver, as if it were killed right after that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Read,
    Put,
    Verify,
    Advance,
    /// The trim's archived keys put, `keyMoves` not yet counted.
    KeysPut,
    /// `keyMoves` counted, nothing deleted yet.
    KeysCounted,
    /// Half of the trim's writes done.
    HalfTrimmed,
    Trimmed,
    Dropped,
}

/// What a run moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Archived {
    /// Messages whose chunk this run put and `archivedThrough` moved past.
    pub messages: u64,
    pub chunks: u64,
    /// Message items deleted from the table.
    pub deleted: u64,
    /// Runs that found another archiver ahead of them on a conversation.
    pub lost_races: u64,
}

impl std::ops::AddAssign for Archived {
    fn add_assign(&mut self, o: Archived) {
        self.messages += o.messages;
        self.chunks += o.chunks;
        self.deleted += o.deleted;
        self.lost_races += o.lost_races;
    }
}

/// What `archive_due` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    pub archived: Archived,
    pub conversations: u64,
    pub failed: u64,
    /// Buckets finished (the cursor moved past them).
    pub buckets: u64,
    /// How far behind the age the oldest unfinished bucket starts, in seconds (0: none).
    pub lag_seconds: u64,
    /// Conversations parked by this run after `ARCHIVE_ATTEMPTS` failed runs.
    pub parked: u64,
    /// Parked conversations this run archived at last (and took off the parked list).
    pub unparked: u64,
    /// Late listings this run worked (`R#late`: listed after the walk may have passed them).
    pub late: u64,
}

const CURSOR_PK: &str = "R#cursor";
const CURSOR_SK: &str = "R";
/// Messages read per Query page while looking for the due ones.
const READ_PAGE: i32 = 200;
/// Conversations archived at once.
const IN_FLIGHT: usize = 8;
/// Runs a listed conversation may fail before it is parked (`R#parked`), so that one
/// conversation that always fails cannot hold the cursor (and all archiving) back.
pub const ARCHIVE_ATTEMPTS: u64 = 3;
/// The parked list: `pk = R#parked, sk = <conversationId>`, retried once per run.
const PARKED_PK: &str = "R#parked";
/// The late list: `pk = R#late, sk = <bucket, 20 digits>#<conversationId>`, listings the walk
/// may have passed already (`ArchiveSettings::is_late`), worked by every run once due.
const LATE_PK: &str = "R#late";

fn late_sk(bucket: u64, id: &ConversationId) -> String {
    format!("{bucket:020}#{id}")
}

/// What became of an archiver's advance of `archivedThrough`.
enum Advance {
    Moved,
    /// An edit committed since the chunk was read: read it again.
    Edited,
    /// Another archiver moved it first.
    Lost,
}

fn work_list_pk(bucket: u64, shard: u64) -> String {
    format!("R#{bucket}#{shard}")
}

impl ChatStore {
    /// The work-list entries for conversation records of the table's stream: one per
    /// conversation whose newest message opened a new bucket (its previous message, in the old
    /// image, is of an earlier bucket, or it is the first), so at most one per conversation per
    /// bucket, whatever the number of messages. Pure: the indexer writes them
    /// (`list_for_archiving`).
    pub fn archive_listing(
        settings: &ArchiveSettings,
        before: Option<&ConversationItem>,
        after: &ConversationItem,
    ) -> Option<(ConversationId, u64)> {
        let grew = after.last_seq > before.map_or(0, |b| b.last_seq);
        let now = settings.bucket_of(after.last_message_at.as_deref()?)?;
        let was = before
            .and_then(|b| b.last_message_at.as_deref())
            .and_then(|t| settings.bucket_of(t));
        (grew && was != Some(now)).then(|| (after.conversation_id.clone(), now))
    }

    /// Writes work-list entries `pk = R#<bucket>#<shard>, sk = <conversationId>` (~70 bytes:
    /// 1 write unit each), BatchWriteItem of 25. Idempotent. First, for a bucket below any this
    /// instance listed before, `cursor_at_most` (1 UpdateItem: once per instance in practice).
    /// Then, for entries that are late (`ArchiveSettings::is_late`, by the clock after they were
    /// written: the walk may have passed their bucket before they landed), the same on the late
    /// list (`R#late`), which every archiver run works: none while the indexer keeps up.
    pub async fn list_for_archiving(
        &self,
        entries: &[(ConversationId, u64)],
    ) -> Result<usize, ChatError> {
        use std::sync::atomic::Ordering;
        let settings = &self.archive_settings;
        if let Some(low) = entries.iter().map(|(_, b)| *b).min() {
            if low < self.listed_from.load(Ordering::Relaxed) {
                self.cursor_at_most(low).await?;
                self.listed_from.fetch_min(low, Ordering::Relaxed);
            }
        }
        let mut requests = Vec::with_capacity(entries.len());
        let mut listed = Vec::with_capacity(entries.len());
        let mut seen = std::collections::HashSet::new();
        for (id, bucket) in entries {
            if seen.insert((id.clone(), *bucket)) {
                let pk = work_list_pk(*bucket, settings.shard_of(id));
                requests.push(put_request(keys::key(pk, id.as_str()))?);
                listed.push((id, *bucket));
            }
        }
        let count = requests.len();
        self.batch_write(requests).await?;
        let now_s = u64::try_from(chat_domain::time::now().unix_timestamp()).unwrap_or(0);
        let late = listed
            .into_iter()
            .filter(|(_, bucket)| settings.is_late(*bucket, now_s))
            .map(|(id, bucket)| put_request(keys::key(LATE_PK.to_owned(), late_sk(bucket, id))))
            .collect::<Result<Vec<_>, _>>()?;
        if !late.is_empty() {
            tracing::warn!(
                late = late.len(),
                "listed for the archiver late: also on the late list"
            );
            telemetry::count("ArchiveLateListings", late.len() as u64);
            self.batch_write(late).await?;
        }
        Ok(count)
    }

    /// Makes the archiver's cursor start at `bucket` at the latest, so that its first run walks
    /// from the first bucket that holds an entry, not a guess (an entry listed late, behind the
    /// cursor, is on the late list instead). 1 UpdateItem (conditional: never moves the cursor forward).
    async fn cursor_at_most(&self, bucket: u64) -> Result<(), ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(CURSOR_PK.to_owned(), CURSOR_SK)))
            .update_expression("SET #n = :b")
            .condition_expression("attribute_not_exists(pk) OR #n > :b")
            .expression_attribute_names("#n", "next")
            .expression_attribute_values(":b", n(bucket))
            .send()
            .await;
        match r {
            Err(e)
                if !e
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(sdk_error("UpdateItem", e))
            }
            _ => Ok(()),
        }
    }
}

/// Archiving itself: only where the archive tier's client is compiled (feature `archive`).
#[cfg(feature = "archive")]
impl ChatStore {
    /// One archiver run (EventBridge schedule; locally a loop): works the due buckets of the
    /// work list from its cursor, oldest first, until `until`. Per bucket and shard a Query of
    /// its entries; per entry `archive_conversation`, then the entry's delete (BatchWriteItem);
    /// per bucket finished, a PutItem of the cursor. A conversation that fails keeps its entry,
    /// and the bucket stays unfinished until a later run has archived it.
    pub async fn archive_due(
        &self,
        now: OffsetDateTime,
        until: Deadline,
    ) -> Result<RunReport, ChatError> {
        let settings = &self.archive_settings;
        let cutoff_t = now - settings.age;
        let cutoff = chat_domain::time::rfc3339(cutoff_t);
        let width = settings.bucket_seconds.max(1);
        let cutoff_s = u64::try_from(cutoff_t.unix_timestamp()).unwrap_or(0);
        let mut report = RunReport::default();
        // Buckets that end at or before the cutoff: every message in them is due.
        let Some(last_due) = (cutoff_s / width).checked_sub(1) else {
            return Ok(report);
        };
        // No cursor: nothing was ever listed (the indexer sets it before its first entry).
        let mut next = self.archive_cursor().await?.unwrap_or(last_due + 1);
        while next <= last_due && !until.passed() {
            let mut finished = true;
            for shard in 0..settings.shards.max(1) {
                let pk = work_list_pk(next, shard);
                let entries = self.work_list(&pk).await?;
                let results: Vec<_> = stream::iter(entries)
                    .map(|(id, failures)| {
                        let cutoff = &cutoff;
                        async move {
                            let r = self.archive_conversation(&id, cutoff, None).await;
                            (id, failures, r)
                        }
                    })
                    .buffer_unordered(IN_FLIGHT)
                    .collect()
                    .await;
                let mut done = Vec::new();
                for (id, failures, result) in results {
                    report.conversations += 1;
                    let entry = keys::key(pk.clone(), id.as_str());
                    match result {
                        Ok(a) => {
                            report.archived += a;
                            done.push(delete_request(entry)?);
                        }
                        Err(e) if failures + 1 >= ARCHIVE_ATTEMPTS => {
                            tracing::error!(conversation = %id, error = ?e, "archiving failed {ARCHIVE_ATTEMPTS} times; parked");
                            report.failed += 1;
                            report.parked += 1;
                            let mut parked = keys::key(PARKED_PK.to_owned(), id.as_str());
                            parked.insert("bucket".into(), n(next));
                            done.push(put_request(parked)?);
                            done.push(delete_request(entry)?);
                        }
                        Err(e) => {
                            tracing::warn!(conversation = %id, error = ?e, "archiving failed; kept in the work list");
                            report.failed += 1;
                            finished = false;
                            self.count_archive_failure(entry, failures + 1).await?;
                        }
                    }
                }
                self.batch_write(done).await?;
            }
            if !finished {
                break;
            }
            self.advance_archive_cursor(next).await?;
            report.buckets += 1;
            next += 1;
        }
        report.lag_seconds = cutoff_s.saturating_sub(next * width);
        if next > last_due {
            report.lag_seconds = 0;
        }
        if !until.passed() {
            self.work_late(&cutoff, last_due, &mut report).await?;
        }
        if !until.passed() {
            self.retry_parked(&cutoff, &mut report).await?;
        }
        telemetry::count("ArchivedMessages", report.archived.messages);
        telemetry::count("ArchivedChunks", report.archived.chunks);
        telemetry::count("ArchiveFailures", report.failed);
        telemetry::count("ArchiveParked", report.parked);
        telemetry::count("ArchiveLateWorked", report.late);
        telemetry::metric("ArchiveLagSeconds", report.lag_seconds as f64, "Seconds");
        Ok(report)
    }

    /// The next bucket to work (None: no run yet). 1 strongly consistent GetItem.
    async fn archive_cursor(&self) -> Result<Option<u64>, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::key(CURSOR_PK.to_owned(), CURSOR_SK)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        Ok(out.item.as_ref().and_then(|i| get_n(i, "next")))
    }

    /// Moves the cursor past `bucket`, never back (two runs at once). 1 PutItem.
    async fn advance_archive_cursor(&self, bucket: u64) -> Result<(), ChatError> {
        let mut item = keys::key(CURSOR_PK.to_owned(), CURSOR_SK);
        item.insert("next".into(), n(bucket + 1));
        let r = self
            .db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR #n <= :b")
            .expression_attribute_names("#n", "next")
            .expression_attribute_values(":b", n(bucket))
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(sdk_error("PutItem", e)),
        }
    }

    /// The conversations listed under one work-list partition, with the runs each has failed.
    /// 1 Query (more past 1 MB).
    async fn work_list(&self, pk: &str) -> Result<Vec<(ConversationId, u64)>, ChatError> {
        let mut out = Vec::new();
        let query = PartitionQuery {
            pk: pk.to_owned(),
            ..Default::default()
        };
        self.query_each(query, |item| {
            let failures = get_n(&item, "failures").unwrap_or(0);
            out.extend(
                get_s(&item, keys::SK)
                    .and_then(ConversationId::parse)
                    .map(|id| (id, failures)),
            );
            Ok(true)
        })
        .await?;
        Ok(out)
    }

    /// Records one more failed run on a work-list entry. 1 PutItem (the entry is its key and
    /// the count).
    async fn count_archive_failure(&self, mut entry: Item, failures: u64) -> Result<(), ChatError> {
        entry.insert("failures".into(), n(failures));
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(entry))
            .send()
            .await
            .map_err(|e| sdk_error("PutItem", e))?;
        Ok(())
    }

    /// The late list's due entries (bucket at most `last_due`), each archived like a work-list
    /// entry (`archive_conversation`; the walk may have passed its bucket before it was
    /// listed), then deleted with its work-list entry; one that fails stays for the next run.
    /// 1 Query of `R#late` (1 read unit while it is empty), and 1 BatchWriteItem of the deletes.
    async fn work_late(
        &self,
        cutoff: &str,
        last_due: u64,
        report: &mut RunReport,
    ) -> Result<(), ChatError> {
        let mut due = Vec::new();
        let query = PartitionQuery {
            pk: LATE_PK.to_owned(),
            range: Some(("0".to_owned(), format!("{last_due:020}$"))),
            ..Default::default()
        };
        self.query_each(query, |item| {
            let parsed = get_s(&item, keys::SK).and_then(|sk| {
                let (bucket, id) = sk.split_once('#')?;
                Some((bucket.parse::<u64>().ok()?, ConversationId::parse(id)?))
            });
            due.extend(parsed);
            Ok(true)
        })
        .await?;
        let mut done = Vec::new();
        for (bucket, id) in due {
            match self.archive_conversation(&id, cutoff, None).await {
                Ok(a) => {
                    report.archived += a;
                    report.late += 1;
                    done.push(delete_request(keys::key(
                        LATE_PK.to_owned(),
                        late_sk(bucket, &id),
                    ))?);
                    let pk = work_list_pk(bucket, self.archive_settings.shard_of(&id));
                    done.push(delete_request(keys::key(pk, id.as_str()))?);
                }
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(conversation = %id, error = ?e, "archiving a late listing failed; kept for the next run")
                }
            }
        }
        self.batch_write(done).await
    }

    /// The parked conversations, tried once more each run (after the due buckets): one that
    /// archives is taken off the list; one that fails stays, without holding anything back.
    /// 1 Query of `R#parked` (1 read unit while it is empty), per parked conversation
    /// `archive_conversation`, and 1 BatchWriteItem of the deletes.
    async fn retry_parked(&self, cutoff: &str, report: &mut RunReport) -> Result<(), ChatError> {
        let parked = self.work_list(PARKED_PK).await?;
        let mut done = Vec::new();
        for (id, _) in parked {
            match self.archive_conversation(&id, cutoff, None).await {
                Ok(a) => {
                    report.archived += a;
                    report.unparked += 1;
                    done.push(delete_request(keys::key(
                        PARKED_PK.to_owned(),
                        id.as_str(),
                    ))?);
                }
                Err(e) => {
                    tracing::warn!(conversation = %id, error = ?e, "parked conversation failed again")
                }
            }
        }
        self.batch_write(done).await
    }

    /// Moves a conversation's messages created before `cutoff` (RFC 3339) to the archive, one
    /// chunk at a time (module comment: the steps and why they keep every message readable).
    /// Per chunk — DynamoDB: 1 GetItem (`C`), 1 Query per 200 messages read, 1 UpdateItem
    /// (`C`), ⌈2 × messages / 25⌉ BatchWriteItem (1 write unit per compact key put and per
    /// message delete); S3: 1 PutObject, 1 GetObject (the read-back), and for a chunk already
    /// partly archived 1 GetObject and 1 DeleteObject more. `stop`: return after that step, as
    /// if killed (tests).
    pub async fn archive_conversation(
        &self,
        id: &ConversationId,
        cutoff: &str,
        stop: Option<Step>,
    ) -> Result<Archived, ChatError> {
        let archive = self
            .archive
            .as_ref()
            .ok_or_else(|| ChatError::internal("no archive bucket configured"))?;
        let stops = |step: Step| stop == Some(step);
        let mut total = Archived::default();
        let mut resumed = false;
        loop {
            // 1. Read.
            let Some((archived, edited)) = self.archived_and_tidied(archive, id).await? else {
                return Ok(total);
            };
            if !std::mem::replace(&mut resumed, true) {
                // A run killed between its advance and its erasure left this chunk unerased.
                if let Some((key, first, last)) = archive::chunk_key(id, archived, archived) {
                    self.erase_late_deletions(archive, id, (&key, first, last), None)
                        .await?;
                }
            }
            let k = archive::chunk_of(archived + 1);
            let (first, end) = (archive::chunk_first(k), archive::chunk_end(k));
            let (left, due) = self.due_messages(id, archived, end, cutoff).await?;
            if due.is_empty() {
                // Only what a stopped run left: message items already archived.
                if !left.is_empty() && !stops(Step::Read) {
                    total.deleted += self.trim(&left, stop).await?;
                }
                return Ok(total);
            }
            let last = due[due.len() - 1].seq;
            let superseded = (archived >= first).then(|| archive::object_key(id, first, archived));
            let Some(chunk) = self
                .assemble_chunk(archive, id, (first, archived), superseded.as_deref(), &due)
                .await?
            else {
                total.lost_races += 1;
                continue;
            };
            if stops(Step::Read) {
                return Ok(total);
            }
            // 2. Put.
            let key = archive::object_key(id, first, last);
            archive.put(&key, archive::encode(&chunk)?).await?;
            if stops(Step::Put) {
                return Ok(total);
            }
            // 3. Verify.
            verify(archive, &key, &chunk).await?;
            if stops(Step::Verify) {
                return Ok(total);
            }
            // 4. Advance.
            let superseding = superseded.is_some().then_some(archived);
            match self
                .advance_archived_through(id, (archived, edited), last, superseding)
                .await?
            {
                Advance::Moved => {}
                Advance::Edited => {
                    // An edit committed since the read: the chunk may hold its old text, so it
                    // is read and put again (the trim would otherwise delete the edit).
                    total.lost_races += 1;
                    self.drop_unless_referenced(archive, id, &key, last).await?;
                    continue;
                }
                Advance::Lost => {
                    total.lost_races += 1;
                    self.drop_unless_referenced(archive, id, &key, last).await?;
                    return Ok(total);
                }
            }
            total.messages += last - archived;
            total.chunks += 1;
            if stops(Step::Advance) {
                return Ok(total);
            }
            self.erase_late_deletions(archive, id, (&key, first, last), Some(chunk))
                .await?;
            // 5. Trim.
            total.deleted += self.trim(&[left, due].concat(), stop).await?;
            if stop.is_some_and(|s| s <= Step::Trimmed) {
                return Ok(total);
            }
            // 6. Drop.
            if let Some(old) = superseded {
                archive.delete(&old).await?;
            }
            if stops(Step::Dropped) || last < end {
                return Ok(total);
            }
        }
    }

    /// After an advance: the chunk `key` without the content of its messages deleted after
    /// step 1 read them (their deletion, had it looked at the boundary before this advance, left
    /// the erasure to this run: docs/data-model.md §8.2); `chunk`: its messages as just put, or
    /// None for the next run's resumption of a run killed before this step. 1 Query of their
    /// marks (+1 GetObject and 1 PutObject over the version read, as a deletion's own erasure:
    /// neither undoes the other's; a lost race reads both again; resuming: +1 GetObject when
    /// the chunk has deleted marks).
    async fn erase_late_deletions(
        &self,
        archive: &archive::Archive,
        id: &ConversationId,
        (key, first, last): (&str, u64, u64),
        chunk: Option<Vec<Message>>,
    ) -> Result<(), ChatError> {
        let mut marks = self.reactions_between(id, first, last).await?;
        let nothing_deleted = match chunk {
            Some(chunk) => super::changes::erased(chunk, &marks).is_none(),
            None => !marks.values().any(|m| m.deleted),
        };
        if nothing_deleted {
            return Ok(());
        }
        let mut retry = self.retry();
        while retry.next().await {
            let Some((chunk, etag)) = archive.get_tagged(key).await? else {
                return Ok(());
            };
            // The marks just read serve the first try; a lost race reads them again.
            let Some(erased) = super::changes::erased(chunk, &marks) else {
                return Ok(());
            };
            if archive
                .put_over(key, &etag, archive::encode(&erased)?)
                .await?
            {
                return Ok(());
            }
            marks = self.reactions_between(id, first, last).await?;
        }
        Err(ChatError::Throttled)
    }

    /// Step 1's head: the conversation's `archivedThrough` (None: no such conversation), once a
    /// partial chunk superseded by the last advance, which a run stopped before its step 6 left
    /// behind, is deleted (deleting it again is harmless).
    async fn archived_and_tidied(
        &self,
        archive: &archive::Archive,
        id: &ConversationId,
    ) -> Result<Option<(u64, u64)>, ChatError> {
        let fields = Some("archivedThrough, supersededThrough, editedChange");
        let Some(head) = self.conversation_fields(id, fields).await? else {
            return Ok(None);
        };
        let archived = get_n(&head, "archivedThrough").unwrap_or(0);
        let edited = get_n(&head, "editedChange").unwrap_or(0);
        if let Some(old) = get_n(&head, "supersededThrough") {
            if old != archived && old != archive::chunk_end(archive::chunk_of(old)) {
                let first = archive::chunk_first(archive::chunk_of(old));
                archive.delete(&archive::object_key(id, first, old)).await?;
            }
        }
        Ok(Some((archived, edited)))
    }

    /// The chunk to put: its archived part `first-archived` when it was partial (read from the
    /// archive), then the due messages, which must follow on with no gap. None: another
    /// archiver moved on meanwhile (and dropped that part), so the run starts again.
    async fn assemble_chunk(
        &self,
        archive: &archive::Archive,
        id: &ConversationId,
        (first, archived): (u64, u64),
        superseded: Option<&str>,
        due: &[Message],
    ) -> Result<Option<Vec<Message>>, ChatError> {
        let last = due[due.len() - 1].seq;
        if due[0].seq != archived + 1 || !archive::is_run(due, id, archived + 1, last) {
            return Err(ChatError::internal(format!(
                "{id}: messages after {archived} are not contiguous"
            )));
        }
        let mut chunk = Vec::with_capacity((last + 1 - first) as usize);
        if let Some(key) = superseded {
            match archive.get(key).await? {
                Some(part) if archive::is_run(&part, id, first, archived) => chunk.extend(part),
                _ if self.archived_through(id).await? != archived => return Ok(None),
                _ => {
                    return Err(ChatError::internal(format!(
                        "{key}: missing or not seqs {first}..={archived}"
                    )))
                }
            }
        }
        chunk.extend(due.iter().cloned());
        Ok(Some(chunk))
    }

    /// After a lost advance: the object this run put is deleted unless it is the one the winner
    /// references (the same key always holds the same messages).
    async fn drop_unless_referenced(
        &self,
        archive: &archive::Archive,
        id: &ConversationId,
        key: &str,
        last: u64,
    ) -> Result<(), ChatError> {
        let now = self.archived_through(id).await?;
        if archive::chunk_key(id, last, now).is_none_or(|(k, _, _)| k != key) {
            archive.delete(key).await?;
        }
        Ok(())
    }

    /// Message items of the conversation at or below `archived` still in the table (left by a
    /// stopped run), and the due ones after it, up to `end`: those created before `cutoff`
    /// (times never go back along seqs, so they are a prefix). Query pages of 200, ascending,
    /// until the first that is not due.
    async fn due_messages(
        &self,
        id: &ConversationId,
        archived: u64,
        end: u64,
        cutoff: &str,
    ) -> Result<(Vec<Message>, Vec<Message>), ChatError> {
        let (mut left, mut due) = (Vec::new(), Vec::new());
        let query = PartitionQuery {
            pk: keys::conversation_pk(id),
            range: Some((keys::FIRST_MESSAGE_SK.to_owned(), keys::message_sk(end))),
            page: Some(READ_PAGE),
            ..Default::default()
        };
        self.query_each(query, |item| {
            let m = from_item::<Message, Item>(item)?;
            if m.seq <= archived {
                left.push(m);
            } else if m.created_at.as_str() < cutoff {
                due.push(m);
            } else {
                return Ok(false);
            }
            Ok(true)
        })
        .await?;
        Ok((left, due))
    }

    /// `archivedThrough` from `from` to `to`, on condition it is still `from` and no edit
    /// committed since the chunk's messages were read (`editedChange` as read, which every edit
    /// sets on condition that its message is not archived yet), noting the partial chunk this
    /// supersedes (`supersededThrough`, dropped in step 6 or by the next run). 1 UpdateItem (more
    /// while the partition's throughput refuses it).
    async fn advance_archived_through(
        &self,
        id: &ConversationId,
        (from, edited): (u64, u64),
        to: u64,
        superseding: Option<u64>,
    ) -> Result<Advance, ChatError> {
        let moved = if from == 0 {
            "attribute_exists(pk) AND attribute_not_exists(archivedThrough)"
        } else {
            "archivedThrough = :from"
        };
        let unedited = if edited == 0 {
            "attribute_not_exists(editedChange)"
        } else {
            "editedChange = :edited"
        };
        let expression = if superseding.is_some() {
            "SET archivedThrough = :to, supersededThrough = :old"
        } else {
            "SET archivedThrough = :to REMOVE supersededThrough"
        };
        let mut update = self
            .conversation_update(id, expression, &format!("{moved} AND {unedited}"))
            .expression_attribute_values(":to", n(to))
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            );
        if let Some(old) = superseding {
            update = update.expression_attribute_values(":old", n(old));
        }
        if from != 0 {
            update = update.expression_attribute_values(":from", n(from));
        }
        if edited != 0 {
            update = update.expression_attribute_values(":edited", n(edited));
        }
        // The chunk's own deletes and key rewrites use the partition's write units, so this write
        // can be refused for throughput after the SDK's quick retries: nothing happened, so it
        // is tried again within the deadline, as a contended write is.
        let mut retry = self.retry();
        while retry.next().await {
            match update.clone().send().await {
                Ok(_) => return Ok(Advance::Moved),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                        let now = failed
                            .item()
                            .map(|i| get_n(i, "archivedThrough").unwrap_or(0));
                        return Ok(if now == Some(from) {
                            Advance::Edited
                        } else {
                            Advance::Lost
                        });
                    }
                    _ if super::throttled(&e) => {}
                    _ => return Err(sdk_error("UpdateItem", e)),
                },
            }
        }
        Err(ChatError::Throttled)
    }

    /// Per archived message: its archived key put (`ArchivedKeyItem`), then the conversation's
    /// `keyMoves` counted up, then its key item `X#` and its message item deleted: all puts
    /// before the count, the count before any delete, every key item before any message item.
    /// So a send that read the conversation before the count and found no archived key cannot
    /// commit after a delete (its condition on `keyMoves`, docs/data-model.md §4.2), and a message
    /// item still there means its key may still be to move (the next run trims it again).
    /// BatchWriteItem of 25, one after another; the deletes, which write the conversation's
    /// partition, paced at `trim_units_per_second`. Returns the message items deleted.
    async fn trim(&self, messages: &[Message], stop: Option<Step>) -> Result<u64, ChatError> {
        let Some(first) = messages.first() else {
            return Ok(0);
        };
        let id = &first.conversation_id;
        let fingerprints = self.sent_fingerprints(messages).await?;
        let mut puts = Vec::with_capacity(messages.len());
        for (m, f) in messages.iter().zip(&fingerprints) {
            if let Some(f) = f {
                let key =
                    ArchivedKeyItem::of(m, f).to_item(id, &m.client_msg_id.to_ascii_lowercase());
                puts.push(put_request(key)?);
            }
        }
        let mut deletes = Vec::with_capacity(messages.len() * 2);
        for m in messages {
            let key = keys::send_key(id, &m.client_msg_id.to_ascii_lowercase());
            deletes.push((delete_request(key)?, 1));
        }
        for m in messages {
            let key = keys::message_key(id, m.seq);
            deletes.push((delete_request(key)?, message_item_write_units(m)));
        }
        let mut deleted = messages.len() as u64;
        if stop == Some(Step::HalfTrimmed) {
            // Killed halfway: the keys moved and some of the key and message items deleted.
            let half = messages.len() + messages.len() / 2;
            deletes.truncate(half);
            deleted = (half - messages.len()) as u64;
        }
        // The archived keys go to a table of their own: unpaced.
        self.batch_write_to(&self.keys_table, puts).await?;
        if stop == Some(Step::KeysPut) {
            return Ok(0);
        }
        self.count_key_moves(id).await?;
        if stop == Some(Step::KeysCounted) {
            return Ok(0);
        }
        self.write_paced(&deletes).await?;
        Ok(deleted)
    }

    /// `writes` (each with its write units) in BatchWriteItem calls of 25, one after another,
    /// paced at `trim_units_per_second` from the first.
    async fn write_paced(&self, writes: &[(WriteRequest, u64)]) -> Result<(), ChatError> {
        let mut pace = Pace::new(self.archive_settings.trim_units_per_second);
        let started = std::time::Instant::now();
        for batch in writes.chunks(BATCH_WRITE) {
            let units = batch.iter().map(|(_, u)| u).sum();
            self.batch_write(batch.iter().map(|(r, _)| r.clone()).collect())
                .await?;
            tokio::time::sleep(pace.wait_after(units, started.elapsed())).await;
        }
        Ok(())
    }

    /// Per message, the fingerprint of the send that made it, for its archived key: from its
    /// content and attachments while it is as sent (version 1), else from its key item (an edit or a deletion
    /// changed the body). None: that key item is gone, so a stopped run already put the
    /// archived key (it puts before it deletes). DynamoDB: 1 BatchGetItem per 100 changed
    /// messages (eventually consistent: key items are never updated).
    async fn sent_fingerprints(
        &self,
        messages: &[Message],
    ) -> Result<Vec<Option<String>>, ChatError> {
        let changed: Vec<&Message> = messages.iter().filter(|m| m.version > 1).collect();
        let mut stored = std::collections::HashMap::new();
        for part in changed.chunks(100) {
            let wanted = part
                .iter()
                .map(|m| keys::send_key(&m.conversation_id, &m.client_msg_id.to_ascii_lowercase()));
            for item in self.batch_get(wanted.collect(), false).await? {
                let key: SendKeyItem = from_item(item)?;
                stored.insert(key.seq, key.fingerprint);
            }
        }
        Ok(messages
            .iter()
            .map(|m| match m.version {
                // As the send computed it: its attachments' ids count (found by probing: a
                // replay of an archived send with files was 409).
                1 => {
                    let ids: Vec<String> = m
                        .attachments
                        .iter()
                        .map(|a| a.attachment_id.clone())
                        .collect();
                    Some(send_fingerprint(&m.sender_id, &m.body, &ids))
                }
                _ => stored.remove(&m.seq),
            })
            .collect())
    }

    /// `keyMoves` + 1 on the conversation item: keys moved out (`trim`). 1 UpdateItem (more
    /// while a send's transaction holds the item or the partition's throughput refuses it).
    async fn count_key_moves(&self, id: &ConversationId) -> Result<(), ChatError> {
        let update = self
            .conversation_update(id, "ADD keyMoves :one", "attribute_exists(pk)")
            .expression_attribute_values(":one", n(1));
        let mut retry = self.retry();
        while retry.next().await {
            match update.clone().send().await {
                Ok(_) => return Ok(()),
                Err(e)
                    if super::throttled(&e) || e.code() == Some("TransactionConflictException") => {
                }
                Err(e) => return Err(sdk_error("UpdateItem", e)),
            }
        }
        Err(ChatError::Throttled)
    }
}

/// Step 3: the chunk read back under `key` must be the chunk put.
#[cfg(feature = "archive")]
async fn verify(archive: &archive::Archive, key: &str, chunk: &[Message]) -> Result<(), ChatError> {
    match archive.get(key).await? {
        Some(back) if back == chunk => Ok(()),
        _ => {
            telemetry::count("ArchiveVerifyFailures", 1);
            Err(ChatError::internal(format!("{key}: read back differs")))
        }
    }
}

/// Items per BatchWriteItem (DynamoDB's limit).
const BATCH_WRITE: usize = 25;

/// What deleting a message item costs: DynamoDB bills a delete by the size of the item deleted,
/// 1 unit per KB started (its attributes and names besides the body are under 300 bytes).
fn message_item_write_units(m: &Message) -> u64 {
    (m.body.len() as u64 + 300).div_ceil(1024)
}

/// Spreads writes at `units_per_second`: after each call, the wait until the units spent so far
/// are due (no wait while behind). A slow spell is no credit: what it left unspent beyond one
/// call's units is not spent later in a burst (the partition's sends would meet it). The clock
/// is passed in.
struct Pace {
    units_per_second: u64,
    spent: f64,
}

impl Pace {
    fn new(units_per_second: u64) -> Pace {
        Pace {
            units_per_second: units_per_second.max(1),
            spent: 0.0,
        }
    }

    fn wait_after(&mut self, units: u64, elapsed: Duration) -> Duration {
        let rate = self.units_per_second as f64;
        let credit_floor = elapsed.as_secs_f64() * rate - 2.0 * units as f64;
        self.spent = self.spent.max(credit_floor) + units as f64;
        Duration::from_secs_f64(self.spent / rate).saturating_sub(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(last_seq: u64, at: Option<&str>) -> ConversationItem {
        let mut c = serde_json::json!({
            "conversationId": "d-00000000000000000000000000000001", "type": "direct",
            "memberCount": 2, "lastSeq": last_seq, "createdAt": "2026-01-01T00:00:00.000Z",
        });
        if let Some(at) = at {
            c["lastMessageAt"] = at.into();
        }
        serde_json::from_value(c).unwrap()
    }

    /// A listing is late once the walk may have worked its bucket: the bucket's end older than
    /// the age by the archiver's clock, allowing one bucket for the indexer's clock.
    #[test]
    fn a_listing_is_late_only_once_its_bucket_may_have_been_walked() {
        let settings = ArchiveSettings {
            age: Duration::from_secs(30),
            bucket_seconds: 5,
            ..ArchiveSettings::AWS
        };
        let bucket = 1_000;
        let start = bucket * 5;
        // The walk works it from start + 5 + 30 on; the listing is late from one bucket before.
        assert!(!settings.is_late(bucket, start));
        assert!(!settings.is_late(bucket, start + 29));
        assert!(settings.is_late(bucket, start + 30));
        assert!(settings.is_late(bucket, start + 35));
        assert!(settings.is_late(bucket, start + 10_000));
        let aws = ArchiveSettings::AWS;
        let hour = 500_000;
        assert!(!aws.is_late(hour, hour * 3_600 + 89 * 86_400));
        assert!(aws.is_late(hour, hour * 3_600 + 90 * 86_400));
    }

    #[test]
    fn a_conversation_is_listed_once_per_bucket() {
        let settings = ArchiveSettings {
            bucket_seconds: 3600,
            ..ArchiveSettings::AWS
        };
        let created = conversation(0, None);
        let first = conversation(1, Some("2026-01-01T00:10:00.000Z"));
        let second = conversation(2, Some("2026-01-01T00:50:00.000Z"));
        let next_hour = conversation(3, Some("2026-01-01T01:00:00.000Z"));
        let listing = |b: Option<&ConversationItem>, a: &ConversationItem| {
            ChatStore::archive_listing(&settings, b, a).map(|(_, bucket)| bucket)
        };
        let hour = settings.bucket_of("2026-01-01T00:00:00.000Z").unwrap();
        assert_eq!(listing(Some(&created), &first), Some(hour));
        assert_eq!(
            listing(Some(&first), &second),
            None,
            "same bucket: listed already"
        );
        assert_eq!(listing(Some(&second), &next_hour), Some(hour + 1));
        // Not a message: creation, a read receipt or a membership change.
        assert_eq!(listing(None, &created), None);
        assert_eq!(listing(Some(&second), &second), None);
        // The first record seen of a conversation that had messages (a creation record lost).
        assert_eq!(listing(None, &second), Some(hour));
    }

    #[test]
    fn the_trim_is_paced_to_its_units_a_second() {
        let mut pace = Pace::new(250);
        // 50 units are due 200 ms after the start: a call that took 50 ms waits 150 ms more.
        assert_eq!(
            pace.wait_after(50, Duration::from_millis(50)),
            Duration::from_millis(150)
        );
        // 100 units are due at 400 ms; a slow call already past that waits nothing.
        assert_eq!(
            pace.wait_after(50, Duration::from_millis(500)),
            Duration::ZERO
        );
        // Behind does not become ahead: 150 units are due at 600 ms.
        assert_eq!(
            pace.wait_after(50, Duration::from_millis(550)),
            Duration::from_millis(50)
        );
        // A long slow spell is no credit beyond one call: after calls that took until 3 s, one
        // more goes at once, and the next waits its 200 ms (not the 9 calls the spell left).
        for wait in [0, 0, 200] {
            assert_eq!(
                pace.wait_after(50, Duration::from_millis(3000)),
                Duration::from_millis(wait)
            );
        }
        assert_eq!(Pace::new(0).units_per_second, 1);
    }

    #[test]
    fn a_message_item_delete_is_billed_by_its_size() {
        let m = |body: usize| {
            Message::new(
                ConversationId::parse("d-0123456789abcdef0123456789abcdef").unwrap(),
                1,
                "x".into(),
                chat_domain::UserId::parse("u").unwrap(),
                "b".repeat(body),
                String::new(),
            )
        };
        assert_eq!(message_item_write_units(&m(0)), 1);
        assert_eq!(message_item_write_units(&m(724)), 1);
        assert_eq!(message_item_write_units(&m(725)), 2);
        assert_eq!(message_item_write_units(&m(16_000)), 16);
    }

    #[test]
    fn shards_spread_conversations() {
        let settings = ArchiveSettings::AWS;
        let a = ConversationId::parse("d-00000000000000000000000000000001").unwrap();
        let b = ConversationId::parse("g-00ff0000000000000000000000000001").unwrap();
        assert!(settings.shard_of(&a) < settings.shards);
        assert_ne!(settings.shard_of(&a), settings.shard_of(&b));
    }
}
