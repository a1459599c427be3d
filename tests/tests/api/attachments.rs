//! Attachments (docs/api.md §34–§36): presigned uploads straight to S3 (through the S3 gate,
//! which refuses what S3 refuses), sends carrying them, fresh download URLs, the stable link,
//! deletion with the message, and every bad input answered with nothing changed.

use aws_sdk_dynamodb::types::AttributeValue;
use chat_tests::{new_uuid, raw_http, seqs, unique, upload_with, Resp, TestApp};
use serde_json::{json, Value};

/// `createAttachment` of `size` bytes of `content_type`.
async fn create(t: &TestApp, c: &str, user: &str, content_type: &str, size: usize) -> Resp {
    let body = json!({"fileName": "photo.png", "contentType": content_type, "size": size});
    t.post(&format!("/conversations/{c}/attachments"), user, body)
        .await
}

/// A created and uploaded attachment of `bytes` (image/png): its id.
async fn uploaded(t: &TestApp, c: &str, user: &str, bytes: &[u8]) -> String {
    let r = create(t, c, user, "image/png", bytes.len()).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(
        upload_with(&r.body["upload"], bytes.to_vec(), &[]).await,
        200
    );
    r.body["attachmentId"].as_str().unwrap().to_owned()
}

async fn send_with(t: &TestApp, c: &str, user: &str, id: &str, ids: &[&str]) -> Resp {
    let body = json!({"clientMsgId": id, "body": "", "attachments": ids});
    t.post(&format!("/conversations/{c}/messages"), user, body)
        .await
}

/// When a presigned URL stops working, as S3 reckons it (`X-Amz-Date` + `X-Amz-Expires`), in
/// the API's time format.
fn signed_until(url: &str) -> String {
    let param = |name: &str| {
        url.split(['?', '&'])
            .find_map(|p| p.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {url}"))
            .to_owned()
    };
    let (date, expires) = (param("X-Amz-Date"), param("X-Amz-Expires"));
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let signed = time::PrimitiveDateTime::parse(&date, format)
        .unwrap()
        .assume_utc();
    let t = signed + time::Duration::seconds(expires.parse().unwrap());
    chat_domain::time::rfc3339(t)
}

async fn download(url: &str) -> (u16, Vec<u8>) {
    let (status, _, body) = raw_http("GET", url, &[], Vec::new()).await;
    (status, body)
}

#[tokio::test]
async fn an_upload_is_sent_read_and_linked() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let bytes = b"\x89PNG not really an image".to_vec();
    let created = create(&t, &c, &a, "image/png", bytes.len()).await;
    assert_eq!(created.status, 201, "{created:?}");
    let upload = &created.body["upload"];
    assert_eq!(upload["method"], "PUT");
    assert!(upload["expiresAt"].is_string(), "{upload}");
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    assert_eq!(upload_with(upload, bytes.clone(), &[]).await, 200);

    let cm = new_uuid();
    let sent = send_with(&t, &c, &a, &cm, &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let att = &sent.body["attachments"][0];
    assert_eq!(
        (
            &att["attachmentId"],
            &att["fileName"],
            &att["contentType"],
            &att["size"]
        ),
        (
            &json!(id),
            &json!("photo.png"),
            &json!("image/png"),
            &json!(bytes.len())
        ),
        "{att}"
    );
    assert_eq!(
        download(att["url"].as_str().unwrap()).await,
        (200, bytes.clone())
    );
    assert_eq!(
        att["urlExpiresAt"].as_str(),
        Some(signed_until(att["url"].as_str().unwrap()).as_str()),
        "urlExpiresAt is when the URL stops working: {att}"
    );
    assert_eq!(
        upload["expiresAt"].as_str(),
        Some(signed_until(upload["url"].as_str().unwrap()).as_str())
    );

    // A replay answers the same message, attachments and all, and creates nothing.
    let replay = send_with(&t, &c, &a, &cm, &[&id]).await;
    assert_eq!(
        (replay.status, &replay.body["seq"]),
        (200, &json!(1)),
        "{replay:?}"
    );
    assert_eq!(replay.body["attachments"][0]["attachmentId"], json!(id));

    // In the peer's history, with a URL of its own.
    let h = t.get(&format!("/conversations/{c}/messages"), &b).await;
    let att = &h.body["messages"][0]["attachments"][0];
    assert_eq!(att["attachmentId"], json!(id), "{h:?}");
    assert_eq!(
        download(att["url"].as_str().unwrap()).await,
        (200, bytes.clone())
    );

    // In the edit's answer (a Message object like any other), once its caption is edited.
    let edited = t.edit(&c, 1, &a, &new_uuid(), "caption").await;
    assert_eq!(edited.status, 200, "{edited:?}");
    let att = &edited.body["attachments"][0];
    assert_eq!(att["attachmentId"], json!(id), "{edited:?}");
    assert_eq!(
        download(
            att["url"]
                .as_str()
                .expect("the edit's answer signs its URLs")
        )
        .await,
        (200, bytes.clone())
    );

    // In the change log.
    let changes = t.get(&format!("/conversations/{c}/changes"), &b).await;
    let att = &changes.body["changes"][0]["message"]["attachments"][0];
    assert_eq!(att["attachmentId"], json!(id), "{changes:?}");
    assert_eq!(
        download(att["url"].as_str().unwrap()).await,
        (200, bytes.clone())
    );

    // The stable link: 302 to a fresh URL, for members only.
    let link = format!("/conversations/{c}/attachments/{id}");
    let r = t.get(&link, &b).await;
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(download(&r.headers["location"]).await, (200, bytes.clone()));
    assert_eq!(t.get(&link, &unique("carol")).await.status, 404);
    let unknown = format!("/conversations/{c}/attachments/{}", new_uuid());
    assert_eq!(t.get(&unknown, &a).await.status, 404);
}

#[tokio::test]
async fn s3_refuses_another_size_or_type_and_anonymous_requests() {
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    let created = create(&t, &c, &a, "image/png", 10).await;
    let upload = &created.body["upload"];
    let url = upload["url"].as_str().unwrap();
    let other_type = [("content-type", "text/html")];
    assert_eq!(upload_with(upload, vec![b'x'; 10], &other_type).await, 403);
    assert_eq!(upload_with(upload, vec![b'x'; 11], &[]).await, 403);
    assert_eq!(upload_with(upload, vec![b'x'; 9], &[]).await, 403);
    // An `x-amz-*` header the signature does not cover (found by probing: the gate stored a
    // GLACIER storage class, whose tags then could not be read).
    for unsigned in [
        ("x-amz-storage-class", "GLACIER"),
        ("x-amz-acl", "public-read"),
        ("x-amz-meta-x", "y"),
    ] {
        let status = upload_with(upload, vec![b'x'; 10], &[unsigned]).await;
        assert_eq!(status, 403, "{unsigned:?}");
    }
    // Without its signature: the bucket is not public.
    let bare = url.split('?').next().unwrap();
    let png = [("content-type", "image/png")];
    assert_eq!(raw_http("PUT", bare, &png, vec![b'x'; 10]).await.0, 403);
    // A signature tampered with.
    let tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0");
    assert_eq!(
        raw_http("PUT", &tampered, &png, vec![b'x'; 10]).await.0,
        403
    );
    // Nothing was stored: the send finds it not uploaded.
    let id = created.body["attachmentId"].as_str().unwrap();
    let r = send_with(&t, &c, &a, &new_uuid(), &[id]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body["error"]["message"].as_str().unwrap().contains(id),
        "{r:?}"
    );
    // The request as signed succeeds.
    assert_eq!(upload_with(upload, vec![b'x'; 10], &[]).await, 200);
}

#[tokio::test]
async fn bad_uploads_are_refused() {
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    let over = 25 * 1024 * 1024 + 1;
    let r = create(&t, &c, &a, "image/png", over).await;
    assert_eq!((r.status, r.code()), (413, "payload_too_large"), "{r:?}");
    let r = create(&t, &c, &a, "text/html", 10).await;
    assert_eq!(
        (r.status, r.code()),
        (415, "unsupported_media_type"),
        "{r:?}"
    );
    let path = format!("/conversations/{c}/attachments");
    for name in [String::new(), "x".repeat(256)] {
        let body = json!({"fileName": name, "contentType": "image/png", "size": 1});
        assert_eq!(t.post(&path, &a, body).await.status, 400);
    }
    // Not a member: 404, as for every conversation route.
    let r = create(&t, &c, &unique("carol"), "image/png", 10).await;
    assert_eq!(r.status, 404, "{r:?}");
}

/// A send retried after its message (and so its attachment) was deleted learns its outcome, as
/// any replay: the tombstone, not a 400 for the attachment gone (found by probing); another
/// send naming that attachment is still refused.
#[tokio::test]
async fn a_send_with_attachments_retried_after_its_deletion_answers_the_tombstone() {
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_group().await;
    let file = uploaded(&t, &c, &a, b"photo").await;
    let id = new_uuid();
    let sent = send_with(&t, &c, &a, &id, &[&file]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    assert_eq!(send_with(&t, &c, &a, &id, &[&file]).await.status, 200);
    let deleted = t.delete_message(&c, 1, &a, &new_uuid()).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let retry = send_with(&t, &c, &a, &id, &[&file]).await;
    assert_eq!((retry.status, &retry.body), (200, &deleted.body));
    let other = send_with(&t, &c, &a, &new_uuid(), &[&file]).await;
    assert_eq!(other.status, 400, "{other:?}");
    let h = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(seqs(&h.body), [1]);
}

/// A caption can be removed: an edit's body may be empty beside attachments, as a send's (found
/// by probing: 400); without attachments it may not.
#[tokio::test]
async fn an_edit_may_empty_the_body_of_a_message_with_attachments() {
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_group().await;
    let file = uploaded(&t, &c, &a, b"photo").await;
    let body = json!({"clientMsgId": new_uuid(), "body": "caption", "attachments": [file]});
    let sent = t
        .post(&format!("/conversations/{c}/messages"), &a, body)
        .await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let edited = t.edit(&c, 1, &a, &new_uuid(), "").await;
    assert_eq!(edited.status, 200, "{edited:?}");
    assert_eq!(
        (
            &edited.body["body"],
            &edited.body["version"],
            &edited.body["attachments"][0]["attachmentId"]
        ),
        (&json!(""), &json!(2), &json!(file))
    );
    assert_eq!(t.send(&c, &a, "plain").await.status, 201);
    let refused = t.edit(&c, 2, &a, &new_uuid(), "").await;
    assert_eq!((refused.status, refused.code()), (400, "invalid_request"));
}

#[tokio::test]
async fn a_send_uses_only_its_own_uploaded_unused_attachments() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_group().await;
    t.send(&c, &a, "first").await;
    let mine = uploaded(&t, &c, &a, b"mine").await;
    let bobs = uploaded(&t, &c, &b, b"bob's").await;
    let not_uploaded = create(&t, &c, &a, "image/png", 3).await.body["attachmentId"]
        .as_str()
        .unwrap()
        .to_owned();
    let unknown = new_uuid();
    let others_conv = {
        let (x, _, o) = t.new_direct().await;
        (uploaded(&t, &o, &x, b"elsewhere").await, x)
    };

    let refused = |r: &Resp, id: &str| {
        assert_eq!(r.status, 400, "{r:?}");
        assert!(
            r.body["error"]["message"].as_str().unwrap().contains(id),
            "{r:?}"
        );
    };
    for id in [&unknown, &not_uploaded, &bobs] {
        refused(&send_with(&t, &c, &a, &new_uuid(), &[&mine, id]).await, id);
    }
    // Another conversation's attachment, even by its own uploader there.
    let (elsewhere, x) = others_conv;
    t.add_members(&c, &a, json!([x])).await;
    refused(
        &send_with(&t, &c, &x, &new_uuid(), &[&elsewhere]).await,
        &elsewhere,
    );
    // Nothing changed: no message, and `mine` is still free to use.
    let h = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(seqs(&h.body), [1]);
    let r = send_with(&t, &c, &a, &new_uuid(), &[&mine]).await;
    assert_eq!(r.status, 201, "{r:?}");
    // Used once: never again, by another message.
    refused(&send_with(&t, &c, &a, &new_uuid(), &[&mine]).await, &mine);
    let h = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(seqs(&h.body), [1, 2]);
    // More than 10: 400.
    let many: Vec<String> = (0..11).map(|_| new_uuid()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(send_with(&t, &c, &a, &new_uuid(), &many).await.status, 400);
}

/// The stable link of an upload not sent yet is its uploader's alone, and only once uploaded
/// (found by probing: any member could fetch an upload never sent, and one never uploaded was
/// `409 attachment_pending` for ever while scanning was on). A member's 404 names the attachment;
/// an outsider's says no more than for any conversation it is not in.
#[tokio::test]
async fn an_upload_not_sent_is_its_uploaders_alone_and_only_once_uploaded() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let created = create(&t, &c, &a, "image/png", 5).await;
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    let link = format!("/conversations/{c}/attachments/{id}");
    let not_found = |r: &Resp, what: &str| {
        assert_eq!((r.status, r.code()), (404, "not_found"), "{r:?}");
        assert_eq!(r.body["error"]["message"], what, "{r:?}");
    };
    not_found(&t.get(&link, &a).await, "attachment not found");
    not_found(&t.get(&link, &b).await, "attachment not found");
    assert_eq!(
        upload_with(&created.body["upload"], b"bytes".to_vec(), &[]).await,
        200
    );
    assert_eq!(t.get(&link, &a).await.status, 302);
    not_found(&t.get(&link, &b).await, "attachment not found");
    not_found(&t.get(&link, &unique("x")).await, "conversation not found");
    assert_eq!(send_with(&t, &c, &a, &new_uuid(), &[&id]).await.status, 201);
    assert_eq!(t.get(&link, &b).await.status, 302);
    let unknown = format!("/conversations/{c}/attachments/{}", new_uuid());
    not_found(&t.get(&unknown, &b).await, "attachment not found");
    let malformed = format!("/conversations/{c}/attachments/not-an-id");
    not_found(&t.get(&malformed, &b).await, "attachment not found");
    not_found(
        &t.get(&malformed, &unique("x")).await,
        "conversation not found",
    );
}

/// A moderator looking at a report sees its photo: the snapshot's attachments carry fresh URLs
/// (found by probing: they had none); once the message is deleted they serve nothing.
#[tokio::test]
async fn a_reported_messages_files_are_shown_to_moderators() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(400, 300, ImageFormat::Png);
    let (id, _) = thumbnailed(&t, &c, &a, "image/png", &png).await;
    assert_eq!(send_with(&t, &c, &a, &new_uuid(), &[&id]).await.status, 201);
    let path = format!("/conversations/{c}/messages/1/reports");
    let r = t.post(&path, &b, json!({"reason": "abuse"})).await;
    assert_eq!(r.status, 202, "{r:?}");
    let report = crate::safety::listed_report(&t, &c).await;
    let shown = &report["message"]["attachments"][0];
    let url = shown["url"].as_str().unwrap_or_else(|| panic!("{report}"));
    assert_eq!(download(url).await, (200, png));
    let thumbnail = shown["thumbnailUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(download(thumbnail).await.0, 200);
    assert_eq!(t.delete_message(&c, 1, &a, &new_uuid()).await.status, 200);
    let report = crate::safety::listed_report(&t, &c).await;
    let url = report["message"]["attachments"][0]["url"].as_str().unwrap();
    assert_eq!(download(url).await.0, 403, "the file is gone");
    // The thumbnail URL held before is refused the same way (found by probing: 404 locally,
    // where S3 answers 403 to a signer that may not list the bucket).
    let gone = download(thumbnail).await;
    assert_eq!(gone.0, 403, "{}", String::from_utf8_lossy(&gone.1));
    assert!(String::from_utf8_lossy(&gone.1).contains("<Code>AccessDenied</Code>"));
}

#[tokio::test]
async fn deleting_the_message_deletes_its_objects() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, b"to be deleted").await;
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let url = sent.body["attachments"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(download(&url).await.0, 200);
    let r = t.delete_message(&c, 1, &a, &new_uuid()).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body["message"]["attachments"].is_null(), "{r:?}");
    assert_erased(&c, &id, &url).await;
    let link = format!("/conversations/{c}/attachments/{id}");
    assert_eq!(t.get(&link, &b).await.status, 404);
}

/// A deleted message's upload: an empty tombstone tagged for the bucket's lifecycle rule and
/// policy, which refuses the download URLs members held (403, as S3 answers a read the bucket
/// policy denies).
async fn assert_erased(c: &str, id: &str, url: &str) {
    let gone = download(url).await;
    assert_eq!(gone.0, 403, "{}", String::from_utf8_lossy(&gone.1));
    assert!(
        String::from_utf8_lossy(&gone.1).contains("<Code>AccessDenied</Code>"),
        "{}",
        String::from_utf8_lossy(&gone.1)
    );
    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    let key = format!("a/{c}/{id}");
    let object = s3
        .get_object()
        .bucket(chat_tests::ATTACHMENTS_BUCKET)
        .key(&key)
        .send()
        .await
        .expect("the tombstone");
    let bytes = object.body.collect().await.unwrap().into_bytes();
    assert!(bytes.is_empty(), "the content is gone: {bytes:?}");
    let tags = s3
        .get_object_tagging()
        .bucket(chat_tests::ATTACHMENTS_BUCKET)
        .key(&key)
        .send()
        .await
        .unwrap();
    let tags: Vec<(&str, &str)> = tags
        .tag_set()
        .iter()
        .map(|t| (t.key(), t.value()))
        .collect();
    assert!(tags.contains(&("chat-deleted", "1")), "{tags:?}");
    assert!(tags.contains(&("chat-unattached", "1")), "{tags:?}");
    assert!(!thumbnail_stored(c, id).await, "no thumbnail");
}

/// Whether the attachment's thumbnail object exists (read by the SDK, as the functions read it).
async fn thumbnail_stored(c: &str, id: &str) -> bool {
    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    let head = s3
        .head_object()
        .bucket(chat_tests::ATTACHMENTS_BUCKET)
        .key(format!("t/{c}/{id}"))
        .send()
        .await;
    head.is_ok()
}

/// An upload is written once (`If-None-Match: *`), and its presigned request, valid for a while
/// after its message's deletion, cannot put bytes back (found by probing: a deleted key took
/// them, and the download URLs members held served them again, malware included). An upload
/// whose attachment is gone all the same is erased by its event; a tombstone's event changes
/// nothing.
#[tokio::test]
async fn an_upload_is_written_once_and_never_comes_back_after_its_message_is_deleted() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let bytes = b"the original".to_vec();
    let created = create(&t, &c, &a, "image/png", bytes.len()).await;
    let upload = &created.body["upload"];
    assert_eq!(upload["headers"]["if-none-match"], "*", "{upload}");
    assert_eq!(upload_with(upload, bytes.clone(), &[]).await, 200);
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let url = sent.body["attachments"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    // Sent, it cannot be replaced by other bytes of the same size.
    let other = b"another text".to_vec();
    assert_eq!(upload_with(upload, other.clone(), &[]).await, 412);
    assert_eq!(download(&url).await, (200, bytes));

    let r = t.delete_message(&c, 1, &a, &new_uuid()).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_erased(&c, &id, &url).await;
    // Not put back: the tombstone holds the key.
    assert_eq!(upload_with(upload, other.clone(), &[]).await, 412);
    assert_erased(&c, &id, &url).await;
    let link = format!("/conversations/{c}/attachments/{id}");
    assert_eq!(t.get(&link, &b).await.status, 404);

    // The tombstone's own event (S3 sends one for every object created): nothing done.
    let path = format!("/{}/a/{c}/{id}", chat_tests::ATTACHMENTS_BUCKET);
    t.calls.take();
    let outcomes = t.thumbnailer().handle(&s3_gate::s3_event(&path, 0)).await;
    assert_eq!(outcomes.expect("thumbnailer"), [thumbnails::Outcome::Gone]);
    assert_eq!(t.calls.take(), Vec::<String>::new());
    // Bytes under a deleted attachment's key all the same (e.g. put there before this
    // release): their event erases them.
    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    s3.put_object()
        .bucket(chat_tests::ATTACHMENTS_BUCKET)
        .key(format!("a/{c}/{id}"))
        .body(other.clone().into())
        .send()
        .await
        .unwrap();
    let outcomes = t
        .thumbnailer()
        .handle(&s3_gate::s3_event(&path, other.len()))
        .await;
    assert_eq!(outcomes.expect("thumbnailer"), [thumbnails::Outcome::Gone]);
    assert_erased(&c, &id, &url).await;
}

/// A deletion answered `503` because its files' erasure failed is finished by its retry: the
/// files' ids stay on the deletion's key, whose replay erases them again.
#[tokio::test]
async fn a_retried_deletion_erases_files_its_first_attempt_left() {
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    let id = uploaded(&t, &c, &a, b"to be deleted").await;
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let url = sent.body["attachments"][0]["url"].as_str().unwrap();
    let change = new_uuid();
    assert_eq!(t.delete_message(&c, 1, &a, &change).await.status, 200);
    // As if the first attempt's erasure had failed: the file is still there.
    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    let key = format!("a/{c}/{id}");
    s3.put_object()
        .bucket(chat_tests::ATTACHMENTS_BUCKET)
        .key(&key)
        .body(b"left behind".to_vec().into())
        .send()
        .await
        .unwrap();
    let retry = t.delete_message(&c, 1, &a, &change).await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_erased(&c, &id, url).await;
}

#[tokio::test]
async fn attachments_cost_a_send_no_extra_dynamodb_round_trip() {
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    let ids = [
        uploaded(&t, &c, &a, b"1").await,
        uploaded(&t, &c, &a, b"2").await,
        uploaded(&t, &c, &a, b"3").await,
    ];
    let dynamodb = |calls: Vec<String>| -> Vec<String> {
        calls
            .into_iter()
            .filter(|c| !c.starts_with("S3:"))
            .collect()
    };
    t.send(&c, &a, "plain").await;
    t.calls.take();
    t.send(&c, &a, "plain").await;
    let plain = dynamodb(t.calls.take());
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let r = send_with(&t, &c, &a, &new_uuid(), &ids).await;
    assert_eq!(r.status, 201, "{r:?}");
    let with = dynamodb(t.calls.take());
    assert_eq!(plain.len(), with.len(), "{plain:?} vs {with:?}");
    assert_eq!(with, ["BatchGetItem", "TransactWriteItems"]);
}

/// Never-attached uploads: their record expires (TTL) 24 h after creation and their object
/// carries `chat-unattached=1`, which the bucket's lifecycle rule (template.yaml) expires after
/// a day; a send removes both, so what was sent stays.
#[tokio::test]
async fn an_upload_never_sent_expires_and_a_sent_one_stays() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let t = TestApp::new().await;
    let (a, _, c) = t.new_direct().await;
    let kept = uploaded(&t, &c, &a, b"sent").await;
    let left = uploaded(&t, &c, &a, b"never sent").await;
    assert_eq!(
        send_with(&t, &c, &a, &new_uuid(), &[&kept]).await.status,
        201
    );

    let record = |id: String| {
        let db = t.db.clone();
        let table = t.table.clone();
        async move {
            let key = [("pk", format!("A#{id}")), ("sk", "A".to_owned())]
                .map(|(k, v)| (k.to_owned(), AttributeValue::S(v)));
            let out = db
                .get_item()
                .table_name(table)
                .set_key(Some(key.into()))
                .send()
                .await;
            out.unwrap().item.unwrap()
        }
    };
    let now = chat_domain::time::unix_seconds(chat_domain::time::now());
    let expires: i64 = record(left.clone()).await["ttl"]
        .as_n()
        .unwrap()
        .parse()
        .unwrap();
    assert!((now + 24 * 3600 - expires).abs() < 60, "{expires} vs {now}");
    assert!(!record(kept.clone()).await.contains_key("ttl"));

    let s3 = chat_tests::s3_client(chat_tests::server::kinesis_endpoint()).await;
    let tags = |id: &str| {
        let key = format!("a/{c}/{id}");
        let s3 = s3.clone();
        async move {
            let out = s3
                .get_object_tagging()
                .bucket(chat_tests::ATTACHMENTS_BUCKET)
                .key(key);
            let tags = out.send().await.unwrap();
            tags.tag_set()
                .iter()
                .map(|t| format!("{}={}", t.key(), t.value()))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(tags(&left).await, ["chat-unattached=1"]);
    assert!(tags(&kept).await.is_empty());
}

/// An uploaded attachment of `bytes` as `content_type`, and the thumbnailer run on its upload
/// event (as the bucket's notification starts it): its id and what became of it.
async fn thumbnailed(
    t: &TestApp,
    c: &str,
    user: &str,
    content_type: &str,
    bytes: &[u8],
) -> (String, thumbnails::Outcome) {
    let r = create(t, c, user, content_type, bytes.len()).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(
        upload_with(&r.body["upload"], bytes.to_vec(), &[]).await,
        200
    );
    let id = r.body["attachmentId"].as_str().unwrap().to_owned();
    let path = format!("/{}/a/{c}/{id}", chat_tests::ATTACHMENTS_BUCKET);
    let event = s3_gate::s3_event(&path, bytes.len());
    let mut outcomes = t.thumbnailer().handle(&event).await.expect("thumbnailer");
    (id, outcomes.remove(0))
}

/// The first object within `v` that has the field `name`.
fn first_with(v: &Value, name: &str) -> Option<Value> {
    match v {
        Value::Object(m) if m.contains_key(name) => Some(v.clone()),
        Value::Object(m) => m.values().find_map(|x| first_with(x, name)),
        Value::Array(a) => a.iter().find_map(|x| first_with(x, name)),
        _ => None,
    }
}

/// The thumbnail behind `att["thumbnailUrl"]`, decoded: its size.
async fn thumbnail_size(att: &Value) -> (u32, u32) {
    let url = att["thumbnailUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("{att}"));
    let (status, bytes) = download(url).await;
    assert_eq!(status, 200, "{att}");
    let img = thumbnails::image::load_from_memory(&bytes).expect("a decodable thumbnail");
    (img.width(), img.height())
}

#[tokio::test]
async fn images_get_a_thumbnail_and_their_size_before_or_after_the_send() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    // PNG thumbnailed before its send: the send copies the size from the record.
    let png = thumbnails::thumb::sample(1000, 600, ImageFormat::Png);
    let (png_id, outcome) = thumbnailed(&t, &c, &a, "image/png", &png).await;
    assert_eq!(
        outcome,
        thumbnails::Outcome::Thumbnail {
            width: 1000,
            height: 600
        }
    );
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&png_id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let att = &sent.body["attachments"][0];
    assert_eq!((&att["width"], &att["height"]), (&json!(1000), &json!(600)));
    assert_eq!(thumbnail_size(att).await, (320, 192));

    // JPEG sent first, thumbnailed after: the thumbnailer updates the message too.
    let jpeg = thumbnails::thumb::sample(600, 1000, ImageFormat::Jpeg);
    let r = create(&t, &c, &a, "image/jpeg", jpeg.len()).await;
    assert_eq!(upload_with(&r.body["upload"], jpeg.clone(), &[]).await, 200);
    let jpeg_id = r.body["attachmentId"].as_str().unwrap().to_owned();
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&jpeg_id]).await;
    assert!(
        sent.body["attachments"][0]["thumbnailUrl"].is_null(),
        "{sent:?}"
    );
    let path = format!("/{}/a/{c}/{jpeg_id}", chat_tests::ATTACHMENTS_BUCKET);
    t.thumbnailer()
        .handle(&s3_gate::s3_event(&path, jpeg.len()))
        .await
        .unwrap();
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    assert_eq!(history.status, 200, "{history:?}");
    let messages = history.body["messages"].as_array().unwrap();
    let of = |id: &str| {
        messages
            .iter()
            .flat_map(|m| m["attachments"].as_array().cloned().unwrap_or_default())
            .find(|att| att["attachmentId"] == id)
            .unwrap_or_else(|| panic!("{id} in {messages:?}"))
    };
    let att = of(&jpeg_id);
    assert_eq!((&att["width"], &att["height"]), (&json!(600), &json!(1000)));
    assert_eq!(thumbnail_size(&att).await, (192, 320));
    assert_eq!(thumbnail_size(&of(&png_id)).await, (320, 192));
}

#[tokio::test]
async fn non_images_corrupt_images_and_bombs_get_no_thumbnail() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let bomb = thumbnails::thumb::png_claiming(100_000, 100_000);
    let cases: [(&str, &[u8]); 3] = [
        ("application/pdf", b"%PDF-1.4 a document"),
        ("image/png", b"\x89PNG\r\n\x1a\n corrupt"),
        ("image/png", &bomb),
    ];
    let mut ids = Vec::new();
    for (content_type, bytes) in cases {
        let (id, outcome) = thumbnailed(&t, &c, &a, content_type, bytes).await;
        assert_eq!(outcome, thumbnails::Outcome::None, "{content_type}");
        ids.push(id);
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let sent = send_with(&t, &c, &a, &new_uuid(), &ids).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    for att in history.body["messages"][0]["attachments"]
        .as_array()
        .unwrap()
    {
        assert!(att["url"].is_string(), "{att}");
        for field in ["width", "height", "thumbnailUrl"] {
            assert!(att[field].is_null(), "{att}");
        }
    }
}

#[tokio::test]
async fn deleting_the_message_deletes_its_thumbnail_and_a_late_thumbnail_is_not_kept() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(400, 400, ImageFormat::Png);
    let (id, _) = thumbnailed(&t, &c, &a, "image/png", &png).await;
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
    let thumb = sent.body["attachments"][0]["thumbnailUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent:?}"))
        .to_owned();
    assert_eq!(download(&thumb).await.0, 200);
    // The changes feed carries a fresh thumbnailUrl too.
    let edited = t.edit(&c, 1, &a, &new_uuid(), "edited").await;
    assert_eq!(edited.status, 200, "{edited:?}");
    let changes = t.get(&format!("/conversations/{c}/changes"), &a).await;
    let att = first_with(&changes.body, "thumbnailUrl").unwrap_or_else(|| panic!("{changes:?}"));
    assert_eq!(thumbnail_size(&att).await, (320, 320));
    let r = t.delete_message(&c, 1, &a, &new_uuid()).await;
    assert_eq!(r.status, 200, "{r:?}");
    // Gone: S3 answers a signer that may not list the bucket 403 for a missing key.
    assert_eq!(download(&thumb).await.0, 403, "the thumbnail is gone");
    // A late event (a retry) of the deleted upload leaves nothing behind.
    let outcome = t
        .thumbnailer()
        .object(&format!("a/{c}/{id}"))
        .await
        .unwrap();
    assert_eq!(outcome, thumbnails::Outcome::Gone);
    assert_eq!(download(&thumb).await.0, 403);
    assert!(!thumbnail_stored(&c, &id).await, "no thumbnail kept");
}

#[tokio::test]
async fn a_thumbnail_of_an_attachment_deleted_meanwhile_is_removed() {
    use thumbnails::image::ImageFormat;
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(400, 300, ImageFormat::Png);
    let r = create(&t, &c, &a, "image/png", png.len()).await;
    assert_eq!(upload_with(&r.body["upload"], png, &[]).await, 200);
    let id = r.body["attachmentId"].as_str().unwrap().to_owned();
    // Its record goes (as a deletion's transaction removes it) while the object is still there.
    t.db.delete_item()
        .table_name(&t.table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("A#{id}")),
        )
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("A".into()))
        .send()
        .await
        .unwrap();
    let outcome = t
        .thumbnailer()
        .object(&format!("a/{c}/{id}"))
        .await
        .unwrap();
    assert_eq!(outcome, thumbnails::Outcome::Gone);
    let conv = chat_domain::ConversationId::parse(&c).unwrap();
    let left = t
        .store_of_function("none")
        .attachment_bytes(&conv, &id, u64::MAX)
        .await
        .unwrap();
    assert!(left.is_none(), "its attachment gone, the upload goes too");
    assert!(
        !thumbnail_stored(&c, &id).await,
        "the thumbnail was removed"
    );
    let head = t
        .thumbnailer()
        .store
        .record_thumbnail(&conv, &id, 1, 1)
        .await
        .unwrap();
    assert!(!head, "the record is not resurrected");
}

/// Arms `before` with a recorder's write to attachment `id`'s record (`set`, with `names` and
/// `values`), as the thumbnailer or a scan's verdict makes it: between a send's read of the
/// record and its claim, the moment a recorder finishing then writes.
pub fn record_write_before_next_transaction(
    before: &chat_tests::BeforeNextTransaction,
    table: &str,
    id: &str,
    set: &'static str,
    names: Vec<(&'static str, &'static str)>,
    values: Vec<(&'static str, AttributeValue)>,
) {
    let (table, id) = (table.to_owned(), id.to_owned());
    before.arm(move || async move {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let mut update = chat_tests::dynamodb_client()
            .await
            .update_item()
            .table_name(table)
            .key("pk", s(&format!("A#{id}")))
            .key("sk", s("A"))
            .update_expression(set);
        for (name, attribute) in names {
            update = update.expression_attribute_names(name, attribute);
        }
        for (name, value) in values {
            update = update.expression_attribute_values(name, value);
        }
        update.send().await.expect("the record's write");
    });
}

/// A thumbnail recorded while a send is between its read of the record and its commit reaches
/// the message all the same: alone, the send's claim fails on the changed record and the send
/// reads again; queued, the message's copies are refreshed after its commit.
#[tokio::test]
async fn a_thumbnail_recorded_while_its_send_is_in_flight_reaches_the_message() {
    let late = chat_tests::BeforeNextTransaction::default();
    let budget = chat_store::retry::Timeouts::LOCAL.request_budget;
    let t = TestApp::custom(budget, Some(late.interceptor())).await;
    let (a, b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(1000, 600, thumbnails::image::ImageFormat::Png);
    let sizes = |r: &Value| {
        let att = &r["attachments"][0];
        (att["width"].clone(), att["height"].clone())
    };
    let want = (json!(1000), json!(600));
    for queued in [false, true] {
        let id = uploaded(&t, &c, &a, &png).await;
        if queued {
            t.mark_busy(&c).await;
        }
        let n = |v: u32| AttributeValue::N(v.to_string());
        let size = vec![(":w", n(1000)), (":h", n(600))];
        let set = "SET width = :w, height = :h";
        record_write_before_next_transaction(&late, &t.table, &id, set, vec![], size);
        let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
        assert_eq!(sent.status, 201, "queued: {queued}: {sent:?}");
        assert!(late.fired(), "the late write ran");
        assert_eq!(sizes(&sent.body), want, "queued: {queued}: the answer");
        assert!(sent.body["attachments"][0]["thumbnailUrl"].is_string());
        let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
        let last = history.body["messages"].as_array().unwrap().last().cloned();
        assert_eq!(sizes(&last.unwrap()), want, "queued: {queued}: history");
    }
}

/// An upload never sent goes when its record's TTL runs out, thumbnail and all, whatever its tags
/// (found by probing: a send refused after it took the upload's "unattached" tag away left the
/// upload to no one, and a thumbnail never had the tag): the indexer reads the record's removal
/// by DynamoDB's TTL on the table's stream. A record removed otherwise (with its message) is not
/// its business.
#[tokio::test]
async fn an_upload_never_sent_goes_with_its_records_expiry_whatever_its_tags() {
    use aws_lambda_events::event::dynamodb::{Event, EventRecord, UserIdentity};
    use thumbnails::image::ImageFormat;
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    let png = thumbnails::thumb::sample(400, 300, ImageFormat::Png);
    let (id, outcome) = thumbnailed(&t, &c, &a, "image/png", &png).await;
    assert!(
        matches!(outcome, thumbnails::Outcome::Thumbnail { .. }),
        "{outcome:?}"
    );
    // Refused (another id is unknown) after taking the tag away.
    let refused = send_with(&t, &c, &a, &new_uuid(), &[&id, &new_uuid()]).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    let key = std::collections::HashMap::from([
        ("pk".to_owned(), AttributeValue::S(format!("A#{id}"))),
        ("sk".to_owned(), AttributeValue::S("A".into())),
    ]);
    let removed =
        t.db.delete_item()
            .table_name(&t.table)
            .set_key(Some(key))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
    let record = |by_ttl: bool| {
        let mut r = EventRecord::default();
        r.event_name = "REMOVE".into();
        r.change.old_image = serde_dynamo::Item::from(removed.clone());
        if by_ttl {
            let mut who = UserIdentity::default();
            who.type_ = "Service".into();
            who.principal_id = "dynamodb.amazonaws.com".into();
            r.user_identity = Some(who);
        }
        r
    };
    let indexer = inbox_index::InboxIndex::new(t.store_of_function("inbox-index"));
    let conv = chat_domain::ConversationId::parse(&c).unwrap();
    let store = t.store_of_function("none");
    let s3 = chat_tests::s3_client(chat_tests::server::s3_gate_endpoint()).await;
    let thumbnail = || {
        s3.head_object()
            .bucket(chat_tests::ATTACHMENTS_BUCKET)
            .key(format!("t/{c}/{id}"))
            .send()
    };
    for by_ttl in [false, true] {
        let mut event = Event::default();
        event.records = vec![record(by_ttl)];
        let answer = indexer.handle(event).await;
        assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
        let left = store.attachment_bytes(&conv, &id, u64::MAX).await.unwrap();
        assert_eq!(left.is_some(), !by_ttl, "by TTL: {by_ttl}");
        assert_eq!(thumbnail().await.is_ok(), !by_ttl, "by TTL: {by_ttl}");
    }
}

/// An upload is stored and served as sent: its `Content-Encoding` is signed (`identity`), so no
/// client decodes it on the way (found by probing: EICAR, gzipped with an unsigned
/// `Content-Encoding: gzip`, passed the scanner as gzip bytes and reached clients decoded).
#[tokio::test]
async fn an_upload_is_stored_and_served_as_sent() {
    use std::io::Write;
    let t = TestApp::new().await;
    let (a, _b, c) = t.new_direct().await;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"what the scanner never saw").unwrap();
    let packed = gz.finish().unwrap();
    let created = create(&t, &c, &a, "text/plain", packed.len()).await;
    let upload = &created.body["upload"];
    assert_eq!(
        upload["headers"]["content-encoding"], "identity",
        "{upload}"
    );
    let claimed = [("content-encoding", "gzip")];
    assert_eq!(upload_with(upload, packed.clone(), &claimed).await, 403);
    assert_eq!(upload_with(upload, packed.clone(), &[]).await, 200);
    let id = created.body["attachmentId"].as_str().unwrap().to_owned();
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let url = sent.body["attachments"][0]["url"].as_str().unwrap();
    let (status, headers, body) = raw_http("GET", url, &[], Vec::new()).await;
    assert_eq!(status, 200);
    assert!(
        headers
            .get("content-encoding")
            .is_none_or(|e| e == "identity"),
        "{headers:?}"
    );
    assert_eq!(body, packed, "the bytes as sent");
}

/// An SVG (or other file a browser runs as a page, scripts included) is saved, not opened, from
/// its download URL (found by probing: an SVG with a script was served inline from the bucket's
/// origin); a PNG still opens in place.
#[tokio::test]
async fn a_file_a_browser_would_run_as_a_page_is_downloaded_as_a_file() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let svg = br#"<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>"#;
    let created = create(&t, &c, &a, "image/svg+xml", svg.len()).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        upload_with(&created.body["upload"], svg.to_vec(), &[]).await,
        200
    );
    let svg_id = created.body["attachmentId"].as_str().unwrap().to_owned();
    let png_id = uploaded(&t, &c, &a, b"\x89PNG not really").await;
    let sent = send_with(&t, &c, &a, &new_uuid(), &[&svg_id, &png_id]).await;
    assert_eq!(sent.status, 201, "{sent:?}");
    let disposition = |headers: &std::collections::HashMap<String, String>| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-disposition"))
            .map(|(_, v)| v.clone())
    };
    let history = t.get(&format!("/conversations/{c}/messages"), &b).await;
    let shown = &history.body["messages"][0]["attachments"];
    let (status, headers, body) =
        raw_http("GET", shown[0]["url"].as_str().unwrap(), &[], vec![]).await;
    assert_eq!((status, body.as_slice()), (200, &svg[..]));
    assert_eq!(
        disposition(&headers).as_deref(),
        Some("attachment"),
        "{headers:?}"
    );
    let (status, headers, _) =
        raw_http("GET", shown[1]["url"].as_str().unwrap(), &[], vec![]).await;
    assert_eq!(status, 200);
    assert_eq!(disposition(&headers), None, "{headers:?}");
}
