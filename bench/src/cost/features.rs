//! The lines of this round's features (docs/cost.md): attachments, rate limiting, offline
//! notifications, typing. Measured like the others (the real handlers and stores in process,
//! every DynamoDB call recorded, units from item sizes), priced with the prices of `cost.rs`; what
//! cannot be measured locally (S3 requests, SNS publishes, WebSocket frames out) is counted from
//! the code's calls and printed as such.

use std::time::Duration;

use chat_domain::notify::{Content, NotifyWindow};
use chat_domain::typing::ExpiryCheck;
use chat_domain::{ConversationId, UserId};
use chat_store::notify::NotifySettings;
use chat_store::push::{Notifier, Pusher};
use chat_store::{ConnectionStore, RateLimits};
use serde_json::json;

use super::{
    dollars, read_units_of, reads_of, total, write_units_in, Bench, Line, Op, HTTP_REQUEST,
    LAMBDA_GB_S, LAMBDA_REQUEST, MEMORY_GB, MILLION, OUT_GB, RRU, WRU, WS_MESSAGE,
};
use chat_tests::{new_uuid, unique, upload_with, Call, TestApp};

/// S3 Standard requests (docs/cost.md, "1 M attachment uploads"): PUT-class and GET-class.
pub const S3_PUT: f64 = 0.005e-3;
pub const S3_GET: f64 = 0.0004e-3;
/// SNS mobile push, per publish.
pub const SNS_PUBLISH: f64 = 0.50e-6;
/// SQS, per request (standard queue).
pub const SQS_REQUEST: f64 = 0.40e-6;

/// Counted from the code, not measurable locally (printed as such).
#[derive(Debug, Clone, Copy)]
pub struct FeatureAssumptions {
    /// Bytes of an attachment downloaded (data out).
    pub attachment_bytes: f64,
    /// S3 requests the client and the send make per upload (the presigned PUT; the send's
    /// `DeleteObjectTagging`, PUT-class) and per download (one GET).
    pub s3_puts_per_upload: f64,
    pub s3_gets_per_download: f64,
    /// Typing frames out per frame in (docs/benchmarks.md, 2026-12-06 "Typing": 150 out for
    /// 10 in a second, 300 online and 20 typing in a 1,000-member group) and bytes per frame out.
    pub typing_out_per_in: f64,
    pub typing_frame_bytes: f64,
    /// The notifier's duration per window, in ms.
    pub notifier_ms: f64,
    /// Devices per member notified (one SNS publish each).
    pub devices_per_member: f64,
}

pub const FEATURES_ASSUMED: FeatureAssumptions = FeatureAssumptions {
    attachment_bytes: 1_000_000.0,
    s3_puts_per_upload: 2.0,
    s3_gets_per_download: 1.0,
    typing_out_per_in: 15.0,
    typing_frame_bytes: 100.0,
    notifier_ms: 15.0,
    devices_per_member: 1.0,
};

/// DynamoDB calls and units of something that is not a REST request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Units {
    pub calls: f64,
    pub wru: f64,
    pub rru: f64,
}

#[derive(Debug, Clone, Default)]
pub struct FeaturesMeasured {
    /// `createAttachment`; what one attachment adds to a send (its claim in the send's
    /// transaction); `getAttachment` (the 302).
    pub upload: Op,
    pub send_plain: Op,
    pub send_with_attachment: Op,
    pub download: Op,
    /// What the send limit and the sampled all-requests limit add to a send (the connections
    /// table's calls and units).
    pub limit_per_send: Units,
    /// Per message: the window's opening (1 in a window) and a message while it is open.
    pub window_open: Units,
    pub window_open_again: Units,
    /// One window of a group whose members each have a device and unread messages: its units,
    /// and how many members it notified.
    pub window: Units,
    pub window_notified: f64,
    /// A typing `start` frame in steady state (not the connection's first in the conversation),
    /// pushes' claims and reads included, per frame.
    pub typing_frame: Units,
    /// The same with every user id 128 characters long (the longest allowed).
    pub typing_frame_long_ids: Units,
    /// ws-connection's time per typing frame (its waits included; posts not: the bench has no
    /// Management API), in ms.
    pub typing_frame_ms: f64,
    /// A start's expiry check when its typist has started again since (the steady state: every
    /// accepted start queues one; the last start of a typist who goes quiet makes a push, a
    /// frame's change), and its time in ms.
    pub typing_check: Units,
    pub typing_check_ms: f64,
}

impl Bench<'_> {
    /// Measures every feature line; `n` requests per REST operation.
    pub(super) async fn measure_features(&self, n: usize) -> FeaturesMeasured {
        let t = self.t;
        let mut f = FeaturesMeasured::default();
        let (a, _b, c) = t.new_direct().await;

        // Attachments: created, uploaded through the S3 gate, sent, downloaded by the stable link.
        let create = |_| {
            let body = json!({"fileName": "photo.jpg", "contentType": "image/jpeg", "size": 1000});
            let path = format!("/conversations/{c}/attachments");
            ("POST", path, a.clone(), Some(body))
        };
        f.upload = self.op(n, create).await;
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(uploaded(t, &c, &a).await);
        }
        f.send_plain = self.sends(n, &c, &a).await;
        f.send_with_attachment = self
            .op(n, |i| {
                let body = json!({"clientMsgId": new_uuid(), "body": "", "attachments": [ids[i]]});
                let path = format!("/conversations/{c}/messages");
                ("POST", path, a.clone(), Some(body))
            })
            .await;
        f.download = self
            .op(n, |i| {
                let path = format!("/conversations/{c}/attachments/{}", ids[i]);
                ("GET", path, a.clone(), None)
            })
            .await;

        f.limit_per_send = limiter_units(n, &c, &a).await;
        self.notifications(&mut f).await;
        (
            f.typing_frame,
            f.typing_frame_ms,
            f.typing_check,
            f.typing_check_ms,
        ) = self.typing(false).await;
        f.typing_frame_long_ids = self.typing(true).await.0;
        f
    }

    /// The delay window of a 100-member group: its opening per message, then its job.
    async fn notifications(&self, f: &mut FeaturesMeasured) {
        let t = self.t;
        let owner = unique("notify-owner");
        let members: Vec<String> = (0..99).map(|i| format!("{owner}-{i}")).collect();
        let g = t.group(&owner, &members).await;
        for m in &members {
            let body = json!({"platform": "fcm", "token": unique("tok")}).to_string();
            let path = format!("/devices/{}", unique("d"));
            assert_eq!(t.call("PUT", &path, Some(m), Some(&body)).await.status, 200);
        }
        let sent = t.send(&g, &owner, "Lunch at 1?").await;
        let seq = sent.body["seq"].as_u64().unwrap();
        let store = t.store_of_function("notifier");
        let id = ConversationId::parse(&g).unwrap();
        let now = chat_domain::time::unix_millis(chat_domain::time::now());
        self.forget();
        assert!(store
            .open_notify_window(&id, seq, now, now + 60_000)
            .await
            .unwrap());
        f.window_open = self.dynamodb().await;
        // The next message, while the window is open.
        assert!(!store
            .open_notify_window(&id, seq + 1, now, now + 60_000)
            .await
            .unwrap());
        f.window_open_again = self.dynamodb().await;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sink_url = format!("http://{}", listener.local_addr().unwrap());
        local_gateway::push_sink::PushSink::default().spawn(listener);
        let sdk = chat_tests::config().sdk_config().await;
        let notifier = Notifier {
            store,
            sqs: aws_sdk_sqs::Client::new(&sdk),
            settings: NotifySettings {
                content: Content::Full,
                push_sink_url: Some(sink_url.clone()),
                ..NotifySettings::default()
            },
        };
        // Opened long ago: its job reads when the newest message was sent (priced), and never
        // waits for it.
        let window = NotifyWindow {
            conversation_id: id,
            from_seq: seq,
            opened_at_ms: 1,
        };
        let report = notifier
            .window_due(&window, "job-1", &Pusher::Sink(sink_url))
            .await
            .unwrap();
        f.window = self.dynamodb().await;
        f.window_notified = report.members_notified as f64;
        assert_eq!(report.members_notified, members.len(), "{report:?}");
    }

    /// A 1,000-member group with 300 members online: 20 of them start typing, one every 100 ms,
    /// and again 2 s later (the steady state: a start every 2 s per connection); per frame of
    /// the second round. `long_ids`: every user id 128 characters long.
    /// Also the mean time a frame's invocation takes (billed Lambda time: a frame that changes
    /// the set within a second of the last push waits out that second), and the expiry checks of
    /// the first round's starts, run after the second's (each finds a later start): their units
    /// and mean time.
    async fn typing(&self, long_ids: bool) -> (Units, f64, Units, f64) {
        let t = self.t;
        let owner = unique("typing-owner");
        let id = |i: usize| {
            if long_ids {
                format!("{:x<128}", format!("{owner}-{i}-"))
            } else {
                format!("{owner}-{i}")
            }
        };
        let members: Vec<String> = (0..999).map(id).collect();
        // A request body is at most 64 KB: 999 long ids go in parts.
        let g = t.group(&owner, &members[..300]).await;
        for part in members[300..].chunks(300) {
            let r = t.add_members(&g, &owner, json!(part)).await;
            assert_eq!(r.status, 200, "{r:?}");
        }
        let table = chat_tests::config().connections_table;
        let connections = ConnectionStore::new(t.db.clone(), table);
        self.connect(&connections, &members[20..300]).await;
        let now = chat_domain::time::unix_millis(chat_domain::time::now()) as i64;
        let mut typists = Vec::new();
        for m in &members[..20] {
            let connection = unique("conn");
            let user = UserId::parse(m).unwrap();
            connections.register(&user, &connection, now).await.unwrap();
            typists.push(connection);
        }
        let typing = ws_connection::Typing::new(
            t.store_of_function("ws-connection"),
            connections.clone(),
            None,
        );
        let gid = ConversationId::parse(&g).unwrap();
        let frame = json!({"action": "typing", "conversationId": g, "state": "start"}).to_string();
        // Each typist refreshes every 2 s: 20 of them, a frame every 100 ms.
        let all = || {
            futures::future::join_all(typists.iter().enumerate().map(|(i, connection)| {
                let (typing, frame) = (&typing, &frame);
                async move {
                    tokio::time::sleep(Duration::from_millis(100 * i as u64)).await;
                    let started = std::time::Instant::now();
                    typing.frame(connection, frame.as_bytes()).await.unwrap();
                    started.elapsed()
                }
            }))
        };
        all().await;
        let first = connections.typing_state(&gid).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        let connections_table = chat_tests::config().connections_table;
        let tables = [t.table.as_str(), connections_table.as_str()];
        self.forget();
        let durations = all().await;
        let u = self.dynamodb_in(&tables).await;
        let frames = typists.len() as f64;
        let mean_ms = |d: &[Duration]| {
            d.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / d.len() as f64
        };
        let per = |u: Units, n: f64| Units {
            calls: u.calls / n,
            wru: u.wru / n,
            rru: u.rru / n,
        };
        let mut checks = Vec::new();
        for e in &first.entries {
            let check = ExpiryCheck {
                conversation_id: gid.clone(),
                connection: e.connection.clone(),
                started_at: e.started_ms,
            };
            let started = std::time::Instant::now();
            typing.expiry_due(&check).await.unwrap();
            checks.push(started.elapsed());
        }
        assert_eq!(checks.len(), typists.len(), "{first:?}");
        let c = self.dynamodb_in(&tables).await;
        (
            per(u, frames),
            mean_ms(&durations),
            per(c, checks.len() as f64),
            mean_ms(&checks),
        )
    }

    /// What was recorded since the last take, in the chat table.
    async fn dynamodb(&self) -> Units {
        self.dynamodb_in(&[&self.t.table]).await
    }

    async fn dynamodb_in(&self, tables: &[&str]) -> Units {
        let calls: Vec<Call> = self.t.calls.take_calls();
        let calls: Vec<Call> = calls
            .into_iter()
            .filter(|c| super::is_dynamodb(&c.name))
            .collect();
        let mut wru = 0;
        for table in tables {
            wru += write_units_in(self.t, table, &writes_to(&calls, table))
                .await
                .1;
        }
        let rru = read_units_of(self.t, &reads_of(&calls)).await;
        Units {
            calls: calls.len() as f64,
            wru: wru as f64,
            rru,
        }
    }
}

/// The recorded writes to `table` (a transaction's parts name their tables too).
fn writes_to(calls: &[Call], table: &str) -> Vec<Call> {
    let needle = format!("\"TableName\":\"{table}\"");
    let to_table = |w: &[u8]| String::from_utf8_lossy(w).contains(&needle);
    calls
        .iter()
        .filter(|c| c.write.as_deref().is_some_and(to_table))
        .cloned()
        .collect()
}

/// A created and uploaded attachment (through the S3 gate, as a client uploads): its id.
async fn uploaded(t: &TestApp, c: &str, user: &str) -> String {
    let body = json!({"fileName": "photo.jpg", "contentType": "image/jpeg", "size": 1000});
    let r = t
        .post(&format!("/conversations/{c}/attachments"), user, body)
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let status = upload_with(&r.body["upload"], vec![7u8; 1000], &[]).await;
    assert_eq!(status, 200, "the upload");
    r.body["attachmentId"].as_str().unwrap().to_owned()
}

/// The limiter's own calls and write units per send (the connections table), sends a user
/// makes within the limits (a limit far above the bench's pace: what a send costs does not
/// depend on the rate while it is under it).
async fn limiter_units(n: usize, _c: &str, _a: &str) -> Units {
    let limits = RateLimits {
        sends: chat_domain::rate::Bucket {
            per_second: 1_000,
            burst: 1_000,
        },
        requests: chat_domain::rate::Bucket {
            per_second: 5_000,
            burst: 5_000,
        },
        ..RateLimits::DEFAULT
    };
    let t = TestApp::with_rate_limits(limits).await;
    let (a, _b, c) = t.new_direct().await;
    let table = chat_tests::config().connections_table;
    t.calls.take_calls();
    for _ in 0..n {
        assert_eq!(t.send(&c, &a, "hi").await.status, 201);
    }
    let calls = t.calls.take_calls();
    let limiter = writes_to(&calls, &table);
    let (_, wru) = write_units_in(&t, &table, &limiter).await;
    let per = n as f64;
    Units {
        calls: limiter.len() as f64 / per,
        wru: wru as f64 / per,
        rru: 0.0,
    }
}

/// The feature tables: name, unit, lines (dollars per 1 M of the unit).
pub fn feature_costs(
    f: &FeaturesMeasured,
    a: &FeatureAssumptions,
) -> Vec<(&'static str, Vec<Line>)> {
    let rest = |op: &Op| {
        HTTP_REQUEST * MILLION
            + LAMBDA_REQUEST * MILLION
            + MILLION * op.ms.ceil() / 1000.0 * MEMORY_GB * LAMBDA_GB_S
    };
    let ddb = |wru: f64, rru: f64| MILLION * (wru * WRU + rru * RRU);
    let line = |part, dollars| Line { part, dollars };
    let claim_wru = (f.send_with_attachment.wru - f.send_plain.wru).max(0.0);
    let claim_rru = (f.send_with_attachment.rru - f.send_plain.rru).max(0.0);
    let per_notified = |x: f64| x / f.window_notified.max(1.0);
    vec![
        (
            "per 1 M attachment uploads",
            vec![
                line("createAttachment (API, function)", rest(&f.upload)),
                line(
                    "DynamoDB, createAttachment",
                    ddb(f.upload.wru, f.upload.rru),
                ),
                line("DynamoDB, the send's claim", ddb(claim_wru, claim_rru)),
                line(
                    "S3 requests (assumed from the code)",
                    MILLION * a.s3_puts_per_upload * S3_PUT,
                ),
            ],
        ),
        (
            "per 1 M attachment downloads (getAttachment)",
            vec![
                line("getAttachment (API, function)", rest(&f.download)),
                line("DynamoDB", ddb(f.download.wru, f.download.rru)),
                line(
                    "S3 GET (assumed)",
                    MILLION * a.s3_gets_per_download * S3_GET,
                ),
                line(
                    "data out (assumed 1 MB)",
                    MILLION * a.attachment_bytes / 1e9 * OUT_GB,
                ),
            ],
        ),
        (
            "per 1 M sends, rate limiting",
            vec![line(
                "DynamoDB, the limiter",
                ddb(f.limit_per_send.wru, f.limit_per_send.rru),
            )],
        ),
        (
            "per 1 M notifications",
            vec![
                line(
                    "DynamoDB, the window (its job, per member notified)",
                    ddb(per_notified(f.window.wru), per_notified(f.window.rru)),
                ),
                line(
                    "notifier (per member notified, assumed ms)",
                    per_notified(
                        LAMBDA_REQUEST * MILLION
                            + MILLION * a.notifier_ms / 1000.0 * MEMORY_GB * LAMBDA_GB_S,
                    ),
                ),
                line(
                    "SQS (one job per window)",
                    per_notified(MILLION * 3.0 * SQS_REQUEST),
                ),
                line("SNS publish", MILLION * a.devices_per_member * SNS_PUBLISH),
            ],
        ),
        (
            "per 1 M typing frames in (1,000-member group, 300 online)",
            vec![
                line("WebSocket message in", MILLION * WS_MESSAGE),
                line(
                    "ws-connection (measured ms)",
                    LAMBDA_REQUEST * MILLION
                        + MILLION * f.typing_frame_ms / 1000.0 * MEMORY_GB * LAMBDA_GB_S,
                ),
                line("DynamoDB", ddb(f.typing_frame.wru, f.typing_frame.rru)),
                line(
                    "WebSocket messages out (assumed ratio)",
                    MILLION * a.typing_out_per_in * WS_MESSAGE,
                ),
                line(
                    "data out",
                    MILLION * a.typing_out_per_in * a.typing_frame_bytes / 1e9 * OUT_GB,
                ),
                line(
                    "expiry check (SQS send, receive, delete; ws-connection, measured ms; DynamoDB)",
                    MILLION * 3.0 * SQS_REQUEST
                        + LAMBDA_REQUEST * MILLION
                        + MILLION * f.typing_check_ms / 1000.0 * MEMORY_GB * LAMBDA_GB_S
                        + ddb(f.typing_check.wru, f.typing_check.rru),
                ),
            ],
        ),
    ]
}

/// Prints the measured figures and the feature tables.
pub fn print_features(f: &FeaturesMeasured, a: &FeatureAssumptions) {
    println!("| feature operation (measured) | DynamoDB calls | WRU | RRU | p50 ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, op) in [
        ("createAttachment", &f.upload),
        ("send 1:1, no attachment", &f.send_plain),
        ("send 1:1, one attachment", &f.send_with_attachment),
        ("getAttachment (302)", &f.download),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.1} |",
            op.calls, op.wru, op.rru, op.ms
        );
    }
    let units = [
        ("the limiter, per send", f.limit_per_send),
        ("a message opening its notification window", f.window_open),
        ("a message while its window is open", f.window_open_again),
        ("a window's job (100 members, 99 notified)", f.window),
        ("a typing start, steady state, per frame", f.typing_frame),
        ("the same, 128-character user ids", f.typing_frame_long_ids),
        (
            "a typing start's expiry check (started again since)",
            f.typing_check,
        ),
    ];
    for (name, u) in units {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | – |",
            u.calls, u.wru, u.rru
        );
    }
    println!(
        "  ws-connection per typing frame: {:.0} ms (mean, waits included); per expiry check: {:.0} ms",
        f.typing_frame_ms, f.typing_check_ms
    );
    println!();
    println!("  assumed (counted from the code, not measurable locally): {a:?}");
    println!("| feature cost | per 1 M | parts |");
    println!("|---|---:|---|");
    for (name, lines) in feature_costs(f, a) {
        let parts: Vec<String> = lines
            .iter()
            .map(|l| format!("{} {}", l.part, dollars(l.dollars)))
            .collect();
        println!(
            "| {name} | {} | {} |",
            dollars(total(&lines)),
            parts.join("; ")
        );
    }
    println!(
        "  + per message with notifications on: its window's opening or a failed conditional \
         update, {:.0} WRU ({} per 1 M messages)",
        f.window_open_again.wru,
        dollars(MILLION * f.window_open_again.wru * WRU)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_costs_by_hand() {
        let op = |wru, rru, ms| Op {
            requests: 1,
            wru,
            rru,
            ms,
            ..Op::default()
        };
        let f = FeaturesMeasured {
            upload: op(1.0, 1.0, 10.0),
            send_plain: op(8.0, 1.0, 20.0),
            send_with_attachment: op(10.0, 2.0, 20.0),
            download: op(0.0, 2.0, 10.0),
            limit_per_send: Units {
                calls: 1.0,
                wru: 1.0,
                rru: 0.0,
            },
            window: Units {
                calls: 10.0,
                wru: 2.0,
                rru: 200.0,
            },
            window_notified: 100.0,
            typing_frame: Units {
                calls: 3.0,
                wru: 1.0,
                rru: 2.0,
            },
            ..FeaturesMeasured::default()
        };
        let lines = feature_costs(&f, &FEATURES_ASSUMED);
        let by = |name: &str| total(&lines.iter().find(|(n, _)| *n == name).unwrap().1);
        // The limiter: 1 WRU per send.
        assert!((by("per 1 M sends, rate limiting") - 0.625).abs() < 1e-9);
        // An upload: API $1 + REQ $0.2 + 10 ms × 0.25 GB; 1 WRU + 1 RRU; the claim 2 WRU + 1 RRU;
        // 2 PUTs at $5 per million each.
        let compute = 0.01 * 0.25 * LAMBDA_GB_S * MILLION;
        let upload = 1.2 + compute + 0.625 + 0.125 + 1.25 + 0.125 + 10.0;
        assert!((by("per 1 M attachment uploads") - upload).abs() < 1e-9);
        // A notification: 0.02 WRU + 2 RRU, the notifier's share, SQS's share, one publish.
        let notify = 0.0125
            + 0.25
            + (0.2 + 0.015 * 0.25 * LAMBDA_GB_S * MILLION) / 100.0
            + 1.2 / 100.0
            + 0.5;
        assert!((by("per 1 M notifications") - notify).abs() < 1e-9);
    }
}
