//! The thumbnailer (docs/api.md §36): the attachments bucket's `ObjectCreated` event on `a/`
//! keys starts it (template.yaml; locally the S3 gate's `--notify`). For an image it writes a
//! thumbnail under `t/<conversationId>/<attachmentId>` and records the original's size on the
//! attachment (`ChatStore::record_thumbnail`); anything else gets none. It never fails an upload
//! it cannot thumbnail (no retry loop): only S3 or DynamoDB failures are errors, which Lambda's
//! asynchronous invocation retries.
//!
//! While uploads are scanned for malware (`ScanUploads`), the upload event does nothing: the
//! scan's result does it all. GuardDuty's "GuardDuty Malware Protection Object Scan Result" event
//! (an EventBridge rule, template.yaml; locally the S3 gate's stand-in scanner, `--scan-notify`)
//! records the verdict on the attachment (`ChatStore::record_scan`), and only a clean upload is
//! then thumbnailed: nothing of an infected file is ever decoded or served.

pub mod thumb;

/// The image crate, for tests that decode thumbnails.
pub use image;

use chat_domain::attachments::{parse_object_key, Scan};
use chat_domain::ChatError;
use chat_store::{ChatStore, Config};

/// Uploads larger than this are not read (the default upload limit is 25 MiB).
pub const MAX_READ_BYTES: u64 = 32 * 1024 * 1024;

/// What became of one upload.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A thumbnail was written and recorded.
    Thumbnail { width: u32, height: u32 },
    /// No thumbnail: not an image, too large, undecodable (the reason is logged).
    None,
    /// The upload (or its record) is gone: nothing kept.
    Gone,
    /// Scanning is on: the upload waits for its scan's verdict (whose event thumbnails it).
    AwaitsScan,
    /// The scan's verdict, recorded, refuses it (`unsafe`, `unscannable`): no thumbnail.
    Refused(Scan),
}

/// The `detail-type` of GuardDuty's scan result event (and of the local stand-in's).
pub const SCAN_RESULT: &str = "GuardDuty Malware Protection Object Scan Result";

#[derive(Clone, Debug)]
pub struct Thumbnailer {
    pub store: ChatStore,
}

impl Thumbnailer {
    pub async fn from_env() -> Result<Self, lambda_runtime::Error> {
        let config = Config::from_env()?.for_function("thumbnails");
        config.init_telemetry();
        let sdk = config.sdk_config().await;
        Ok(Thumbnailer {
            store: config.chat_store(&sdk),
        })
    }

    /// An S3 event (each record's object, one after the other), or a scan result.
    pub async fn handle(&self, event: &serde_json::Value) -> Result<Vec<Outcome>, ChatError> {
        if event["detail-type"] == SCAN_RESULT {
            return Ok(vec![self.scan_result(&event["detail"]).await?]);
        }
        let records = event["Records"].as_array().cloned().unwrap_or_default();
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let key = url_decode(r["s3"]["object"]["key"].as_str().unwrap_or_default());
            // An upload has at least 1 byte: an empty object is a deleted attachment's tombstone.
            if r["s3"]["object"]["size"].as_u64() == Some(0) {
                tracing::info!(key, "a deleted attachment's tombstone: nothing to do");
                out.push(Outcome::Gone);
                continue;
            }
            out.push(self.uploaded(&key).await?);
        }
        Ok(out)
    }

    /// An upload's event: an upload whose attachment is gone is erased (a deleted message's
    /// upload is a tombstone already, which no presigned PUT replaces: this is the safety net);
    /// else thumbnailed, or left to its scan's verdict.
    async fn uploaded(&self, key: &str) -> Result<Outcome, ChatError> {
        let Some((id, attachment_id)) = parse_object_key(key) else {
            tracing::info!(key, "not an attachment's object: no thumbnail");
            return Ok(Outcome::None);
        };
        if !self.store.attachment_exists(&attachment_id).await? {
            tracing::info!(%id, attachment_id, "an upload of a deleted attachment: erased");
            self.store.erase_orphan_upload(&id, &attachment_id).await?;
            return Ok(Outcome::Gone);
        }
        if self.store.scan_uploads() {
            return Ok(Outcome::AwaitsScan);
        }
        self.object(key).await
    }

    /// A scan's result (the event's `detail`): its verdict recorded on the attachment, and a
    /// clean upload thumbnailed. Only `NO_THREATS_FOUND` is clean (`Scan::of_guardduty`).
    pub async fn scan_result(&self, detail: &serde_json::Value) -> Result<Outcome, ChatError> {
        let object = &detail["s3ObjectDetails"];
        let bucket = object["bucketName"].as_str().unwrap_or_default();
        if Some(bucket) != self.store.attachments_bucket() {
            tracing::warn!(bucket, "a scan result of another bucket: ignored");
            return Ok(Outcome::None);
        }
        let key = url_decode(object["objectKey"].as_str().unwrap_or_default());
        let Some((id, attachment_id)) = parse_object_key(&key) else {
            tracing::info!(key, "a scan result of no attachment's object: ignored");
            return Ok(Outcome::None);
        };
        let status = detail["scanResultDetails"]["scanResultStatus"].as_str();
        let scan = Scan::of_guardduty(status.unwrap_or_default());
        tracing::info!(key, ?status, verdict = scan.as_str(), "scan result");
        if !self.store.record_scan(&id, &attachment_id, scan).await? {
            // Its message was deleted, its upload erased then (a tombstone, whose own scan this
            // may be: erasing it again would upload, scan and come back here without end).
            tracing::info!(key, "a scan result of a deleted attachment: nothing to do");
            return Ok(Outcome::Gone);
        }
        if scan != Scan::Clean {
            return Ok(Outcome::Refused(scan));
        }
        self.object(&key).await
    }

    /// One uploaded object, by key.
    pub async fn object(&self, key: &str) -> Result<Outcome, ChatError> {
        let Some((id, attachment_id)) = parse_object_key(key) else {
            tracing::info!(key, "not an attachment's object: no thumbnail");
            return Ok(Outcome::None);
        };
        let Some(bytes) = self
            .store
            .attachment_bytes(&id, &attachment_id, MAX_READ_BYTES)
            .await?
        else {
            return Ok(Outcome::Gone);
        };
        let made = match thumb::make(&bytes) {
            Ok(t) => t,
            Err(why) => {
                tracing::info!(key, ?why, "no thumbnail");
                return Ok(Outcome::None);
            }
        };
        self.store
            .put_thumbnail(&id, &attachment_id, made.bytes, made.content_type)
            .await?;
        let kept = self
            .store
            .record_thumbnail(&id, &attachment_id, made.width, made.height)
            .await?;
        if !kept {
            // Deleted while the thumbnail was made: its deletion did not see the thumbnail (and
            // the upload may still await its erasure).
            tracing::info!(key, "deleted while thumbnailed: erased");
            self.store.erase_orphan_upload(&id, &attachment_id).await?;
            return Ok(Outcome::Gone);
        }
        Ok(Outcome::Thumbnail {
            width: made.width,
            height: made.height,
        })
    }
}

/// An S3 event's object key, URL-encoded as S3 sends it (`+` is a space).
pub fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_url_decoded() {
        assert_eq!(super::url_decode("a/d-1/x%2Fy+z"), "a/d-1/x/y z");
        assert_eq!(super::url_decode("100%"), "100%");
        assert_eq!(super::url_decode("%4"), "%4");
    }
}
