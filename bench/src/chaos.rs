//! The chaos soak (docs/benchmarks.md, "Chaos soak"): mixed traffic from 8 users, no client
//! retries, and in its middle a DynamoDB brownout of 25 s: DynamoDB Local's process frozen
//! (SIGSTOP); on a backend without a DynamoDB-only process to stop (moto, which serves Kinesis
//! too), DynamoDB frozen by the strictness layer (`/strict/freeze`: no call goes on and no answer
//! comes back until the thaw, and a call that came meanwhile is served then even if its client
//! left). Afterwards every invariant the API promises is checked:
//!
//! - no acknowledged message is lost, and each conversation's seqs are exactly 1..N;
//! - a watermark never goes back, and unread counts are exact;
//! - a send answered 4xx (429 included) never appears, then or later (no ghost);
//! - a send whose outcome was unknown (503) is settled by its retry with the same `clientMsgId`:
//!   the original if it landed, sent now if not, never twice;
//! - no 5xx other than `503 unavailable`, and every 5xx in the API's error shape.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Table;
use chat_tests::{new_uuid, unique, TestApp};

const USERS: usize = 8;
/// When the brownout starts, how long it lasts, how long traffic runs in all.
const FREEZE_AT: Duration = Duration::from_secs(15);
const FREEZE_FOR: Duration = Duration::from_secs(25);
const TRAFFIC_FOR: Duration = Duration::from_secs(60);
/// How long after the traffic every late write (a commit frozen mid-way) has surely landed.
const SETTLE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct SendRecord {
    conversation: String,
    user: String,
    client_msg_id: String,
    body: String,
    status: u16,
    seq: Option<u64>,
}

#[derive(Default)]
struct Tally {
    ops: usize,
    by_status: BTreeMap<u16, usize>,
    /// 5xx answers not in the API's error shape, or with a code other than `unavailable`.
    bad_5xx: Vec<String>,
    sends: Vec<SendRecord>,
    /// Per (user, conversation): the watermarks its mark-reads answered, in order.
    watermarks: HashMap<(String, String), Vec<u64>>,
}

/// One worker: `user` acting on its conversations in a closed loop until `until`.
async fn worker(
    t: Arc<TestApp>,
    user: String,
    conversations: Vec<String>,
    until: Instant,
    seed: u64,
) -> Tally {
    let mut tally = Tally::default();
    let mut n = seed;
    while Instant::now() < until {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let c = conversations[(n >> 33) as usize % conversations.len()].clone();
        let pick = (n >> 20) % 100;
        let resp = if pick < 50 {
            let (id, body) = (new_uuid(), format!("from {user}, {}", tally.ops));
            let r = t
                .post(
                    &format!("/conversations/{c}/messages"),
                    &user,
                    json!({"clientMsgId": id, "body": body}),
                )
                .await;
            tally.sends.push(SendRecord {
                conversation: c.clone(),
                user: user.clone(),
                client_msg_id: id,
                body,
                status: r.status,
                seq: r.body["seq"].as_u64().filter(|_| r.status < 300),
            });
            r
        } else if pick < 80 {
            let seq = (n >> 40) % 200;
            let r = t
                .post(
                    &format!("/conversations/{c}/read"),
                    &user,
                    json!({"seq": seq}),
                )
                .await;
            if let (200, Some(w)) = (r.status, r.body["lastReadSeq"].as_u64()) {
                tally
                    .watermarks
                    .entry((user.clone(), c.clone()))
                    .or_default()
                    .push(w);
            }
            r
        } else if pick < 95 {
            t.get(&format!("/conversations/{c}/messages?limit=20"), &user)
                .await
        } else {
            t.get("/inbox?limit=10", &user).await
        };
        tally.ops += 1;
        *tally.by_status.entry(resp.status).or_default() += 1;
        if resp.status >= 500 && resp.code() != "unavailable" {
            tally.bad_5xx.push(format!("{} {}", resp.status, resp.body));
        }
    }
    tally
}

/// Every message of `c`, in order (walking `afterSeq`), and its `lastSeq`.
async fn all_messages(t: &TestApp, user: &str, c: &str) -> (Vec<Value>, u64) {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let page = t
            .get(
                &format!(
                    "/conversations/{c}/messages?afterSeq={}&limit=100",
                    out.len()
                ),
                user,
            )
            .await;
        assert_eq!(page.status, 200, "{page:?}");
        out.extend(page.body["messages"].as_array().unwrap().iter().cloned());
        if !page.body["hasMore"].as_bool().unwrap_or(false) {
            return (out, page.body["lastSeq"].as_u64().unwrap_or(0));
        }
    }
}

/// How the brownout is made.
enum Brownout {
    /// DynamoDB Local's process, stopped.
    Process(u32),
    /// The strictness layer holds every DynamoDB call.
    Layer,
    /// Neither is there (another endpoint without the layer).
    None,
}

impl Brownout {
    /// Stops DynamoDB Local's process `local` when there is one, else freezes the layer.
    fn start(local: Option<u32>) -> Brownout {
        if let Some(pid) = local {
            signal(pid, "-STOP");
            Brownout::Process(pid)
        } else if chat_tests::server::freeze_dynamodb(true) {
            Brownout::Layer
        } else {
            Brownout::None
        }
    }

    fn end(&self) {
        match self {
            Brownout::Process(pid) => signal(*pid, "-CONT"),
            Brownout::Layer => {
                chat_tests::server::freeze_dynamodb(false);
            }
            Brownout::None => {}
        }
    }

    fn describe(&self) -> String {
        let how = match self {
            Brownout::Process(_) => "DynamoDB Local's process stopped (SIGSTOP)".to_owned(),
            Brownout::Layer => {
                let held = chat_tests::server::dynamodb_partitions()
                    .and_then(|r| r["heldByFreeze"].as_u64())
                    .unwrap_or(0);
                let what = match chat_tests::server::dynamodb_kind() {
                    chat_tests::server::DynamoDb::Moto => "moto's DynamoDB",
                    chat_tests::server::DynamoDb::Local => "DynamoDB Local",
                    chat_tests::server::DynamoDb::Given => "DYNAMODB_ENDPOINT",
                };
                format!("{what} frozen by the strictness layer ({held} calls held)")
            }
            Brownout::None => return "none (no DynamoDB process, no strictness layer)".into(),
        };
        format!(
            "{how} {} s at {} s of {} s",
            FREEZE_FOR.as_secs(),
            FREEZE_AT.as_secs(),
            TRAFFIC_FOR.as_secs()
        )
    }
}

fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {signal} {pid}");
}

pub async fn run() -> Table {
    let t = Arc::new(TestApp::new().await);
    let users: Vec<String> = (0..USERS).map(|i| unique(&format!("chaos{i}"))).collect();
    let others: Vec<&str> = users[1..].iter().map(String::as_str).collect();
    let group = t.group(&users[0], &others).await;
    let mut of_user: Vec<Vec<String>> = vec![vec![group.clone()]; USERS];
    let mut conversations = vec![(group.clone(), users[0].clone())];
    for pair in (0..USERS).collect::<Vec<_>>().chunks(2) {
        let c = t.direct(&users[pair[0]], &users[pair[1]]).await;
        of_user[pair[0]].push(c.clone());
        of_user[pair[1]].push(c.clone());
        conversations.push((c, users[pair[0]].clone()));
    }

    let started = Instant::now();
    let until = started + TRAFFIC_FOR;
    let workers: Vec<_> = users
        .iter()
        .zip(of_user)
        .enumerate()
        .map(|(i, (u, cs))| tokio::spawn(worker(t.clone(), u.clone(), cs, until, i as u64 + 7)))
        .collect();
    // Found before the traffic: its /proc walk is no part of the brownout.
    let local = chat_tests::server::dynamodb_local_pid();
    tokio::time::sleep(FREEZE_AT).await;
    let brownout = Brownout::start(local);
    tokio::time::sleep(FREEZE_FOR).await;
    brownout.end();
    let mut tally = Tally::default();
    for w in workers {
        let one = w.await.unwrap();
        tally.ops += one.ops;
        for (s, n) in one.by_status {
            *tally.by_status.entry(s).or_default() += n;
        }
        tally.bad_5xx.extend(one.bad_5xx);
        tally.sends.extend(one.sends);
        tally.watermarks.extend(one.watermarks);
    }
    tokio::time::sleep(SETTLE).await;

    // Stored messages: seqs exactly 1..N; where each clientMsgId is.
    let mut gaps = 0;
    let mut stored: HashMap<String, (String, u64)> = HashMap::new();
    for (c, member) in &conversations {
        let (messages, last_seq) = all_messages(&t, member, c).await;
        let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
        if seqs != (1..=last_seq).collect::<Vec<_>>() {
            gaps += 1;
        }
        for m in &messages {
            let id = m["clientMsgId"].as_str().unwrap_or_default().to_lowercase();
            stored.insert(id, (c.clone(), m["seq"].as_u64().unwrap_or(0)));
        }
    }
    let find = |s: &SendRecord| stored.get(&s.client_msg_id.to_lowercase()).cloned();
    let lost = tally
        .sends
        .iter()
        .filter(|s| s.status < 300)
        .filter(|s| find(s) != Some((s.conversation.clone(), s.seq.unwrap_or(0))))
        .count();
    let ghosts = tally
        .sends
        .iter()
        .filter(|s| (400..500).contains(&s.status) && find(s).is_some())
        .count();
    // Unknown outcomes: the retry with the same clientMsgId settles each, once.
    let unknown: Vec<&SendRecord> = tally.sends.iter().filter(|s| s.status >= 500).collect();
    let (mut landed, mut unsettled) = (0, 0);
    for s in &unknown {
        let was_stored = find(s).is_some();
        landed += usize::from(was_stored);
        let r = t
            .post(
                &format!("/conversations/{}/messages", s.conversation),
                &s.user,
                json!({"clientMsgId": s.client_msg_id, "body": s.body}),
            )
            .await;
        let expected = if was_stored { 200 } else { 201 };
        unsettled += usize::from(r.status != expected);
    }
    for (c, member) in &conversations {
        let (messages, last_seq) = all_messages(&t, member, c).await;
        let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
        if seqs != (1..=last_seq).collect::<Vec<_>>() {
            gaps += 1;
        }
    }
    // Watermarks: never back, and what readStates shows now is at least the last answered.
    let mut regressions = tally
        .watermarks
        .values()
        .filter(|ws| ws.windows(2).any(|w| w[1] < w[0]))
        .count();
    for ((user, c), ws) in &tally.watermarks {
        let states = t.get(&format!("/conversations/{c}/reads"), user).await;
        let now = states.body["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["userId"] == user.as_str())
            .and_then(|m| m["lastReadSeq"].as_u64())
            .unwrap_or(0);
        regressions += usize::from(ws.last().is_some_and(|last| now < *last));
    }
    let mut wrong_unread = 0;
    for u in &users {
        let inbox = t.get("/inbox?limit=100", u).await;
        for e in inbox.body["conversations"].as_array().into_iter().flatten() {
            let (last, read) = (e["lastSeq"].as_u64(), e["lastReadSeq"].as_u64());
            let unread = e["unreadCount"].as_u64();
            wrong_unread += usize::from(
                last.zip(read).map(|(l, r)| l.saturating_sub(r)) != unread || read > last,
            );
        }
    }

    let count = |pred: &dyn Fn(u16) -> bool| -> usize {
        tally
            .by_status
            .iter()
            .filter(|(s, _)| pred(**s))
            .map(|(_, n)| n)
            .sum()
    };
    for b in tally.bad_5xx.iter().take(5) {
        eprintln!("chaos: a 5xx other than 503 unavailable: {b}");
    }
    let mut table = Table::new(vec![
        "brownout",
        "requests",
        "2xx",
        "429",
        "503 unavailable",
        "other 4xx",
        "other 5xx",
        "lost acks",
        "seq gaps",
        "watermark regressions",
        "unread wrong",
        "ghosts after a 4xx",
        "503s that had landed / not (all settled by the retry)",
    ]);
    table.rows.push(vec![
        brownout.describe(),
        tally.ops.to_string(),
        count(&|s| (200..300).contains(&s)).to_string(),
        count(&|s| s == 429).to_string(),
        (count(&|s| s >= 500) - tally.bad_5xx.len()).to_string(),
        count(&|s| (400..500).contains(&s) && s != 429).to_string(),
        tally.bad_5xx.len().to_string(),
        lost.to_string(),
        gaps.to_string(),
        regressions.to_string(),
        wrong_unread.to_string(),
        ghosts.to_string(),
        format!(
            "{landed} / {}{}",
            unknown.len() - landed,
            if unsettled > 0 {
                format!(" (**{unsettled} not settled**)")
            } else {
                String::new()
            }
        ),
    ]);
    table
}
