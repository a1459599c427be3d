//! The archiver (docs/data-model.md §7 "Tiers"): on a schedule (EventBridge in template.yaml;
//! locally a loop every few seconds), moves messages older than the archive age from the chat
//! table to the archive bucket, working the list of conversations the inbox indexer filed
//! (`ChatStore::archive_due`).

use std::time::Duration;

use chat_domain::ChatError;
use chat_store::retry::Deadline;
use chat_store::RunReport;
use chat_store::{ChatStore, Config};

/// How long one run works before it leaves the rest to the next (the function times out after
/// 15 minutes).
pub const RUN_BUDGET: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct Archiver {
    chat: ChatStore,
}

impl Archiver {
    pub fn new(chat: ChatStore) -> Self {
        Archiver { chat }
    }

    pub async fn from_env() -> Result<(Self, Config), lambda_runtime::Error> {
        let config = Config::from_env()?.for_function("archiver");
        config.init_telemetry();
        let sdk = config.sdk_config().await;
        if config.archive_bucket.is_none() {
            return Err("the archiver needs CHAT_ARCHIVE_BUCKET".into());
        }
        Ok((Archiver::new(config.chat_store(&sdk)), config))
    }

    /// One run, now, for at most `budget`.
    pub async fn run(&self, budget: Duration) -> Result<RunReport, ChatError> {
        let report = self
            .chat
            .archive_due(chat_domain::time::now(), Deadline::after(budget))
            .await?;
        tracing::info!(?report, "archiver run");
        if report.failed > 0 {
            // An error for the function's Errors alarm: those conversations stay listed and the
            // next run tries them again.
            return Err(ChatError::Unavailable);
        }
        Ok(report)
    }

    /// An operator's one-off upgrade (README, "Upgrading"), by name: `layout` (its older name
    /// `memberShards` still works), `ChatStore::migrate_member_shards`. Its report, with `done: false` when the budget ran
    /// out first (invoke it again).
    pub async fn migrate(
        &self,
        what: &str,
        budget: Duration,
    ) -> Result<serde_json::Value, ChatError> {
        match what {
            "layout" | "memberShards" => {
                let report = self
                    .chat
                    .migrate_member_shards(Deadline::after(budget))
                    .await?;
                tracing::info!(?report, "layout migration");
                serde_json::to_value(report).map_err(ChatError::internal)
            }
            other => Err(ChatError::invalid(format!("no migration named {other:?}"))),
        }
    }
}
