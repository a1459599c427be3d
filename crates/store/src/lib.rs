//! The store and its configuration: everything that speaks the AWS SDK.
//!
//! | module | holds |
//! |---|---|
//! | this one, `conversations`, `send`, `messages`, `changes`, `reads`, `inbox`, `connections` | DynamoDB storage (docs/data-model.md): the chat table, one module per concern, each operation commented with the DynamoDB calls it makes; the connections table |
//! | `items`, `keys`, `attrs`, `tx` | the stored layout: items, keys, attribute helpers, transactions |
//! | `archive`, `archiver` | the archive tier (S3, feature `archive`) and the archiver's work list |
//! | `stream` | the chat table's stream records decoded into push events |
//! | `config` | every environment variable, read once at init, and the AWS clients built from it |
//! | `retry`, `telemetry`, `iam_log` | deadlines and retries, logs and metrics, the IAM actions of each call (tests) |
//!
//! The rules come from `chat_domain`; this layer turns them into keys, conditions and calls, and
//! maps SDK errors into `ChatError`. Each function compiles only the SDK clients it calls: DynamoDB
//! always, S3 with feature `archive`, Kinesis with `kinesis`, the API Gateway Management API with
//! `management`.

#[cfg(feature = "archive")]
pub mod archive;
// Without feature `archive` only its settings and work list are compiled (archiving is not).
#[cfg_attr(not(feature = "archive"), allow(dead_code, unused_imports))]
pub mod archiver;
#[cfg(feature = "attachments")]
pub mod attachments;
mod attrs;
mod changes;
pub mod config;
pub mod connections;
mod conversations;
pub mod iam_log;
mod inbox;
pub mod items;
pub mod keys;
pub mod limits;
mod messages;
pub mod migrate;
pub mod notify;
#[cfg(feature = "management")]
pub mod presence_push;
#[cfg(feature = "notify")]
pub mod push;
mod reads;
pub mod retry;
mod roles;
mod safety;
mod send;
pub mod stream;
pub mod telemetry;
mod tx;
pub mod typing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{KeysAndAttributes, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use crate::retry::{Deadline, Retry};
use chat_domain::error::ChatError;
use chat_domain::ConversationId;

pub use archiver::{ArchiveSettings, Archived, RunReport, Step};
pub use attrs::Item;
pub use config::{init, Config};
pub use connections::ConnectionStore;
pub use conversations::PushState;
pub use inbox::MoveCount;
pub use items::{ConversationItem, MemberItem};
pub use limits::RateLimits;
pub use safety::SUSPENSION_TTL;

/// The chat table, reached through one DynamoDB client built at init. A request's copy carries
/// its deadline (`with_deadline`), which every retry inside the store shares.
#[derive(Clone, Debug)]
pub struct ChatStore {
    db: Client,
    table: String,
    /// The archived idempotency keys' table (docs/data-model.md §2.4c).
    keys_table: String,
    /// How long one request may take (`Config::timeouts`).
    budget: Duration,
    deadline: Option<Deadline>,
    /// What this instance has seen of conversations (shared by its requests).
    seen: Arc<Seen>,
    /// The archive tier (S3), where old messages are read from; None where none is configured
    /// (then nothing is ever archived, and history reads DynamoDB only).
    #[cfg(feature = "archive")]
    archive: Option<archive::Archive>,
    /// Whether an archive tier is configured (the indexer lists conversations for it): where
    /// `archive` is compiled, whether it is set.
    archive_tier: bool,
    /// The archive age and work-list layout (used only with `archive`).
    archive_settings: archiver::ArchiveSettings,
    /// The lowest work-list bucket this instance has made sure the archiver's cursor is at or
    /// below (`list_for_archiving`; u64::MAX: none yet).
    listed_from: Arc<std::sync::atomic::AtomicU64>,
    /// How long a user's suspension state read stays true in this instance (`is_suspended`).
    suspension_ttl: Duration,
    /// The attachments bucket (None: attachments are off; a send with some is refused).
    #[cfg(feature = "attachments")]
    attachments: Option<attachments::Attachments>,
    /// Per-user rate limits (None: off), shared by the instance's requests.
    limiter: Option<Arc<limits::Limiter>>,
    /// The slow-mode rules of the conversations this instance sent to.
    slow_rules: Arc<roles::SlowRules>,
}

/// What an instance remembers of the conversations it served, to skip reads:
/// - the highest `lastSeq` seen: `lastSeq` only grows, so it is a lower bound of the current
///   one, and a read receipt at or below it needs no read of the conversation to be clamped (in
///   a receipt storm, most are);
/// - until when sends were queued (`busyUntil`): while so, a send queues up at once instead of
///   reading the conversation first.
///
/// Bounded: forgotten wholesale past 10,000 conversations.
#[derive(Debug, Default)]
struct Seen(Mutex<HashMap<ConversationId, (u64, u64)>>);

impl Seen {
    const MAX: usize = 10_000;

    fn entry(&self, id: &ConversationId, f: impl FnOnce(&mut (u64, u64))) {
        if let Ok(mut m) = self.0.lock() {
            if m.len() >= Self::MAX && !m.contains_key(id) {
                m.clear();
            }
            f(m.entry(id.clone()).or_default());
        }
    }

    fn last_seq(&self, id: &ConversationId) -> u64 {
        self.0.lock().map_or(0, |m| m.get(id).map_or(0, |e| e.0))
    }

    fn saw(&self, id: &ConversationId, last_seq: u64) {
        self.entry(id, |e| e.0 = e.0.max(last_seq));
    }

    fn busy(&self, id: &ConversationId, now_ms: u64) -> bool {
        self.0
            .lock()
            .is_ok_and(|m| m.get(id).is_some_and(|e| e.1 > now_ms))
    }

    fn saw_busy(&self, id: &ConversationId, until_ms: u64) {
        self.entry(id, |e| e.1 = e.1.max(until_ms));
    }
}

/// What `query_each` reads: a partition, optionally a range of its sort keys, some attributes,
/// and at most `page` items per Query, ascending unless `descending`.
#[derive(Default)]
struct PartitionQuery<'a> {
    pk: String,
    range: Option<(String, String)>,
    projection: Option<&'a str>,
    page: Option<i32>,
    descending: bool,
}

/// Result of a TransactWriteItems: committed, or cancelled with one reason per item (in request
/// order), or lost to a concurrent transaction on one of its items (DynamoDB's
/// `TransactionConflict`: retry after a short pause).
enum TxOutcome {
    Committed,
    Cancelled(Vec<CancelReason>),
    Conflict,
}

struct CancelReason {
    code: Option<String>,
    /// The item as it was, where ReturnValuesOnConditionCheckFailure = ALL_OLD asked for it.
    item: Option<Item>,
}

impl CancelReason {
    fn failed_condition(&self) -> bool {
        self.code.as_deref() == Some("ConditionalCheckFailed")
    }
}

fn reason_failed(reasons: &[CancelReason], i: usize) -> Option<&CancelReason> {
    reasons.get(i).filter(|r| r.failed_condition())
}

/// Request-level errors that mean "too much at once": the SDK has already retried them.
/// Refusals that did nothing: a retry later is safe and the 429 is true ("no visible effect").
/// Not `TransactionInProgressException`: an earlier attempt of the same token is still running
/// and may land, so its outcome is unknown (`Unavailable`).
pub(crate) const THROTTLING: [&str; 4] = [
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "ThrottlingException",
    "TransactionConflictException",
];

/// Whether DynamoDB refused a call for throughput (nothing happened: try again later).
pub(crate) fn throttled<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    matches!(
        err.code(),
        Some(
            "ProvisionedThroughputExceededException"
                | "RequestLimitExceeded"
                | "ThrottlingException"
        )
    )
}

/// Maps an SDK error: throttling to `Throttled`; no answer, an unreadable answer or DynamoDB's
/// own failure to `Unavailable`; the rest to `Internal` with the details (which the edge logs
/// once and never shows).
pub(crate) fn sdk_error<E, R>(op: &str, err: SdkError<E, R>) -> ChatError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if THROTTLING.contains(&err.code().unwrap_or_default()) {
        return ChatError::Throttled;
    }
    // No answer, an answer that could not be read, or DynamoDB's own failure (5xx): a write may
    // or may not have been applied.
    let server_failed = matches!(
        err.code(),
        Some(
            "InternalServerError"
                | "ServiceUnavailable"
                | "InternalFailure"
                | "TransactionInProgressException"
        )
    );
    if server_failed || unanswered(&err) {
        return ChatError::Unavailable;
    }
    let detail = aws_sdk_dynamodb::error::DisplayErrorContext(&err);
    ChatError::internal(format!("{op}: {detail}"))
}

/// Whether a call got no answer, or one that could not be read (of any AWS SDK: DynamoDB's, S3's):
/// what it asked may or may not have been done.
pub(crate) fn unanswered<E, R>(err: &SdkError<E, R>) -> bool {
    matches!(
        err,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
    )
}

/// The refusal of what a direct conversation's member may not do while its peer blocks it
/// (docs/api.md §28): send, edit, add a reaction.
pub(crate) fn blocked_by_peer() -> ChatError {
    ChatError::Blocked("the other user has blocked you".into())
}

/// A failure before the request wrote anything: a call that got no answer (`Unavailable`) is no
/// unknown outcome then, so it becomes `Throttled` (a 429: nothing happened, then or later).
pub(crate) fn nothing_done(e: ChatError) -> ChatError {
    match e {
        ChatError::Unavailable => ChatError::Throttled,
        other => other,
    }
}

/// Whether a TransactWriteItems may or may not have been applied: no answer, or DynamoDB still
/// working on an earlier attempt of the same token.
fn ambiguous<R>(err: &SdkError<TransactWriteItemsError, R>) -> bool {
    unanswered(err)
        || matches!(
            err.as_service_error(),
            Some(TransactWriteItemsError::TransactionInProgressException(_))
        )
}

/// The least time an ambiguous commit gets to be settled, even at the deadline.
const SETTLE_TIME: Duration = Duration::from_millis(1500);

/// The archived keys' table as template.yaml names it (the local stack creates it so).
pub const ARCHIVED_KEYS_TABLE: &str = "ArchivedKeysTable";

impl ChatStore {
    pub fn new(db: Client, table: impl Into<String>) -> Self {
        ChatStore {
            db,
            table: table.into(),
            keys_table: ARCHIVED_KEYS_TABLE.into(),
            budget: crate::retry::Timeouts::AWS.request_budget,
            deadline: None,
            seen: Arc::default(),
            #[cfg(feature = "archive")]
            archive: None,
            archive_tier: false,
            archive_settings: archiver::ArchiveSettings::AWS,
            limiter: None,
            slow_rules: Arc::default(),
            listed_from: Arc::new(u64::MAX.into()),
            suspension_ttl: safety::SUSPENSION_TTL,
            #[cfg(feature = "attachments")]
            attachments: None,
        }
    }

    /// This store remembering suspension states for `ttl` (default `SUSPENSION_TTL`: not at all).
    pub fn with_suspension_ttl(self, ttl: Duration) -> Self {
        ChatStore {
            suspension_ttl: ttl,
            ..self
        }
    }

    /// This store with attachments in a bucket (docs/api.md §34).
    #[cfg(feature = "attachments")]
    pub fn with_attachments(self, attachments: Option<attachments::Attachments>) -> Self {
        ChatStore {
            attachments,
            ..self
        }
    }

    pub fn with_budget(self, budget: Duration) -> Self {
        ChatStore { budget, ..self }
    }

    /// This store with its archived keys in `keys_table` (default `ArchivedKeysTable`).
    pub fn with_archived_keys_table(self, keys_table: impl Into<String>) -> Self {
        ChatStore {
            keys_table: keys_table.into(),
            ..self
        }
    }

    pub fn archived_keys_table(&self) -> &str {
        &self.keys_table
    }

    /// This store with the archive tier: history reads archived messages from `archive`, the
    /// indexer lists conversations for the archiver and the archiver moves them, by `settings`.
    #[cfg(feature = "archive")]
    pub fn with_archive(
        self,
        archive: Option<archive::Archive>,
        archive_settings: archiver::ArchiveSettings,
    ) -> Self {
        ChatStore {
            archive_tier: archive.is_some(),
            archive,
            archive_settings,
            ..self
        }
    }

    /// This store, for a function that never reads the archive (built without feature
    /// `archive`), told whether an archive tier is `configured`: the indexer lists
    /// conversations for it, by `settings`.
    #[cfg(not(feature = "archive"))]
    pub fn with_archive_tier(
        self,
        configured: bool,
        archive_settings: archiver::ArchiveSettings,
    ) -> Self {
        ChatStore {
            archive_tier: configured,
            archive_settings,
            ..self
        }
    }

    pub fn archive_settings(&self) -> &archiver::ArchiveSettings {
        &self.archive_settings
    }

    /// Whether an archive tier is configured.
    pub fn has_archive_tier(&self) -> bool {
        self.archive_tier
    }

    #[cfg(feature = "archive")]
    pub fn archive(&self) -> Option<&archive::Archive> {
        self.archive.as_ref()
    }

    /// This store for one request starting now: every retry inside shares its deadline.
    pub fn for_request(&self) -> Self {
        ChatStore {
            deadline: Some(Deadline::after(self.budget)),
            ..self.clone()
        }
    }

    /// The longest a request of this store may take, from now: its deadline, plus the time an
    /// ambiguous commit gets to be settled after it. The HTTP edge answers `Unavailable` past it
    /// (`chat_http::http::handle`), so that no call, however slow, holds a request longer.
    pub fn time_allowed(&self) -> Duration {
        self.deadline().remaining() + SETTLE_TIME + Duration::from_millis(500)
    }

    /// The request's deadline (an operation outside a request gets the budget from now).
    fn deadline(&self) -> Deadline {
        self.deadline
            .unwrap_or_else(|| Deadline::after(self.budget))
    }

    fn retry(&self) -> Retry {
        Retry::until(self.deadline())
    }

    /// One TransactWriteItems, with a ClientRequestToken. When the answer is lost or DynamoDB is
    /// still busy with the same token, the identical request is sent again with the same token:
    /// DynamoDB applies a token at most once (for 10 minutes) and answers the repeat as it would
    /// have answered the first, so the outcome reported is the true one.
    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<TxOutcome, ChatError> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut answer = self.transact_once(&items, &token).await;
        let settle_by = Deadline::after(self.deadline().remaining().max(SETTLE_TIME));
        while matches!(&answer, Err(e) if ambiguous(e)) && !settle_by.passed() {
            settle_by.sleep(Duration::from_millis(20)).await;
            answer = self.transact_once(&items, &token).await;
        }
        let err = match answer {
            Ok(_) => return Ok(TxOutcome::Committed),
            Err(err) => err,
        };
        if ambiguous(&err) {
            // Not settled in time: the client retries the same request, which is safe.
            return Err(ChatError::Unavailable);
        }
        let Some(TransactWriteItemsError::TransactionCanceledException(e)) = err.as_service_error()
        else {
            return Err(sdk_error("TransactWriteItems", err));
        };
        let reasons: Vec<CancelReason> = e
            .cancellation_reasons()
            .iter()
            .map(|r| CancelReason {
                code: r.code().map(str::to_owned),
                item: r.item().cloned(),
            })
            .collect();
        let codes = || reasons.iter().filter_map(|r| r.code.as_deref());
        if codes().any(|c| c == "TransactionConflict") {
            crate::telemetry::count("TransactionConflicts", 1);
            return Ok(TxOutcome::Conflict);
        }
        // The partition's throughput ran out: nothing was written, as with a conflict, and the
        // caller tries again within its deadline the same way (a commit waits about one commit).
        if codes().any(|c| matches!(c, "ThrottlingError" | "ProvisionedThroughputExceeded")) {
            crate::telemetry::count("TransactionsThrottled", 1);
            return Ok(TxOutcome::Conflict);
        }
        if let Some(other) = codes().find(|c| !matches!(*c, "None" | "ConditionalCheckFailed")) {
            // Not a condition of ours: never guess an answer from it.
            return Err(ChatError::internal(format!(
                "transaction cancelled: {other}"
            )));
        }
        Ok(TxOutcome::Cancelled(reasons))
    }

    async fn transact_once(
        &self,
        items: &[TransactWriteItem],
        token: &str,
    ) -> Result<(), SdkError<TransactWriteItemsError, HttpResponse>> {
        self.db
            .transact_write_items()
            .set_transact_items(Some(items.to_vec()))
            .client_request_token(token)
            .send()
            .await
            .map(|_| ())
    }

    /// A conversation's item, or some of its attributes (None: no such conversation). 1 strongly
    /// consistent GetItem.
    async fn conversation_fields(
        &self,
        id: &ConversationId,
        projection: Option<&str>,
    ) -> Result<Option<Item>, ChatError> {
        self.item_fields(keys::conversation_key(id), projection)
            .await
    }

    /// An UpdateItem of the conversation item `id` by `expression` on `condition`, its values
    /// still to add.
    fn conversation_update(
        &self,
        id: &ConversationId,
        expression: &str,
        condition: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::conversation_key(id)))
            .update_expression(expression)
            .condition_expression(condition)
    }

    /// An item, or some of its attributes (None: no such item). 1 strongly consistent GetItem.
    async fn item_fields(
        &self,
        key: Item,
        projection: Option<&str>,
    ) -> Result<Option<Item>, ChatError> {
        self.item_in(&self.table, key, projection).await
    }

    /// As `item_fields`, from the table `table`.
    async fn item_in(
        &self,
        table: &str,
        key: Item,
        projection: Option<&str>,
    ) -> Result<Option<Item>, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(table)
            .set_key(Some(key))
            .consistent_read(true)
            .set_projection_expression(projection.map(str::to_owned))
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        Ok(out.item)
    }

    /// The items of a conversation's log with `sk` in `from..=to`, in `sk` order: 1 strongly
    /// consistent Query, more pages past 1 MB.
    async fn conversation_range(
        &self,
        id: &ConversationId,
        range: (String, String),
        projection: Option<&str>,
    ) -> Result<Vec<Item>, ChatError> {
        self.query_partition(keys::conversation_pk(id), Some(range), projection)
            .await
    }

    /// A conversation's member items, in `sk` order: 1 round trip, a strongly consistent Query of
    /// each member partition at once (1 for a direct conversation, `keys::MEMBER_SHARDS` for a
    /// group), more pages past 1 MB (about 2,000 members). Only the member sort keys: a direct
    /// conversation's members share its log partition.
    async fn member_items(
        &self,
        id: &ConversationId,
        projection: Option<&str>,
    ) -> Result<Vec<Item>, ChatError> {
        let members = || {
            (
                keys::MEMBER_SK_PREFIX.to_owned(),
                keys::MEMBERS_END_SK.to_owned(),
            )
        };
        let shards = keys::members_pks(id)
            .into_iter()
            .map(|pk| self.query_partition(pk, Some(members()), projection));
        let mut items: Vec<Item> = futures::future::try_join_all(shards)
            .await?
            .into_iter()
            .flatten()
            .collect();
        // The order of one partition, whichever projection (every one names `memberId`).
        items.sort_by(|a, b| attrs::get_s(a, "memberId").cmp(&attrs::get_s(b, "memberId")));
        Ok(items)
    }

    /// Every item of one partition (`sk` in a range, when given), ascending, strongly consistent.
    async fn query_partition(
        &self,
        pk: String,
        range: Option<(String, String)>,
        projection: Option<&str>,
    ) -> Result<Vec<Item>, ChatError> {
        let mut items = Vec::new();
        let all = PartitionQuery {
            pk,
            range,
            projection,
            ..Default::default()
        };
        self.query_each(all, |item| {
            items.push(item);
            Ok(true)
        })
        .await?;
        Ok(items)
    }

    /// Each item of one partition (`sk` in a range, when given), in `sk` order, strongly
    /// consistent, Query page by Query page, until `keep` says stop (false) or the items end.
    async fn query_each(
        &self,
        q: PartitionQuery<'_>,
        mut keep: impl FnMut(Item) -> Result<bool, ChatError>,
    ) -> Result<(), ChatError> {
        let mut start = None;
        loop {
            let mut request = self
                .db
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .set_projection_expression(q.projection.map(str::to_owned))
                .set_limit(q.page)
                .scan_index_forward(!q.descending)
                .expression_attribute_values(":pk", attrs::s(q.pk.clone()))
                .set_exclusive_start_key(start.take());
            request = match &q.range {
                Some((from, to)) => request
                    .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
                    .expression_attribute_values(":from", attrs::s(from.clone()))
                    .expression_attribute_values(":to", attrs::s(to.clone())),
                None => request.key_condition_expression("pk = :pk"),
            };
            let resp = request.send().await.map_err(|e| sdk_error("Query", e))?;
            for item in resp.items.unwrap_or_default() {
                if !keep(item)? {
                    return Ok(());
                }
            }
            match resp.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(()),
            }
        }
    }

    async fn batch_get(&self, keys: Vec<Item>, consistent: bool) -> Result<Vec<Item>, ChatError> {
        batch_get(&self.db, &self.table, keys, consistent, self.deadline()).await
    }
}

/// A function built without feature `attachments` serves no attachments: a send with some is
/// refused, and messages have no URLs to sign.
#[cfg(not(feature = "attachments"))]
impl ChatStore {
    pub(crate) async fn attachments_for_send(
        &self,
        _ids: &[String],
        _found: Vec<Item>,
        _id: &ConversationId,
        _sender: &chat_domain::UserId,
        _key: &str,
    ) -> Result<Vec<chat_domain::attachments::Attachment>, ChatError> {
        Err(ChatError::invalid(
            "attachments are not enabled on this deployment",
        ))
    }

    pub(crate) fn attachment_keys(_ids: &[String]) -> Vec<Item> {
        Vec::new()
    }

    pub(crate) fn claim_items(
        &self,
        _ids: &[String],
        _key: &str,
        _copies: &[chat_domain::attachments::Attachment],
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        Ok(Vec::new())
    }

    pub(crate) async fn refresh_attachment_copies(
        &self,
        _message: &mut chat_domain::model::Message,
    ) -> Result<(), ChatError> {
        Ok(())
    }

    pub(crate) fn attachment_erasure_parts(
        &self,
        _message: &chat_domain::model::Message,
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        Ok(Vec::new())
    }

    pub(crate) async fn erase_attachment_objects(
        &self,
        _id: &ConversationId,
        _attachment_ids: &[String],
    ) -> Result<(), ChatError> {
        Ok(())
    }

    pub(crate) async fn untag_after_send(
        &self,
        _message: &chat_domain::model::Message,
    ) -> Result<(), ChatError> {
        Ok(())
    }

    pub async fn sign_attachments<'m>(
        &self,
        _messages: impl IntoIterator<Item = &'m mut chat_domain::model::Message>,
    ) -> Result<(), ChatError> {
        Ok(())
    }

    pub async fn sign_attachment_list(
        &self,
        _id: &ConversationId,
        _list: &mut [chat_domain::attachments::Attachment],
    ) -> Result<(), ChatError> {
        Ok(())
    }
}

/// BatchGetItem of up to 100 keys of one table, retrying unprocessed keys with backoff.
pub(crate) async fn batch_get(
    db: &Client,
    table: &str,
    keys: Vec<Item>,
    consistent: bool,
    deadline: Deadline,
) -> Result<Vec<Item>, ChatError> {
    let mut out = Vec::with_capacity(keys.len());
    let mut pending = keys;
    let mut retry = Retry::until(deadline);
    while retry.next().await {
        if pending.is_empty() {
            return Ok(out);
        }
        let request = KeysAndAttributes::builder()
            .set_keys(Some(std::mem::take(&mut pending)))
            .consistent_read(consistent)
            .build()
            .map_err(ChatError::internal)?;
        let resp = db
            .batch_get_item()
            .request_items(table, request)
            .send()
            .await
            .map_err(|e| sdk_error("BatchGetItem", e))?;
        if let Some(mut found) = resp.responses {
            out.extend(found.remove(table).unwrap_or_default());
        }
        if let Some(mut unprocessed) = resp.unprocessed_keys {
            if let Some(left) = unprocessed.remove(table) {
                pending = left.keys;
            }
        }
    }
    if pending.is_empty() {
        Ok(out)
    } else {
        Err(ChatError::Throttled)
    }
}
