use std::time::Duration;

use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let (archiver, _) = archiver::Archiver::from_env().await?;
    // `archiver migrate <name>`: an upgrade's one-off migration from a shell (README).
    let args: Vec<String> = std::env::args().collect();
    if let [_, command, name] = args.as_slice() {
        if command == "migrate" {
            let report = archiver.migrate(name, archiver::RUN_BUDGET).await?;
            println!("{report}");
            return Ok(());
        }
    }
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
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let archiver = archiver.clone();
        async move {
            // `{"migrate": "<name>"}`: an upgrade's one-off migration (README), not a run.
            if let Some(name) = event.payload.get("migrate").and_then(|v| v.as_str()) {
                return archiver
                    .migrate(name, archiver::RUN_BUDGET)
                    .await
                    .map_err(lambda_runtime::Error::from);
            }
            archiver
                .run(archiver::RUN_BUDGET)
                .await
                .map(|r| serde_json::json!({"archived": r.archived.messages, "lagSeconds": r.lag_seconds}))
                .map_err(lambda_runtime::Error::from)
        }
    }))
    .await
}
