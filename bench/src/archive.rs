//! Storage tiering (docs/data-model.md §7, docs/cost.md "Storage tiers"): what a message leaves
//! in DynamoDB before and after it is archived, what it takes in S3 (compressed), what the
//! archiver's moves cost per 1 M messages, and a history page from the archive against one from
//! DynamoDB (S3 GETs per page, latency). In process: the real handlers and archiver against
//! DynamoDB Local behind the strictness layer and moto's S3.
//!
//! `cargo run --profile bench -p chat-bench --bin bench -- archive --messages 1000`

use std::time::{Duration, Instant};

use chat_domain::ConversationId;
use chat_store::ArchiveSettings;

use super::{item_json, percentile, write_units, Table};
use chat_tests::capacity;
use chat_tests::{unique, TestApp};

/// On-demand write request unit, per million (docs/cost.md "Prices").
const WRU: f64 = 0.625;
/// Strongly consistent read request unit, per million.
const RRU: f64 = 0.125;
/// S3 Standard PutObject, per 1,000 requests (assumed as listed on 2026-12-01, docs/cost.md).
const S3_PUT: f64 = 0.005;
/// S3 Standard GetObject, per 1,000 requests (assumed, as above).
const S3_GET: f64 = 0.0004;
/// DynamoDB's storage overhead per item, bytes.
const ITEM_OVERHEAD: usize = 100;
/// Pages timed per tier.
const PAGES: usize = 200;

pub async fn run(messages: usize) -> Table {
    let t = TestApp::with_archive(ArchiveSettings {
        age: Duration::from_secs(3600),
        bucket_seconds: 1,
        shards: 4,
        trim_units_per_second: ArchiveSettings::AWS.trim_units_per_second,
    })
    .await;
    let (a, b) = (unique("a"), unique("b"));
    let c = t.direct(&a, &b).await;
    let id = ConversationId::parse(&c).unwrap();
    let mut sent = Vec::with_capacity(messages);
    for i in 0..messages {
        // About 60 characters, as the cost model assumes.
        let body = format!(
            "message {i:05}: see you at the station at half past, ok? {}",
            i % 10
        );
        let r = t.send(&c, if i % 2 == 0 { &a } else { &b }, &body).await;
        assert_eq!(r.status, 201, "{r:?}");
        sent.push(r.body["clientMsgId"].as_str().unwrap().to_ascii_lowercase());
    }
    let before = stored(&t, &id, &sent).await;
    let table_pages = pages(&t, &c, &a, messages as u64).await;

    t.calls.keep_reads();
    t.calls.take();
    let cutoff = chat_domain::time::rfc3339(chat_domain::time::now() + Duration::from_secs(60));
    let started = Instant::now();
    let moved = t
        .archiver()
        .archive_conversation(&id, &cutoff, None)
        .await
        .expect("archive");
    let took = started.elapsed();
    let calls = t.calls.take_calls();
    assert_eq!(moved.messages, messages as u64);
    let (wru, _) = write_units(&t, &calls).await;
    let count = |name: &str| calls.iter().filter(|c| c.name == name).count();
    let reads = read_units(&calls);
    let (puts, gets) = (count("S3:PUT"), count("S3:GET"));
    let after = stored(&t, &id, &sent).await;
    let s3_bytes = archive_bytes(&t, &c).await;
    let archive_pages = pages(&t, &c, &a, messages as u64).await;

    let n = messages as f64;
    let per_m = |x: f64| x / n * 1e6;
    let dollars = per_m(wru as f64) * WRU / 1e6
        + per_m(reads as f64) * RRU / 1e6
        + per_m(puts as f64) * S3_PUT / 1e3
        + per_m(gets as f64) * S3_GET / 1e3;
    let mut table = Table::new(vec!["figure", "value"]);
    let mut row = |k: &str, v: String| table.rows.push(vec![k.to_owned(), v]);
    row(
        "messages archived (one conversation)",
        format!("{messages} in {:.2} s", took.as_secs_f64()),
    );
    row(
        "DynamoDB bytes per message before (message + key items, +100 B each)",
        format!(
            "{:.0} ({:.0} without the overhead)",
            before.billed, before.raw
        ),
    );
    row(
        "DynamoDB bytes per message after (the archived key item, +100 B)",
        format!(
            "{:.0} ({:.0} without the overhead)",
            after.billed, after.raw
        ),
    );
    row(
        "S3 bytes per message (gzip JSON Lines)",
        format!("{:.1}", s3_bytes as f64 / n),
    );
    row(
        "archiver per 1 M messages: DynamoDB write / read units",
        format!(
            "{:.0} WRU / {:.0} RRU",
            per_m(wru as f64),
            per_m(reads as f64)
        ),
    );
    row(
        "archiver per 1 M messages: S3 PUT / GET (chunks of 1,000)",
        format!("{:.0} / {:.0}", per_m(puts as f64), per_m(gets as f64)),
    );
    row("archiver per 1 M messages: $", format!("{dollars:.2}"));
    for (name, p) in [("DynamoDB", &table_pages), ("archive", &archive_pages)] {
        row(
            &format!("history page of 50 from {name}: p50 / p99 ms"),
            format!(
                "{:.1} / {:.1}",
                percentile(&p.latencies, 0.5),
                percentile(&p.latencies, 0.99)
            ),
        );
        row(
            &format!("history page of 50 from {name}: S3 GETs per page (max)"),
            format!("{:.2} ({})", p.gets as f64 / PAGES as f64, p.max_gets),
        );
    }
    row(
        "archive p99 / DynamoDB p99",
        format!(
            "{:.2}",
            percentile(&archive_pages.latencies, 0.99) / percentile(&table_pages.latencies, 0.99)
        ),
    );
    table
}

/// Bytes per message the conversation's message and key items take, and the archived keys of
/// its sends `sent` (lower-case `clientMsgId`s) (billed: + 100 per item).
struct Stored {
    raw: f64,
    billed: f64,
}

async fn stored(t: &TestApp, id: &ConversationId, sent: &[String]) -> Stored {
    let (mut raw, mut items, mut messages) = (0usize, 0usize, 0usize);
    for key in sent {
        let key = chat_store::keys::archived_send_key(id, key);
        let table = chat_tests::config().archived_keys_table;
        let got = t.db.get_item().table_name(table).set_key(Some(key));
        if let Some(item) = got.consistent_read(true).send().await.unwrap().item {
            messages += 1;
            items += 1;
            raw += capacity::item_size(item_json(&item).as_object().unwrap());
        }
    }
    for item in t.partition(&format!("C#{id}")).await {
        let sk = item["sk"].as_s().unwrap();
        if !(sk.starts_with("S#") || sk.starts_with("X#")) {
            continue;
        }
        messages += usize::from(sk.starts_with("X#"));
        items += 1;
        raw += capacity::item_size(item_json(&item).as_object().unwrap());
    }
    let per = |x: usize| x as f64 / messages.max(1) as f64;
    Stored {
        raw: per(raw),
        billed: per(raw + items * ITEM_OVERHEAD),
    }
}

async fn archive_bytes(t: &TestApp, c: &str) -> i64 {
    let archive = t.archiver();
    let archive = archive.archive().unwrap();
    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    let out = s3
        .list_objects_v2()
        .bucket(archive.bucket())
        .prefix(format!("{c}/"))
        .send()
        .await
        .unwrap();
    out.contents().iter().filter_map(|o| o.size()).sum()
}

/// Strongly consistent read units of the recorded reads, from their responses.
fn read_units(calls: &[chat_tests::Call]) -> u64 {
    calls
        .iter()
        .filter_map(|c| {
            let body = c.read.as_ref()?.response.as_ref()?;
            let body: serde_json::Value = serde_json::from_slice(body).ok()?;
            Some(crate::inbox::response_read_units(&c.name, &body))
        })
        .sum()
}

struct Pages {
    latencies: Vec<Duration>,
    gets: usize,
    max_gets: usize,
}

/// `PAGES` history pages of 50 at spread cursors (`beforeSeq`), timed, with their S3 GETs.
async fn pages(t: &TestApp, c: &str, user: &str, last: u64) -> Pages {
    let mut p = Pages {
        latencies: Vec::with_capacity(PAGES),
        gets: 0,
        max_gets: 0,
    };
    t.calls.take();
    for i in 0..PAGES as u64 {
        let before = 51 + (i * 7919) % last.saturating_sub(50).max(1);
        let started = Instant::now();
        let r = t
            .get(
                &format!("/conversations/{c}/messages?beforeSeq={before}&limit=50"),
                user,
            )
            .await;
        p.latencies.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
        let gets = t.calls.take().iter().filter(|n| *n == "S3:GET").count();
        p.gets += gets;
        p.max_gets = p.max_gets.max(gets);
    }
    p
}
