//! One hot conversation: `n` senders in a closed loop (each sends its next message as soon as the
//! previous one is acknowledged, retrying 429/503 with the same `clientMsgId` after `Retry-After`
//! as clients do), optionally with 50 members sending read receipts at about ten per send. After
//! each row the conversation must hold exactly 1..N, every acknowledged send at its seq.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::target::Target;
use super::{percentile, write_units, Table};
use chat_tests::{new_uuid, unique};

const READERS: usize = 50;
const RECEIPTS_PER_SEND: usize = 10;
/// DynamoDB's limit per partition (one partition key): write units a second.
const PARTITION_WRITE_UNITS: f64 = 1000.0;

pub struct Outcome {
    pub sends_per_s: f64,
}

/// Read receipts during a row: none; from 50 members of the hot conversation itself (they write
/// its member partition, not the one its sends write); or the same receipts to another
/// conversation (the baseline of what receipts cost wherever they go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipts {
    None,
    Here,
    Elsewhere,
    /// Not receipts: the same 50 members reacting to the conversation's newest message (adding,
    /// then removing, 👍), about ten reactions per send (issue 19's goal: sends keep their
    /// figures; reactions write `H#` and `R#`, never the log partition).
    Reactions,
}

/// Write units the strictness layer recorded on the chat table's partitions `keys` so far (it
/// sits in front of DynamoDB Local in this process: `server::dynamodb_partitions`).
fn partition_write_units(target: &Target, keys: &[String]) -> Option<f64> {
    target.app()?;
    let record = chat_tests::server::dynamodb_partitions()?;
    let units = record["partitions"]
        .as_array()?
        .iter()
        .filter(|p| p["table"] == "ChatTable" && p["index"].is_null())
        .filter(|p| keys.iter().any(|k| p["key"] == k.as_str()))
        .filter_map(|p| p["writeUnits"].as_f64())
        .sum();
    Some(units)
}

pub fn table() -> Table {
    Table::new(vec![
        "scenario",
        "sends",
        "sends/s",
        "ratio",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "give-ups",
        "receipts/s",
        "DynamoDB calls/send",
        "write units/send",
        "partition write units/send",
        "member partitions write units/send",
        "DynamoDB ceiling, sends/s",
        "1..N, acks at their seq",
    ])
}

/// One row: `senders` senders, `per_sender` messages each.
pub async fn row(
    target: &Target,
    table: &mut Table,
    senders: usize,
    per_sender: usize,
    receipts_to: Receipts,
    baseline: Option<f64>,
) -> Outcome {
    let receipts = receipts_to != Receipts::None;
    let owner = unique("hot");
    let others: Vec<String> = (1..senders).map(|i| format!("{owner}-s{i}")).collect();
    let readers: Vec<String> = if receipts {
        (0..READERS).map(|i| format!("{owner}-r{i}")).collect()
    } else {
        vec![]
    };
    let here: Vec<&String> = if matches!(receipts_to, Receipts::Here | Receipts::Reactions) {
        others.iter().chain(&readers).collect()
    } else {
        others.iter().collect()
    };
    let c = target.create_group(&owner, "hot", &here).await;
    // Where the receipts go: the hot conversation, or another one holding as many messages as
    // the row will send (so that they advance there too).
    let receipts_at = if receipts_to == Receipts::Elsewhere {
        let elsewhere = target.create_group(&owner, "elsewhere", &readers).await;
        for i in 0..senders * per_sender {
            let body = json!({"clientMsgId": new_uuid(), "body": format!("earlier {i}")});
            let path = format!("/conversations/{elsewhere}/messages");
            // As a client does: one sender alone can exceed the partition's 1,000 write units
            // a second (the strictness layer then throttles it).
            loop {
                let (status, answer) = target.call("POST", &path, &owner, Some(body.clone())).await;
                match status {
                    200 | 201 => break,
                    429 | 503 => tokio::time::sleep(Duration::from_millis(500)).await,
                    _ => panic!("{status}: {answer}"),
                }
            }
        }
        elsewhere
    } else {
        c.clone()
    };
    if let Some(t) = target.app() {
        t.calls.take_calls();
    }
    let id = chat_domain::ConversationId::parse(&c).unwrap();
    let (log, members) = (
        vec![chat_store::keys::conversation_pk(&id)],
        chat_store::keys::members_pks(&id),
    );
    let units_before =
        partition_write_units(target, &log).zip(partition_write_units(target, &members));

    let sent = Arc::new(AtomicU64::new(0));
    let give_ups = Arc::new(AtomicUsize::new(0));
    // Receipt credits: each acknowledged send lets the readers send ten receipts (a semaphore,
    // so idle readers cost nothing while they wait).
    let credits = receipts.then(|| Arc::new(tokio::sync::Semaphore::new(0)));
    let started = Instant::now();
    let sender_tasks: Vec<_> = std::iter::once(owner.clone())
        .chain(others)
        .map(|user| {
            let (target, c, sent, give_ups) =
                (target.clone(), c.clone(), sent.clone(), give_ups.clone());
            let credits = credits.clone();
            tokio::spawn(async move {
                let mut acked = vec![];
                for i in 0..per_sender {
                    let id = new_uuid();
                    let body =
                        json!({"clientMsgId": id, "body": format!("message {i} from {user}")});
                    let began = Instant::now();
                    loop {
                        let (status, answer) = target
                            .call(
                                "POST",
                                &format!("/conversations/{c}/messages"),
                                &user,
                                Some(body.clone()),
                            )
                            .await;
                        match status {
                            201 | 200 => {
                                acked.push((began.elapsed(), answer));
                                sent.fetch_add(1, Ordering::SeqCst);
                                if let Some(credits) = &credits {
                                    credits.add_permits(RECEIPTS_PER_SEND);
                                }
                                break;
                            }
                            429 | 503 => {
                                give_ups.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                            other => panic!("send answered {other}: {answer}"),
                        }
                    }
                }
                acked
            })
        })
        .collect();
    let receipts_done = Arc::new(AtomicU64::new(0));
    let receipts_throttled = Arc::new(AtomicU64::new(0));
    let reader_tasks: Vec<_> = readers
        .iter()
        .cloned()
        .map(|reader| {
            let (target, c, sent, credits, receipts_done) = (
                target.clone(),
                receipts_at.clone(),
                sent.clone(),
                credits.clone().expect("readers only with receipts"),
                receipts_done.clone(),
            );
            let receipts_throttled = receipts_throttled.clone();
            tokio::spawn(async move {
                let mut reacted = false;
                while let Ok(permit) = credits.acquire().await {
                    permit.forget();
                    receipts_done.fetch_add(1, Ordering::SeqCst);
                    let seen = sent.load(Ordering::SeqCst);
                    let (status, answer) = if receipts_to == Receipts::Reactions {
                        let path =
                            format!("/conversations/{c}/messages/{seen}/reactions/%F0%9F%91%8D");
                        reacted = !reacted;
                        let method = if reacted { "PUT" } else { "DELETE" };
                        target.call(method, &path, &reader, None).await
                    } else {
                        let path = format!("/conversations/{c}/read");
                        target
                            .call("POST", &path, &reader, Some(json!({"seq": seen})))
                            .await
                    };
                    match status {
                        200 => {}
                        // The member partition's write units ran out: nothing happened, and
                        // the next receipt carries a higher seq anyway (clients debounce).
                        // A change lost to the others past its deadline: nothing happened.
                        429 | 503 => {
                            receipts_throttled.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        _ => panic!("a read receipt answered {status}: {answer}"),
                    }
                }
            })
        })
        .collect();
    let mut acked: Vec<(Duration, Value)> = vec![];
    for t in sender_tasks {
        acked.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    if let Some(credits) = &credits {
        credits.close();
    }
    for t in reader_tasks {
        t.await.unwrap();
    }
    let calls = target.app().map(|t| t.calls.take_calls());
    if let (Some(calls), true) = (&calls, std::env::var_os("BENCH_CALLS").is_some()) {
        let mut by: std::collections::BTreeMap<&str, (usize, Duration, Duration)> =
            Default::default();
        for c in calls {
            let e = by.entry(c.name.as_str()).or_default();
            e.0 += 1;
            e.1 += c.elapsed;
            e.2 = e.2.max(c.elapsed);
        }
        for (name, (n, total, max)) in by {
            eprintln!(
                "  {senders} senders: {name:<20} {n:>5} calls, mean {:>6.1} ms, max {:>6.1} ms",
                total.as_secs_f64() * 1000.0 / n as f64,
                max.as_secs_f64() * 1000.0
            );
        }
    }

    let units_after =
        partition_write_units(target, &log).zip(partition_write_units(target, &members));
    let ok = verify(target, &owner, &c, &acked).await;
    let n = acked.len();
    // Sends write the conversation's log partition: its units per send say how many sends a
    // second DynamoDB's 1,000 write units per partition allow. Receipts write the member
    // partition, whose limit throttles receipts only.
    let per_send = |(before, after): (f64, f64)| (after - before) / n.max(1) as f64;
    let partition_units = units_before
        .zip(units_after)
        .map(|((log0, m0), (log1, m1))| (per_send((log0, log1)), per_send((m0, m1))));
    let rate = n as f64 / elapsed.as_secs_f64();
    let latencies: Vec<Duration> = acked.iter().map(|(d, _)| *d).collect();
    let (calls_per_send, units_per_send) = match (&calls, target.app()) {
        (Some(calls), Some(t)) if !receipts => {
            // Failed conditional writes and cancelled transactions are billed too.
            let (_, units) = write_units(t, calls).await;
            (
                format!("{:.2}", calls.len() as f64 / n as f64),
                format!("{:.1}", units as f64 / n as f64),
            )
        }
        _ => ("–".into(), "–".into()),
    };
    table.rows.push(vec![
        format!(
            "{senders} sender(s), one conversation{}",
            match receipts_to {
                Receipts::None => "",
                Receipts::Here => ", + receipts from 50 of its members (~10 per send)",
                Receipts::Elsewhere => ", + the same receipts to another conversation",
                Receipts::Reactions =>
                    ", + 50 of its members reacting to its newest message (~10 per send)",
            }
        ),
        n.to_string(),
        format!("{rate:.1}"),
        baseline.map_or("1.00".into(), |b| format!("{:.2}", rate / b)),
        format!("{:.0}", percentile(&latencies, 0.5)),
        format!("{:.0}", percentile(&latencies, 0.95)),
        format!("{:.0}", percentile(&latencies, 0.99)),
        give_ups.load(Ordering::SeqCst).to_string(),
        if receipts {
            let throttled = receipts_throttled.load(Ordering::SeqCst);
            format!(
                "{:.0}{}",
                receipts_done.load(Ordering::SeqCst) as f64 / elapsed.as_secs_f64(),
                if throttled > 0 {
                    format!(" ({throttled} throttled)")
                } else {
                    String::new()
                }
            )
        } else {
            "–".into()
        },
        calls_per_send,
        units_per_send,
        partition_units.map_or("–".into(), |(u, _)| format!("{u:.1}")),
        partition_units.map_or("–".into(), |(_, m)| format!("{m:.1}")),
        partition_units.map_or("–".into(), |(u, _)| {
            format!("{:.0}", PARTITION_WRITE_UNITS / u.max(f64::MIN_POSITIVE))
        }),
        if ok { "yes".into() } else { "**NO**".into() },
    ]);
    Outcome { sends_per_s: rate }
}

/// Exactly 1..N, and every acknowledged `clientMsgId` at the seq it was acknowledged with.
async fn verify(target: &Target, user: &str, c: &str, acked: &[(Duration, Value)]) -> bool {
    let mut stored: Vec<Value> = vec![];
    loop {
        let (status, page) = target
            .call(
                "GET",
                &format!(
                    "/conversations/{c}/messages?afterSeq={}&limit=100",
                    stored.len()
                ),
                user,
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        stored.extend(page["messages"].as_array().unwrap().iter().cloned());
        if !page["hasMore"].as_bool().unwrap_or(false) {
            break;
        }
    }
    let gap_free = stored
        .iter()
        .enumerate()
        .all(|(i, m)| m["seq"].as_u64() == Some(i as u64 + 1));
    let by_id: HashMap<&str, u64> = stored
        .iter()
        .filter_map(|m| Some((m["clientMsgId"].as_str()?, m["seq"].as_u64()?)))
        .collect();
    let at_their_seq = acked.iter().all(|(_, a)| {
        by_id.get(a["clientMsgId"].as_str().unwrap_or("")) == a["seq"].as_u64().as_ref()
    });
    gap_free && at_their_seq && stored.len() == acked.len()
}
