//! DynamoDB storage (docs/data-model.md): one module per concern, each operation commented with
//! the DynamoDB calls it makes. The rules come from `domain`; this layer turns them into keys,
//! conditions and calls.

mod attrs;
pub mod connections;
mod conversations;
mod inbox;
pub mod items;
pub mod keys;
mod messages;
mod reads;
mod tx;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{KeysAndAttributes, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use crate::error::ChatError;

pub use attrs::Item;
pub use connections::ConnectionStore;
pub use items::{ConversationItem, MemberItem};

/// The chat table, reached through one DynamoDB client built at init.
#[derive(Clone, Debug)]
pub struct ChatStore {
    db: Client,
    table: String,
}

/// Result of a TransactWriteItems: committed, or cancelled with one reason per item (in request
/// order), or lost to a concurrent transaction.
enum TxOutcome {
    Committed,
    Cancelled(Vec<CancelReason>),
    Contended,
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

const THROTTLING: [&str; 5] = [
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "ThrottlingException",
    "TransactionInProgressException",
    "TransactionConflictException",
];

/// Maps an SDK error: throttling to `Throttled`, the rest to `Internal` with the details (which
/// the edge logs once and never shows).
pub(crate) fn sdk_error<E, R>(op: &str, err: SdkError<E, R>) -> ChatError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if THROTTLING.contains(&err.code().unwrap_or_default()) {
        return ChatError::Throttled;
    }
    let detail = aws_sdk_dynamodb::error::DisplayErrorContext(&err);
    ChatError::internal(format!("{op}: {detail}"))
}

impl ChatStore {
    pub fn new(db: Client, table: impl Into<String>) -> Self {
        ChatStore {
            db,
            table: table.into(),
        }
    }

    /// One TransactWriteItems call.
    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<TxOutcome, ChatError> {
        match self
            .db
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await
        {
            Ok(_) => Ok(TxOutcome::Committed),
            Err(err) => {
                use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError as E;
                match err.as_service_error() {
                    Some(E::TransactionCanceledException(e)) => {
                        let reasons: Vec<CancelReason> = e
                            .cancellation_reasons()
                            .iter()
                            .map(|r| CancelReason {
                                code: r.code().map(str::to_owned),
                                item: r.item().cloned(),
                            })
                            .collect();
                        let contended = reasons.iter().any(|r| {
                            matches!(
                                r.code.as_deref(),
                                Some("TransactionConflict" | "ThrottlingError")
                            )
                        });
                        Ok(if contended {
                            TxOutcome::Contended
                        } else {
                            TxOutcome::Cancelled(reasons)
                        })
                    }
                    Some(E::TransactionInProgressException(_)) => Ok(TxOutcome::Contended),
                    _ => Err(sdk_error("TransactWriteItems", err)),
                }
            }
        }
    }

    async fn batch_get(&self, keys: Vec<Item>, consistent: bool) -> Result<Vec<Item>, ChatError> {
        batch_get(&self.db, &self.table, keys, consistent).await
    }
}

/// BatchGetItem of up to 100 keys of one table, retrying unprocessed keys with backoff.
pub(crate) async fn batch_get(
    db: &Client,
    table: &str,
    keys: Vec<Item>,
    consistent: bool,
) -> Result<Vec<Item>, ChatError> {
    let mut out = Vec::with_capacity(keys.len());
    let mut pending = keys;
    let mut retry = crate::retry::Retry::new();
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
