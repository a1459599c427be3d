use std::time::Duration;

use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let (archiver, _) = archiver::Archiver::from_env().await?;
    // The local stack runs it as a loop (`CHAT_ARCHIVE_INTERVAL_SECONDS`, 5 s with
    // `CHAT_ARCHIVE_AFTER_SECONDS`); deployed, EventBridge invokes it on its schedule.
    if let Some(every) = std::env::var("CHAT_ARCHIVE_INTERVAL_SECONDS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        let every = Duration::from_secs(every.max(1));
        loop {
            if let Err(e) = archiver.run(archiver::RUN_BUDGET).await {
                tracing::warn!(error = ?e, "archiver run failed");
            }
            tokio::time::sleep(every).await;
        }
    }
    lambda_runtime::run(service_fn(|_: LambdaEvent<serde_json::Value>| {
        let archiver = archiver.clone();
        async move {
            archiver
                .run(archiver::RUN_BUDGET)
                .await
                .map(|r| serde_json::json!({"archived": r.archived.messages, "lagSeconds": r.lag_seconds}))
                .map_err(lambda_runtime::Error::from)
        }
    }))
    .await
}
