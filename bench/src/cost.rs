//! The cost model's figures (docs/cost.md): `cargo run -p chat-bench --bin bench -- cost`.
//!
//! Measured here, with the real handlers in process against the emulator: DynamoDB calls, write
//! units (from the requests and the stored item sizes, `capacity`, failed writes included) and
//! read units (from the items read, re-read without projection where a request projected: DynamoDB
//! charges whole items) per operation; durations; response, stored, Kinesis record and push frame
//! sizes (the relay's and the fanout's own event types); the per-request log line (the JSON the
//! Lambda runtime's subscriber writes); the fanout's read units from the items it reads; the EMF
//! metric names in the sources. What cannot be measured locally is an [`Assumptions`] value,
//! printed as such. [`costs`] turns both into dollars with the prices below.

use std::collections::HashMap;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use chat_domain::events::{Event, EventBatch};
use chat_domain::{ConversationId, UserId};
use chat_store::ConnectionStore;
use serde_json::{json, Value};
use tracing::Instrument;

use super::{percentile, write_units_in, Request};

mod access_log;
mod features;
use chat_tests::capacity::{item_size, read_units};
use chat_tests::{new_uuid, unique, Call, LogCapture, TestApp};

// --- prices -------------------------------------------------------------------------------------

/// Where the prices below come from.
pub const PRICES_TAKEN: &str = "docs/cost.md's Prices table as of 2026-11-30 (us-east-1, on-demand list prices; not re-checked online)";

/// DynamoDB, per write request unit.
pub const WRU: f64 = 0.625e-6;
/// DynamoDB, per read request unit.
pub const RRU: f64 = 0.125e-6;
/// DynamoDB storage and point-in-time recovery, per GB-month.
pub const DDB_STORAGE_GB_MONTH: f64 = 0.25;
pub const DDB_PITR_GB_MONTH: f64 = 0.20;
/// Lambda (arm64), per GB-second and per request.
pub const LAMBDA_GB_S: f64 = 0.000_013_333_4;
pub const LAMBDA_REQUEST: f64 = 0.20e-6;
/// API Gateway: HTTP API request; WebSocket message (either direction); connection minute.
pub const HTTP_REQUEST: f64 = 1.00e-6;
pub const WS_MESSAGE: f64 = 1.00e-6;
pub const WS_CONNECTION_MINUTE: f64 = 0.25e-6;
/// Kinesis on-demand: stream-hour, data in per GB (records rounded up to 1 KB).
pub const KINESIS_STREAM_HOUR: f64 = 0.04;
pub const KINESIS_IN_GB: f64 = 0.08;
/// Kinesis data out through the fanout's enhanced fan-out consumer (template.yaml), per GB, and per
/// consumer-hour. ASSUMED: not in cost.md's table and not verifiable offline; $0.05 per GB and no
/// consumer-hour charge in on-demand mode is what the pricing page is recalled to say.
pub const KINESIS_EFO_GB: f64 = 0.05;
pub const KINESIS_EFO_CONSUMER_HOUR: f64 = 0.0;
/// CloudWatch: log ingestion per GB; alarm metric per month; custom metric per month.
pub const LOG_INGEST_GB: f64 = 0.50;
pub const ALARM_METRIC_MONTH: f64 = 0.10;
pub const CUSTOM_METRIC_MONTH: f64 = 0.30;
/// Data transfer out to the internet, per GB.
pub const OUT_GB: f64 = 0.09;

/// Alarm metrics in template.yaml (30 single-metric alarms, 8 metrics in 4 metric-math alarms).
pub const ALARM_METRICS: f64 = 38.0;
const HOURS_PER_MONTH: f64 = 730.0;
const MILLION: f64 = 1e6;
/// Memory of the REST functions, relay, inbox indexer and ws-connection; of the fanout (GB).
const MEMORY_GB: f64 = 0.25;
const FANOUT_MEMORY_GB: f64 = 0.5;

// --- figures ------------------------------------------------------------------------------------

/// One operation, per request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Op {
    pub requests: usize,
    pub calls: f64,
    pub wru: f64,
    pub rru: f64,
    /// In-process p50 (this build, the emulator's round trips).
    pub ms: f64,
    pub response_bytes: f64,
    /// The function's log lines for the request (with the deployed sampling: most requests write
    /// none), and the bytes of one line where one was written (what every request wrote before).
    pub log_bytes: f64,
    pub line_bytes: f64,
}

/// What the bench measures.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub send: Op,
    pub send_group: Op,
    pub read: Op,
    pub read_noop: Op,
    /// A page of 20 direct conversations (each read with one Query of its log partition).
    pub inbox: Op,
    /// A page of 20 groups (each its conversation item, the caller's member item and its change
    /// head, from three partitions).
    pub inbox_groups: Op,
    /// `history?afterSeq` of the few newest messages of the 1,000-member group.
    pub history: Op,
    /// Stored bytes per 1:1 message, DynamoDB's 100 bytes per item included.
    pub message_bytes: f64,
    /// The HTTP API's access-log line per REST request: template.yaml's format filled in with
    /// example values (`access_log`; 600 bytes *assumed* before 2026-12-06, of 16 fields).
    pub access_log_bytes: f64,
    /// Kinesis record (an `EventBatch` of one event): full and light `message.new`, `read.updated`.
    pub event_bytes: f64,
    pub event_bytes_light: f64,
    pub event_bytes_read: f64,
    /// Push frames: full `message.new`, light, `read.updated`.
    pub push_bytes: f64,
    pub push_bytes_light: f64,
    pub push_bytes_read: f64,
    /// The fanout's read units per event with its member list cached (GetItem + presence), and
    /// the member Query it adds when the list changed or the instance is new.
    pub fanout_rru_1to1: f64,
    pub fanout_rru_group: f64,
    /// The same for a read receipt of a direct conversation: its members' presence only (no
    /// content to withhold, members that never change; functions/fanout `members`).
    pub fanout_rru_read_1to1: f64,
    pub fanout_query_rru_1to1: f64,
    pub fanout_query_rru_group: f64,
    /// The inbox index per 1:1 message, and per message of a 1,000-member group (its members
    /// have big-group entries, which nothing moves: docs/data-model.md §2.5).
    pub index_wru_1to1: f64,
    pub index_rru_1to1: f64,
    pub index_group_wru: f64,
    pub index_group_rru: f64,
    /// `$connect`: a user's further connection (the usual case), and a user's first.
    pub connect_wru: f64,
    pub connect_first_wru: f64,
    pub connect_ms: f64,
    /// Distinct custom metrics (name × Function dimension).
    pub emf_metrics: f64,
}

/// Figures that cannot be measured locally: stated, printed, never presented as measured.
#[derive(Debug, Clone, Copy)]
pub struct Assumptions {
    /// Lambda bills per ms: a request's billed duration is taken as its in-process p50 rounded up
    /// to the next whole ms (a debug build against the emulator, whose round trips stand in for
    /// DynamoDB's in-region ones; a release build's CPU time is lower).
    pub billed_ms_rounding: f64,
    /// Messages (events) per relay / indexer invocation, Kinesis records per fanout invocation:
    /// 1 on a quiet stream (every record its own invocation, the most invocations); more at the
    /// design's load (`LOADED`: docs/cost.md, "Stream batches at load").
    pub relay_batch: f64,
    pub fanout_batch: f64,
    /// Durations per invocation of the stream consumers for one message (docs/event-pipeline.md,
    /// "Latency on AWS": PutRecords 10-30 ms; fanout reads 10-30 ms, 5 rounds of pushes
    /// 100-200 ms), and what each further message of a batch adds.
    pub relay_ms: f64,
    pub index_ms: f64,
    pub fanout_ms_1to1: f64,
    pub fanout_ms_group: f64,
    pub relay_more_ms: f64,
    pub index_more_ms: f64,
    pub fanout_more_ms_1to1: f64,
    pub fanout_more_ms_group: f64,
    /// Open connections per online user.
    pub connections_per_online_user: f64,
    /// The share of sends and reads whose request names the connection it came from
    /// (`X-Connection-Id`, docs/api.md §15.4: the SDK does once its socket's `hello` came), whose
    /// push then skips that connection: one push fewer per message or receipt (a group's too: the
    /// fanout skips it before the push goes light).
    pub named_connection_share: f64,
    /// Members online in a 1:1 conversation when a message or receipt is pushed (both: the most).
    pub online_1to1: f64,
    /// Members online of the 1,000-member group.
    pub online_group: f64,
    /// `history` fetches per light push by a client that has the conversation on screen (every
    /// such client fetches every message: the most).
    pub fetches_per_push: f64,
    /// The share of the group's online members whose client has it on screen: the SDK's
    /// `lightFetch: "watched"` fetches light pushes only for those (clients/js); 1 before.
    pub watching_share: f64,
    /// Lambda's own JSON lines per invocation (platform.start, platform.report), a stream
    /// consumer's per-batch line. (The HTTP API's access-log line is sized from template.yaml:
    /// `Measured::access_log_bytes`.)
    pub platform_log_bytes: f64,
    pub consumer_log_bytes: f64,
    /// The share of stream-consumer batches that write their line (`CHAT_LOG_EVERY`: one in 20 of
    /// the ordinary ones); whether every REST request writes its `request` line (before).
    pub consumer_line_share: f64,
    pub every_request_line: bool,
    /// HTTP response headers and framing per response (data out).
    pub response_overhead_bytes: f64,
}

/// The deployed stack on a quiet stream: `SystemLogLevel: WARN` (template.yaml: Lambda's
/// platform.start/platform.report lines of a successful invocation are not written), the
/// request and batch lines sampled (`CHAT_LOG_EVERY`, 20), light pushes fetched by the clients
/// that have the group on screen (*assumed* a fifth of those online).
pub const ASSUMED: Assumptions = Assumptions {
    billed_ms_rounding: 1.0,
    relay_batch: 1.0,
    fanout_batch: 1.0,
    relay_ms: 30.0,
    index_ms: 40.0,
    fanout_ms_1to1: 60.0,
    fanout_ms_group: 250.0,
    relay_more_ms: 1.0,
    index_more_ms: 5.0,
    fanout_more_ms_1to1: 10.0,
    fanout_more_ms_group: 50.0,
    connections_per_online_user: 1.3,
    named_connection_share: 1.0,
    online_1to1: 2.0,
    online_group: 300.0,
    fetches_per_push: 1.0,
    watching_share: 0.2,
    platform_log_bytes: 0.0,
    consumer_log_bytes: 250.0,
    consumer_line_share: 1.0 / chat_domain::log_sampling::LogSampling::DEFAULT.every as f64,
    every_request_line: false,
    response_overhead_bytes: 200.0,
};

/// As `ASSUMED` at the design's load (400 M messages a day, docs/cost.md "Stream batches at
/// load"): 5 messages per relay and indexer invocation, 10 Kinesis records per fanout invocation.
pub const LOADED: Assumptions = Assumptions {
    relay_batch: 5.0,
    fanout_batch: 10.0,
    ..ASSUMED
};

/// The model before this round (docs/cost.md of 2026-11-30): platform lines at `SystemLogLevel:
/// INFO`, every request and batch line written, every online client fetching every light push,
/// every push echoed to the connection that sent it.
pub const BEFORE: Assumptions = Assumptions {
    watching_share: 1.0,
    named_connection_share: 0.0,
    platform_log_bytes: 700.0,
    consumer_line_share: 1.0,
    every_request_line: true,
    ..ASSUMED
};

// --- the arithmetic -----------------------------------------------------------------------------

/// One line of a cost table: what, and dollars per million operations (or per month).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub part: &'static str,
    pub dollars: f64,
}

fn line(part: &'static str, dollars: f64) -> Line {
    Line { part, dollars }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    pub direct: Vec<Line>,
    pub group: Vec<Line>,
    pub receipts: Vec<Line>,
    /// A read receipt in a 1,000-member group with 300 online: pushed to every online member
    /// (SPEC §5), so it costs as a light message's push does (no goal of SPEC §11 names it).
    pub group_receipts: Vec<Line>,
    pub inbox: Vec<Line>,
    pub inbox_groups: Vec<Line>,
    pub fixed: Vec<Line>,
    /// Storage per month kept of 1 M 1:1 messages (table and PITR).
    pub storage_per_month: f64,
    /// The DynamoDB part of the 1:1 total (send, index, fanout reads).
    pub direct_dynamodb: f64,
}

pub fn total(lines: &[Line]) -> f64 {
    lines.iter().map(|l| l.dollars).sum()
}

fn kib(bytes: f64) -> f64 {
    (bytes / 1024.0).ceil().max(1.0)
}

/// Dollars per 1 M operations and per month, from the figures and the prices above.
pub fn costs(m: &Measured, a: &Assumptions) -> Costs {
    let billed = |ms: f64| (ms / a.billed_ms_rounding).ceil() * a.billed_ms_rounding / 1000.0;
    // One REST request: the API, the invocation and its compute.
    let rest = |op: &Op| HTTP_REQUEST + LAMBDA_REQUEST + billed(op.ms) * MEMORY_GB * LAMBDA_GB_S;
    let ddb = |op: &Op| op.wru * WRU + op.rru * RRU;
    // A stream consumer's invocation of `batch` messages, per message: the request and the
    // compute of the whole batch (`ms` for the first message, `more` for each further one).
    let consumer = |batch: f64, ms: f64, more: f64, gb: f64| {
        (LAMBDA_REQUEST + billed(ms + more * (batch - 1.0)) * gb * LAMBDA_GB_S) / batch
    };
    let kinesis = |bytes: f64| kib(bytes) * 1024.0 / 1e9 * (KINESIS_IN_GB + KINESIS_EFO_GB);
    let gb = |bytes: f64| bytes / 1e9;
    // A REST request's log bytes: its own lines, Lambda's, the access log's.
    let rest_logs = |op: &Op| {
        let own = if a.every_request_line {
            op.line_bytes
        } else {
            op.log_bytes
        };
        own + a.platform_log_bytes + m.access_log_bytes
    };
    // A stream consumer's lines per message: its batch line (sampled) and Lambda's, per batch.
    let consumer_logs =
        |batch: f64| (a.consumer_log_bytes * a.consumer_line_share + a.platform_log_bytes) / batch;
    let stream_logs = 2.0 * consumer_logs(a.relay_batch) + consumer_logs(a.fanout_batch);
    let relay = consumer(a.relay_batch, a.relay_ms, a.relay_more_ms, MEMORY_GB);
    let indexer = consumer(a.relay_batch, a.index_ms, a.index_more_ms, MEMORY_GB);
    let fanout_1to1 = consumer(
        a.fanout_batch,
        a.fanout_ms_1to1,
        a.fanout_more_ms_1to1,
        FANOUT_MEMORY_GB,
    );
    // The sending (or reading) connection is one of its user's: without it when the request named it.
    let pushes_1to1 = a.online_1to1 * a.connections_per_online_user - a.named_connection_share;

    let index_ddb = m.index_wru_1to1 * WRU + m.index_rru_1to1 * RRU;
    let direct = vec![
        line("API request", HTTP_REQUEST),
        line("send-message function", rest(&m.send) - HTTP_REQUEST),
        line("DynamoDB, send", ddb(&m.send)),
        line("relay", relay),
        line("inbox index, DynamoDB", index_ddb),
        line("inbox index, function", indexer),
        line("Kinesis", kinesis(m.event_bytes)),
        line("fanout function", fanout_1to1),
        line("DynamoDB, fanout", m.fanout_rru_1to1 * RRU),
        line("pushes", pushes_1to1 * WS_MESSAGE),
        line("logs", gb(rest_logs(&m.send) + stream_logs) * LOG_INGEST_GB),
        Line {
            part: "data out",
            dollars: gb(m.send.response_bytes
                + a.response_overhead_bytes
                + pushes_1to1 * m.push_bytes)
                * OUT_GB,
        },
    ];

    let pushes_group = a.online_group * a.connections_per_online_user - a.named_connection_share;
    let fanout_group = consumer(
        a.fanout_batch,
        a.fanout_ms_group,
        a.fanout_more_ms_group,
        FANOUT_MEMORY_GB,
    );
    let fetches = a.online_group * a.watching_share * a.fetches_per_push;
    let group = vec![
        line(
            "API request, send-message, DynamoDB send",
            rest(&m.send_group) + ddb(&m.send_group),
        ),
        line("relay, Kinesis", relay + kinesis(m.event_bytes_light)),
        Line {
            part: "inbox index",
            dollars: m.index_group_wru * WRU + m.index_group_rru * RRU + indexer,
        },
        line("fanout function", fanout_group),
        line("DynamoDB, fanout", m.fanout_rru_group * RRU),
        line("pushes", pushes_group * WS_MESSAGE),
        line(
            "fetches after light pushes",
            fetches * (rest(&m.history) + ddb(&m.history)),
        ),
        Line {
            part: "logs, data out",
            dollars: gb(rest_logs(&m.send_group) + stream_logs + fetches * rest_logs(&m.history))
                * LOG_INGEST_GB
                + gb(m.send_group.response_bytes
                    + pushes_group * m.push_bytes_light
                    + fetches * m.history.response_bytes
                    + (1.0 + fetches) * a.response_overhead_bytes)
                    * OUT_GB,
        },
    ];

    // A read receipt: its request, its pipeline's `lines`, and its `pushes`.
    let receipt = |pipeline: Vec<Line>, pushes: f64| {
        let mut lines = vec![
            line("API request", HTTP_REQUEST),
            line("mark-read function", rest(&m.read) - HTTP_REQUEST),
            line("DynamoDB", ddb(&m.read)),
        ];
        lines.extend(pipeline);
        lines.push(line("pushes", pushes * WS_MESSAGE));
        lines.push(Line {
            part: "logs, data out",
            dollars: gb(rest_logs(&m.read)
                + consumer_logs(a.relay_batch)
                + consumer_logs(a.fanout_batch))
                * LOG_INGEST_GB
                + gb(m.read.response_bytes
                    + a.response_overhead_bytes
                    + pushes * m.push_bytes_read)
                    * OUT_GB,
        });
        lines
    };
    let receipts = receipt(
        vec![line(
            "relay, Kinesis, fanout",
            relay + kinesis(m.event_bytes_read) + fanout_1to1 + m.fanout_rru_read_1to1 * RRU,
        )],
        pushes_1to1,
    );
    let group_receipts = receipt(
        vec![
            line(
                "relay, Kinesis, fanout function",
                relay + kinesis(m.event_bytes_read) + fanout_group,
            ),
            line("DynamoDB, fanout", m.fanout_rru_group * RRU),
        ],
        pushes_group,
    );

    let inbox_page = |page: &Op| {
        vec![
            line("API request", HTTP_REQUEST),
            line("inbox function", rest(page) - HTTP_REQUEST),
            line("DynamoDB", ddb(page)),
            Line {
                part: "logs, data out",
                dollars: gb(rest_logs(page)) * LOG_INGEST_GB
                    + gb(page.response_bytes + a.response_overhead_bytes) * OUT_GB,
            },
        ]
    };
    let (inbox, inbox_groups) = (inbox_page(&m.inbox), inbox_page(&m.inbox_groups));

    let per_million = |lines: Vec<Line>| -> Vec<Line> {
        lines
            .into_iter()
            .map(|l| Line {
                dollars: l.dollars * MILLION,
                ..l
            })
            .collect()
    };
    let direct = per_million(direct);
    let direct_dynamodb = direct
        .iter()
        .filter(|l| l.part.contains("DynamoDB"))
        .map(|l| l.dollars)
        .sum();
    Costs {
        direct,
        group: per_million(group),
        receipts: per_million(receipts),
        group_receipts: per_million(group_receipts),
        inbox: per_million(inbox),
        inbox_groups: per_million(inbox_groups),
        fixed: vec![
            line(
                "Kinesis on-demand stream",
                KINESIS_STREAM_HOUR * HOURS_PER_MONTH,
            ),
            line(
                "enhanced fan-out consumer",
                KINESIS_EFO_CONSUMER_HOUR * HOURS_PER_MONTH,
            ),
            line("alarms", ALARM_METRICS * ALARM_METRIC_MONTH),
            line("custom metrics (EMF)", m.emf_metrics * CUSTOM_METRIC_MONTH),
        ],
        storage_per_month: MILLION * m.message_bytes / 1e9
            * (DDB_STORAGE_GB_MONTH + DDB_PITR_GB_MONTH),
        direct_dynamodb,
    }
}

// --- measuring ----------------------------------------------------------------------------------

/// A 60-character message, the size assumed for an average one.
const BODY: &str = "See you at the station at 7, I'll bring the tickets, snacks!";

/// Runs every measurement (`n` requests per operation) and prints the figures and the costs.
pub async fn run(n: usize) {
    let n = n.clamp(5, 100);
    let logs = install_log_capture();
    // Every request reads its user's suspension, as deployed (a send too: no rate limits here).
    let t = TestApp::new().await.with_deployed_suspension_checks();
    t.calls.keep_reads();
    let b = Bench { t: &t, logs: &logs };
    let m = b.measure_all(n).await;
    let f = b.measure_features(n).await;
    print_report(&m, &ASSUMED, n);
    features::print_features(&f, &features::FEATURES_ASSUMED);
}

struct Bench<'a> {
    t: &'a TestApp,
    logs: &'a LogCapture,
}

impl Bench<'_> {
    async fn measure_all(&self, n: usize) -> Measured {
        let t = self.t;
        let mut m = Measured {
            access_log_bytes: access_log::from_template() as f64,
            ..Measured::default()
        };
        let (a, b) = (unique("a"), unique("b"));
        let c = t.direct(&a, &b).await;
        let pk = format!("C#{c}");

        // The inbox first: its page reads the index, which the emulator answers by looking at
        // every item of the table (the 1,000-member group adds thousands).
        let reader = unique("reader");
        for i in 0..25 {
            let peer = format!("{reader}-peer{i}");
            let conversation = t.direct(&reader, &peer).await;
            assert_eq!(t.send(&conversation, &peer, BODY).await.status, 201);
        }
        t.index().await;
        m.inbox = self
            .op(n, |_| {
                ("GET", "/inbox?limit=20".into(), reader.clone(), None)
            })
            .await;
        let member = unique("member");
        for i in 0..25 {
            let owner = format!("{member}-owner{i}");
            let group = t.group(&owner, &[&member]).await;
            assert_eq!(t.send(&group, &owner, BODY).await.status, 201);
        }
        t.index().await;
        m.inbox_groups = self
            .op(n, |_| {
                ("GET", "/inbox?limit=20".into(), member.clone(), None)
            })
            .await;

        // 1:1 sends, and what they leave stored.
        let before = partition(t, &pk).await;
        m.send = self.sends(n, &c, &a).await;
        let after = partition(t, &pk).await;
        let added: usize = after
            .iter()
            .filter(|(sk, _)| !before.contains_key(*sk))
            .map(|(_, size)| size + 100)
            .sum();
        m.message_bytes = added as f64 / n as f64;
        m.read = self
            .op(n, |i| {
                let body = json!({"seq": i + 1});
                (
                    "POST",
                    format!("/conversations/{c}/read"),
                    b.clone(),
                    Some(body),
                )
            })
            .await;
        m.read_noop = self
            .op(n, |_| {
                let body = json!({"seq": 1});
                (
                    "POST",
                    format!("/conversations/{c}/read"),
                    b.clone(),
                    Some(body),
                )
            })
            .await;

        // Events and frames, as the relay and the fanout build them from a real message.
        let sent = t.send(&c, &a, BODY).await;
        let conversation = ConversationId::parse(&c).unwrap();
        let full = Event::MessageNew {
            conversation_id: conversation.clone(),
            seq: sent.body["seq"].as_u64().unwrap(),
            sender_id: UserId::parse(&a),
            client_msg_id: sent.body["clientMsgId"].as_str().map(str::to_owned),
            body: Some(BODY.into()),
            created_at: sent.body["createdAt"].as_str().map(str::to_owned),
            version: Some(1),
            edited_at: None,
            attachments: Vec::new(),
            // Sent from a connection the request named (the SDK names its own): the record
            // carries it, the frame does not.
            origin: Some(CONNECTION_ID.into()),
        };
        let read = Event::ReadUpdated {
            conversation_id: conversation.clone(),
            user_id: UserId::parse(&b).unwrap(),
            last_read_seq: sent.body["seq"].as_u64().unwrap(),
            origin: Some(CONNECTION_ID.into()),
        };
        m.event_bytes = record_bytes(&full);
        m.event_bytes_read = record_bytes(&read);
        m.push_bytes = frame_bytes(&full);
        m.push_bytes_read = frame_bytes(&read);

        // The inbox index per 1:1 message (the real indexer, one message per batch).
        let (mut wru, mut rru) = (0.0, 0.0);
        let messages = 5;
        for _ in 0..messages {
            t.index().await;
            assert_eq!(t.send(&c, &b, BODY).await.status, 201);
            self.forget();
            t.index().await;
            let (_, w, r) = self.units().await;
            wru += w;
            rru += r;
        }
        m.index_wru_1to1 = wru / messages as f64;
        m.index_rru_1to1 = rru / messages as f64;

        // $connect: the two of the 1:1 conversation, then each again (a further connection).
        let connections =
            ConnectionStore::new(t.db.clone(), chat_tests::config().connections_table);
        let (first, _) = self.connect(&connections, &[a.clone(), b.clone()]).await;
        let (again, ms) = self.connect(&connections, &[a.clone(), b.clone()]).await;
        let (fanout, query, presence) = fanout_reads(t, &c, &[a.clone(), b.clone()]).await;
        m.fanout_rru_1to1 = fanout;
        m.fanout_query_rru_1to1 = query;
        m.fanout_rru_read_1to1 = presence;

        // The 1,000-member group, 300 of them online.
        let owner = unique("owner");
        let members: Vec<String> = (0..999).map(|i| format!("{owner}-{i}")).collect();
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        let g = t.group(&owner, &refs).await;
        let (first_300, _) = self.connect(&connections, &members[..300]).await;
        m.connect_first_wru = (first * 2.0 + first_300 * 300.0) / 302.0;
        let (again_300, ms_300) = self.connect(&connections, &members[..300]).await;
        m.connect_wru = (again * 2.0 + again_300 * 300.0) / 302.0;
        m.connect_ms = (ms * 2.0 + ms_300 * 300.0) / 302.0;
        let mut everyone = members.clone();
        everyone.push(owner.clone());
        let (fanout, query, _) = fanout_reads(t, &g, &everyone).await;
        m.fanout_rru_group = fanout;
        m.fanout_query_rru_group = query;
        let light = Event::light(&ConversationId::parse(&g).unwrap(), 1);
        m.event_bytes_light = record_bytes(&light);
        m.push_bytes_light = frame_bytes(&light);

        // The index's work for a group message, the first of a 5-second step (before its members
        // had big-group entries, a move of 1,000 entries: 2,000 write units).
        t.index().await;
        tokio::time::sleep(std::time::Duration::from_millis(5_050)).await;
        assert_eq!(t.send(&g, &owner, BODY).await.status, 201);
        self.forget();
        t.index().await;
        let (_, w, r) = self.units().await;
        m.index_group_wru = w;
        m.index_group_rru = r;

        let group_sends = n.min(20);
        m.send_group = self.sends(group_sends, &g, &owner).await;
        let last = t.get(&format!("/conversations/{g}"), &owner).await.body["lastSeq"]
            .as_u64()
            .unwrap();
        let reader = members[0].clone();
        m.history = self
            .op(n, |_| {
                let after = last - 3;
                (
                    "GET",
                    format!("/conversations/{g}/messages?afterSeq={after}"),
                    reader.clone(),
                    None,
                )
            })
            .await;
        m.emf_metrics = emf_metrics().len() as f64;
        m
    }

    /// Drops what was recorded so far.
    fn forget(&self) {
        self.t.calls.take_calls();
    }

    /// DynamoDB calls, write units (failed writes included: they are billed) and read units of
    /// what was recorded since the last take.
    async fn units(&self) -> (f64, f64, f64) {
        // The log holds S3's calls too (attachments; a presigned URL runs the interceptors
        // without a request): DynamoDB's only.
        let calls: Vec<Call> = self
            .t
            .calls
            .take_calls()
            .into_iter()
            .filter(|c| is_dynamodb(&c.name))
            .collect();
        let (_, wru) = write_units_in(self.t, &self.t.table, &calls).await;
        let rru = read_units_of(self.t, &reads_of(&calls)).await;
        self.forget();
        (calls.len() as f64, wru as f64, rru)
    }

    /// `n` requests one at a time: per request the mean calls, units, sizes and log bytes, and
    /// the p50 duration.
    /// `n` sends of `BODY` by `sender` to `conversation`, each a new message.
    async fn sends(&self, n: usize, conversation: &str, sender: &str) -> Op {
        self.op(n, |_| {
            let body = json!({"clientMsgId": new_uuid(), "body": BODY});
            let path = format!("/conversations/{conversation}/messages");
            ("POST", path, sender.to_owned(), Some(body))
        })
        .await
    }

    async fn op(&self, n: usize, request: impl Fn(usize) -> Request) -> Op {
        let mut op = Op {
            requests: n,
            ..Op::default()
        };
        let mut latencies = Vec::with_capacity(n);
        let mut lines = 0;
        for i in 0..n {
            let (method, path, user, body) = request(i);
            self.forget();
            self.logs.take();
            // The span Lambda's runtime opens around an invocation: its fields are in every line.
            let span = tracing::info_span!(
                "Lambda runtime invoke",
                requestId = %new_uuid(),
                xrayTraceId = "Root=1-674a5e2b-3f1c2a9d8e7b6c5d4e3f2a1b;Parent=53995c3f42cd8ad8;Sampled=0;Lineage=1:a3f1b2c4:0"
            );
            let body = body.map(|b| b.to_string());
            let (mut event, function) = self.t.event(method, &path, Some(&user), body.as_deref());
            // As the SDK calls, naming its socket (docs/api.md §15.4: stored with a send or read).
            event["headers"]["x-connection-id"] = json!(CONNECTION_ID);
            // As browsers and the mobile platforms' HTTP clients ask: long answers come gzipped
            // (docs/api.md §1, "Compression"), and data out is billed as sent.
            event["headers"]["accept-encoding"] = json!("gzip, deflate, br");
            let started = Instant::now();
            let r = self.t.invoke(event, function).instrument(span).await;
            latencies.push(started.elapsed());
            assert!(r.status < 400, "{method} {path}: {r:?}");
            let logged = self.logs.take();
            lines += logged.iter().filter(|&&b| b == b'\n').count();
            op.log_bytes += logged.len() as f64;
            op.response_bytes += r.wire_bytes as f64;
            let (calls, wru, rru) = self.units().await;
            op.calls += calls;
            op.wru += wru;
            op.rru += rru;
        }
        op.ms = percentile(&latencies, 0.5);
        op.line_bytes = op.log_bytes / lines.max(1) as f64;
        let per = |x: f64| x / n as f64;
        op.calls = per(op.calls);
        op.wru = per(op.wru);
        op.rru = per(op.rru);
        op.log_bytes = per(op.log_bytes);
        op.response_bytes = per(op.response_bytes);
        op
    }

    /// Registers one connection for each of `users` as `$connect` does: mean write units and p50 ms.
    async fn connect(&self, connections: &ConnectionStore, users: &[String]) -> (f64, f64) {
        self.forget();
        let mut latencies = Vec::new();
        for u in users {
            let now = chat_domain::time::unix_millis(chat_domain::time::now()) as i64;
            let started = Instant::now();
            connections
                .register(&UserId::parse(u).unwrap(), &unique("conn"), now)
                .await
                .unwrap();
            latencies.push(started.elapsed());
        }
        let calls = self.t.calls.take_calls();
        let table = chat_tests::config().connections_table;
        let (_, wru) = write_units_in(self.t, &table, &calls).await;
        self.forget();
        (wru as f64 / users.len() as f64, percentile(&latencies, 0.5))
    }
}

/// The fanout's read units for one event of `conversation` (members `everyone`), from the items
/// it reads: the conversation's `membersVersion` (strongly consistent GetItem, charged for the
/// whole item) and every member's presence item (eventually consistent BatchGetItem: half a unit
/// per started 4 KB, the minimum for a member without one); and what it adds on a cache miss: the
/// Query of each member partition (strongly consistent, every member item) and the
/// `membersVersion` read again after it; and, apart, the presence alone (a read receipt of a
/// direct conversation reads nothing else).
async fn fanout_reads(t: &TestApp, conversation: &str, everyone: &[String]) -> (f64, f64, f64) {
    let conversation_item = partition(t, &format!("C#{conversation}")).await["C"];
    // One Query per member partition, each charged for its own items.
    let id = chat_domain::ConversationId::parse(conversation).unwrap();
    let mut members = 0;
    for pk in chat_store::keys::members_pks(&id) {
        // Only the member items: a direct conversation's share its log partition.
        let items = partition(t, &pk).await;
        let bytes = items.iter().filter(|(sk, _)| sk.starts_with("M#"));
        members += read_units(bytes.map(|(_, size)| size).sum());
    }
    let table = chat_tests::config().connections_table;
    let mut presence = 0.0;
    for user in everyone {
        let found =
            t.db.get_item()
                .table_name(&table)
                .key("pk", AttributeValue::S(format!("U#{user}")))
                .key("sk", AttributeValue::S("P".into()))
                .send()
                .await
                .unwrap();
        presence += 0.5 * found.item().map_or(1, |i| read_units(item_size_of(i))) as f64;
    }
    t.calls.take_calls();
    (
        read_units(conversation_item) as f64 + presence,
        (members + read_units(conversation_item)) as f64,
        presence,
    )
}

/// The items of one partition of the chat table: sort key → size.
async fn partition(t: &TestApp, pk: &str) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    let mut start = None;
    loop {
        let page =
            t.db.query()
                .table_name(&t.table)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .unwrap();
        for item in page.items() {
            let sk = item["sk"].as_s().unwrap().clone();
            out.insert(sk, item_size_of(item));
        }
        match page.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => break,
        }
    }
    t.calls.take_calls();
    out
}

fn item_size_of(item: &HashMap<String, AttributeValue>) -> usize {
    item_size(super::item_json(item).as_object().unwrap())
}

/// The relay's Kinesis record for one event: an `EventBatch` as it serializes it.
fn record_bytes(e: &Event) -> f64 {
    let batch = EventBatch {
        conversation_id: e.conversation_id().clone(),
        events: vec![e.clone()],
    };
    serde_json::to_vec(&batch).unwrap().len() as f64
}

/// The fanout's push frame for one event.
fn frame_bytes(e: &Event) -> f64 {
    serde_json::to_string(&e.frame()).unwrap().len() as f64
}

/// A connection id as API Gateway makes them (16 characters).
const CONNECTION_ID: &str = "L0SM9cOFvHcCIhw=";

// --- read units ---------------------------------------------------------------------------------

/// A read's operation, request and response (DynamoDB JSON).
type Read = (String, Value, Value);

/// The reads among `calls` that were answered (a body that is not JSON as `null`).
fn reads_of(calls: &[Call]) -> Vec<Read> {
    let json = |bytes: &[u8]| serde_json::from_slice(bytes).unwrap_or(Value::Null);
    calls
        .iter()
        .filter_map(|c| {
            let read = c.read.as_ref()?;
            let response = read.response.as_deref()?;
            Some((c.name.clone(), json(&read.request), json(response)))
        })
        .collect()
}

/// Whether a recorded call is DynamoDB's (the log also records S3's).
fn is_dynamodb(name: &str) -> bool {
    name.ends_with("Item") || name.ends_with("Items") || matches!(name, "Query" | "Scan")
}

/// Read units of recorded reads as DynamoDB bills them: whole items (a projected or filtered read
/// is read again without projection and filter), per started 4 KB (a Query sums its items first;
/// BatchGetItem and GetItem round each item, a missing one costs the minimum), half for eventually
/// consistent reads.
async fn read_units_of(t: &TestApp, reads: &[Read]) -> f64 {
    let mut total = 0.0;
    for (op, req, resp) in reads {
        let factor = |consistent: &Value| if consistent == &json!(true) { 1.0 } else { 0.5 };
        let narrowed = req.get("ProjectionExpression").is_some()
            || req.get("FilterExpression").is_some()
            || req.get("AttributesToGet").is_some();
        match op.as_str() {
            "GetItem" => {
                let item = if narrowed {
                    let out =
                        t.db.get_item()
                            .table_name(req["TableName"].as_str().unwrap())
                            .set_key(Some(attributes(&req["Key"])))
                            .send()
                            .await
                            .unwrap();
                    out.item().map(item_size_of)
                } else {
                    resp["Item"].as_object().map(item_size)
                };
                total += factor(&req["ConsistentRead"]) * item.map_or(1, read_units) as f64;
            }
            "Query" => {
                let bytes: usize = if narrowed {
                    whole_query(t, req).await
                } else {
                    resp["Items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_object)
                        .map(item_size)
                        .sum()
                };
                total += factor(&req["ConsistentRead"]) * read_units(bytes) as f64;
            }
            "BatchGetItem" => {
                for (table, request) in req["RequestItems"].as_object().into_iter().flatten() {
                    let asked = request["Keys"].as_array().map_or(0, Vec::len);
                    let found: Vec<usize> = resp["Responses"][table]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_object)
                        .map(item_size)
                        .collect();
                    let units: u64 = found.iter().map(|s| read_units(*s)).sum::<u64>()
                        + asked.saturating_sub(found.len()) as u64;
                    total += factor(&request["ConsistentRead"]) * units as f64;
                }
            }
            other => eprintln!("  cost: read units of {other} not counted"),
        }
    }
    t.calls.take_calls();
    total
}

/// The bytes a narrowed Query reads: the same keys, pages and order, whole items, no filter.
async fn whole_query(t: &TestApp, req: &Value) -> usize {
    let condition = req["KeyConditionExpression"].as_str().unwrap_or("");
    // Only the names and values the key condition uses (DynamoDB refuses unused ones).
    let names: HashMap<String, String> = req["ExpressionAttributeNames"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| condition.contains(k.as_str()))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
        .collect();
    let values: HashMap<String, AttributeValue> = attributes(&req["ExpressionAttributeValues"])
        .into_iter()
        .filter(|(k, _)| condition.contains(k.as_str()))
        .collect();
    let out =
        t.db.query()
            .table_name(req["TableName"].as_str().unwrap())
            .set_index_name(req["IndexName"].as_str().map(str::to_owned))
            .key_condition_expression(condition)
            .set_expression_attribute_names((!names.is_empty()).then_some(names))
            .set_expression_attribute_values(Some(values))
            .set_exclusive_start_key(req.get("ExclusiveStartKey").map(attributes))
            .set_limit(req["Limit"].as_i64().map(|l| l as i32))
            .set_scan_index_forward(req["ScanIndexForward"].as_bool())
            .send()
            .await
            .unwrap();
    out.items().iter().map(item_size_of).sum()
}

/// DynamoDB JSON of keys and expression values (strings, numbers, booleans) as SDK values.
fn attributes(v: &Value) -> HashMap<String, AttributeValue> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, typed)| {
            let (kind, inner) = typed.as_object()?.iter().next()?;
            let value = match kind.as_str() {
                "S" => AttributeValue::S(inner.as_str()?.to_owned()),
                "N" => AttributeValue::N(inner.as_str()?.to_owned()),
                "BOOL" => AttributeValue::Bool(inner.as_bool()?),
                _ => return None,
            };
            Some((k.clone(), value))
        })
        .collect()
}

// --- logs and metrics ---------------------------------------------------------------------------

/// The functions' log output, written by the subscriber the Lambda runtime sets up (JSON, as
/// template.yaml's `LogFormat: JSON` makes it), into memory.
fn install_log_capture() -> LogCapture {
    // What Lambda sets for the functions; RUST_LOG would add lines they do not write.
    std::env::set_var("AWS_LAMBDA_LOG_FORMAT", "JSON");
    std::env::set_var("AWS_LAMBDA_LOG_LEVEL", "INFO");
    std::env::remove_var("RUST_LOG");
    let capture = LogCapture::default();
    chat_store::telemetry::init_with_writer(false, None, capture.clone());
    capture
}

/// The custom metrics the functions emit: (name, Function dimension), from the sources' calls of
/// `telemetry::count`/`metric` (and the fanout's list of counters). A name in `crates/` counts for
/// each function whose code path emits it.
pub fn emf_metrics() -> std::collections::BTreeSet<(String, String)> {
    let root = chat_tests::server::workspace_root();
    let mut files = Vec::new();
    let mut dirs = vec![root.join("crates"), root.join("functions")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let relative = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let functions: Vec<String> = match relative.split('/').collect::<Vec<_>>().as_slice() {
            ["functions", f, ..] => vec![(*f).to_owned()],
            [.., "telemetry.rs"] => vec![],
            [.., "send.rs"] => vec!["send-message".into()],
            [.., "reads.rs"] => vec!["mark-read".into()],
            // Transactions: creating and changing conversations, sending.
            ["crates", "store", "src", "lib.rs"] => {
                vec!["conversations".into(), "send-message".into()]
            }
            _ => vec![format!("? {relative}")],
        };
        for pattern in ["count(\"", "metric(\"", "(\""] {
            for (at, _) in text.match_indices(pattern) {
                let rest = &text[at + pattern.len()..];
                let Some(end) = rest.find('"') else { continue };
                let name = &rest[..end];
                // `("Name", n)`: the fanout's list of counters (CamelCase names only).
                let listed = pattern == "(\""
                    && relative.starts_with("functions/")
                    && text[..at].ends_with(char::is_whitespace)
                    && rest[end..].starts_with("\", ")
                    && name.starts_with(|c: char| c.is_ascii_uppercase());
                if (pattern != "(\"" || listed) && name.chars().all(|c| c.is_ascii_alphanumeric()) {
                    for f in &functions {
                        out.insert((name.to_owned(), f.clone()));
                    }
                }
            }
        }
    }
    out
}

// --- the report ---------------------------------------------------------------------------------

fn dollars(x: f64) -> String {
    if x >= 100.0 {
        format!("${x:.0}")
    } else if x >= 0.01 {
        format!("${x:.2}")
    } else {
        format!("${x:.4}")
    }
}

fn print_report(m: &Measured, a: &Assumptions, n: usize) {
    let today = &chat_domain::time::now_rfc3339()[..10];
    println!(
        "cost model figures, {today}: {n} requests per operation, handlers in process, emulator"
    );
    println!();
    println!("| operation (measured) | requests | DynamoDB calls | WRU | RRU | p50 ms | response bytes | log bytes (sampled) | log bytes per line |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, op) in [
        ("send 1:1", &m.send),
        ("send, 1,000-member group", &m.send_group),
        ("markRead, advancing", &m.read),
        ("markRead, not advancing", &m.read_noop),
        ("inbox, page of 20", &m.inbox),
        ("inbox, page of 20 groups", &m.inbox_groups),
        ("history?afterSeq, 3 newest (group)", &m.history),
    ] {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} | {:.0} | {:.0} |",
            op.requests,
            op.calls,
            op.wru,
            op.rru,
            op.ms,
            op.response_bytes,
            op.log_bytes,
            op.line_bytes
        );
    }
    println!();
    println!("| figure (measured) | value |");
    println!("|---|---:|");
    for (name, value) in [
        (
            "stored bytes per 1:1 message (items + 100 B each)",
            m.message_bytes,
        ),
        ("Kinesis record, message.new (full)", m.event_bytes),
        ("Kinesis record, message.new (light)", m.event_bytes_light),
        ("Kinesis record, read.updated", m.event_bytes_read),
        ("push frame, message.new (full)", m.push_bytes),
        ("push frame, message.new (light)", m.push_bytes_light),
        ("push frame, read.updated", m.push_bytes_read),
        (
            "fanout RRU per event, 2 members (members cached)",
            m.fanout_rru_1to1,
        ),
        (
            "fanout RRU per read receipt, 2 members (members cached)",
            m.fanout_rru_read_1to1,
        ),
        (
            "fanout RRU per event, 1,000 members (members cached)",
            m.fanout_rru_group,
        ),
        (
            "  + member Query on a cache miss, 2 members",
            m.fanout_query_rru_1to1,
        ),
        (
            "  + member Query on a cache miss, 1,000 members",
            m.fanout_query_rru_group,
        ),
        ("inbox index WRU per 1:1 message", m.index_wru_1to1),
        ("inbox index RRU per 1:1 message", m.index_rru_1to1),
        (
            "inbox index WRU per message, 1,000 members",
            m.index_group_wru,
        ),
        (
            "inbox index RRU per message, 1,000 members",
            m.index_group_rru,
        ),
        ("$connect WRU (a further connection)", m.connect_wru),
        ("$connect WRU (a user's first)", m.connect_first_wru),
        ("$connect p50 ms (presence writes)", m.connect_ms),
        ("custom metrics (name x Function)", m.emf_metrics),
    ] {
        println!("| {name} | {value:.1} |");
    }
    println!();
    println!("assumed (not measurable locally):");
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "optimised build"
    };
    println!(
        "  billed duration = in-process p50 rounded up to {} ms ({build}, emulator round trips)",
        a.billed_ms_rounding
    );
    println!(
        "  messages per relay and indexer invocation: {} quiet, {} at load; records per fanout invocation: {} quiet, {} at load",
        a.relay_batch, LOADED.relay_batch, a.fanout_batch, LOADED.fanout_batch
    );
    println!(
        "  per invocation: relay {} ms, indexer {} ms, fanout {} ms (1:1) / {} ms (group), each further message of a batch +{} / +{} / +{} / +{} ms",
        a.relay_ms, a.index_ms, a.fanout_ms_1to1, a.fanout_ms_group,
        a.relay_more_ms, a.index_more_ms, a.fanout_more_ms_1to1, a.fanout_more_ms_group
    );
    println!(
        "  {} connections per online user; 1:1: both members online; group: {} of 1,000 online, {} of them with it on screen (they fetch light pushes: SDK lightFetch \"watched\"; before: all), {} fetch per light push",
        a.connections_per_online_user, a.online_group, a.watching_share, a.fetches_per_push
    );
    println!(
        "  {} of sends and reads name their connection (X-Connection-Id, as the SDK does; before: {}): their push skips it",
        a.named_connection_share, BEFORE.named_connection_share
    );
    println!(
        "  log bytes per invocation: Lambda's platform lines {} (SystemLogLevel WARN; before: {} at INFO), a stream consumer's line {} written for {:.2} of batches (CHAT_LOG_EVERY; before: all); {} B of headers per response",
        a.platform_log_bytes, BEFORE.platform_log_bytes, a.consumer_log_bytes, a.consumer_line_share, a.response_overhead_bytes
    );
    println!(
        "  the access log's line: template.yaml's format, {} bytes with the example values of bench/src/cost/access_log.rs (a UUID sub, a 1:1 send's path; no user agent since 2026-12-07)",
        m.access_log_bytes
    );
    println!(
        "  Kinesis enhanced fan-out ${}/GB, ${}/consumer-hour; fanout reads with its member list cached",
        KINESIS_EFO_GB, KINESIS_EFO_CONSUMER_HOUR
    );
    println!("  prices: {PRICES_TAKEN}");
    let metrics: Vec<String> = emf_metrics()
        .into_iter()
        .map(|(name, function)| format!("{name}@{function}"))
        .collect();
    println!("  custom metrics found: {}", metrics.join(", "));
    println!();
    let c = costs(m, a);
    let loaded = costs(m, &LOADED);
    let before = costs(m, &BEFORE);
    let direct = total(&c.direct);
    println!("| cost | before (the 2026-11-30 model) | quiet stream | at load | goal | largest parts (quiet) |");
    println!("|---|---:|---:|---:|---:|---|");
    // SPEC §11's goals; a group's read receipts and the fixed costs have none.
    let goals = [
        Some(8.0),
        Some(1_000.0),
        Some(5.0),
        Some(6.0),
        Some(6.0),
        None,
        None,
    ];
    for (i, (name, pick)) in scenarios().into_iter().enumerate() {
        let lines = pick(&c);
        let mut sorted: Vec<&Line> = lines.iter().collect();
        sorted.sort_by(|x, y| y.dollars.total_cmp(&x.dollars));
        let parts: Vec<String> = sorted
            .iter()
            .take(3)
            .map(|l| format!("{} {}", l.part, dollars(l.dollars)))
            .collect();
        let goal = goals[i].map_or("–".to_owned(), |g| {
            let met = |lines: &[Line]| if total(lines) <= g { "met" } else { "not met" };
            format!("≤ {}: {} / {}", dollars(g), met(lines), met(pick(&loaded)))
        });
        println!(
            "| {name} | {} | {} | {} | {goal} | {} |",
            dollars(total(pick(&before))),
            dollars(total(lines)),
            dollars(total(pick(&loaded))),
            parts.join(", ")
        );
    }
    println!();
    for (label, costs) in [("quiet", &c), ("at load", &loaded)] {
        for (name, pick) in scenarios() {
            let parts: Vec<String> = pick(costs)
                .iter()
                .map(|l| format!("{} {}", l.part, dollars(l.dollars)))
                .collect();
            println!("  {label}, {name}: {}", parts.join("; "));
        }
    }
    println!(
        "  storage: {} per month per 1 M 1:1 messages kept",
        dollars(c.storage_per_month)
    );
    println!();
    let svg = chat_tests::server::workspace_root().join(CHART);
    match std::fs::write(&svg, chart(&c, &loaded)) {
        Ok(()) => println!("chart of where each dollar goes: {CHART}"),
        Err(e) => println!("chart not written ({CHART}): {e}"),
    }
    println!(
        "per message (1:1): {} per million on a quiet stream ({} at load), DynamoDB share {:.0}%",
        dollars(direct),
        dollars(total(&loaded.direct)),
        100.0 * c.direct_dynamodb / direct
    );
}

type Pick = fn(&Costs) -> &[Line];

/// The cost tables, in the order they are printed and charted.
fn scenarios() -> [(&'static str, Pick); 7] {
    [
        ("per 1 M messages, 1:1", |c| &c.direct),
        ("per 1 M group messages (1,000 members, 300 online)", |c| {
            &c.group
        }),
        ("per 1 M read receipts", |c| &c.receipts),
        ("per 1 M inbox loads (page of 20)", |c| &c.inbox),
        ("per 1 M inbox loads (page of 20 groups)", |c| {
            &c.inbox_groups
        }),
        (
            "per 1 M read receipts in a 1,000-member group (300 online)",
            |c| &c.group_receipts,
        ),
        ("fixed, per month (no traffic, before storage)", |c| {
            &c.fixed
        }),
    ]
}

/// Where the bench writes its chart, from the workspace root.
pub const CHART: &str = "docs/cost-breakdown.svg";

/// An SVG of where each dollar goes: per table (quiet stream, and at load), one bar per line,
/// longest first, each as a share of its table's total.
pub fn chart(quiet: &Costs, loaded: &Costs) -> String {
    const W: f64 = 980.0;
    const LABEL: f64 = 330.0;
    const ROW: f64 = 18.0;
    let bar = W - LABEL - 150.0;
    let mut body = String::new();
    let mut y = 40.0;
    for (label, costs) in [("quiet stream", quiet), ("at load", loaded)] {
        for (name, pick) in scenarios().into_iter().take(6) {
            let lines = pick(costs);
            let sum = total(lines);
            body += &format!(
                "<text x=\"10\" y=\"{y}\" font-weight=\"bold\">{name}, {label}: {}</text>\n",
                dollars(sum)
            );
            y += ROW;
            let mut sorted: Vec<&Line> = lines.iter().filter(|l| l.dollars > 0.0).collect();
            sorted.sort_by(|x, z| z.dollars.total_cmp(&x.dollars));
            for l in sorted {
                let share = l.dollars / sum;
                body += &format!(
                    "<text x=\"20\" y=\"{}\">{}</text><rect x=\"{LABEL}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"#4a7fb5\"/><text x=\"{:.1}\" y=\"{}\">{} ({:.0} %)</text>\n",
                    y + 12.0,
                    l.part.replace('&', "&amp;"),
                    y + 2.0,
                    (share * bar).max(1.0),
                    ROW - 4.0,
                    LABEL + (share * bar).max(1.0) + 6.0,
                    y + 12.0,
                    dollars(l.dollars),
                    share * 100.0
                );
                y += ROW;
            }
            y += ROW;
        }
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{y}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">Where each dollar goes (bench -- cost; docs/cost.md)</text>\n{body}</svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_by_hand() {
        let m = Measured {
            send: Op {
                ms: 10.0,
                wru: 4.0,
                rru: 1.0,
                ..Op::default()
            },
            event_bytes: 300.0,
            fanout_rru_1to1: 2.0,
            fanout_rru_read_1to1: 1.0,
            emf_metrics: 10.0,
            ..Measured::default()
        };
        let a = Assumptions {
            relay_ms: 0.0,
            index_ms: 0.0,
            fanout_ms_1to1: 0.0,
            connections_per_online_user: 1.0,
            named_connection_share: 0.0,
            platform_log_bytes: 0.0,
            consumer_log_bytes: 0.0,
            response_overhead_bytes: 0.0,
            ..ASSUMED
        };
        let c = costs(&m, &a);
        // API $1; send-message $0.20 + 0.01 s × 0.25 GB × $0.0000133334 × 1 M; DynamoDB
        // 4 × $0.625 + $0.125; relay, indexer, fanout $0.20 each; Kinesis one KB in and out,
        // 1024 B × 1 M / 10^9 × ($0.08 + $0.05); fanout reads 2 × $0.125; pushes 2 × $1.
        let by_hand = 1.0 + 0.2 + 0.033_333_5 + 2.625 + 0.6 + 0.133_12 + 0.25 + 2.0;
        assert!((total(&c.direct) - by_hand).abs() < 1e-6, "{:?}", c.direct);
        assert!((c.direct_dynamodb - 2.875).abs() < 1e-9);
        // A receipt: relay and fanout $0.20 each, Kinesis as above, the fanout's 1 read unit
        // (presence only) $0.125.
        let receipt = c
            .receipts
            .iter()
            .find(|l| l.part == "relay, Kinesis, fanout");
        let by_hand = 0.2 + 0.133_12 + 0.2 + 0.125;
        assert!(
            (receipt.unwrap().dollars - by_hand).abs() < 1e-6,
            "{receipt:?}"
        );
        // A group's read receipt reaches every online member, as its light message does, and
        // its fanout reads the same items.
        let part =
            |lines: &[Line], name: &str| lines.iter().find(|l| l.part == name).unwrap().dollars;
        assert_eq!(part(&c.group_receipts, "pushes"), part(&c.group, "pushes"));
        assert_eq!(
            part(&c.group_receipts, "DynamoDB, fanout"),
            part(&c.group, "DynamoDB, fanout")
        );
        // A send naming its connection: the sender's one connection gets no push.
        let named = costs(
            &m,
            &Assumptions {
                named_connection_share: 1.0,
                ..a
            },
        );
        assert!((total(&c.direct) - total(&named.direct) - 1.0).abs() < 1e-6);
        // Stream $29.20, no consumer-hour, 38 alarm metrics $3.80, 10 metrics $3.00.
        assert!((total(&c.fixed) - 36.00).abs() < 1e-9);
    }

    #[test]
    fn batches_share_an_invocation_and_only_watching_clients_fetch() {
        let m = Measured {
            history: Op {
                ms: 10.0,
                rru: 3.0,
                ..Op::default()
            },
            ..Measured::default()
        };
        let part = |c: &Costs, name: &str| {
            let all = c.direct.iter().chain(&c.group);
            all.filter(|l| l.part == name)
                .map(|l| l.dollars)
                .sum::<f64>()
        };
        // A relay batch of 5: one request ($0.20 per 1 M) and 30 + 4 × 1 ms of 0.25 GB, per
        // message a fifth.
        let a = Assumptions {
            relay_batch: 5.0,
            ..ASSUMED
        };
        let by_hand = (0.2 + 34.0 / 1000.0 * 0.25 * 0.000_013_333_4 * 1e6) / 5.0;
        assert!((part(&costs(&m, &a), "relay") - by_hand).abs() < 1e-9);
        // 300 online, a fifth watching, one fetch each: 60 × (API $1 + request $0.20 + 10 ms of
        // 0.25 GB + 3 RRU) per 1 M.
        let fetch = 1.0 + 0.2 + 0.01 * 0.25 * 0.000_013_333_4 * 1e6 + 3.0 * 0.125;
        let c = costs(&m, &ASSUMED);
        assert!((part(&c, "fetches after light pushes") - 60.0 * fetch).abs() < 1e-6);
        let all = costs(&m, &BEFORE);
        assert!((part(&all, "fetches after light pushes") - 300.0 * fetch).abs() < 1e-6);
    }
}
