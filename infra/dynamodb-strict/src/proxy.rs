//! The proxy: routes each request, applies the rules in order (fault, conflict, throughput,
//! latency), forwards, then settles units from the answer.

use crate::conflicts::{Conflicts, Hold};
use crate::faults::{FaultKind, Faults, Latency};
use crate::freeze::Freeze;
use crate::schema::{self, Schema};
use crate::throughput::{Charge, Dir, Limits, PartitionId, Throughput};
use crate::wire::{self, Resp};
use crate::{control, units, Rules, StrictConfig};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

type Obj = Map<String, Value>;

pub(crate) struct State {
    pub rules: RwLock<Rules>,
    pub faults: Faults,
    pub freeze: Freeze,
    conflicts: Arc<Conflicts>,
    throughput: Throughput,
    latency: Latency,
    schemas: Mutex<HashMap<String, Arc<Schema>>>,
    /// Last size seen of items (by item id): estimates for writes whose size the request hides.
    sizes: Mutex<HashMap<String, usize>>,
    client: Client<HttpConnector, Full<Bytes>>,
    dynamodb: String,
    other: Option<String>,
    tx_conflicts: AtomicU64,
    write_conflicts: AtomicU64,
    faults_fired: AtomicU64,
}

fn base_url(url: &str) -> io::Result<String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(a)) => Ok(format!("http://{a}")),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{url}: an http://host:port URL is needed"),
        )),
    }
}

impl State {
    pub fn new(config: &StrictConfig) -> io::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1024)
            .build(connector);
        Ok(State {
            rules: RwLock::new(config.rules.clone()),
            faults: Faults::default(),
            freeze: Freeze::default(),
            conflicts: Arc::default(),
            throughput: Throughput::default(),
            latency: Latency::default(),
            schemas: Mutex::default(),
            sizes: Mutex::default(),
            client,
            dynamodb: base_url(&config.dynamodb)?,
            other: config.other.as_deref().map(base_url).transpose()?,
            tx_conflicts: AtomicU64::new(0),
            write_conflicts: AtomicU64::new(0),
            faults_fired: AtomicU64::new(0),
        })
    }

    pub fn rules(&self) -> Rules {
        self.rules.read().expect("rules lock").clone()
    }

    /// New rules take effect at once: a shorter transaction window also ends the windows of
    /// transactions already answered (in-flight ones keep their holds).
    pub fn set_rules(&self, rules: Rules) {
        let mut current = self.rules.write().expect("rules lock");
        if rules.tx_window_ms < current.tx_window_ms {
            self.conflicts.clear_windows();
        }
        *current = rules;
    }

    pub fn record(&self) -> Value {
        json!({
            "partitions": self.throughput.snapshot(),
            "txConflicts": self.tx_conflicts.load(Ordering::Relaxed),
            "writeConflicts": self.write_conflicts.load(Ordering::Relaxed),
            "faultsFired": self.faults_fired.load(Ordering::Relaxed),
            "heldByFreeze": self.freeze.held(),
        })
    }

    pub fn reset(&self) {
        self.throughput.reset();
        self.faults.clear();
        self.freeze.reset();
        self.conflicts.clear_windows();
        self.schemas.lock().expect("schemas lock").clear();
        self.sizes.lock().expect("sizes lock").clear();
        for c in [
            &self.tx_conflicts,
            &self.write_conflicts,
            &self.faults_fired,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// After a table's DDL: its schema is learnt again.
    fn forget_schemas(&self, tables: &[String]) {
        let mut schemas = self.schemas.lock().expect("schemas lock");
        tables.iter().for_each(|t| drop(schemas.remove(t)));
    }

    fn known_size(&self, id: &str) -> Option<usize> {
        self.sizes.lock().expect("sizes lock").get(id).copied()
    }

    fn set_size(&self, id: String, size: Option<usize>) {
        let mut sizes = self.sizes.lock().expect("sizes lock");
        if sizes.len() > 200_000 {
            sizes.clear();
        }
        match size {
            Some(s) => sizes.insert(id, s),
            None => sizes.remove(&id),
        };
    }

    /// A table's key schema, learnt once by DescribeTable (with the caller's credentials
    /// header: DynamoDB Local wants one).
    async fn schema(&self, table: &str, headers: &HeaderMap) -> Option<Arc<Schema>> {
        if let Some(s) = self.schemas.lock().expect("schemas lock").get(table) {
            return Some(s.clone());
        }
        let mut req = Request::post(format!("{}/", self.dynamodb))
            .header("x-amz-target", "DynamoDB_20120810.DescribeTable")
            .header("content-type", "application/x-amz-json-1.0");
        for h in ["authorization", "x-amz-date", "x-amz-security-token"] {
            if let Some(v) = headers.get(h) {
                req = req.header(h, v);
            }
        }
        let body = Full::new(Bytes::from(json!({ "TableName": table }).to_string()));
        let resp = self.client.request(req.body(body).ok()?).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        let schema = Arc::new(Schema::from_describe(
            &serde_json::from_slice(&bytes).ok()?,
        )?);
        let mut schemas = self.schemas.lock().expect("schemas lock");
        schemas.insert(table.to_owned(), schema.clone());
        Some(schema)
    }

    async fn forward(
        &self,
        base: &str,
        parts: &Parts,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), String> {
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::builder()
            .method(parts.method.clone())
            .uri(format!("{base}{pq}"));
        for (k, v) in &parts.headers {
            if !is_hop(k.as_str()) {
                req = req.header(k, v);
            }
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (p, b) = resp.into_parts();
        let bytes = b.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((p.status, p.headers, bytes))
    }
}

fn is_hop(h: &str) -> bool {
    matches!(
        h,
        "host" | "content-length" | "connection" | "transfer-encoding" | "keep-alive"
    )
}

pub(crate) async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    // Connections live in this set, so dropping the server (aborting this task) ends them too.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

#[derive(Default, PartialEq)]
enum Class {
    #[default]
    Other,
    Get,
    Write,
    BatchWrite,
    BatchGet,
    TxWrite,
    TxRead,
    Query,
    Ddl,
}

/// What an action does to its item: how it is charged, what size it leaves behind.
#[derive(Clone, Copy, PartialEq)]
enum Act {
    /// The item written, in bytes.
    Put(usize),
    /// At least its key and the values given.
    Update(usize),
    Delete,
    ConditionCheck,
    /// Strongly consistent or not.
    Read(bool),
}

/// What one request touches. Per action (a single-item call, a transaction action, a batch
/// entry): its item id, partition-key value, act and the charges it needs.
#[derive(Default)]
struct Plan {
    class: Class,
    tables: Vec<String>,
    keys: Vec<String>,
    items: Vec<String>,
    acts: Vec<Act>,
    groups: Vec<Vec<Charge>>,
    /// Batch entries: (table, position in that table's list).
    slots: Vec<(String, usize)>,
    schemas: HashMap<String, Arc<Schema>>,
}

fn str_of<'a>(m: &'a Obj, k: &str) -> Option<&'a str> {
    m.get(k)?.as_str()
}

fn obj(v: Option<&Value>) -> Option<&Obj> {
    v?.as_object()
}

fn consistent(m: &Obj) -> bool {
    m.get("ConsistentRead") == Some(&Value::Bool(true))
}

fn projected(m: &Obj) -> bool {
    m.contains_key("ProjectionExpression") || m.contains_key("AttributesToGet")
}

/// An action's key (from the Put item, or its `Key`), its Put item and its act.
fn action<'a>(
    schema: &Schema,
    kind: &str,
    body: &'a Obj,
    strong: bool,
) -> Option<(Obj, Option<&'a Obj>, Act)> {
    let put = obj(body.get("Item")).filter(|_| kind == "Put");
    let key = match put {
        Some(item) => schema.key_of(item),
        None => obj(body.get("Key"))?.clone(),
    };
    let values = obj(body.get("ExpressionAttributeValues"));
    let act = match kind {
        "Put" => Act::Put(units::item_size(put?)),
        "Update" => Act::Update(units::item_size(&key) + values.map_or(0, units::item_size)),
        "Delete" => Act::Delete,
        "Get" => Act::Read(strong),
        _ => Act::ConditionCheck,
    };
    Some((key, put, act))
}

impl Plan {
    /// Adds an action; `factor` 2 for transactions. A Put is also charged to each global index
    /// whose partition key its item has, for the projected size.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        st: &State,
        table: &str,
        schema: &Schema,
        key: Obj,
        put: Option<&Obj>,
        act: Act,
        factor: f64,
    ) {
        let id = schema::item_id(table, &key);
        let known = st.known_size(&id).unwrap_or(0);
        let (dir, units) = match act {
            Act::Read(strong) => (Dir::Read, units::read_units(known, strong)),
            Act::Put(min) | Act::Update(min) => (Dir::Write, units::write_units(known.max(min))),
            _ => (
                Dir::Write,
                units::write_units(known.max(units::item_size(&key))),
            ),
        };
        let pk = key
            .get(&schema.keys.pk)
            .map(schema::scalar)
            .unwrap_or_default();
        let part = PartitionId {
            table: table.to_owned(),
            index: None,
            key: pk.clone(),
        };
        let mut group = vec![Charge {
            part,
            dir,
            units: units * factor,
        }];
        for (ix, item) in put
            .iter()
            .flat_map(|i| schema.indexes.iter().map(move |ix| (ix, *i)))
        {
            let Some(v) = item.get(&ix.keys.pk).filter(|_| ix.global) else {
                continue;
            };
            let part = PartitionId {
                table: table.to_owned(),
                index: Some(ix.name.clone()),
                key: schema::scalar(v),
            };
            let units = units::write_units(schema.projected_size(ix, item)) * factor;
            group.push(Charge {
                part,
                dir: Dir::Write,
                units,
            });
        }
        self.tables.push(table.to_owned());
        self.keys.push(pk);
        self.items.push(id);
        self.acts.push(act);
        self.groups.push(group);
    }

    async fn schema(
        &mut self,
        st: &State,
        table: &str,
        headers: &HeaderMap,
    ) -> Option<Arc<Schema>> {
        let s = st.schema(table, headers).await?;
        self.schemas.insert(table.to_owned(), s.clone());
        Some(s)
    }

    /// A Query: one read charge to the partition it reads (the table's, or a global index's).
    async fn query(
        &mut self,
        st: &State,
        table: &str,
        req: &Obj,
        headers: &HeaderMap,
    ) -> Option<()> {
        let schema = self.schema(st, table, headers).await?;
        let index = str_of(req, "IndexName").and_then(|n| schema.index(n));
        let value = schema::query_partition(req, &index.map_or(&schema.keys, |i| &i.keys).pk)?;
        // A local index shares the table's partitions; a global one has its own and is
        // only eventually consistent.
        let global = index.filter(|i| i.global);
        let strong = global.is_none() && consistent(req);
        let key = schema::scalar(&value);
        let part = PartitionId {
            table: table.to_owned(),
            index: global.map(|i| i.name.clone()),
            key,
        };
        self.class = Class::Query;
        self.tables.push(table.to_owned());
        self.keys.push(part.key.clone());
        self.acts.push(Act::Read(strong));
        self.groups.push(vec![Charge {
            part,
            dir: Dir::Read,
            units: units::read_units(0, strong),
        }]);
        Some(())
    }
}

/// One action of a request as read from it: (table, kind, body, strongly consistent, batch
/// position).
type ActionSpec<'a> = (&'a str, &'a str, Cow<'a, Obj>, bool, Option<usize>);

/// A transaction's actions, each strongly consistent.
fn transact_actions(req: &Obj) -> Option<Vec<ActionSpec<'_>>> {
    let mut actions = Vec::new();
    for a in req.get("TransactItems")?.as_array()? {
        let (kind, body) = a.as_object()?.iter().next()?;
        let body = body.as_object()?;
        actions.push((
            str_of(body, "TableName")?,
            kind.as_str(),
            Cow::Borrowed(body),
            true,
            None,
        ));
    }
    Some(actions)
}

/// A BatchWriteItem's entries, with their positions in their table's list.
fn batch_write_actions(req: &Obj) -> Option<Vec<ActionSpec<'_>>> {
    let mut actions = Vec::new();
    for (table, entries) in obj(req.get("RequestItems"))? {
        for (i, e) in entries.as_array()?.iter().enumerate() {
            let (kind, body) = e.as_object()?.iter().next()?;
            let kind = kind.trim_end_matches("Request");
            actions.push((
                table.as_str(),
                kind,
                Cow::Borrowed(body.as_object()?),
                false,
                Some(i),
            ));
        }
    }
    Some(actions)
}

/// A BatchGetItem's keys, as Gets, with their positions in their table's list.
fn batch_get_actions(req: &Obj) -> Option<Vec<ActionSpec<'_>>> {
    let mut actions = Vec::new();
    for (table, spec) in obj(req.get("RequestItems"))? {
        let strong = consistent(spec.as_object()?);
        for (i, key) in spec.get("Keys")?.as_array()?.iter().enumerate() {
            let body = Obj::from_iter([("Key".to_owned(), key.clone())]);
            actions.push((table.as_str(), "Get", Cow::Owned(body), strong, Some(i)));
        }
    }
    Some(actions)
}

async fn plan(st: &State, op: &str, req: &Obj, headers: &HeaderMap) -> Option<Plan> {
    let mut p = Plan::default();
    let table_name = str_of(req, "TableName");
    // (table, kind, body, strongly consistent, batch position) per action.
    let mut actions: Vec<ActionSpec> = Vec::new();
    let mut factor = 1.0;
    match op {
        "PutItem" | "UpdateItem" | "DeleteItem" | "GetItem" => {
            p.class = if op == "GetItem" {
                Class::Get
            } else {
                Class::Write
            };
            let kind = op.trim_end_matches("Item");
            actions.push((table_name?, kind, Cow::Borrowed(req), consistent(req), None));
        }
        "TransactWriteItems" | "TransactGetItems" => {
            p.class = if op == "TransactWriteItems" {
                Class::TxWrite
            } else {
                Class::TxRead
            };
            factor = 2.0;
            actions = transact_actions(req)?;
        }
        "BatchWriteItem" => {
            p.class = Class::BatchWrite;
            actions = batch_write_actions(req)?;
        }
        "BatchGetItem" => {
            p.class = Class::BatchGet;
            actions = batch_get_actions(req)?;
        }
        "Query" => p.query(st, table_name?, req, headers).await?,
        "CreateTable" | "DeleteTable" | "UpdateTable" => {
            p.class = Class::Ddl;
            p.tables.push(table_name?.to_owned());
        }
        _ => p.tables.extend(table_name.map(str::to_owned)),
    }
    for (table, kind, body, strong, slot) in actions {
        let schema = p.schema(st, table, headers).await?;
        let (key, put, act) = action(&schema, kind, &body, strong)?;
        p.push(st, table, &schema, key, put, act, factor);
        p.slots.extend(slot.map(|i| (table.to_owned(), i)));
    }
    Some(p)
}

fn is_write(op: &str) -> bool {
    matches!(
        op,
        "PutItem" | "UpdateItem" | "DeleteItem" | "BatchWriteItem" | "TransactWriteItems"
    )
}

fn codes(n: usize, hit: &[usize], code: &'static str) -> Vec<&'static str> {
    (0..n)
        .map(|i| if hit.contains(&i) { code } else { "None" })
        .collect()
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> io::Result<Resp> {
    if req.uri().path().starts_with("/strict/") {
        return Ok(control::handle(&state, req).await);
    }
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // A call arriving at a frozen DynamoDB is served at the thaw even if its client has left
    // by then: in a task of its own, which the connection's end does not cancel.
    if state.freeze.is_frozen() && to_dynamodb(&state, &target) {
        let task = tokio::spawn(serve_call(state, parts, body, target));
        return task.await.map_err(io::Error::other)?;
    }
    serve_call(state, parts, body, target).await
}

/// Whether a call goes to the DynamoDB upstream (DynamoDB or DynamoDB Streams).
fn to_dynamodb(state: &State, target: &str) -> bool {
    state.other.is_none() || target.starts_with("DynamoDB")
}

async fn serve_call(
    state: Arc<State>,
    parts: Parts,
    body: Bytes,
    target: String,
) -> io::Result<Resp> {
    let gated = to_dynamodb(&state, &target);
    if gated {
        state.freeze.thawed().await;
    }
    let op = target.split_once('.').map_or("", |(_, op)| op).to_owned();
    let dynamo = target.starts_with("DynamoDB_20120810.");
    let upstream = upstream_of(&state, &target);
    let rules = state.rules();
    let mut req: Option<Obj> = dynamo.then(|| serde_json::from_slice(&body).ok()).flatten();
    let p = plan_of(&state, &op, req.as_ref(), &parts.headers).await;

    // 1. Faults.
    let fault = fault_effect(&state, &rules, dynamo, &target, &op, &p);
    let (mut refused, lost) = (fault.refused, fault.lost);

    if !fault.late.is_zero() {
        tokio::time::sleep(fault.late).await;
    }

    // 2. Transaction conflicts.
    let mut hold: Option<Hold> = None;
    if refused.is_none() && rules.conflicts {
        (hold, refused) = take_holds(&state, &rules, &p);
    }

    // 3. Throughput. Throttled batch entries are held back; anything else is all or nothing.
    let mut admission = Admission::unmetered(p.groups.len());
    if refused.is_none() && rules.throughput && !p.groups.is_empty() {
        (admission, refused) = admit(&state, &rules, &p);
    }

    // 4. Latency, while holding the items.
    if !fault.delay.is_zero() {
        tokio::time::sleep(fault.delay).await;
    }
    if let Some(r) = refused {
        return Ok(refusal(&state, r, hold, gated).await);
    }

    // 5. The request as forwarded: throttled batch entries out, ConsumedCapacity asked for.
    let (body, fixes) = outgoing(req.as_mut(), &p, &admission.throttled, body);
    let forwarded = admission.forwarded(p.groups.len());
    let forwarded_call = forward_gated(&state, gated, &upstream, &parts, body).await;
    let Ok((status, mut headers, mut bytes)) = forwarded_call else {
        settle(&state, &p, &forwarded, &admission.metered, &[]);
        return Ok(wire::internal_server_error());
    };

    // 6. Settle units, remember sizes, fix the answer up.
    let ok = status.is_success();
    let mut answer: Option<Obj> = None;
    if dynamo && p.class != Class::Other {
        answer = serde_json::from_slice(&bytes).ok();
    }
    let sent = Sent {
        req: req.as_ref(),
        forwarded: &forwarded,
        metered: &admission.metered,
    };
    let changed = settle_answer(&state, &p, &sent, ok, answer.as_mut(), fixes);
    if p.class == Class::Ddl {
        state.forget_schemas(&p.tables);
    }
    if let Some(cancelled) = hold.take().and_then(|h| end_hold(&state, h, ok, &p)) {
        return Ok(cancelled);
    }
    if let (true, Some(a)) = (changed, answer) {
        bytes = reencoded(&a, &mut headers);
    }
    // The call is done and its items free: only its answer is late.
    if !fault.answer_delay.is_zero() {
        tokio::time::sleep(fault.answer_delay).await;
    }
    respond(lost, status, &headers, bytes)
}

/// A refused call's answer, once its items are free (and, to a frozen DynamoDB, at the thaw).
async fn refusal(state: &State, r: Resp, hold: Option<Hold>, gated: bool) -> Resp {
    if let Some(h) = hold {
        h.release_now();
    }
    if gated {
        state.freeze.thawed().await;
    }
    r
}

/// Where a call goes: DynamoDB (and DynamoDB Streams), or the other upstream.
fn upstream_of(state: &State, target: &str) -> String {
    match &state.other {
        Some(other) if !target.starts_with("DynamoDB") => other.clone(),
        _ => state.dynamodb.clone(),
    }
}

/// Forwards a call; one to a frozen DynamoDB waits for the thaw on its way in and on its way
/// back.
async fn forward_gated(
    state: &State,
    gated: bool,
    upstream: &str,
    parts: &Parts,
    body: Bytes,
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    if gated {
        // A call on its way in when DynamoDB froze (past the first gate) waits here.
        state.freeze.thawed().await;
    }
    let forwarded_call = state.forward(upstream, parts, body).await;
    if gated {
        // An answer on its way back when DynamoDB froze comes back at the thaw.
        state.freeze.thawed().await;
    }
    forwarded_call
}

/// Ends a call's hold on its items once answered; returns the cancellation to answer instead
/// when a conflicting call doomed the transaction meanwhile.
fn end_hold(state: &State, h: Hold, ok: bool, p: &Plan) -> Option<Resp> {
    let doomed = h.doomed();
    if ok && !doomed.is_empty() {
        state.tx_conflicts.fetch_add(1, Ordering::Relaxed);
        let reasons = codes(p.items.len(), &doomed, "TransactionConflict");
        return Some(wire::transaction_canceled(&reasons));
    }
    // A cancelled transaction (a failed condition) changed nothing: its items are free at
    // once, as the window stands for a committed one's writes settling.
    if !ok {
        h.release_now();
    }
    None
}

/// A fixed-up answer's body, its checksum header (if it had one) made to match.
fn reencoded(a: &Obj, headers: &mut HeaderMap) -> Bytes {
    let bytes = Bytes::from(serde_json::to_vec(a).unwrap_or_default());
    if headers.contains_key("x-amz-crc32") {
        let crc = crc32fast::hash(&bytes).to_string();
        headers.insert("x-amz-crc32", crc.parse().expect("digits"));
    }
    bytes
}

/// A call's plan; one that cannot be planned touches at most the table it names.
async fn plan_of(state: &State, op: &str, req: Option<&Obj>, headers: &HeaderMap) -> Plan {
    match req {
        Some(r) => plan(state, op, r, headers).await.unwrap_or_else(|| Plan {
            tables: str_of(r, "TableName")
                .map(str::to_owned)
                .into_iter()
                .collect(),
            ..Plan::default()
        }),
        None => Plan::default(),
    }
}

/// What the fault rules (and the latency rule) do to a call.
struct FaultEffect {
    /// Answered with an error instead of forwarded.
    refused: Option<Resp>,
    /// The answer is lost (`AnswerLost`, `AnswerLost500`).
    lost: Option<FaultKind>,
    /// Before the call is forwarded.
    delay: Duration,
    /// Before the call reaches the table (before it holds anything).
    late: Duration,
    /// Before its answer is given.
    answer_delay: Duration,
}

/// The faults rule: the latency drawn for a DynamoDB call, and the first fault rule the call matches
/// (fired once).
fn fault_effect(
    state: &State,
    rules: &Rules,
    dynamo: bool,
    target: &str,
    op: &str,
    p: &Plan,
) -> FaultEffect {
    let mut effect = FaultEffect {
        refused: None,
        lost: None,
        delay: Duration::ZERO,
        late: Duration::ZERO,
        answer_delay: Duration::ZERO,
    };
    if dynamo {
        effect.delay = state
            .latency
            .next(rules.latency_ms, rules.latency_p99_ms, rules.seed);
    }
    if let Some(f) = state.faults.take(target, &p.tables, &p.keys) {
        state.faults_fired.fetch_add(1, Ordering::Relaxed);
        let table = p.tables.first().map_or("", String::as_str);
        effect.refused = match f.kind {
            FaultKind::ProvisionedThroughputExceededException => {
                Some(wire::throughput_exceeded(table, None, is_write(op)))
            }
            FaultKind::ThrottlingException => Some(wire::throttling_exception()),
            FaultKind::RequestLimitExceeded => Some(wire::request_limit_exceeded()),
            FaultKind::InternalServerError => Some(wire::internal_server_error()),
            FaultKind::Slow => {
                effect.delay += Duration::from_millis(f.delay_ms);
                None
            }
            FaultKind::Late => {
                effect.late = Duration::from_millis(f.delay_ms);
                None
            }
            FaultKind::AnswerLost | FaultKind::AnswerLost500 => {
                effect.lost = Some(f.kind);
                None
            }
            FaultKind::AnswerSlow => {
                effect.answer_delay = Duration::from_millis(f.delay_ms);
                None
            }
        };
    }
    effect
}

/// The conflicts rule: the hold on the call's items (none for calls that take none), or the
/// refusal when other calls hold them.
fn take_holds(state: &State, rules: &Rules, p: &Plan) -> (Option<Hold>, Option<Resp>) {
    let (items, n) = (p.items.clone(), p.items.len());
    let window = Duration::from_millis(rules.tx_window_ms);
    let c = &state.conflicts;
    let outcome = match p.class {
        Class::TxWrite => c.tx_write(items, window).map(Some),
        Class::TxRead => c.tx_read(items).map(Some),
        Class::Write => c.write(items, true).map(Some),
        Class::BatchWrite => c.write(items, false).map(Some),
        _ => Ok(None),
    };
    match outcome {
        Ok(h) => (h, None),
        Err(_) if p.class == Class::Write => {
            state.write_conflicts.fetch_add(1, Ordering::Relaxed);
            (None, Some(wire::transaction_conflict()))
        }
        Err(hit) => {
            state.tx_conflicts.fetch_add(1, Ordering::Relaxed);
            let reasons = codes(n, &hit, "TransactionConflict");
            (None, Some(wire::transaction_canceled(&reasons)))
        }
    }
}

/// What the throughput rule admitted, per group.
struct Admission {
    /// Charged to its partitions' buckets.
    metered: Vec<bool>,
    /// Not admitted: held back from a batch (or the whole call refused).
    throttled: Vec<usize>,
}

impl Admission {
    /// Throughput off: nothing metered, nothing throttled.
    fn unmetered(groups: usize) -> Self {
        Admission {
            metered: vec![false; groups],
            throttled: Vec::new(),
        }
    }

    /// Per group: whether it goes upstream.
    fn forwarded(&self, groups: usize) -> Vec<bool> {
        (0..groups).map(|i| !self.throttled.contains(&i)).collect()
    }
}

/// The throughput rule: which groups are admitted, and the refusal when the call cannot go on (a
/// batch goes on while some of its entries are admitted).
fn admit(state: &State, rules: &Rules, p: &Plan) -> (Admission, Option<Resp>) {
    let limits = Limits {
        write_per_sec: 1000.0 * rules.scale,
        read_per_sec: 3000.0 * rules.scale,
        burst_secs: rules.burst_secs,
    };
    let batch = matches!(p.class, Class::BatchWrite | Class::BatchGet);
    let metered = state.throughput.admit(&p.groups, !batch, &limits);
    let throttled: Vec<usize> = (0..metered.len()).filter(|&i| !metered[i]).collect();
    let mut refused = None;
    if !throttled.is_empty() && (!batch || throttled.len() == metered.len()) {
        refused = Some(if matches!(p.class, Class::TxWrite | Class::TxRead) {
            wire::transaction_canceled(&codes(p.groups.len(), &throttled, "ThrottlingError"))
        } else {
            let c = &p.groups[throttled[0]][0];
            wire::throughput_exceeded(&c.part.table, c.part.index.as_deref(), c.dir == Dir::Write)
        });
    }
    (Admission { metered, throttled }, refused)
}

/// What the answer needs fixing for, after the request was changed on its way.
struct AnswerFixes {
    /// Throttled batch entries taken out: the answer gives them back as unprocessed.
    held_back: Obj,
    /// ConsumedCapacity INDEXES asked for on the client's behalf.
    injected: bool,
    /// The ReturnConsumedCapacity the client asked for.
    asked: String,
}

/// The body as forwarded (throttled batch entries out, ConsumedCapacity asked for), and what
/// its answer then needs fixing for.
fn outgoing(
    req: Option<&mut Obj>,
    p: &Plan,
    throttled: &[usize],
    body: Bytes,
) -> (Bytes, AnswerFixes) {
    let mut fixes = AnswerFixes {
        held_back: Obj::new(),
        injected: false,
        asked: String::new(),
    };
    let Some(r) = req else {
        return (body, fixes);
    };
    if !throttled.is_empty() {
        fixes.held_back = take_entries(r, &p.slots, throttled, p.class == Class::BatchWrite);
    }
    // INDEXES separates the table's units from its indexes'; the answer is then given the
    // shape the client asked for (none, or TOTAL).
    fixes.asked = str_of(r, "ReturnConsumedCapacity")
        .unwrap_or("NONE")
        .to_owned();
    if p.class == Class::Write && fixes.asked != "INDEXES" {
        r.insert("ReturnConsumedCapacity".into(), "INDEXES".into());
        fixes.injected = true;
    }
    let body = if fixes.injected || !fixes.held_back.is_empty() {
        Bytes::from(serde_json::to_vec(r).unwrap_or_default())
    } else {
        body
    };
    (body, fixes)
}

/// What went upstream: the request as parsed, and per group whether it was forwarded and
/// metered.
struct Sent<'a> {
    req: Option<&'a Obj>,
    forwarded: &'a [bool],
    metered: &'a [bool],
}

/// Settles units and remembers sizes from a successful answer (from the estimates
/// otherwise), and fixes the answer up; returns whether the answer changed.
fn settle_answer(
    state: &State,
    p: &Plan,
    sent: &Sent,
    ok: bool,
    answer: Option<&mut Obj>,
    fixes: AnswerFixes,
) -> bool {
    let (forwarded, metered) = (sent.forwarded, sent.metered);
    let mut changed = false;
    match (answer, sent.req) {
        (Some(a), Some(r)) if ok => {
            let actual = actual_units(p, r, a);
            settle(state, p, forwarded, metered, &actual);
            remember_sizes(state, p, r, a, forwarded);
            if fixes.injected && fixes.asked == "TOTAL" {
                if let Some(cc) = a.get_mut("ConsumedCapacity").and_then(Value::as_object_mut) {
                    for k in ["Table", "GlobalSecondaryIndexes", "LocalSecondaryIndexes"] {
                        changed |= cc.remove(k).is_some();
                    }
                }
            } else if fixes.injected {
                changed |= a.remove("ConsumedCapacity").is_some();
            }
            if !fixes.held_back.is_empty() {
                merge_unprocessed(a, fixes.held_back, p.class == Class::BatchWrite);
                changed = true;
            }
        }
        _ => settle(state, p, forwarded, metered, &[]),
    }
    changed
}

/// The answer as the client gets it: lost (a fault), or the upstream's without hop headers.
fn respond(
    lost: Option<FaultKind>,
    status: StatusCode,
    headers: &HeaderMap,
    bytes: Bytes,
) -> io::Result<Resp> {
    match lost {
        Some(FaultKind::AnswerLost) => Err(io::Error::other("strict: answer lost (fault)")),
        Some(_) => Ok(wire::internal_server_error()),
        None => {
            let mut resp = Response::builder().status(status);
            for (k, v) in headers.iter().filter(|(k, _)| !is_hop(k.as_str())) {
                resp = resp.header(k, v);
            }
            Ok(resp
                .body(Full::new(bytes))
                .expect("upstream headers are valid"))
        }
    }
}

/// Settles every forwarded group: its first charge to `actual[i]` when known, the rest (and
/// unknown ones) to their estimates. Unmetered groups (throughput off) are only recorded.
fn settle(st: &State, p: &Plan, forwarded: &[bool], metered: &[bool], actual: &[Option<f64>]) {
    for (i, g) in p.groups.iter().enumerate().filter(|(i, _)| forwarded[*i]) {
        for (j, c) in g.iter().enumerate() {
            let a = actual.get(i).copied().flatten().filter(|_| j == 0);
            st.throughput.settle(c, a.unwrap_or(c.units), metered[i]);
        }
    }
}

/// Per group, the actual units of its first charge from a successful answer (`None`: keep
/// the estimate). Reads are sized from the items answered; a projected read costs at least
/// what the whole item did when last seen.
fn actual_units(p: &Plan, req: &Obj, a: &Obj) -> Vec<Option<f64>> {
    let size = |v: Option<&Value>| v.and_then(Value::as_object).map_or(0, units::item_size);
    let strong = |i: usize| matches!(p.acts.get(i), Some(Act::Read(true)));
    match p.class {
        Class::Write => vec![table_units(a)],
        Class::Get => {
            let read = units::read_units(size(a.get("Item")), strong(0));
            let floor = if projected(req) {
                p.groups[0][0].units
            } else {
                0.0
            };
            vec![Some(read.max(floor))]
        }
        Class::Query => {
            let items = a.get("Items").and_then(Value::as_array);
            let total = items.into_iter().flatten().map(|i| size(Some(i))).sum();
            vec![items.map(|_| units::read_units(total, strong(0)))]
        }
        Class::TxRead => {
            let responses = a.get("Responses").and_then(Value::as_array);
            let item = |i: usize| responses.and_then(|r| r.get(i)?.get("Item"));
            (0..p.groups.len())
                .map(|i| Some(2.0 * units::read_units(size(item(i)), true)))
                .collect()
        }
        Class::BatchGet => {
            // Answered items by id; a key not answered (no such item) costs the minimum.
            let mut sizes = HashMap::new();
            for (table, list) in obj(a.get("Responses")).into_iter().flatten() {
                let Some(schema) = p.schemas.get(table) else {
                    continue;
                };
                for item in list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object)
                {
                    let id = schema::item_id(table, &schema.key_of(item));
                    sizes.insert(id, units::item_size(item));
                }
            }
            let read = |i: usize| sizes.get(&p.items[i]).copied().unwrap_or(0);
            (0..p.groups.len())
                .map(|i| Some(units::read_units(read(i), strong(i))))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The units a single write's answer reports for its table.
fn table_units(a: &Obj) -> Option<f64> {
    let cc = a.get("ConsumedCapacity")?;
    cc.pointer("/Table/CapacityUnits")
        .or(cc.get("CapacityUnits"))?
        .as_f64()
}

/// Remembers the item sizes a successful answer reveals, for later write estimates.
fn remember_sizes(st: &State, p: &Plan, req: &Obj, a: &Obj, forwarded: &[bool]) {
    for (i, act) in p.acts.iter().enumerate().filter(|(i, _)| forwarded[*i]) {
        let id = || p.items[i].clone();
        match act {
            Act::Put(size) => st.set_size(id(), Some(*size)),
            Act::Delete => st.set_size(id(), None),
            // A single update: the units reported bound its new size.
            Act::Update(_) if p.class == Class::Write => {
                if let Some(u) = table_units(a).filter(|u| *u >= 1.0) {
                    st.set_size(id(), Some((u as usize - 1) * 1024 + 1));
                }
            }
            Act::Read(_) if p.class == Class::Get && !projected(req) => {
                let size = a
                    .get("Item")
                    .and_then(Value::as_object)
                    .map(units::item_size);
                st.set_size(id(), size);
            }
            _ => {}
        }
    }
}

/// Takes the throttled entries out of a batch request; answers them as DynamoDB answers
/// unprocessed ones (`{table: [requests]}` or `{table: {"Keys": [...], ...params}}`).
fn take_entries(req: &mut Obj, slots: &[(String, usize)], throttled: &[usize], write: bool) -> Obj {
    let mut out = Obj::new();
    let Some(items) = req.get_mut("RequestItems").and_then(Value::as_object_mut) else {
        return out;
    };
    let mut by_table: HashMap<&str, Vec<usize>> = HashMap::new();
    for &i in throttled {
        by_table.entry(&slots[i].0).or_default().push(slots[i].1);
    }
    for (table, mut positions) in by_table {
        let Some(spec) = items.get_mut(table) else {
            continue;
        };
        let list = if write {
            spec.as_array_mut()
        } else {
            spec.get_mut("Keys").and_then(Value::as_array_mut)
        };
        let Some(list) = list else { continue };
        positions.sort_unstable_by(|a, b| b.cmp(a));
        let mut taken: Vec<Value> = positions.iter().map(|&i| list.remove(i)).collect();
        taken.reverse();
        let empty = list.is_empty();
        let held = if write {
            Value::Array(taken)
        } else {
            let mut params = spec.as_object().cloned().unwrap_or_default();
            params.insert("Keys".into(), Value::Array(taken));
            Value::Object(params)
        };
        out.insert(table.to_owned(), held);
        if empty {
            items.remove(table);
        }
    }
    out
}

fn merge_unprocessed(a: &mut Obj, held: Obj, write: bool) {
    let field = if write {
        "UnprocessedItems"
    } else {
        "UnprocessedKeys"
    };
    let Some(un) = a.entry(field).or_insert_with(|| json!({})).as_object_mut() else {
        return;
    };
    for (table, v) in held {
        match un.get_mut(&table) {
            Some(existing) => {
                let mut v = v;
                let (Some(to), Some(from)) = (entries(existing, write), entries(&mut v, write))
                else {
                    continue;
                };
                to.append(from);
            }
            None => {
                un.insert(table, v);
            }
        }
    }
}

fn entries(v: &mut Value, write: bool) -> Option<&mut Vec<Value>> {
    if write {
        v.as_array_mut()
    } else {
        v.get_mut("Keys")?.as_array_mut()
    }
}
