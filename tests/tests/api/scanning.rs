//! Malware scanning of attachments (`ScanUploads`, docs/api.md §34–§36): while it is on, an
//! attachment is served only once its scan says clean; the EICAR test file is found infected and
//! never served (`409 attachment_unsafe`, never a URL). The scans are the S3 gate's stand-in for
//! GuardDuty Malware Protection for S3, which tags each upload with its verdict and delivers the
//! verdict's event to the thumbnailer (chat_tests::scan).

use std::time::{Duration, Instant};

use chat_tests::scan::{scan_now, Scanner};
use chat_tests::{new_uuid, raw_http, upload_with, Resp, TestApp, ATTACHMENTS_BUCKET};
use serde_json::{json, Value};

const EICAR: &[u8] = s3_gate::EICAR.as_bytes();

/// A created and uploaded attachment of `bytes` as `content_type`: its id.
async fn uploaded(t: &TestApp, c: &str, user: &str, content_type: &str, bytes: &[u8]) -> String {
    let body = json!({"fileName": "file", "contentType": content_type, "size": bytes.len()});
    let r = t
        .post(&format!("/conversations/{c}/attachments"), user, body)
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(
        upload_with(&r.body["upload"], bytes.to_vec(), &[]).await,
        200
    );
    r.body["attachmentId"].as_str().unwrap().to_owned()
}

async fn send_with(t: &TestApp, c: &str, user: &str, ids: &[&str]) -> Resp {
    let body = json!({"clientMsgId": new_uuid(), "body": "", "attachments": ids});
    t.post(&format!("/conversations/{c}/messages"), user, body)
        .await
}

/// The attachment `id` as the first message of `v` that has it carries it.
fn attachment_in(v: &Value, id: &str) -> Value {
    fn find(v: &Value, id: &str) -> Option<Value> {
        match v {
            Value::Object(m) if m.get("attachmentId") == Some(&json!(id)) => Some(v.clone()),
            Value::Object(m) => m.values().find_map(|x| find(x, id)),
            Value::Array(a) => a.iter().find_map(|x| find(x, id)),
            _ => None,
        }
    }
    find(v, id).unwrap_or_else(|| panic!("attachment {id} in {v}"))
}

/// No presigned URL anywhere in an answer.
#[track_caller]
fn no_url(r: &Resp) {
    let text = r.body.to_string();
    assert!(!text.contains("X-Amz-Signature"), "a URL in {text}");
    assert!(!r.headers.contains_key("location"), "{r:?}");
}

/// An answer that carries the attachment `id` with `scan`, and no URL at all.
#[track_caller]
fn carried_without_url(r: &Resp, id: &str, scan: &str) {
    assert_eq!(attachment_in(&r.body, id)["scan"], scan, "{r:?}");
    no_url(r);
}

async fn download(url: &str) -> (u16, Vec<u8>) {
    let (status, _, body) = raw_http("GET", url, &[], Vec::new()).await;
    (status, body)
}

/// moto's S3, straight (no gate): what GuardDuty and the tests see of the objects.
async fn s3() -> aws_sdk_s3::Client {
    chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await
}

/// An upload's tags, `key=value`.
async fn tags(c: &str, id: &str) -> Vec<String> {
    let out = s3()
        .await
        .get_object_tagging()
        .bucket(ATTACHMENTS_BUCKET)
        .key(format!("a/{c}/{id}"))
        .send()
        .await
        .expect("GetObjectTagging");
    out.tag_set()
        .iter()
        .map(|t| format!("{}={}", t.key(), t.value()))
        .collect()
}

/// Sets an upload's tags, as a scanner writes them back.
async fn put_tags(c: &str, id: &str, tags: &[(&str, &str)]) {
    use aws_sdk_s3::types::{Tag, Tagging};
    let set = tags
        .iter()
        .map(|(k, v)| Tag::builder().key(*k).value(*v).build().unwrap())
        .collect();
    s3().await
        .put_object_tagging()
        .bucket(ATTACHMENTS_BUCKET)
        .key(format!("a/{c}/{id}"))
        .tagging(Tagging::builder().set_tag_set(Some(set)).build().unwrap())
        .send()
        .await
        .expect("PutObjectTagging");
}

/// GuardDuty's result event for an upload, as EventBridge delivers it.
fn scan_result(c: &str, id: &str, status: &str) -> Value {
    let path = format!("/{ATTACHMENTS_BUCKET}/a/{c}/{id}");
    s3_gate::scan_result_event(&path, "etag", status, 1_796_303_100)
}

#[tokio::test]
async fn the_eicar_file_is_never_served() {
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, "text/plain", EICAR).await;
    let link = format!("/conversations/{c}/attachments/{id}");

    // Sent before its scan: carried as pending, with no URL.
    let sent = send_with(&t, &c, &a, &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    carried_without_url(&sent, &id, "pending");
    let r = t.get(&link, &b).await;
    assert_eq!((r.status, r.code()), (409, "attachment_pending"), "{r:?}");
    assert_eq!(r.headers["retry-after"], "2");
    no_url(&r);

    assert_eq!(scan_now(&c, &id).await, "THREATS_FOUND");

    // Found infected: unsafe everywhere, never a URL.
    let r = t.get(&link, &b).await;
    assert_eq!((r.status, r.code()), (409, "attachment_unsafe"), "{r:?}");
    no_url(&r);
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    carried_without_url(&history, &id, "unsafe");
    let edited = t.edit(&c, 1, &a, &new_uuid(), "caption").await;
    assert_eq!(edited.status, 200, "{edited:?}");
    carried_without_url(&edited, &id, "unsafe");
    let changes = t.get(&format!("/conversations/{c}/changes"), &b).await;
    carried_without_url(&changes, &id, "unsafe");

    // Scanned before its send: the send is refused, and nothing is stored.
    let second = uploaded(&t, &c, &a, "text/plain", EICAR).await;
    assert_eq!(scan_now(&c, &second).await, "THREATS_FOUND");
    let tagged = tags(&c, &second).await;
    assert_eq!(
        tagged,
        [
            "chat-unattached=1",
            "GuardDutyMalwareScanStatus=THREATS_FOUND"
        ]
    );
    let r = send_with(&t, &c, &a, &[&second]).await;
    assert_eq!((r.status, r.code()), (409, "attachment_unsafe"), "{r:?}");
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&second));
    let history = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(chat_tests::seqs(&history.body), [1]);
}

#[tokio::test]
async fn a_clean_file_is_served_once_scanned_and_only_then_thumbnailed() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, b, c) = t.new_direct().await;
    let text = b"just text".to_vec();
    let png = thumbnails::thumb::sample(640, 480, ImageFormat::Png);
    let doc = uploaded(&t, &c, &a, "text/plain", &text).await;
    let img = uploaded(&t, &c, &a, "image/png", &png).await;
    // The upload event thumbnails nothing while the scan is pending.
    let path = format!("/{ATTACHMENTS_BUCKET}/a/{c}/{img}");
    let outcomes = t
        .thumbnailer()
        .handle(&s3_gate::s3_event(&path, png.len()))
        .await
        .unwrap();
    assert_eq!(outcomes, [thumbnails::Outcome::AwaitsScan]);

    let sent = send_with(&t, &c, &a, &[&doc, &img]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    no_url(&sent);
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    no_url(&history);
    for id in [&doc, &img] {
        let r = t
            .get(&format!("/conversations/{c}/attachments/{id}"), &b)
            .await;
        assert_eq!((r.status, r.code()), (409, "attachment_pending"), "{r:?}");
    }

    assert_eq!(scan_now(&c, &doc).await, "NO_THREATS_FOUND");
    assert_eq!(scan_now(&c, &img).await, "NO_THREATS_FOUND");
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    let att = attachment_in(&history.body, &doc);
    assert_eq!(att["scan"], "clean", "{att}");
    assert_eq!(
        download(att["url"].as_str().unwrap()).await,
        (200, text.clone())
    );
    let r = t
        .get(&format!("/conversations/{c}/attachments/{doc}"), &b)
        .await;
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(download(&r.headers["location"]).await, (200, text));
    // The image, thumbnailed on its clean verdict.
    let att = attachment_in(&history.body, &img);
    assert_eq!(
        (&att["scan"], &att["width"]),
        (&json!("clean"), &json!(640)),
        "{att}"
    );
    let (status, _) = download(att["thumbnailUrl"].as_str().unwrap()).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn an_infected_image_is_never_thumbnailed() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, _b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(400, 300, ImageFormat::Png);
    let id = uploaded(&t, &c, &a, "image/png", &png).await;
    let path = format!("/{ATTACHMENTS_BUCKET}/a/{c}/{id}");
    let thumbnailer = t.thumbnailer();
    let upload = thumbnailer
        .handle(&s3_gate::s3_event(&path, png.len()))
        .await;
    assert_eq!(upload.unwrap(), [thumbnails::Outcome::AwaitsScan]);
    // GuardDuty finds this (valid) image infected.
    let verdict = thumbnailer
        .handle(&scan_result(&c, &id, "THREATS_FOUND"))
        .await;
    assert_eq!(
        verdict.unwrap(),
        [thumbnails::Outcome::Refused(
            chat_domain::attachments::Scan::Unsafe
        )]
    );
    let thumb = s3()
        .await
        .head_object()
        .bucket(ATTACHMENTS_BUCKET)
        .key(format!("t/{c}/{id}"))
        .send()
        .await;
    assert!(thumb.is_err(), "no thumbnail: {thumb:?}");
    // A result GuardDuty could not reach (UNSUPPORTED, FAILED, …) is not served either.
    let other = uploaded(&t, &c, &a, "image/png", &png).await;
    let verdict = thumbnailer
        .handle(&scan_result(&c, &other, "UNSUPPORTED"))
        .await;
    assert_eq!(
        verdict.unwrap(),
        [thumbnails::Outcome::Refused(
            chat_domain::attachments::Scan::Unscannable
        )]
    );
    let r = t
        .get(&format!("/conversations/{c}/attachments/{other}"), &a)
        .await;
    assert_eq!(
        (r.status, r.code()),
        (409, "attachment_unscannable"),
        "{r:?}"
    );
    let r = send_with(&t, &c, &a, &[&other]).await;
    assert_eq!(
        (r.status, r.code()),
        (409, "attachment_unscannable"),
        "{r:?}"
    );
}

#[tokio::test]
async fn the_stable_link_follows_the_scan_tag_before_its_event_arrives() {
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, b, c) = t.new_direct().await;
    let clean = uploaded(&t, &c, &a, "text/plain", b"fine").await;
    let infected = uploaded(&t, &c, &a, "text/plain", b"not fine").await;
    let sent = send_with(&t, &c, &a, &[&clean, &infected]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    // GuardDuty has tagged them; its events have not reached the records yet.
    put_tags(
        &c,
        &clean,
        &[("GuardDutyMalwareScanStatus", "NO_THREATS_FOUND")],
    )
    .await;
    put_tags(
        &c,
        &infected,
        &[("GuardDutyMalwareScanStatus", "THREATS_FOUND")],
    )
    .await;
    let r = t
        .get(&format!("/conversations/{c}/attachments/{clean}"), &b)
        .await;
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(
        download(&r.headers["location"]).await,
        (200, b"fine".to_vec())
    );
    let r = t
        .get(&format!("/conversations/{c}/attachments/{infected}"), &b)
        .await;
    assert_eq!((r.status, r.code()), (409, "attachment_unsafe"), "{r:?}");
    // A message's copy waits for the event.
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    carried_without_url(&history, &clean, "pending");
}

#[tokio::test]
async fn the_prompt_scanner_decides_on_its_own() {
    let t = TestApp::scanning(Scanner::Prompt).await;
    let (a, _b, c) = t.new_direct().await;
    let clean = uploaded(&t, &c, &a, "text/plain", b"hello").await;
    let infected = uploaded(&t, &c, &a, "text/plain", EICAR).await;
    let link = |id: &str| format!("/conversations/{c}/attachments/{id}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut clean_link, mut infected_link);
    loop {
        // Not sent yet: the uploader's alone.
        clean_link = t.get(&link(&clean), &a).await;
        infected_link = t.get(&link(&infected), &a).await;
        let pending = |r: &Resp| r.code() == "attachment_pending";
        if !(pending(&clean_link) || pending(&infected_link)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(clean_link.status, 302, "{clean_link:?}");
    assert_eq!(
        (infected_link.status, infected_link.code()),
        (409, "attachment_unsafe"),
        "{infected_link:?}"
    );
    // Both verdicts reached the records: a send takes the clean one, refuses the other.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sent = loop {
        let r = send_with(&t, &c, &a, &[&clean]).await;
        let scan = r.body["attachments"][0]["scan"].clone();
        if scan != "pending" || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(sent.body["attachments"][0]["scan"], "clean", "{sent:?}");
    let url = sent.body["attachments"][0]["url"].as_str().unwrap();
    assert_eq!(download(url).await, (200, b"hello".to_vec()));
    let r = send_with(&t, &c, &a, &[&infected]).await;
    assert_eq!((r.status, r.code()), (409, "attachment_unsafe"), "{r:?}");
}

#[tokio::test]
async fn scanning_off_serves_every_upload_as_before() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let body = json!({"fileName": "eicar.txt", "contentType": "text/plain", "size": EICAR.len()});
    let created = t
        .post(&format!("/conversations/{c}/attachments"), &a, body)
        .await;
    // Written once, scanned or not (attachments.rs).
    assert_eq!(
        created.body["upload"]["headers"]["if-none-match"], "*",
        "{created:?}"
    );
    assert_eq!(
        upload_with(&created.body["upload"], EICAR.to_vec(), &[]).await,
        200
    );
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    let sent = send_with(&t, &c, &a, &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let att = attachment_in(&sent.body, &id);
    assert!(att["scan"].is_null(), "{att}");
    assert_eq!(
        download(att["url"].as_str().unwrap()).await,
        (200, EICAR.to_vec())
    );
    let r = t
        .get(&format!("/conversations/{c}/attachments/{id}"), &b)
        .await;
    assert_eq!(r.status, 302, "{r:?}");
}

#[tokio::test]
async fn a_scanned_upload_cannot_be_replaced() {
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, _b, c) = t.new_direct().await;
    let body = json!({"fileName": "a.txt", "contentType": "text/plain", "size": 5});
    let created = t
        .post(&format!("/conversations/{c}/attachments"), &a, body)
        .await;
    let upload = &created.body["upload"];
    assert_eq!(upload["headers"]["if-none-match"], "*", "{created:?}");
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    assert_eq!(upload_with(upload, b"clean".to_vec(), &[]).await, 200);
    assert_eq!(scan_now(&c, &id).await, "NO_THREATS_FOUND");
    // The same presigned PUT again, with other bytes under the clean verdict: refused.
    assert_eq!(upload_with(upload, b"EVIL!".to_vec(), &[]).await, 412);
    let r = send_with(&t, &c, &a, &[&id]).await;
    let url = attachment_in(&r.body, &id)["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(download(&url).await, (200, b"clean".to_vec()));
}

/// A scanner tags by reading the tags and writing them back with its verdict: one that read them
/// before a send removed the unattached tag puts it back, and the lifecycle rule would delete the
/// sent file after a day. The verdict's event, finding the attachment sent, removes it again.
#[tokio::test]
async fn a_verdict_written_over_a_send_leaves_no_unattached_tag() {
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, _b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, "text/plain", b"kept").await;
    assert_eq!(tags(&c, &id).await, ["chat-unattached=1"]);
    assert_eq!(send_with(&t, &c, &a, &[&id]).await.status, 201);
    assert!(tags(&c, &id).await.is_empty());
    // The scanner's write, from what it read before the send.
    put_tags(
        &c,
        &id,
        &[
            ("chat-unattached", "1"),
            ("GuardDutyMalwareScanStatus", "NO_THREATS_FOUND"),
        ],
    )
    .await;
    let outcome = t
        .thumbnailer()
        .handle(&scan_result(&c, &id, "NO_THREATS_FOUND"))
        .await;
    assert_eq!(outcome.unwrap(), [thumbnails::Outcome::None]);
    let left = tags(&c, &id).await;
    assert!(!left.contains(&"chat-unattached=1".into()), "{left:?}");
}

/// Writes the unattached tag back on `key`'s object, as a scanner's stale write does.
async fn stale_scan_tagging(key: String) {
    let url = format!(
        "{}/{ATTACHMENTS_BUCKET}/{key}?tagging",
        chat_tests::server::kinesis_endpoint()
    );
    let tags = [
        ("chat-unattached".to_owned(), "1".to_owned()),
        (
            "GuardDutyMalwareScanStatus".to_owned(),
            "NO_THREATS_FOUND".to_owned(),
        ),
    ];
    let xml = s3_gate::tagging_xml(&tags).into_bytes();
    // moto checks no signature, but takes a request without one as anonymous.
    let auth = [(
        "authorization",
        "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/s3/aws4_request, \
         SignedHeaders=host, Signature=0",
    )];
    let (status, _, body) = raw_http("PUT", &url, &auth, xml).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn a_verdict_written_between_a_sends_untag_and_its_commit_is_undone() {
    let stale = chat_tests::BeforeNextTransaction::default();
    let t = TestApp::scanning_custom(Scanner::OnRequest, Some(stale.interceptor())).await;
    let (a, _b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, "text/plain", b"kept").await;
    // Between the send's untag and its commit.
    let key = format!("a/{c}/{id}");
    stale.arm(move || stale_scan_tagging(key));
    let sent = send_with(&t, &c, &a, &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    assert!(stale.fired(), "the stale write ran");
    let left = tags(&c, &id).await;
    assert!(!left.contains(&"chat-unattached=1".into()), "{left:?}");
}

/// A verdict recorded while a send is between its read of the record and its claim reaches the
/// message: the claim fails on the changed record and the send reads again.
#[tokio::test]
async fn a_verdict_recorded_while_its_send_is_in_flight_reaches_the_message() {
    let late = chat_tests::BeforeNextTransaction::default();
    let t = TestApp::scanning_custom(Scanner::OnRequest, Some(late.interceptor())).await;
    let (a, b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, "text/plain", b"clean soon").await;
    let clean = vec![(
        ":v",
        aws_sdk_dynamodb::types::AttributeValue::S("clean".into()),
    )];
    let names = vec![("#scan", "scan")];
    let set = "SET #scan = :v";
    super::attachments::record_write_before_next_transaction(
        &late, &t.table, &id, set, names, clean,
    );
    let sent = send_with(&t, &c, &a, &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    assert!(late.fired(), "the late write ran");
    let att = attachment_in(&sent.body, &id);
    assert_eq!(att["scan"], "clean", "{att}");
    assert!(att["url"].is_string(), "served at once: {att}");
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    assert_eq!(attachment_in(&history.body, &id)["scan"], "clean");
}

#[tokio::test]
async fn scanning_costs_a_send_no_dynamodb_round_trip_and_a_served_link_no_s3_request() {
    let t = TestApp::scanning(Scanner::OnRequest).await;
    let (a, b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, "text/plain", b"counted").await;
    // The peer's first request reads whether it is suspended; the ones counted below do not.
    t.get(&format!("/conversations/{c}/messages"), &b).await;
    t.calls.take();
    assert_eq!(send_with(&t, &c, &a, &[&id]).await.status, 201);
    let send = t.calls.take();
    // The head's read and the transaction; S3: the untag before the commit and after it.
    assert_eq!(
        send,
        [
            "BatchGetItem",
            "S3:DELETE",
            "TransactWriteItems",
            "S3:DELETE"
        ],
        "{send:?}"
    );
    // The call log counts a presigning as an `S3:GET` too (it runs the SDK's request pipeline up
    // to the signature, sending nothing); a 409 presigns nothing.
    let link = format!("/conversations/{c}/attachments/{id}");
    assert_eq!(t.get(&link, &b).await.status, 409);
    let pending = t.calls.take();
    assert_eq!(
        pending,
        ["BatchGetItem", "S3:GET"],
        "the tag, while pending"
    );
    scan_now(&c, &id).await;
    t.calls.take();
    assert_eq!(t.get(&link, &b).await.status, 302);
    let served = t.calls.take();
    assert_eq!(
        served,
        ["BatchGetItem", "S3:GET"],
        "the presigning only: no tag read"
    );
}
