//! The benchmark (docs/benchmarks.md):
//!
//!     cargo run -p chat-tests --bin bench [-- [hot] [ops] [inbox] [--messages N] [--api URL]]
//!     cargo run -p chat-tests --bin bench -- cost [--messages N]
//!
//! By default the real handlers run in this process against the emulator the tests use (or
//! `DYNAMODB_ENDPOINT`), every DynamoDB call recorded, so calls and write units per operation are
//! counted (write units from item sizes by DynamoDB's rules: the emulator's own figures are
//! constants). With `--api http://127.0.0.1:9000` the hot-conversation rows drive a running local
//! stack over HTTP instead (the functions under `cargo lambda watch` with concurrent instances).
//! Against the emulator the absolute rates measure moto, which answers one request at a time;
//! ratios, round trips and behaviour under contention are what carry over.
//!
//! For tuning, `hot32` runs the 32-sender row alone and `receipts1` the 1-sender row without and
//! with read receipts.
//!
//! `cost` measures the figures of docs/cost.md (calls, write and read units, sizes, log bytes per
//! operation; tests/src/bench/cost.rs) and prints what 1 M messages, receipts and inbox loads
//! cost at the prices listed there, and the per-message figure.

use std::sync::Arc;

use chat_tests::bench::target::Target;
use chat_tests::bench::{cost, flag_value, hot, ops};
use chat_tests::TestApp;

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("push") {
        return chat_tests::bench_push::run(&std::env::args().skip(2).collect::<Vec<_>>()).await;
    }
    // Before any logging is set up: the scenario captures the functions' log lines itself.
    if std::env::args().nth(1).as_deref() == Some("cost") {
        let args: Vec<String> = std::env::args().collect();
        let n = flag_value(&args, "--messages")
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        return cost::run(n).await;
    }
    if std::env::var_os("RUST_LOG").is_some() {
        chat_shared::telemetry::init(false, None);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| flag_value(&args, flag);
    let messages: usize = value("--messages")
        .and_then(|v| v.parse().ok())
        .unwrap_or(192);
    let mut scenarios: Vec<&str> = args
        .iter()
        .filter(|a| {
            !a.starts_with("--")
                && value("--messages").as_ref() != Some(a)
                && value("--api").as_ref() != Some(a)
        })
        .map(String::as_str)
        .collect();
    if scenarios.is_empty() {
        scenarios = vec!["hot", "ops"];
    }
    let app = Arc::new(TestApp::new().await);
    let target = match value("--api") {
        Some(url) => Target::http(&url),
        None => Target::InProcess(app.clone()),
    };
    println!(
        "bench: {} messages per row, {}",
        messages,
        match &target {
            Target::Http { base, .. } => format!("local stack at {base}"),
            Target::InProcess(_) => "handlers in process, emulator".into(),
        }
    );
    for scenario in scenarios {
        match scenario {
            "hot" => {
                // Ratio: to the 1-sender rate; with receipts, to the same senders without them.
                let mut table = hot::table();
                let mut alone = std::collections::HashMap::new();
                let one = hot::row(&target, &mut table, 1, messages, false, None).await;
                alone.insert(1, one.sends_per_s);
                for senders in [8, 16, 32] {
                    let per = messages / senders;
                    let r = hot::row(
                        &target,
                        &mut table,
                        senders,
                        per,
                        false,
                        Some(one.sends_per_s),
                    );
                    alone.insert(senders, r.await.sends_per_s);
                }
                for senders in [1, 16, 32] {
                    let per = messages / senders;
                    hot::row(
                        &target,
                        &mut table,
                        senders,
                        per,
                        true,
                        alone.get(&senders).copied(),
                    )
                    .await;
                }
                table.print();
            }
            "ops" => ops::run(&app, messages).await.print(),
            // One row, for tuning: 32 senders.
            "hot32" => {
                let mut table = hot::table();
                hot::row(&target, &mut table, 32, messages / 32, false, None).await;
                table.print();
            }
            // Two rows, for tuning: 1 sender alone, then with receipts.
            "receipts1" => {
                let mut table = hot::table();
                let one = hot::row(&target, &mut table, 1, messages, false, None).await;
                hot::row(
                    &target,
                    &mut table,
                    1,
                    messages,
                    true,
                    Some(one.sends_per_s),
                )
                .await;
                table.print();
            }
            // The inbox at 10-5,000 memberships and the index's cost per message
            // (tests/src/bench_inbox.rs; its own client, to record the reads' responses).
            "inbox" => chat_tests::bench_inbox::run(messages).await.print(),
            other => {
                eprintln!("bench: unknown scenario {other:?} (hot, ops, hot32, receipts1, inbox, push, cost)")
            }
        }
    }
}
