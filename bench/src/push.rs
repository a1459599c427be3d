//! Push benchmarks (rows of docs/benchmarks.md), against the local stack in-process: the
//! emulator, the local gateway (WebSocket API, Management API, stream → relay → Kinesis → fanout
//! pollers) and the real REST handlers.
//!
//! ```text
//! cargo run -p chat-bench --bin bench -- push [big-group|storm|typing] [--online N]
//!     [--api http://127.0.0.1:9000 [--ws ws://127.0.0.1:9001/]]
//! ```
//!
//! With `--api`, both drive a running local stack (`infra/run-local.sh`) over its REST API and
//! WebSocket endpoint instead, as a client would; `--online` sets how many of the big group's
//! 999 other members are connected (default 300).
//!
//! * **big group**: a 1,000-member group with 300 (`--online`) of its members online.
//!   Send-to-push latency is, per online member and message k, from the start of the send
//!   request to the first `message.new`
//!   of seq ≥ k at that member (light messages may be coalesced: a client holding seq ≥ k knows of
//!   k and fetches it with `afterSeq`). Reported: p50, p99, max, missing (never learnt of), and
//!   pushes/s (frames received ÷ time from the first send to the last frame).
//! * **reconnect storm**: 300 users in a 301-member group and in 30 groups of 11 while a sender
//!   keeps sending; all 300 drop their sockets, messages keep coming, then all reconnect at once,
//!   catch up with `/inbox` + `afterSeq` (and on every push gap), and mark read. Reported: 5xx
//!   (REST answers and refused handshakes), p50/p99 of the REST calls and of reconnect-to-caught-up
//!   per user, and missed messages: each user must end holding exactly 1..lastSeq of each of its
//!   conversations, judged against the server's lastSeq without a final fetch.
//! * **typing**: a 1,000-member group with 300 (`--online`) members online, 20 of them typing
//!   (a `start` every 2 s, the fastest the server accepts) for 20 s (docs/api.md §37), all at
//!   once, then spread out (one every 100 ms, so the set changes every second). Reported:
//!   the typing frames in and out per second, per recipient the most frames in any 1 s and the
//!   shortest gap between two, the time from the first start to each recipient's first frame, and
//!   the largest `count` seen (20: nothing of the set lost).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::flag_value;
use crate::target::Target;
use chat_tests::push::{gateway, WsClient};
use chat_tests::{unique, TestApp};

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the scenarios named in `args` (all when none).
pub async fn run(args: &[String]) {
    let value = |flag: &str| flag_value(args, flag);
    let online: usize = value("--online").map_or(300, |n| n.parse().expect("--online N"));
    let named = |s: &str| args.iter().any(|a| a == s);
    let all = !named("storm") && !named("big-group") && !named("typing");
    let today = &chat_domain::time::now_rfc3339()[..10];
    let stack = match value("--api") {
        Some(api) => {
            let ws = value("--ws").unwrap_or_else(|| "ws://127.0.0.1:9001/".into());
            println!("push benchmarks, {today}, local stack at {api} and {ws}");
            Stack {
                target: Target::http(&api),
                ws_url: ws,
            }
        }
        None => {
            let t = Arc::new(TestApp::new().await);
            let build = if cfg!(debug_assertions) {
                "debug build"
            } else {
                "optimised build"
            };
            println!("push benchmarks, {today}, {build}, local stack in process");
            Stack {
                target: Target::InProcess(t),
                ws_url: gateway().ws_url.clone(),
            }
        }
    };
    let stack = Arc::new(stack);
    // The storm first: its catch-up reads the inbox index, which the emulator answers by looking
    // at every item of the table, and the big groups add thousands.
    if all || named("storm") {
        reconnect_storm(&stack).await;
    }
    if all || named("big-group") {
        big_group(&stack, online, 20, Duration::from_millis(500)).await;
        big_group(&stack, online, 20, Duration::ZERO).await;
    }
    if all || named("typing") {
        typing(&stack, online, 20, Duration::from_secs(20), false).await;
        typing(&stack, online, 20, Duration::from_secs(20), true).await;
    }
}

/// What one member's socket saw of the conversation's typing frames: arrival times and counts.
async fn typing_member(
    mut client: WsClient,
    conv: String,
    typist: bool,
    first: Instant,
    until: Instant,
) -> (Vec<Instant>, usize) {
    let frame = json!({"action": "typing", "conversationId": conv, "state": "start"}).to_string();
    let (mut arrivals, mut most) = (Vec::new(), 0);
    let mut next_start = first;
    loop {
        let now = Instant::now();
        if typist && now >= next_start && now < until {
            client.send_text(&frame).await;
            next_start += Duration::from_millis(2_000);
        }
        let wake = if typist && next_start < until {
            next_start.min(until + Duration::from_secs(2))
        } else {
            until + Duration::from_secs(2)
        };
        if client.closed || (Instant::now() >= wake && wake >= until) {
            break;
        }
        let left = wake.saturating_duration_since(Instant::now());
        if let Some(e) = client.next_event(left).await {
            if e["type"] == "typing" && e["conversationId"] == conv.as_str() {
                arrivals.push(Instant::now());
                most = most.max(e["count"].as_u64().unwrap_or(0) as usize);
            }
        }
    }
    (arrivals, most)
}

/// `spread`: the typists start one after another over the 2 s (each then every 2 s), instead of
/// all at once.
async fn typing(stack: &Stack, online: usize, typists: usize, period: Duration, spread: bool) {
    let owner = unique("ty");
    let members: Vec<String> = (1..1000).map(|i| format!("{owner}-{i}")).collect();
    let conv = stack.target.create_group(&owner, "typing", &members).await;
    let online = &members[..online.min(members.len())];
    let clients = stack.connect_all(online).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = Instant::now() + Duration::from_millis(200);
    let until = first + period;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let offset = if spread && i < typists {
                Duration::from_millis(2_000 * i as u64 / typists as u64)
            } else {
                Duration::ZERO
            };
            let typist = i < typists;
            tokio::spawn(typing_member(
                c,
                conv.clone(),
                typist,
                first + offset,
                until,
            ))
        })
        .collect();
    let (mut frames, mut most_count, mut worst_second, mut min_gap) = (0, 0, 0, Duration::MAX);
    let mut first_frames = Vec::new();
    for t in tasks {
        let (arrivals, most) = t.await.unwrap();
        frames += arrivals.len();
        most_count = most_count.max(most);
        if let Some(a) = arrivals.first() {
            first_frames.push(a.saturating_duration_since(first));
        }
        for (i, a) in arrivals.iter().enumerate() {
            let within = arrivals[i..]
                .iter()
                .take_while(|b| b.duration_since(*a) < Duration::from_secs(1))
                .count();
            worst_second = worst_second.max(within);
            if let Some(b) = arrivals.get(i + 1) {
                min_gap = min_gap.min(b.duration_since(*a));
            }
        }
    }
    first_frames.sort();
    let secs = period.as_secs_f64();
    let starts = typists as f64 * (secs / 2.0).ceil();
    println!(
        "typing, 1,000 members, {} online, {typists} typing {} for {secs:.0} s: {:.0} starts/s in, \
         {:.0} typing frames/s out ({frames} in all, {:.2} per recipient per s); per recipient \
         at most {worst_second} in any 1 s, shortest gap {:.0} ms; first frame p50 {:.0} ms, \
         p99 {:.0} ms; largest count {most_count}; {} of {} members got a frame",
        online.len(),
        if spread { "one every 100 ms" } else { "at once" },
        starts / secs,
        frames as f64 / secs,
        frames as f64 / secs / online.len() as f64,
        ms(min_gap.min(Duration::from_secs(60))),
        percentile(&first_frames, 0.5),
        percentile(&first_frames, 0.99),
        first_frames.len(),
        online.len(),
    );
}

/// Where the big-group rows run: REST calls, and the WebSocket endpoint clients connect to.
struct Stack {
    target: Target,
    ws_url: String,
}

impl Stack {
    /// The WebSocket URL `user` connects with.
    fn ws_url_for(&self, user: &str) -> String {
        format!("{}?token={}", self.ws_url, self.target.token(user))
    }

    async fn connect(&self, user: &str) -> WsClient {
        WsClient::connect_url(&self.ws_url_for(user))
            .await
            .unwrap_or_else(|status| panic!("handshake refused: {status}"))
    }

    /// Connects `users` (at most 25 handshakes at once).
    async fn connect_all(&self, users: &[String]) -> Vec<WsClient> {
        use futures::stream::{self, StreamExt};
        stream::iter(users)
            .map(|u| self.connect(u))
            .buffered(25)
            .collect()
            .await
    }
}

/// `message.new` arrivals at one client: (seq, when).
type Arrivals = Vec<(u64, Instant)>;

/// Reads a client's frames until `stop`, recording the `message.new` of `conversation`.
/// Counts frames, and the listeners that have seen the last seq.
#[derive(Default)]
struct Progress {
    frames: AtomicU64,
    done: AtomicU64,
}

fn listen(
    mut client: WsClient,
    conversation: String,
    last: u64,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
) -> tokio::task::JoinHandle<Arrivals> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut done = false;
        while !stop.load(Ordering::Relaxed) && !client.closed {
            if let Some(e) = client.next_event(Duration::from_millis(100)).await {
                let at = Instant::now();
                progress.frames.fetch_add(1, Ordering::Relaxed);
                if e["type"] == "message.new" && e["conversationId"] == conversation.as_str() {
                    let seq = e["seq"].as_u64().unwrap_or(0);
                    out.push((seq, at));
                    if seq >= last && !done {
                        done = true;
                        progress.done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        out
    })
}

/// A 1,000-member group with `online` of its other members connected; `n` messages, one every
/// `interval` (zero: back to back).
async fn big_group(stack: &Stack, online: usize, n: u64, interval: Duration) {
    let owner = unique("bg");
    let members: Vec<String> = (1..1000).map(|i| format!("{owner}-{i}")).collect();
    let conv = stack
        .target
        .create_group(&owner, "big group", &members)
        .await;
    let online = &members[..online.min(members.len())];
    let clients = stack.connect_all(online).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered_before = stack
        .target
        .app()
        .map(|_| gateway().fanout_stats().delivered());
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    let listeners: Vec<_> = clients
        .into_iter()
        .map(|c| listen(c, conv.clone(), n, stop.clone(), progress.clone()))
        .collect();

    let mut sent_at = Vec::new();
    let first = Instant::now();
    for k in 1..=n {
        let started = Instant::now();
        let body = json!({"clientMsgId": uuid::Uuid::new_v4().to_string(), "body": format!("message {k}")});
        let (status, r) = stack
            .target
            .call(
                "POST",
                &format!("/conversations/{conv}/messages"),
                &owner,
                Some(body),
            )
            .await;
        assert_eq!(status, 201, "{r}");
        sent_at.push(started);
        let next = first + interval * k as u32;
        tokio::time::sleep_until(next.into()).await;
    }
    // Until every member has seen seq n (or 15 s), and a moment for repeats.
    let deadline = Instant::now() + Duration::from_secs(15);
    while progress.done.load(Ordering::Relaxed) < online.len() as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let (mut missing, mut received, mut last_frame) = (0usize, 0usize, first);
    for l in listeners {
        let arrivals = l.await.unwrap();
        received += arrivals.len();
        for (_, at) in &arrivals {
            last_frame = last_frame.max(*at);
        }
        for (k, sent) in (1..=n).zip(&sent_at) {
            match arrivals
                .iter()
                .filter(|(s, _)| *s >= k)
                .map(|(_, at)| *at)
                .min()
            {
                Some(at) => latencies.push(at.saturating_duration_since(*sent)),
                None => missing += 1,
            }
        }
    }
    latencies.sort();
    let span = last_frame.saturating_duration_since(first).as_secs_f64();
    let pace = if interval.is_zero() {
        "back to back".to_owned()
    } else {
        format!("1 every {} ms", interval.as_millis())
    };
    println!("| scenario | samples | p50 ms | p99 ms | max ms | pushes | pushes/s | missing |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| 1,000-member group, {} online, {n} messages {pace} | {} | {:.0} | {:.0} | {:.0} | {received} | {:.0} | {missing} |",
        online.len(),
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().map_or(f64::NAN, |d| ms(*d)),
        received as f64 / span,
    );
    let other_frames = progress.frames.load(Ordering::Relaxed) as usize - received;
    match delivered_before {
        Some(before) => println!(
            "  (fanout delivered {} frames; {other_frames} frames of other kinds)",
            gateway().fanout_stats().delivered() - before
        ),
        None => println!("  ({other_frames} frames of other kinds)"),
    }
}

/// What a storm client holds and how its calls went.
#[derive(Default)]
struct Holdings {
    seqs: HashMap<String, BTreeSet<u64>>,
}

impl Holdings {
    /// The highest seq held without a gap.
    fn contiguous(&self, conversation: &str) -> u64 {
        let mut n = 0;
        if let Some(s) = self.seqs.get(conversation) {
            while s.contains(&(n + 1)) {
                n += 1;
            }
        }
        n
    }
}

#[derive(Default)]
struct Calls {
    latencies: Mutex<Vec<Duration>>,
    server_errors: AtomicU64,
    other_errors: AtomicU64,
}

/// Client retries of a failed call (docs/api.md §17: 5xx and 429 are retried, with backoff).
const CLIENT_ATTEMPTS: u32 = 20;

fn client_backoff(attempt: u32) -> Duration {
    chat_domain::retry::jitter(
        Duration::from_millis(100),
        Duration::from_millis(250 << attempt.min(4)).min(Duration::from_secs(3)),
    )
}

impl Calls {
    async fn get(&self, t: &Target, path: &str, user: &str) -> Value {
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            let (status, body) = t.call("GET", path, user, None).await;
            self.record(started, status);
            attempt += 1;
            if (status < 500 && status != 429) || attempt == CLIENT_ATTEMPTS {
                return body;
            }
            tokio::time::sleep(client_backoff(attempt)).await;
        }
    }

    async fn post(&self, t: &Target, path: &str, user: &str, body: Value) {
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            let (status, _) = t.call("POST", path, user, Some(body.clone())).await;
            self.record(started, status);
            attempt += 1;
            if (status < 500 && status != 429) || attempt == CLIENT_ATTEMPTS {
                return;
            }
            tokio::time::sleep(client_backoff(attempt)).await;
        }
    }

    fn record(&self, started: Instant, status: u16) {
        self.latencies.lock().unwrap().push(started.elapsed());
        if status >= 500 {
            self.server_errors.fetch_add(1, Ordering::Relaxed);
        } else if status >= 400 {
            self.other_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Fetches `afterSeq` pages until caught up with the server; returns its lastSeq.
async fn fetch_after(t: &Target, calls: &Calls, user: &str, c: &str, h: &mut Holdings) -> u64 {
    loop {
        let after = h.contiguous(c);
        let page = calls
            .get(
                t,
                &format!("/conversations/{c}/messages?afterSeq={after}&limit=100"),
                user,
            )
            .await;
        let set = h.seqs.entry(c.to_owned()).or_default();
        for m in page["messages"].as_array().into_iter().flatten() {
            set.insert(m["seq"].as_u64().unwrap_or(0));
        }
        if page["hasMore"] != json!(true) {
            return page["lastSeq"].as_u64().unwrap_or(0);
        }
    }
}

/// A push: a full message is held; a light one or a gap is filled with `afterSeq`.
async fn on_push(t: &Target, calls: &Calls, user: &str, e: &Value, h: &mut Holdings) {
    if e["type"] != "message.new" {
        return;
    }
    let (c, seq) = (
        e["conversationId"].as_str().unwrap_or(""),
        e["seq"].as_u64().unwrap_or(0),
    );
    let full = e.get("body").is_some();
    if full && seq <= h.contiguous(c) + 1 {
        h.seqs.entry(c.to_owned()).or_default().insert(seq);
    } else if seq > h.contiguous(c) {
        fetch_after(t, calls, user, c, h).await;
    }
}

/// Connect, then catch up (inbox, afterSeq for each conversation that moved), mark read.
async fn catch_up(t: &Target, calls: &Calls, user: &str, h: &mut Holdings) {
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/inbox?limit=100&cursor={c}"),
            None => "/inbox?limit=100".to_owned(),
        };
        let page = calls.get(t, &path, user).await;
        for entry in page["conversations"].as_array().into_iter().flatten() {
            let c = entry["conversationId"].as_str().unwrap_or("").to_owned();
            if entry["lastSeq"].as_u64().unwrap_or(0) > h.contiguous(&c) {
                let last = fetch_after(t, calls, user, &c, h).await;
                calls
                    .post(
                        t,
                        &format!("/conversations/{c}/read"),
                        user,
                        json!({ "seq": last }),
                    )
                    .await;
            }
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
}

async fn reconnect_storm(stack: &Arc<Stack>) {
    const USERS: usize = 300;
    let t = &stack.target;
    let sender = unique("storm");
    let users: Vec<String> = (0..USERS).map(|i| format!("{sender}-{i}")).collect();
    let big = t.create_group(&sender, "storm", &users).await;
    let small: Vec<String> = {
        let mut out = Vec::new();
        for chunk in users.chunks(10) {
            out.push(t.create_group(&sender, "storm", chunk).await);
        }
        out
    };
    let mut conversations = vec![big.clone()];
    conversations.extend(small.iter().cloned());

    // The sender: alternately the big group and the next small group, every 100 ms.
    let sending = Arc::new(AtomicBool::new(true));
    let sender_task = {
        let (t, sending, big, small, sender) = (
            t.clone(),
            sending.clone(),
            big.clone(),
            small.clone(),
            sender.clone(),
        );
        tokio::spawn(async move {
            let (mut i, mut errors) = (0usize, 0usize);
            let start = Instant::now();
            // Paced at 10/s; a send that takes longer delays the next (closed loop).
            while sending.load(Ordering::Relaxed) {
                let c = if i % 2 == 0 {
                    &big
                } else {
                    &small[(i / 2) % small.len()]
                };
                let body = json!({"clientMsgId": uuid::Uuid::new_v4().to_string(), "body": format!("storm {i}")});
                let (status, _) = t
                    .call(
                        "POST",
                        &format!("/conversations/{c}/messages"),
                        &sender,
                        Some(body),
                    )
                    .await;
                errors += usize::from(status >= 500);
                i += 1;
                tokio::time::sleep_until((start + Duration::from_millis(100) * i as u32).into())
                    .await;
            }
            (i, errors, start.elapsed())
        })
    };

    // Phase 1: everyone online for 2 s.
    let calls = Arc::new(Calls::default());
    let stop = Arc::new(AtomicBool::new(false));
    let holdings: Vec<Arc<tokio::sync::Mutex<Holdings>>> =
        (0..USERS).map(|_| Arc::default()).collect();
    let session = |user: String,
                   client: WsClient,
                   h: Arc<tokio::sync::Mutex<Holdings>>,
                   stop: Arc<AtomicBool>| {
        let (t, calls) = (t.clone(), calls.clone());
        tokio::spawn(async move {
            let mut client = client;
            while !stop.load(Ordering::Relaxed) && !client.closed {
                if let Some(e) = client.next_event(Duration::from_millis(100)).await {
                    on_push(&t, &calls, &user, &e, &mut *h.lock().await).await;
                }
            }
            client
        })
    };
    let clients = stack.connect_all(&users).await;
    let tasks: Vec<_> = users
        .iter()
        .zip(clients)
        .zip(&holdings)
        .map(|((u, c), h)| session(u.clone(), c, h.clone(), stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Phase 2: all drop their sockets; messages keep coming for 2 s.
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap().close().await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Phase 3: all reconnect at once, socket first, then catch up and mark read.
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(app) = t.app() {
        app.calls.take_calls();
    }
    let storm_started = Instant::now();
    let reconnects: Vec<_> = users
        .iter()
        .zip(&holdings)
        .map(|(u, h)| {
            let url = stack.ws_url_for(u);
            let (t, calls, refused, h, u, stop) = (
                t.clone(),
                calls.clone(),
                refused.clone(),
                h.clone(),
                u.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let started = Instant::now();
                // A refused handshake (the $connect handler answered 5xx) is retried with
                // backoff, as clients reconnect.
                let mut attempt = 0;
                let client = loop {
                    match WsClient::connect_url(&url).await {
                        Ok(c) => break c,
                        Err(status) if attempt + 1 < CLIENT_ATTEMPTS => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            if status >= 500 {
                                calls.server_errors.fetch_add(1, Ordering::Relaxed);
                            }
                            attempt += 1;
                            tokio::time::sleep(client_backoff(attempt)).await;
                        }
                        Err(status) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            if status >= 500 {
                                calls.server_errors.fetch_add(1, Ordering::Relaxed);
                            }
                            return (Duration::ZERO, None);
                        }
                    }
                };
                catch_up(&t, &calls, &u, &mut *h.lock().await).await;
                let caught_up = started.elapsed();
                let mut client = client;
                while !stop.load(Ordering::Relaxed) && !client.closed {
                    if let Some(e) = client.next_event(Duration::from_millis(100)).await {
                        on_push(&t, &calls, &u, &e, &mut *h.lock().await).await;
                    }
                }
                (caught_up, Some(client))
            })
        })
        .collect();
    // Messages keep coming for 3 s after the reconnect, then the pipeline drains.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sending.store(false, Ordering::Relaxed);
    let (sent, send_errors, sending_for) = sender_task.await.unwrap();
    // The server's lastSeq of each conversation, now that nothing more is sent; then the pipeline
    // drains: until every user holds 1..lastSeq of its conversations, or 30 s (a user still
    // missing something then has missed it: no push is coming that would make it look).
    let mut last_seq = HashMap::new();
    for c in &conversations {
        let (_, conv) = t
            .call("GET", &format!("/conversations/{c}"), &sender, None)
            .await;
        last_seq.insert(c.clone(), conv["lastSeq"].as_u64().unwrap_or(0));
    }
    let drained = Instant::now() + Duration::from_secs(30);
    loop {
        let mut complete = true;
        for (i, h) in holdings.iter().enumerate() {
            let h = h.lock().await;
            for c in [&big, &small[i / 10]] {
                complete &= h.contiguous(c) >= last_seq[c];
            }
        }
        if complete || Instant::now() > drained {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut caught_up = Vec::new();
    for r in reconnects {
        let (d, client) = r.await.unwrap();
        if let Some(c) = client {
            caught_up.push(d);
            c.close().await;
        }
    }
    let storm = storm_started.elapsed();

    // Judged against the server: exactly 1..lastSeq of each of the user's conversations.
    let (mut missed, mut extra) = (0u64, 0u64);
    let mut missing_seqs: Vec<(bool, u64, u64)> = Vec::new();
    for (i, h) in holdings.iter().enumerate() {
        let h = h.lock().await;
        for c in [&big, &small[i / 10]] {
            let held = h.seqs.get(c.as_str()).cloned().unwrap_or_default();
            let want = last_seq[c];
            for s in (1..=want).filter(|s| !held.contains(s)) {
                missed += 1;
                missing_seqs.push((c == &big, s, want));
            }
            extra += held.iter().filter(|s| **s == 0 || **s > want).count() as u64;
        }
    }
    let mut rest = calls.latencies.lock().unwrap().clone();
    rest.sort();
    caught_up.sort();
    println!("| scenario | 5xx (REST and handshakes) | other 4xx | refused handshakes | REST calls | REST p50 ms | REST p99 ms | caught up p50 ms | caught up p99 ms | messages sent | missed | extra |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| reconnect storm: {USERS} users drop and reconnect at once, a sender at up to 10 msg/s ({:.1}/s reached) | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {sent} | {missed} | {extra} |",
        sent as f64 / sending_for.as_secs_f64(),
        calls.server_errors.load(Ordering::Relaxed) + send_errors as u64,
        calls.other_errors.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        rest.len(),
        percentile(&rest, 0.5),
        percentile(&rest, 0.99),
        percentile(&caught_up, 0.5),
        percentile(&caught_up, 0.99),
    );
    println!("  (storm phase {:.1} s)", storm.as_secs_f64());
    let Some(app) = t.app() else {
        return; // a running stack: its fanout and DynamoDB calls are in its own log
    };
    let f = gateway().fanout_stats();
    println!(
        "  fanout since start: delivered {}, retries {}, gave up {}, records deleted {}, kept in grace {}",
        f.delivered(),
        f.retries(),
        f.gave_up(),
        f.forgotten(),
        f.kept_in_grace()
    );
    if !missing_seqs.is_empty() {
        println!(
            "  missed (big group?, seq, lastSeq): {:?}",
            &missing_seqs[..missing_seqs.len().min(20)]
        );
    }
    // The REST handlers' DynamoDB calls during the storm (the emulator answers one at a time).
    let mut by: std::collections::BTreeMap<String, (usize, Duration)> = Default::default();
    for c in app.calls.take_calls() {
        let e = by.entry(c.name).or_default();
        e.0 += 1;
        e.1 += c.elapsed;
    }
    for (name, (n, d)) in by {
        println!(
            "  REST DynamoDB {name}: {n} calls, mean {:.0} ms",
            ms(d) / n as f64
        );
    }
}
