//! The layer end to end: the AWS SDK for Rust → the layer → Amazon DynamoDB Local.
//!
//! DynamoDB Local is found through `DYNAMODB_LOCAL_DIR` (the folder of `DynamoDBLocal.jar`), else
//! in `<workspace>/.local/dynamodb-local/*/`, else after running `infra/setup-dynamodb-local.sh`
//! when the repo has it. Only when none of that works (or Java is missing) do these tests skip,
//! saying why. One DynamoDB Local serves the whole run; each test has its own layer and tables.

use aws_sdk_dynamodb::config::{retry::RetryConfig, BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_get_items::builders::TransactGetItemsFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::CancellationReason;
use aws_sdk_dynamodb::types::*;
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use dynamodb_strict::{start, FaultKind, FaultSpec, Rules, Running, StrictConfig};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn jar_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("DYNAMODB_LOCAL_DIR") {
        let dir = PathBuf::from(dir);
        return match dir.join("DynamoDBLocal.jar").exists() {
            true => Ok(dir),
            false => Err(format!(
                "DYNAMODB_LOCAL_DIR={} has no DynamoDBLocal.jar",
                dir.display()
            )),
        };
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let installed = || {
        let base = root.join(".local/dynamodb-local");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.push(base);
        dirs.into_iter()
            .find(|d| d.join("DynamoDBLocal.jar").exists())
    };
    if let Some(dir) = installed() {
        return Ok(dir);
    }
    let script = root.join("infra/setup-dynamodb-local.sh");
    if !script.exists() {
        return Err("not in .local/dynamodb-local and no infra/setup-dynamodb-local.sh".into());
    }
    let status = Command::new("bash")
        .arg(&script)
        .current_dir(&root)
        .stdout(Stdio::null())
        .status();
    installed().ok_or(format!(
        "infra/setup-dynamodb-local.sh ({status:?}) installed nothing found"
    ))
}

const AUTH: &str = "AWS4-HMAC-SHA256 Credential=strict/20260101/us-east-1/dynamodb/aws4_request, \
                    SignedHeaders=host, Signature=00";

fn launch() -> Result<String, String> {
    Command::new("java")
        .arg("-version")
        .output()
        .map_err(|e| format!("java: {e}"))?;
    let dir = jar_dir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    // Stops when this test process ends (tests never run destructors of statics).
    let script = format!(
        "java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar -inMemory -sharedDb \
         -disableTelemetry -port {port} & j=$!; while kill -0 {} 2>/dev/null && kill -0 $j 2>/dev/null; \
         do sleep 1; done; kill $j 2>/dev/null",
        std::process::id()
    );
    let mut java = Command::new("bash");
    java.args(["-c", &script]).current_dir(&dir);
    java.stdout(Stdio::null()).stderr(Stdio::null());
    java.spawn().map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let probe = || -> std::io::Result<bool> {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            write!(
                s,
                "POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n\
                Content-Type: application/x-amz-json-1.0\r\nAuthorization: {AUTH}\r\n\
                Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            Ok(answer.starts_with("HTTP/1.1 200"))
        };
        if probe().unwrap_or(false) {
            return Ok(format!("http://127.0.0.1:{port}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "no answer on port {port} within 60 s (from {})",
        dir.display()
    ))
}

fn dynamodb_local() -> Option<&'static str> {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    URL.get_or_init(|| {
        launch()
            .inspect_err(|why| {
                // Straight to stderr: the harness captures eprintln! of passing tests.
                let msg = format!("SKIPPED: no Amazon DynamoDB Local to test against: {why}\n");
                let _ = std::io::stderr().write_all(msg.as_bytes());
            })
            .ok()
    })
    .as_deref()
}

async fn layer(rules: Rules) -> Option<(Running, Client)> {
    let mut config = StrictConfig::new(dynamodb_local()?);
    config.rules = rules;
    let running = start(config).await.unwrap();
    let client = sdk(&running.url());
    Some((running, client))
}

fn sdk(url: &str) -> Client {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("strict", "strict", None, None, "test"))
        .endpoint_url(url)
        .http_client(http)
        // The layer's errors are what is under test, not the SDK's retries of them.
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn attr(name: &str) -> AttributeDefinition {
    let a = AttributeDefinition::builder().attribute_name(name);
    a.attribute_type(ScalarAttributeType::S).build().unwrap()
}

fn key_el(name: &str, t: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(t)
        .build()
        .unwrap()
}

/// pk/sk strings, and a global index `byUser` on `user`.
async fn create_table(c: &Client, name: &str) {
    let gsi = GlobalSecondaryIndex::builder()
        .index_name("byUser")
        .key_schema(key_el("user", KeyType::Hash))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .unwrap();
    c.create_table()
        .table_name(name)
        .set_attribute_definitions(Some(vec![attr("pk"), attr("sk"), attr("user")]))
        .key_schema(key_el("pk", KeyType::Hash))
        .key_schema(key_el("sk", KeyType::Range))
        .global_secondary_indexes(gsi)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
}

fn code<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> String {
    e.as_service_error()
        .and_then(|e| e.code())
        .unwrap_or("(no service error)")
        .to_owned()
}

async fn get(c: &Client, t: &str, pk: &str, sk: &str) -> Option<String> {
    let out = c
        .get_item()
        .table_name(t)
        .key("pk", s(pk))
        .key("sk", s(sk))
        .consistent_read(true);
    let item = out.send().await.unwrap().item?;
    Some(
        item.get("v")
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default(),
    )
}

async fn put(c: &Client, t: &str, pk: &str, sk: &str, v: &str) -> Result<(), String> {
    let r = c
        .put_item()
        .table_name(t)
        .item("pk", s(pk))
        .item("sk", s(sk))
        .item("v", s(v));
    r.send().await.map(drop).map_err(|e| code(&e))
}

fn tx_put(t: &str, pk: &str, sk: &str, v: &str) -> TransactWriteItem {
    let item = [("pk", pk), ("sk", sk), ("v", v)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), s(v)));
    let put = Put::builder()
        .table_name(t)
        .set_item(Some(item.collect()))
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

/// The reasons of a TransactWriteItems refused with a TransactionCanceledException.
fn cancellation_reasons<R: std::fmt::Debug>(
    err: &SdkError<TransactWriteItemsError, R>,
) -> &[CancellationReason] {
    let Some(TransactWriteItemsError::TransactionCanceledException(x)) = err.as_service_error()
    else {
        panic!("{err:?}")
    };
    x.cancellation_reasons()
}

fn codes(reasons: &[CancellationReason]) -> Vec<&str> {
    reasons
        .iter()
        .map(|r| r.code().unwrap_or_default())
        .collect()
}

/// A TransactGetItems of one item.
fn tx_get(c: &Client, t: &str, pk: &str, sk: &str) -> TransactGetItemsFluentBuilder {
    let get = Get::builder()
        .table_name(t)
        .key("pk", s(pk))
        .key("sk", s(sk))
        .build()
        .unwrap();
    c.transact_get_items()
        .transact_items(TransactGetItem::builder().get(get).build())
}

fn partition<'a>(record: &'a Value, key: &str, index: Option<&str>) -> &'a Value {
    let rows = record["partitions"].as_array().unwrap();
    rows.iter()
        .find(|r| r["key"] == key && r["index"] == json!(index))
        .unwrap_or(&Value::Null)
}

#[tokio::test]
async fn forwards_and_records_units_by_dynamodb_rules() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "units";
    create_table(&c, t).await;
    // 2 + 2 + 2 + 1 + 4 + 2000 + 4 + 2 = 2017 bytes: 2 write units, to the table and the index.
    let put = || {
        let item = c
            .put_item()
            .table_name(t)
            .item("pk", s("c1"))
            .item("sk", s("a"));
        item.item("body", s(&"x".repeat(2000)))
            .item("user", s("u1"))
    };
    let out = put().send().await.unwrap();
    assert!(
        out.consumed_capacity.is_none(),
        "the capacity the layer asked for is not shown"
    );
    let out = put()
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .unwrap();
    let cc = out.consumed_capacity.unwrap();
    assert!(
        cc.capacity_units.is_some() && cc.table.is_none(),
        "TOTAL keeps its shape"
    );
    let key = |g: aws_sdk_dynamodb::operation::get_item::builders::GetItemFluentBuilder| {
        g.table_name(t).key("pk", s("c1")).key("sk", s("a"))
    };
    assert!(key(c.get_item())
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some());
    key(c.get_item()).send().await.unwrap();
    let q = c.query().table_name(t).key_condition_expression("pk = :p");
    let q = q
        .expression_attribute_values(":p", s("c1"))
        .send()
        .await
        .unwrap();
    assert_eq!(q.count, 1);
    let u = c
        .update_item()
        .table_name(t)
        .key("pk", s("c1"))
        .key("sk", s("a"));
    let u = u
        .update_expression("SET n = :n")
        .expression_attribute_values(":n", AttributeValue::N("1".into()));
    u.send().await.unwrap();
    c.delete_item()
        .table_name(t)
        .key("pk", s("c1"))
        .key("sk", s("a"))
        .send()
        .await
        .unwrap();

    let record = layer.partitions();
    let c1 = partition(&record, "c1", None);
    // Two puts, an update, a delete of a 2-KB item: 2 units each (the last two as DynamoDB
    // Local reported them); strong get 1, eventual get 0.5, eventual query 0.5.
    assert_eq!(c1["writeUnits"], 8.0, "{record}");
    assert_eq!(c1["writeRequests"], 4);
    assert_eq!(c1["readUnits"], 2.0);
    assert_eq!(
        partition(&record, "u1", Some("byUser"))["writeUnits"],
        4.0,
        "{record}"
    );

    // Hundreds of concurrent requests pass through the pool.
    put().send().await.unwrap();
    let calls = (0..200).map(|_| key(c.get_item()).send());
    let answers = futures_join(calls).await;
    assert!(answers
        .iter()
        .all(|r| r.as_ref().is_ok_and(|o| o.item.is_some())));
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    fs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn overlapping_transactions_conflict_and_refused_writes_do_not_happen() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "conflicts";
    create_table(&c, t).await;
    // Transaction A stays in flight for 500 ms.
    layer.add_fault(FaultSpec {
        op: Some("TransactWriteItems".into()),
        delay_ms: 500,
        ..FaultSpec::new(FaultKind::Slow)
    });
    let a = c
        .transact_write_items()
        .transact_items(tx_put(t, "c1", "a", "A"))
        .transact_items(tx_put(t, "c1", "b", "A"));
    let a = tokio::spawn(a.send());
    tokio::time::sleep(Duration::from_millis(150)).await;

    let b = || {
        c.transact_write_items()
            .transact_items(tx_put(t, "c9", "x", "B"))
            .transact_items(tx_put(t, "c1", "b", "B"))
    };
    let err = b().send().await.unwrap_err();
    let reasons = cancellation_reasons(&err);
    assert_eq!(codes(reasons), ["None", "TransactionConflict"]);
    assert_eq!(
        reasons[1].message(),
        Some("Transaction is ongoing for the item")
    );
    assert_eq!(
        put(&c, t, "c1", "a", "P").await,
        Err("TransactionConflictException".into())
    );
    // A plain read is not blocked (and sees nothing uncommitted); a transactional one is.
    assert_eq!(get(&c, t, "c1", "a").await, None);
    let err = tx_get(&c, t, "c1", "a").send().await.unwrap_err();
    assert_eq!(code(&err), "TransactionCanceledException");

    a.await.unwrap().unwrap();
    assert_eq!(
        get(&c, t, "c1", "a").await.as_deref(),
        Some("A"),
        "the refused put did not happen"
    );
    assert_eq!(
        get(&c, t, "c9", "x").await,
        None,
        "the cancelled transaction did not happen"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    b().send().await.unwrap();
    put(&c, t, "c1", "a", "P").await.unwrap();
    assert_eq!(layer.partitions()["txConflicts"], 2);

    // Switched off: the same overlap goes through.
    layer.set_rules(Rules {
        conflicts: false,
        ..Rules::default()
    });
    layer.add_fault(FaultSpec {
        op: Some("TransactWriteItems".into()),
        delay_ms: 300,
        ..FaultSpec::new(FaultKind::Slow)
    });
    let a = tokio::spawn(
        c.transact_write_items()
            .transact_items(tx_put(t, "c1", "a", "A2"))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(&c, t, "c1", "a", "P2").await.unwrap();
    a.await.unwrap().unwrap();
}

#[tokio::test]
async fn transact_get_in_flight_is_cancelled_by_a_write_arriving() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "txget";
    create_table(&c, t).await;
    put(&c, t, "c1", "a", "old").await.unwrap();
    layer.add_fault(FaultSpec {
        op: Some("TransactGetItems".into()),
        delay_ms: 300,
        ..FaultSpec::new(FaultKind::Slow)
    });
    let read = tokio::spawn(tx_get(&c, t, "c1", "a").send());
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(&c, t, "c1", "a", "new").await.unwrap();
    let err = read.await.unwrap().unwrap_err();
    assert_eq!(code(&err), "TransactionCanceledException");
}

#[tokio::test]
async fn a_hot_partition_is_throttled_another_is_not() {
    let rules = Rules {
        scale: 0.01,
        ..Rules::default()
    }; // 10 write units/s, 10 of burst
    let Some((layer, c)) = layer(rules).await else {
        return;
    };
    let t = "throttle";
    create_table(&c, t).await;
    let started = Instant::now();
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for i in 0..30 {
        match put(&c, t, "hot", &format!("m{i}"), "x").await {
            Ok(()) => ok.push(i),
            Err(e) => {
                assert_eq!(e, "ProvisionedThroughputExceededException");
                refused.push(i);
            }
        }
    }
    let allowed = 10.0 + 10.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(
        ok.len() >= 10 && ok.len() as f64 <= allowed,
        "{} admitted",
        ok.len()
    );
    assert!(refused.len() >= 10);
    put(&c, t, "cold", "m0", "x").await.unwrap();
    // A large write, once admitted, drives the bucket ~19 units into debt: the partition stays
    // exhausted for the next two seconds, however slow this machine.
    let mut big_refused = 0;
    while put(&c, t, "hot", "big", &"x".repeat(20_000)).await.is_err() {
        big_refused += 1;
        tokio::time::sleep(Duration::from_millis(120)).await;
    }

    // Still exhausted: a transaction touching it is cancelled at that position only, and
    // its other item is not written; a batch gets the hot entry back as unprocessed.
    let tx = c
        .transact_write_items()
        .transact_items(tx_put(t, "hot", "tx", "x"))
        .transact_items(tx_put(t, "cold", "tx", "x"));
    let err = tx.send().await.unwrap_err();
    assert_eq!(
        codes(cancellation_reasons(&err)),
        ["ThrottlingError", "None"]
    );
    let req = |pk: &str| {
        let item = [("pk", pk), ("sk", "b"), ("v", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), s(v)));
        let put = PutRequest::builder()
            .set_item(Some(item.collect()))
            .build()
            .unwrap();
        WriteRequest::builder().put_request(put).build()
    };
    let batch = c
        .batch_write_item()
        .request_items(t, vec![req("hot"), req("cold")])
        .send()
        .await
        .unwrap();
    let unprocessed = batch.unprocessed_items.unwrap_or_default();
    assert_eq!(unprocessed.get(t).map(Vec::len), Some(1));
    assert_eq!(get(&c, t, "cold", "b").await.as_deref(), Some("x"));
    assert_eq!(get(&c, t, "hot", "b").await, None);
    assert_eq!(get(&c, t, "cold", "tx").await, None);

    // Throttled writes did not happen: the partition holds exactly the admitted ones.
    let q = c
        .query()
        .table_name(t)
        .key_condition_expression("pk = :p")
        .consistent_read(true);
    let q = q
        .expression_attribute_values(":p", s("hot"))
        .send()
        .await
        .unwrap();
    assert_eq!(q.count as usize, ok.len() + 1);
    let record = layer.partitions();
    let hot = partition(&record, "hot", None);
    let throttled = refused.len() + 2 + big_refused;
    assert_eq!(hot["throttledWrites"], throttled as u64, "{record}");
    // 1 unit per small item, 20 for the 20,011-byte one.
    let units = ok.len() as f64 + 20.0;
    assert_eq!(hot["writeUnits"], units);
    assert!(hot["peakWriteUnitsPerSec"].as_f64().unwrap() <= 21.0 + 20.0);
    assert_eq!(partition(&record, "cold", None)["throttledWrites"], 0);
}

#[tokio::test]
async fn injected_faults_and_latency() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "faults";
    create_table(&c, t).await;
    let fault = |op: &str, key: &str, kind, count| FaultSpec {
        op: Some(op.into()),
        table: Some(t.into()),
        key: Some(key.into()),
        count,
        ..FaultSpec::new(kind)
    };
    layer.add_fault(fault("PutItem", "k1", FaultKind::ThrottlingException, 2));
    assert_eq!(
        put(&c, t, "k2", "a", "x").await,
        Ok(()),
        "another key is not hit"
    );
    for _ in 0..2 {
        assert_eq!(
            put(&c, t, "k1", "a", "x").await,
            Err("ThrottlingException".into())
        );
    }
    assert_eq!(get(&c, t, "k1", "a").await, None, "refused, not forwarded");
    put(&c, t, "k1", "a", "x").await.unwrap();
    for (kind, name) in [
        (FaultKind::InternalServerError, "InternalServerError"),
        (FaultKind::RequestLimitExceeded, "RequestLimitExceeded"),
        (
            FaultKind::ProvisionedThroughputExceededException,
            "ProvisionedThroughputExceededException",
        ),
    ] {
        layer.add_fault(fault("PutItem", "k5", kind, 1));
        assert_eq!(put(&c, t, "k5", "a", "x").await, Err(name.into()));
    }
    // Answer lost: the write happens, the client does not learn it.
    layer.add_fault(fault("PutItem", "k3", FaultKind::AnswerLost, 1));
    let r = c
        .put_item()
        .table_name(t)
        .item("pk", s("k3"))
        .item("sk", s("a"))
        .item("v", s("lost"));
    let err = r.send().await.unwrap_err();
    assert!(
        matches!(
            err,
            SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
        ),
        "{err:?}"
    );
    assert_eq!(get(&c, t, "k3", "a").await.as_deref(), Some("lost"));
    layer.add_fault(fault("PutItem", "k4", FaultKind::AnswerLost500, 1));
    assert_eq!(
        put(&c, t, "k4", "a", "lost").await,
        Err("InternalServerError".into())
    );
    assert_eq!(get(&c, t, "k4", "a").await.as_deref(), Some("lost"));
    layer.add_fault(FaultSpec {
        delay_ms: 300,
        ..fault("GetItem", "k4", FaultKind::Slow, 1)
    });
    let started = Instant::now();
    get(&c, t, "k4", "a").await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(layer.partitions()["faultsFired"], 8);

    layer.set_rules(Rules {
        latency_ms: 40.0,
        latency_p99_ms: 40.0,
        ..Rules::default()
    });
    let started = Instant::now();
    get(&c, t, "k4", "a").await;
    assert!(started.elapsed() >= Duration::from_millis(40));
}

async fn http(method: &str, url: &str, target: Option<&str>, body: &str) -> (u16, Value) {
    use hyper_util::client::legacy::Client;
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", AUTH);
    req = req.header("content-type", "application/x-amz-json-1.0");
    if let Some(t) = target {
        req = req.header("x-amz-target", t);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// An "other" upstream that answers with the target it got.
async fn echo_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(
                |req: hyper::Request<hyper::body::Incoming>| async move {
                    let target = req
                        .headers()
                        .get("x-amz-target")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let body = json!({ "echo": target }).to_string();
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        body,
                    ))))
                },
            );
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, svc));
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn routes_streams_to_dynamodb_and_other_targets_to_the_other_upstream() {
    let Some(ddb) = dynamodb_local() else { return };
    let mut config = StrictConfig::new(ddb);
    config.other = Some(echo_server().await);
    let layer = start(config).await.unwrap();
    let url = layer.url();
    let (status, body) = http("POST", &url, Some("Kinesis_20131202.ListStreams"), "{}").await;
    assert_eq!(
        (status, body),
        (200, json!({"echo": "Kinesis_20131202.ListStreams"}))
    );
    let (status, body) = http(
        "POST",
        &url,
        Some("DynamoDBStreams_20120810.ListStreams"),
        "{}",
    )
    .await;
    assert_eq!(status, 200);
    assert!(body["Streams"].is_array(), "{body}");
    layer.add_fault(FaultSpec {
        op: Some("Kinesis_20131202.PutRecords".into()),
        ..FaultSpec::new(FaultKind::InternalServerError)
    });
    assert_eq!(
        http("POST", &url, Some("Kinesis_20131202.PutRecords"), "{}")
            .await
            .0,
        500
    );
    assert_eq!(
        http("POST", &url, Some("Kinesis_20131202.PutRecords"), "{}")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn control_api_over_http() {
    // Needs no upstream: the control API is the layer's own.
    let layer = start(StrictConfig::new("http://127.0.0.1:9"))
        .await
        .unwrap();
    let url = |p: &str| format!("{}{p}", layer.url());
    let (status, config) = http("GET", &url("/strict/config"), None, "").await;
    assert_eq!(
        (status, &config),
        (200, &serde_json::to_value(Rules::default()).unwrap())
    );
    let (status, config) = http(
        "POST",
        &url("/strict/config"),
        None,
        r#"{"scale":0.1,"throughput":false}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            config["scale"].clone(),
            config["throughput"].clone(),
            config["txWindowMs"].clone()
        ),
        (json!(0.1), json!(false), json!(0))
    );
    assert_eq!(layer.rules().scale, 0.1);
    assert_eq!(
        http("POST", &url("/strict/config"), None, r#"{"scael":1}"#)
            .await
            .0,
        400
    );
    let faults =
        r#"[{"op":"PutItem","kind":"ThrottlingException","count":2},{"kind":"slow","delayMs":5}]"#;
    let (status, listed) = http("POST", &url("/strict/faults"), None, faults).await;
    assert_eq!(
        (status, listed["faults"].as_array().map(Vec::len)),
        (200, Some(2))
    );
    assert_eq!(
        http("POST", &url("/strict/faults"), None, r#"{"kind":"nope"}"#)
            .await
            .0,
        400
    );
    let (_, listed) = http("DELETE", &url("/strict/faults"), None, "").await;
    assert_eq!(listed, json!({"faults": []}));
    let (status, record) = http("GET", &url("/strict/partitions"), None, "").await;
    assert_eq!((status, record["partitions"].clone()), (200, json!([])));
    assert_eq!(http("POST", &url("/strict/reset"), None, "").await.0, 200);
    assert_eq!(http("GET", &url("/strict/nothing"), None, "").await.0, 404);
}

/// `answerSlow`: the write is applied and its items are free at once; only the answer is late,
/// so a client that gives up (or dies) meanwhile never learns that its write happened.
#[tokio::test]
async fn a_slow_answer_comes_after_the_write_has_happened() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "answer_slow";
    create_table(&c, t).await;
    let slow = |op: &str, key: &str| FaultSpec {
        op: Some(op.into()),
        table: Some(t.into()),
        key: Some(key.into()),
        delay_ms: 1500,
        ..FaultSpec::new(FaultKind::AnswerSlow)
    };
    layer.add_fault(slow("TransactWriteItems", "k1"));
    let started = Instant::now();
    let held = tokio::spawn({
        let c = c.clone();
        async move {
            let r = c
                .transact_write_items()
                .transact_items(tx_put(t, "k1", "a", "first"));
            r.send().await.map(drop).map_err(|e| code(&e))
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&c, t, "k1", "a").await.is_none() {
        assert!(Instant::now() < deadline, "the write never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // DynamoDB's answer reaches the layer, which then frees the items, a moment after the write
    // shows (more than a moment on a loaded machine); the answer to the client is 1.5 s away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "applied, not yet answered");
    // Its items are free: another transaction on them is not a conflict.
    let again = c
        .transact_write_items()
        .transact_items(tx_put(t, "k1", "a", "second"));
    again.send().await.unwrap();
    assert_eq!(held.await.unwrap(), Ok(()));
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(get(&c, t, "k1", "a").await.as_deref(), Some("second"));

    // A client that gives up waiting: its write stands all the same.
    layer.add_fault(slow("PutItem", "k2"));
    let gave_up =
        tokio::time::timeout(Duration::from_millis(300), put(&c, t, "k2", "a", "x")).await;
    assert!(gave_up.is_err(), "still waiting for its answer");
    assert_eq!(get(&c, t, "k2", "a").await.as_deref(), Some("x"));
}

/// A freeze holds every call (a call arriving, and one already on its way in) until the thaw;
/// a call whose client gave up during the freeze is still served at the thaw.
#[tokio::test]
async fn a_frozen_dynamodb_serves_nothing_until_the_thaw() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    // A second layer on the same DynamoDB Local, not frozen: what is stored meanwhile.
    let (_watch, w) = self::layer(Rules::off()).await.unwrap();
    let t = "frozen";
    create_table(&c, t).await;
    // On its way in (slowed before forwarding) when the freeze comes.
    layer.add_fault(FaultSpec {
        op: Some("PutItem".into()),
        key: Some("k0".into()),
        delay_ms: 300,
        ..FaultSpec::new(FaultKind::Slow)
    });
    let on_its_way = tokio::spawn({
        let c = c.clone();
        async move { put(&c, t, "k0", "a", "x").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!layer.freeze(true));
    let arriving = tokio::spawn({
        let c = c.clone();
        async move { put(&c, t, "k1", "a", "x").await }
    });
    let read = tokio::spawn({
        let c = c.clone();
        async move { get(&c, t, "k9", "a").await }
    });
    // Given up by its client during the freeze.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(300), put(&c, t, "k2", "a", "late")).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(400)).await;
    for task in [&on_its_way, &arriving] {
        assert!(!task.is_finished(), "held while frozen");
    }
    assert!(!read.is_finished());
    for k in ["k0", "k1", "k2"] {
        assert_eq!(
            get(&w, t, k, "a").await,
            None,
            "{k}: not forwarded while frozen"
        );
    }
    let (status, answer) = http("GET", &format!("{}/strict/freeze", layer.url()), None, "").await;
    assert_eq!((status, answer), (200, json!({"frozen": true})));

    let (status, answer) = http("POST", &format!("{}/strict/thaw", layer.url()), None, "").await;
    assert_eq!(
        (status, answer),
        (200, json!({"frozen": false, "wasFrozen": true}))
    );
    assert_eq!(on_its_way.await.unwrap(), Ok(()));
    assert_eq!(arriving.await.unwrap(), Ok(()));
    assert_eq!(read.await.unwrap(), None);
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&w, t, "k2", "a").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "a call its client gave up on lands at the thaw"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(layer.partitions()["heldByFreeze"].as_u64().unwrap() >= 4);
    // Control over HTTP.
    let (status, answer) = http("POST", &format!("{}/strict/freeze", layer.url()), None, "").await;
    assert_eq!(
        (status, answer),
        (200, json!({"frozen": true, "wasFrozen": false}))
    );
    layer.reset();
    assert_eq!(
        get(&c, t, "k1", "a").await.as_deref(),
        Some("x"),
        "reset thaws"
    );
}

/// `late`: the call reaches the table `delayMs` after it was sent and holds nothing meanwhile
/// (unlike `slow`, a transaction in flight): another transaction on its item goes through, and
/// the late one is applied after it.
#[tokio::test]
async fn a_late_call_holds_nothing_until_it_arrives() {
    let Some((layer, c)) = layer(Rules::default()).await else {
        return;
    };
    let t = "late";
    create_table(&c, t).await;
    layer.add_fault(FaultSpec {
        op: Some("TransactWriteItems".into()),
        table: Some(t.into()),
        key: Some("k1".into()),
        delay_ms: 1000,
        ..FaultSpec::new(FaultKind::Late)
    });
    let late = tokio::spawn({
        let c = c.clone();
        async move {
            let r = c
                .transact_write_items()
                .transact_items(tx_put(t, "k1", "a", "late"));
            r.send().await.map(drop).map_err(|e| code(&e))
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = c
        .transact_write_items()
        .transact_items(tx_put(t, "k1", "a", "first"));
    first.send().await.unwrap();
    assert_eq!(get(&c, t, "k1", "a").await.as_deref(), Some("first"));
    assert!(!late.is_finished(), "still on its way");
    assert_eq!(late.await.unwrap(), Ok(()));
    assert_eq!(get(&c, t, "k1", "a").await.as_deref(), Some("late"));
}
