//! The benchmark (docs/benchmarks.md):
//!
//!     cargo run -p chat-bench --bin bench [-- [hot] [ops] [inbox] [--messages N] [--api URL]]
//!     cargo run -p chat-bench --bin bench -- cost [--messages N]
//!
//! By default the real handlers run in this process against the DynamoDB the tests use (DynamoDB
//! Local behind the strictness layer, here with in-region latency added: 5 ms median, 20 ms p99;
//! or `DYNAMODB_ENDPOINT`), every DynamoDB call recorded, so calls and write units per operation are
//! counted (write units from item sizes by DynamoDB's rules: the emulator's own figures are
//! constants). With `--api http://127.0.0.1:9000` the hot-conversation rows drive a running local
//! stack over HTTP instead (the functions under `cargo lambda watch` with concurrent instances).
//! Against the emulator the absolute rates measure moto, which answers one request at a time;
//! ratios, round trips and behaviour under contention are what carry over.
//!
//! Each hot row also reports the write units per send of the conversation's two partitions (its
//! log, which sends write, and its members, which receipts write), as the DynamoDB strictness
//! layer in front of DynamoDB Local recorded them, and the DynamoDB ceiling they imply: the sends a
//! second at which the log partition reaches DynamoDB's 1,000 write units a second.
//! `chaos` is the chaos soak (bench/src/chaos.rs): DynamoDB frozen for 25 s in the middle of
//! mixed traffic (DynamoDB Local's process stopped, or on moto the layer's freeze), then every
//! invariant checked.
//! `scaled` runs hot rows with the layer's per-partition limits at 1/10 (throttling on), so that
//! the design is shown holding its partition's ceiling: no give-up, no gap.
//!
//! For tuning, `hot32` runs the 32-sender row alone and `receipts1` the 1-sender row without and
//! with read receipts.
//!
//! `flood` sends 1,000 messages in a second from one user under the default rate limits while 8
//! others send beside it (bench/src/flood.rs): what is stored, refused, and the others' latency.
//!
//! `cost` measures the figures of docs/cost.md (calls, write and read units, sizes, log bytes per
//! operation; bench/src/cost.rs) and prints what 1 M messages, receipts and inbox loads
//! cost at the prices listed there, and the per-message figure.

use std::sync::Arc;

use chat_bench::hot::Receipts;
use chat_bench::target::Target;
use chat_bench::{chaos, cost, flag_value, hot, ops};
use chat_tests::TestApp;

#[tokio::main]
async fn main() {
    // DynamoDB's in-region latency, which DynamoDB Local (microseconds) lacks: the strictness
    // layer adds it, unless set otherwise (docs/benchmarks.md says what each table ran with).
    for (name, value) in [
        ("CHAT_STRICT_LATENCY_MS", "5"),
        ("CHAT_STRICT_LATENCY_P99_MS", "20"),
    ] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    if std::env::args().nth(1).as_deref() == Some("push") {
        return chat_bench::push::run(&std::env::args().skip(2).collect::<Vec<_>>()).await;
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
        chat_store::telemetry::init(false, None);
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
                // Ratio: to the 1-sender rate; with receipts on the hot conversation, to the
                // same senders while the same receipts go to another conversation.
                let mut table = hot::table();
                let one = hot::row(&target, &mut table, 1, messages, Receipts::None, None).await;
                for senders in [8, 16, 32] {
                    let per = messages / senders;
                    let base = Some(one.sends_per_s);
                    hot::row(&target, &mut table, senders, per, Receipts::None, base).await;
                }
                for senders in [1, 16, 32] {
                    let per = messages / senders;
                    let elsewhere =
                        hot::row(&target, &mut table, senders, per, Receipts::Elsewhere, None);
                    let base = Some(elsewhere.await.sends_per_s);
                    hot::row(&target, &mut table, senders, per, Receipts::Here, base).await;
                }
                // Reactions on the hot conversation, to the same senders without them.
                for senders in [1, 16] {
                    let per = messages / senders;
                    let alone = hot::row(&target, &mut table, senders, per, Receipts::None, None);
                    let base = Some(alone.await.sends_per_s);
                    hot::row(&target, &mut table, senders, per, Receipts::Reactions, base).await;
                }
                table.print();
            }
            // The scale model: DynamoDB's per-partition limits at 1/10 (the strictness layer's
            // scale), so that 2 cores can drive one conversation past its partition's ceiling.
            "scaled" => {
                let before =
                    chat_tests::server::emulator_settings(&serde_json::json!({"scale": 0.1}));
                let mut table = hot::table();
                let one = hot::row(&target, &mut table, 1, messages, Receipts::None, None).await;
                for senders in [16, 32] {
                    let per = messages / senders;
                    let base = Some(one.sends_per_s);
                    hot::row(&target, &mut table, senders, per, Receipts::None, base).await;
                }
                let per = messages / 16;
                hot::row(&target, &mut table, 16, per, Receipts::Here, None).await;
                chat_tests::server::emulator_settings(&before);
                println!("(per-partition limits at 1/10: the model's ceiling is a tenth of the column's)");
                table.print();
            }
            "ops" => ops::run(&app, messages).await.print(),
            // A DynamoDB brownout in the middle of mixed traffic, then every invariant.
            "chaos" => chaos::run().await.print(),
            // One row, for tuning: 32 senders.
            "hot32" => {
                let mut table = hot::table();
                hot::row(&target, &mut table, 32, messages / 32, Receipts::None, None).await;
                table.print();
            }
            // Two rows, for tuning: 1 sender alone, then with receipts.
            "receipts1" => {
                let mut table = hot::table();
                let one = hot::row(&target, &mut table, 1, messages, Receipts::None, None).await;
                let base = Some(one.sends_per_s);
                hot::row(&target, &mut table, 1, messages, Receipts::Here, base).await;
                table.print();
            }
            // The inbox at 10-5,000 memberships and the index's cost per message
            // (bench/src/inbox.rs; its own client, to record the reads' responses).
            "inbox" => chat_bench::inbox::run(messages).await.print(),
            "archive" => chat_bench::archive::run(messages).await.print(),
            // One user's 1,000 sends in a second under the default rate limits, others beside it.
            "flood" => chat_bench::flood::run().await.print(),
            other => {
                eprintln!("bench: unknown scenario {other:?} (hot, scaled, chaos, ops, hot32, receipts1, inbox, archive, flood, push, cost)")
            }
        }
    }
}
