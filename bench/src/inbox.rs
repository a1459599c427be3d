//! Benchmark rows of the inbox (docs/benchmarks.md): a page's latency, DynamoDB calls and read
//! units for users in 10 to 5,000 conversations, and the write units the inbox index costs per
//! message: `cargo run -p chat-bench --bin bench -- inbox` (`chat_bench::inbox::run(pages)`).
//!
//! Units are computed from the items themselves by DynamoDB's rules (`capacity`): a strongly
//! consistent read costs 1 unit per started 4 KB, per item for BatchGetItem and for the sum of the
//! items for a Query (at least 1); a write 1 unit per started 1 KB of the item written (a delete:
//! of the item deleted). The read sizes come from the responses, the write sizes from the
//! requests (both recorded by `CallLog`, which keeps reads here).
//!
//! Set-up: the users' conversations, memberships and inbox entries are written directly with
//! BatchWriteItem (the same item structs the store writes), not through the API: creating 5,000
//! conversations one request at a time takes minutes against the emulator. The write-cost rows
//! go through the API and the real indexer (`TestApp::index`).

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use chat_domain::inbox::InboxPosition;
use chat_domain::{ConversationId, ConversationType, UserId};
use chat_store::items::{ConversationItem, InboxEntryItem, LastMessage, MemberItem};
use serde_json::{Map, Value};

use chat_tests::capacity::{item_size, read_units, write_units};
use chat_tests::{unique, TestApp};

/// A page of the inbox for one user.
#[derive(Debug, Clone)]
pub struct PageRow {
    pub memberships: usize,
    pub limit: u32,
    pub pages: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub calls_max: usize,
    pub read_units_max: u64,
    pub read_units_mean: f64,
    pub shown: usize,
}

/// The index's cost for messages of one kind of conversation.
#[derive(Debug, Clone)]
pub struct WriteRow {
    pub scenario: String,
    pub messages: usize,
    pub moves: usize,
    pub write_units: u64,
    /// Strongly consistent reads of the members, one Query per move.
    pub read_units: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub pages: Vec<PageRow>,
    pub writes: Vec<WriteRow>,
}

/// Runs every inbox row against the test server (`pages` pages per page row, at most 50: the
/// emulator's Query reads the whole table).
pub async fn run(pages: usize) -> Report {
    let pages = pages.clamp(1, 50);
    let t = TestApp::new().await;
    t.calls.keep_reads();
    let mut report = Report::default();
    // All users first, then the pages: every page runs against the same table.
    let mut users = vec![];
    for memberships in [10, 100, 1_000, 5_000] {
        let user = unique(&format!("inbox{memberships}"));
        let started = Instant::now();
        set_up_memberships(&t, &user, memberships).await;
        eprintln!(
            "  inbox: {memberships} conversations written in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        users.push((memberships, user));
    }
    for (memberships, user) in &users {
        report
            .pages
            .push(page_row(&t, user, *memberships, 20, pages).await);
    }
    let (memberships, user) = &users[3];
    report
        .pages
        .push(page_row(&t, user, *memberships, 100, pages.div_ceil(4)).await);
    report.writes.push(direct_messages(&t, 20).await);
    report.writes.extend(big_group_messages(&t, 20).await);
    report
}

impl Report {
    pub fn print(&self) {
        println!("| inbox page | limit | pages | p50 ms | p99 ms | DynamoDB calls/page (max) | read units/page (mean / max) | ≤ 3 × limit |");
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.pages {
            println!(
                "| user in {} conversations | {} | {} | {:.1} | {:.1} | {} | {:.1} / {} | {} |",
                group_digits(r.memberships),
                r.limit,
                r.pages,
                r.p50_ms,
                r.p99_ms,
                r.calls_max,
                r.read_units_mean,
                r.read_units_max,
                if r.read_units_max <= 3 * u64::from(r.limit) && r.calls_max <= 3 {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        println!();
        println!("| index cost per message | messages | index moves | write units | write units/message | member reads (read units) |");
        println!("|---|---:|---:|---:|---:|---:|");
        for w in &self.writes {
            println!(
                "| {} | {} | {} | {} | {:.1} | {} |",
                w.scenario,
                w.messages,
                w.moves,
                w.write_units,
                w.write_units as f64 / w.messages as f64,
                w.read_units
            );
        }
    }
}

fn group_digits(n: usize) -> String {
    if n >= 1000 {
        format!("{},{:03}", n / 1000, n % 1000)
    } else {
        n.to_string()
    }
}

async fn page_row(
    t: &TestApp,
    user: &str,
    memberships: usize,
    limit: u32,
    pages: usize,
) -> PageRow {
    t.calls.take();
    let mut latencies = Vec::with_capacity(pages);
    let (mut calls_max, mut units_max, mut units_sum, mut shown) = (0, 0, 0, 0);
    for _ in 0..pages {
        let started = Instant::now();
        let r = t.get(&format!("/inbox?limit={limit}"), user).await;
        latencies.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
        shown = r.body["conversations"].as_array().map_or(0, Vec::len);
        let calls = t.calls.take_calls();
        calls_max = calls_max.max(calls.len());
        let units: u64 = calls
            .iter()
            .filter_map(|c| {
                let response = c.read.as_ref()?.response.as_deref()?;
                let body: Value = serde_json::from_slice(response).ok()?;
                Some(response_read_units(&c.name, &body))
            })
            .sum();
        units_max = units_max.max(units);
        units_sum += units;
    }
    latencies.sort();
    PageRow {
        memberships,
        limit,
        pages,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        calls_max,
        read_units_max: units_max,
        read_units_mean: units_sum as f64 / pages.max(1) as f64,
        shown,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// `user` in `n` conversations (one in ten a group), each with a last message of about 60
/// characters: the conversation, `user`'s member item and inbox entry, as the store writes them.
async fn set_up_memberships(t: &TestApp, user: &str, n: usize) {
    let me = UserId::parse(user).unwrap();
    let start = chat_domain::time::now() - Duration::from_secs(30 * 86_400);
    let mut items = Vec::with_capacity(3 * n);
    for i in 0..n {
        let at = chat_domain::time::rfc3339(start + Duration::from_secs(i as u64 * 7));
        let peer = UserId::parse(&format!("{user}-peer{i}")).unwrap();
        let group = i % 10 == 0;
        let id = if group {
            ConversationId::group(&me, Some(&uuid::Uuid::new_v4().to_string()))
        } else {
            ConversationId::direct(&me, &peer)
        };
        let mut pair = vec![me.clone(), peer.clone()];
        pair.sort();
        let kind = if group {
            ConversationType::Group
        } else {
            ConversationType::Direct
        };
        let c = ConversationItem {
            title: group.then(|| format!("Project {i}")),
            owner_id: group.then(|| me.clone()),
            direct_members: if group { vec![] } else { pair },
            member_count: if group { 12 } else { 2 },
            last_seq: 42,
            last_message_at: Some(at.clone()),
            last_message: Some(LastMessage {
                seq: 42,
                client_msg_id: uuid::Uuid::new_v4().to_string(),
                sender_id: peer.clone(),
                body: "See you at the station at 7, I'll bring the tickets and snacks".into(),
                created_at: at.clone(),
                truncated: false,
                has_attachments: false,
                origin: None,
            }),
            ..ConversationItem::new(&id, kind, &at)
        };
        let member = MemberItem {
            last_read_seq: 40,
            ..MemberItem::new(&id, &me, 40, &at, &at)
        };
        let filed = InboxPosition {
            key: c.activity_key(),
            conversation_id: id,
        };
        items.push(c.to_item().unwrap());
        items.push(member.to_item().unwrap());
        items.push(InboxEntryItem::to_item(&me, &filed).unwrap());
    }
    t.put_items(&items).await;
    t.calls.take();
}

/// Write units of the indexer's BatchWriteItem calls for `conversation` since the last take, and
/// the number of moves they made (entries put for `member`).
fn index_writes(t: &TestApp, conversation: &str, member: &str) -> (u64, usize) {
    let (mut units, mut moves) = (0, 0);
    let member_pk = format!("I#{member}");
    for call in t.calls.take_calls() {
        let Some(body) = call.write.filter(|_| call.name == "BatchWriteItem") else {
            continue;
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        let requests: Vec<&Value> = body["RequestItems"]
            .as_object()
            .into_iter()
            .flat_map(|tables| tables.values())
            .flat_map(|r| r.as_array().into_iter().flatten())
            .collect();
        // One call holds one conversation's writes.
        let ours = requests.iter().any(|r| {
            let item = r.get("PutRequest").map(|p| &p["Item"]);
            let key = r.get("DeleteRequest").map(|d| &d["Key"]);
            item.or(key)
                .and_then(|i| i["sk"]["S"].as_str())
                .is_some_and(|sk| sk.ends_with(conversation))
        });
        if !ours {
            continue;
        }
        for r in requests {
            units += match r.get("PutRequest") {
                Some(put) => {
                    moves += usize::from(put["Item"]["pk"]["S"] == member_pk.as_str());
                    write_units(item_size(put["Item"].as_object().unwrap()))
                }
                // Deleting an inbox entry (well under 1 KB), or nothing: 1 unit.
                None => 1,
            };
        }
    }
    (units, moves)
}

/// Read units of the Query a move makes: all the conversation's member items, strongly consistent
/// (DynamoDB charges the items read, not the projected attributes).
async fn member_query_units(t: &TestApp, conversation: &str) -> u64 {
    let id = chat_domain::ConversationId::parse(conversation).unwrap();
    let mut units = 0;
    for pk in chat_store::keys::members_pks(&id) {
        units += partition_query_units(t, &pk).await;
    }
    units
}

/// Read units of a strongly consistent Query of every member item of one partition.
async fn partition_query_units(t: &TestApp, pk: &str) -> u64 {
    let mut bytes = 0;
    let mut start = None;
    loop {
        let out =
            t.db.query()
                .table_name(&t.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND begins_with(sk, :m)")
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .expression_attribute_values(":m", AttributeValue::S("M#".into()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .unwrap();
        for item in out.items() {
            let json: Map<String, Value> = item
                .iter()
                .map(|(k, v)| (k.clone(), attribute_json(v)))
                .collect();
            bytes += item_size(&json);
        }
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => break,
        }
    }
    t.calls.take();
    read_units(bytes)
}

/// 1:1 messages, the indexer running after each (one message per batch, the common case).
async fn direct_messages(t: &TestApp, messages: usize) -> WriteRow {
    let (a, b) = (unique("a"), unique("b"));
    let c = t.direct(&a, &b).await;
    t.index().await;
    t.calls.take();
    let (mut units, mut moves) = (0, 0);
    for i in 0..messages {
        let sender = if i % 2 == 0 { &a } else { &b };
        assert_eq!(
            t.send(
                &c,
                sender,
                "a message of about sixty characters, as most are"
            )
            .await
            .status,
            201
        );
        t.calls.take();
        t.index().await;
        let (u, m) = index_writes(t, &c, &a);
        units += u;
        moves += m;
    }
    let per_move = member_query_units(t, &c).await;
    WriteRow {
        scenario: "1:1, one message per indexer batch".into(),
        messages,
        moves,
        write_units: units,
        read_units: per_move * moves as u64,
    }
}

/// A 1,000-member group: the first message of a 5-second step moves every member's entry; the
/// rest of a burst within the step move nothing.
async fn big_group_messages(t: &TestApp, burst: usize) -> Vec<WriteRow> {
    let owner = unique("owner");
    let prefix = unique("m");
    let others: Vec<String> = (0..999).map(|i| format!("{prefix}-{i}")).collect();
    let refs: Vec<&str> = others.iter().map(String::as_str).collect();
    let g = t.group(&owner, &refs).await;
    t.index().await;
    let per_move = member_query_units(t, &g).await;
    // At the start of a 5-second step, a message and then a burst as fast as sends go (all in
    // that step), before the indexer runs: then the indexer, one stream record per invocation, so
    // that each message is its own batch, as with an indexer that keeps up. The first message
    // moves every entry; the others leave the key where it is, and nothing moves.
    let now_ms = chat_domain::time::unix_millis(chat_domain::time::now());
    tokio::time::sleep(Duration::from_millis(5_000 - now_ms % 5_000 + 20)).await;
    let started = Instant::now();
    let hold = chat_tests::indexer::hold().await;
    let first = t.send(&g, &owner, "one for a thousand").await;
    assert_eq!(first.status, 201);
    let mut times = vec![first.body["createdAt"].as_str().unwrap().to_owned()];
    for i in 0..burst {
        let sent = t.send(&g, &owner, &format!("burst {i}")).await;
        assert_eq!(sent.status, 201);
        times.push(sent.body["createdAt"].as_str().unwrap().to_owned());
    }
    let took = started.elapsed().as_secs_f64();
    drop(hold);
    t.calls.take();
    t.index_in_batches_of(1).await;
    let (units, moves) = index_writes(t, &g, &owner);
    // The 5-second step of a time (bucketed from the empty key: the step itself).
    let step = |at: &str| chat_domain::inbox::activity_key(at, Some(""));
    let crossed = times.iter().any(|at| step(at) != step(&times[0]));
    vec![WriteRow {
        scenario: format!(
            "1,000-member group: a message, then {burst} more within {took:.1} s (one message per indexer batch{})",
            if crossed { "; crossed into the next 5-s step" } else { "" }
        ),
        messages: 1 + burst,
        moves,
        write_units: units,
        read_units: per_move * moves as u64,
    }]
}

// --- units of responses -------------------------------------------------------------------------

/// Strongly consistent read units of one read's response.
pub fn response_read_units(op: &str, body: &Value) -> u64 {
    let items = |v: &Value| -> Vec<Map<String, Value>> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_object().cloned())
            .collect()
    };
    match op {
        "Query" | "Scan" => read_units(items(&body["Items"]).iter().map(item_size).sum()),
        "BatchGetItem" => body["Responses"]
            .as_object()
            .into_iter()
            .flat_map(|tables| tables.values())
            .flat_map(items)
            .map(|i| read_units(item_size(&i)))
            .sum(),
        "GetItem" => body["Item"]
            .as_object()
            .map_or(1, |i| read_units(item_size(i))),
        _ => 0,
    }
}

fn attribute_json(v: &AttributeValue) -> Value {
    use serde_json::json;
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        AttributeValue::Null(b) => json!({ "NULL": b }),
        AttributeValue::Ss(s) => json!({ "SS": s }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(attribute_json).collect::<Vec<_>>() }),
        AttributeValue::M(m) => {
            json!({ "M": m.iter().map(|(k, v)| (k.clone(), attribute_json(v))).collect::<Map<_, _>>() })
        }
        _ => json!({ "NULL": true }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_are_counted_by_dynamodb_rules() {
        // A Query sums then rounds; BatchGetItem rounds each item.
        let small = json!({"pk": {"S": "x".repeat(1000)}});
        let query = json!({"Items": [small, small, small]});
        assert_eq!(response_read_units("Query", &query), 1);
        let batch = json!({"Responses": {"ChatTable": [small, small, small]}});
        assert_eq!(response_read_units("BatchGetItem", &batch), 3);
        assert_eq!(
            response_read_units("Query", &json!({"Items": []})),
            1,
            "at least 1"
        );
        let big = json!({"pk": {"S": "x".repeat(5000)}});
        assert_eq!(response_read_units("GetItem", &json!({"Item": big})), 2);
        assert_eq!(response_read_units("PutItem", &json!({})), 0);
    }
}
