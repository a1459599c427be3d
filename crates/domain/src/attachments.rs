//! Attachments (docs/api.md §34–§36): what an upload may be, and when a send may use one. The
//! bytes go straight to S3 with a presigned request; these rules decide what that request fixes
//! (its size and content type) and which uploaded attachments a message may carry.

use serde::{Deserialize, Serialize};

use crate::error::ChatError;
use crate::requests::Fields;
use crate::{ConversationId, UserId};

/// The default `MaxAttachmentBytes` (template parameter): 25 MiB.
pub const DEFAULT_MAX_ATTACHMENT_BYTES: u64 = 25 * 1024 * 1024;
/// At most this many attachments on one message.
pub const MAX_ATTACHMENTS_PER_MESSAGE: usize = 10;
pub const MAX_FILE_NAME_CHARS: usize = 255;
/// The default content-type allowlist (template parameter `AttachmentContentTypes`): `type/*`
/// admits every subtype.
pub const DEFAULT_CONTENT_TYPES: &str =
    "image/*,video/*,audio/*,application/pdf,text/plain,application/zip";

/// What uploads are allowed: a size limit and a content-type allowlist; and whether uploads are
/// scanned for malware before they are served (template parameter `ScanUploads`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentPolicy {
    pub max_bytes: u64,
    allowed: Vec<String>,
    pub scan_uploads: bool,
}

impl Default for AttachmentPolicy {
    fn default() -> Self {
        AttachmentPolicy::new(DEFAULT_MAX_ATTACHMENT_BYTES, DEFAULT_CONTENT_TYPES)
    }
}

impl AttachmentPolicy {
    /// `allowed`: comma-separated content types, `type/*` for a whole type.
    pub fn new(max_bytes: u64, allowed: &str) -> Self {
        let allowed = allowed
            .split(',')
            .map(|t| t.trim().to_ascii_lowercase())
            .filter(|t| !t.is_empty())
            .collect();
        AttachmentPolicy {
            max_bytes,
            allowed,
            scan_uploads: false,
        }
    }

    /// The same with malware scanning on or off.
    pub fn with_scanning(self, scan_uploads: bool) -> Self {
        AttachmentPolicy {
            scan_uploads,
            ..self
        }
    }

    /// Whether an attachment whose scan stands at `scan` may be served (its URLs signed, its
    /// stable link followed), else why not (docs/api.md §35, §36). Never one found unsafe or
    /// unscannable; while scanning is on, not one still pending; one uploaded while scanning was
    /// off has no scan and is served (GuardDuty scans only new uploads); a pending one is served
    /// once scanning is off again (no verdict will come).
    pub fn may_serve(&self, id: &str, scan: Option<Scan>) -> Result<(), ChatError> {
        match scan {
            None | Some(Scan::Clean) => Ok(()),
            Some(Scan::Pending) if !self.scan_uploads => Ok(()),
            Some(Scan::Pending) => Err(ChatError::AttachmentPending(format!(
                "attachment `{id}` is being scanned for malware: retry later"
            ))),
            Some(bad) => Err(refused_by_scan(id, bad)),
        }
    }

    /// Whether `content_type` (a bare `type/subtype`, compared case-insensitively) is allowed.
    pub fn allows(&self, content_type: &str) -> bool {
        let t = content_type.to_ascii_lowercase();
        let Some((kind, sub)) = t.split_once('/') else {
            return false;
        };
        // A token each: parameters (`; charset=`) or spaces would make the signed header
        // differ from what the rule checked.
        // At most 127 characters each (RFC 6838 §4.2).
        let token = |s: &str| {
            (1..=127).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        if !token(kind) || !token(sub) {
            return false;
        }
        self.allowed
            .iter()
            .any(|a| *a == t || a.strip_suffix("/*") == Some(kind))
    }
}

/// Whether a browser that opens a file of `content_type` runs it as a page (SVG and other XML,
/// HTML), scripts included: its download URLs make the browser save it instead, so that a file
/// a member sent never runs in the bucket's origin. An `<img>` still shows an SVG (without its
/// scripts).
pub fn opens_as_a_page(content_type: &str) -> bool {
    let t = content_type.to_ascii_lowercase();
    let sub = t.split_once('/').map_or("", |(_, sub)| sub);
    sub == "xml" || sub == "html" || sub.ends_with("+xml")
}

/// A `createAttachment` request, checked against the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateAttachment {
    pub file_name: String,
    /// Lower case, as signed into the upload and served back.
    pub content_type: String,
    pub size: u64,
}

impl CreateAttachment {
    pub fn parse(body: &[u8], policy: &AttachmentPolicy) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        let file_name = f.required_str("fileName")?;
        let chars = file_name.chars().count();
        if chars == 0 || chars > MAX_FILE_NAME_CHARS || file_name.chars().any(char::is_control) {
            return Err(ChatError::invalid(format!(
                "field `fileName` must be 1 to {MAX_FILE_NAME_CHARS} characters, without control characters"
            )));
        }
        let size = f.required_size("size")?;
        if size == 0 {
            return Err(ChatError::invalid("field `size` must be at least 1"));
        }
        let content_type = f.required_str("contentType")?;
        // A media type is at most 255 characters, its type and subtype 127 each (RFC 6838): a
        // longer one is no media type, whatever the allowlist says (found by probing: 60 KB ones
        // made a send's message too large to store, a 500; long subtypes were 415, not 400).
        let chars = |s: &str| s.chars().count();
        if chars(content_type) > 255 || content_type.split('/').any(|part| chars(part) > 127) {
            return Err(ChatError::invalid(
                "field `contentType` must be a media type of at most 255 characters (127 each for its type and subtype)",
            ));
        }
        if !policy.allows(content_type) {
            return Err(ChatError::UnsupportedMediaType(format!(
                "field `contentType`: `{content_type}` is not an allowed content type"
            )));
        }
        if size > policy.max_bytes {
            return Err(ChatError::PayloadTooLarge(format!(
                "field `size`: attachments are limited to {} bytes",
                policy.max_bytes
            )));
        }
        Ok(CreateAttachment {
            file_name: file_name.to_owned(),
            content_type: content_type.to_ascii_lowercase(),
            size,
        })
    }
}

/// The `attachments` of a send: at most 10 attachment ids, no repeats, order kept.
pub fn parse_attachment_ids(f: &Fields) -> Result<Vec<String>, ChatError> {
    let ids = f.optional_strings("attachments")?;
    if ids.len() > MAX_ATTACHMENTS_PER_MESSAGE {
        return Err(ChatError::invalid(format!(
            "field `attachments` holds at most {MAX_ATTACHMENTS_PER_MESSAGE} attachment ids"
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(ids.len());
    for id in ids {
        let key = attachment_id(id).ok_or_else(|| unusable(id, "is not an attachment id"))?;
        if out.contains(&key) {
            return Err(unusable(id, "is listed twice"));
        }
        out.push(key);
    }
    Ok(out)
}

/// An attachment id as this service hands them out (a UUID), lower case; None: not one.
pub fn attachment_id(raw: &str) -> Option<String> {
    (raw.len() == 36 && uuid::Uuid::try_parse(raw).is_ok()).then(|| raw.to_ascii_lowercase())
}

/// The `{attachmentId}` of a path. An id this service never hands out names no attachment: it is
/// looked up as the nil UUID (never an attachment's: ids are random), so that a member's `404`
/// names the attachment and an outsider's says no more than for any conversation it is not in
/// (found by probing: a malformed id told a member "conversation not found").
pub fn attachment_id_param(raw: &str) -> String {
    attachment_id(raw).unwrap_or_else(|| uuid::Uuid::nil().to_string())
}

fn unusable(id: &str, why: &str) -> ChatError {
    ChatError::invalid(format!("attachment `{id}` {why}"))
}

/// The refusal of an attachment by its scan's verdict (never served, never sent).
fn refused_by_scan(id: &str, scan: Scan) -> ChatError {
    match scan {
        Scan::Unscannable => ChatError::AttachmentUnscannable(format!(
            "attachment `{id}` could not be scanned for malware"
        )),
        _ => ChatError::AttachmentUnsafe(format!("attachment `{id}` failed its malware scan")),
    }
}

/// The object tag GuardDuty Malware Protection for S3 writes on a scanned object (and so does
/// the local stand-in, infra/s3-gate).
pub const SCAN_TAG: &str = "GuardDutyMalwareScanStatus";

/// An attachment's malware scan (docs/api.md §36). Recorded only while scanning is on: `Pending`
/// from its creation until the scan's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scan {
    Pending,
    Clean,
    Unsafe,
    Unscannable,
}

impl Scan {
    /// The verdict of GuardDuty's result (its tag's value, its event's `scanResultStatus`): only
    /// `NO_THREATS_FOUND` is clean and `THREATS_FOUND` unsafe; anything else (`UNSUPPORTED`,
    /// `ACCESS_DENIED`, `FAILED`, or a value this code does not know) was not scanned, and is not
    /// served either.
    pub fn of_guardduty(status: &str) -> Scan {
        match status {
            "NO_THREATS_FOUND" => Scan::Clean,
            "THREATS_FOUND" => Scan::Unsafe,
            _ => Scan::Unscannable,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scan::Pending => "pending",
            Scan::Clean => "clean",
            Scan::Unsafe => "unsafe",
            Scan::Unscannable => "unscannable",
        }
    }
}

/// An attachment as its record keeps it (docs/data-model.md §10): whose, where, what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRecord {
    pub attachment_id: String,
    pub conversation_id: ConversationId,
    pub owner_id: UserId,
    pub file_name: String,
    pub content_type: String,
    pub size: u64,
    pub created_at: String,
    /// The `clientMsgId` key of the send that used it (absent: never used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by: Option<String>,
    /// The original's size in pixels, recorded by the thumbnailer once `t/…` holds its
    /// thumbnail (absent: not an image, not decodable, or not done yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Its malware scan (absent: uploaded while scanning was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<Scan>,
}

impl AttachmentRecord {
    /// Whether the send of `client_msg_key` by `sender` in `conversation` may carry it, given
    /// whether its object is in the bucket (`uploaded`, as S3 says). Its own replay may: the same
    /// key used it. One whose scan is still pending may be sent (its message carries it without
    /// URLs until the verdict); one found unsafe or unscannable may not.
    pub fn check_use(
        &self,
        conversation: &ConversationId,
        sender: &UserId,
        client_msg_key: &str,
        uploaded: bool,
    ) -> Result<(), ChatError> {
        let id = &self.attachment_id;
        if &self.conversation_id != conversation {
            return Err(unusable(id, "belongs to another conversation"));
        }
        if &self.owner_id != sender {
            return Err(unusable(id, "was uploaded by another user"));
        }
        if self.used_by.as_deref().is_some_and(|k| k != client_msg_key) {
            return Err(unusable(id, "is already used by another message"));
        }
        if !uploaded {
            return Err(unusable(id, "is not uploaded yet"));
        }
        let replay = self.used_by.as_deref() == Some(client_msg_key);
        match self.scan {
            Some(bad @ (Scan::Unsafe | Scan::Unscannable)) if !replay => {
                Err(refused_by_scan(id, bad))
            }
            _ => Ok(()),
        }
    }

    /// As a message carries it (no URL yet: those are signed on every read).
    pub fn attachment(&self) -> Attachment {
        Attachment {
            attachment_id: self.attachment_id.clone(),
            file_name: self.file_name.clone(),
            content_type: self.content_type.clone(),
            size: self.size,
            url: None,
            url_expires_at: None,
            width: self.width,
            height: self.height,
            thumbnail_url: None,
            scan: self.scan,
        }
    }
}

/// The error of an id that names no attachment record.
pub fn unknown_attachment(id: &str) -> ChatError {
    unusable(id, "is unknown")
}

/// An attachment of a message (docs/api.md §5). Stored in the message without its URLs, which
/// are presigned afresh on every read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub attachment_id: String,
    pub file_name: String,
    pub content_type: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbnail_url: Option<String>,
    /// Its malware scan, while scanning is on (docs/api.md §36): `url` and `thumbnailUrl` only
    /// once it is `clean`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<Scan>,
}

impl Attachment {
    /// A 1-byte PNG `id` as a message carries it, for tests here and in other crates.
    #[cfg(any(test, feature = "fixtures"))]
    pub fn fixture(id: &str) -> Attachment {
        Attachment {
            attachment_id: id.into(),
            file_name: "f.png".into(),
            content_type: "image/png".into(),
            size: 1,
            url: None,
            url_expires_at: None,
            width: None,
            height: None,
            thumbnail_url: None,
            scan: None,
        }
    }
}

/// The object key of an attachment's bytes: under `a/`, by conversation, so that a policy can
/// name the prefix and a deletion finds them.
pub fn object_key(conversation: &ConversationId, attachment_id: &str) -> String {
    format!("a/{}/{attachment_id}", conversation.as_str())
}

/// The object key of an image attachment's thumbnail (its longest side at most 320 px, JPEG, or
/// PNG for an image with transparency). An attachment has one exactly when its record (and its
/// message's copy) has `width` and `height`.
pub fn thumbnail_key(conversation: &ConversationId, attachment_id: &str) -> String {
    format!("t/{}/{attachment_id}", conversation.as_str())
}

/// The conversation and attachment id of an object key `a/<conversationId>/<attachmentId>` (None:
/// not an attachment's bytes, e.g. a thumbnail).
pub fn parse_object_key(key: &str) -> Option<(ConversationId, String)> {
    let rest = key.strip_prefix("a/")?;
    let (conversation, id) = rest.split_once('/')?;
    Some((ConversationId::parse(conversation)?, attachment_id(id)?))
}

#[cfg(test)]
mod tests {

    #[test]
    fn files_a_browser_runs_as_pages_are_known() {
        for t in [
            "image/svg+xml",
            "IMAGE/SVG+XML",
            "text/xml",
            "application/xhtml+xml",
            "text/html",
        ] {
            assert!(opens_as_a_page(t), "{t}");
        }
        for t in [
            "image/png",
            "application/pdf",
            "text/plain",
            "video/mp4",
            "application/zip",
        ] {
            assert!(!opens_as_a_page(t), "{t}");
        }
    }

    use super::*;

    fn parse(body: &str) -> Result<CreateAttachment, ChatError> {
        CreateAttachment::parse(body.as_bytes(), &AttachmentPolicy::default())
    }

    #[test]
    fn object_keys_round_trip() {
        let conv = ConversationId::parse(&format!("d-{}", "1".repeat(32))).unwrap();
        let id = uuid::Uuid::new_v4().to_string();
        assert_eq!(
            parse_object_key(&object_key(&conv, &id)),
            Some((conv.clone(), id.clone()))
        );
        assert_eq!(parse_object_key(&thumbnail_key(&conv, &id)), None);
        assert_eq!(parse_object_key(&format!("a/{conv}/nope")), None);
        assert_eq!(parse_object_key("a/x"), None);
    }

    #[test]
    fn the_default_allowlist() {
        let p = AttachmentPolicy::default();
        for ok in [
            "image/png",
            "IMAGE/JPEG",
            "video/mp4",
            "audio/ogg",
            "application/pdf",
            "text/plain",
            "application/zip",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for no in [
            "text/html",
            "application/x-msdownload",
            "image/",
            "image",
            "image/png; charset=x",
            "image/*",
            "",
        ] {
            assert!(!p.allows(no), "{no}");
        }
    }

    #[test]
    fn create_checks_name_type_and_size() {
        let ok = parse(r#"{"fileName":"a.png","contentType":"Image/PNG","size":10}"#).unwrap();
        assert_eq!(ok.content_type, "image/png");
        let status = |b: &str| parse(b).unwrap_err().status();
        let long = format!(
            r#"{{"fileName":"a","contentType":"image/{}","size":1}}"#,
            "b".repeat(250)
        );
        assert_eq!(status(&long), 400, "longer than 255 characters");
        let sub128 = format!(
            r#"{{"fileName":"a","contentType":"image/{}","size":1}}"#,
            "b".repeat(128)
        );
        assert_eq!(status(&sub128), 400, "a subtype longer than 127 characters");
        let type128 = format!(
            r#"{{"fileName":"a","contentType":"{}/png","size":1}}"#,
            "b".repeat(128)
        );
        assert_eq!(status(&type128), 400, "a type longer than 127 characters");
        let accented = format!(
            r#"{{"fileName":"a","contentType":"image/{}","size":1}}"#,
            "é".repeat(64)
        );
        assert_eq!(
            status(&accented),
            415,
            "127 characters or fewer: not a length error"
        );
        let sub127 = format!(
            r#"{{"fileName":"a","contentType":"font/{}","size":1}}"#,
            "b".repeat(127)
        );
        assert_eq!(status(&sub127), 415, "a media type, not on the allowlist");
        assert_eq!(
            status(r#"{"fileName":"","contentType":"image/png","size":1}"#),
            400
        );
        let long = "x".repeat(256);
        let body = format!(r#"{{"fileName":"{long}","contentType":"image/png","size":1}}"#);
        assert_eq!(status(&body), 400);
        let name255 = "é".repeat(255);
        let body = format!(r#"{{"fileName":"{name255}","contentType":"image/png","size":1}}"#);
        assert!(parse(&body).is_ok());
        assert_eq!(
            status(r#"{"fileName":"a","contentType":"text/html","size":1}"#),
            415
        );
        let e = parse(r#"{"fileName":"a","contentType":"text/html","size":1}"#).unwrap_err();
        assert_eq!(e.code(), "unsupported_media_type");
        let over = DEFAULT_MAX_ATTACHMENT_BYTES + 1;
        let body = format!(r#"{{"fileName":"a","contentType":"image/png","size":{over}}}"#);
        assert_eq!(status(&body), 413);
        // Too large for any integer type: still too large, not malformed.
        for huge in ["18446744073709551616", "1e30", "99999999999999999999999"] {
            let body = format!(r#"{{"fileName":"a","contentType":"image/png","size":{huge}}}"#);
            assert_eq!(status(&body), 413, "{huge}");
        }
        let body = r#"{"fileName":"a","contentType":"image/png","size":-1e30}"#;
        assert_eq!(status(body), 400);
        let at = DEFAULT_MAX_ATTACHMENT_BYTES;
        let body = format!(r#"{{"fileName":"a","contentType":"image/png","size":{at}}}"#);
        assert!(parse(&body).is_ok());
        assert_eq!(
            status(r#"{"fileName":"a","contentType":"image/png","size":0}"#),
            400
        );
        assert_eq!(status(r#"{"fileName":"a","contentType":"image/png"}"#), 400);
    }

    #[test]
    fn attachment_ids_are_bounded_and_distinct() {
        let id = || uuid::Uuid::new_v4().to_string();
        let ids = |v: Vec<String>| {
            let body = serde_json::json!({ "attachments": v }).to_string();
            parse_attachment_ids(&Fields::parse(body.as_bytes()).unwrap())
        };
        assert_eq!(ids((0..10).map(|_| id()).collect()).unwrap().len(), 10);
        assert!(ids((0..11).map(|_| id()).collect()).is_err());
        let one = id();
        let e = ids(vec![one.clone(), one.clone()]).unwrap_err();
        assert!(e.to_string().contains(&one), "{e}");
        let e = ids(vec!["nope".into()]).unwrap_err();
        assert!(e.to_string().contains("`nope`"), "{e}");
    }

    #[test]
    fn a_send_may_use_only_its_own_uploaded_unused_attachment() {
        let conv = ConversationId::parse(&format!("d-{}", "1".repeat(32))).unwrap();
        let alice = UserId::parse("alice").unwrap();
        let record = AttachmentRecord {
            attachment_id: "id1".into(),
            conversation_id: conv.clone(),
            owner_id: alice.clone(),
            file_name: "a.png".into(),
            content_type: "image/png".into(),
            size: 3,
            created_at: "t".into(),
            used_by: None,
            width: None,
            height: None,
            scan: None,
        };
        assert!(record.check_use(&conv, &alice, "k1", true).is_ok());
        assert!(record.check_use(&conv, &alice, "k1", false).is_err());
        let other = ConversationId::parse(&format!("d-{}", "2".repeat(32))).unwrap();
        assert!(record.check_use(&other, &alice, "k1", true).is_err());
        let bob = UserId::parse("bob").unwrap();
        assert!(record.check_use(&conv, &bob, "k1", true).is_err());
        let used = AttachmentRecord {
            used_by: Some("k1".into()),
            ..record
        };
        assert!(used.check_use(&conv, &alice, "k1", true).is_ok());
        let e = used.check_use(&conv, &alice, "k2", true).unwrap_err();
        assert!(e.to_string().contains("id1"), "{e}");
    }

    #[test]
    fn a_scan_verdict_decides_serving_and_sending() {
        let conv = ConversationId::parse(&format!("d-{}", "1".repeat(32))).unwrap();
        let alice = UserId::parse("alice").unwrap();
        let record = |scan, used_by: Option<&str>| AttachmentRecord {
            attachment_id: "id1".into(),
            conversation_id: conv.clone(),
            owner_id: alice.clone(),
            file_name: "a.txt".into(),
            content_type: "text/plain".into(),
            size: 68,
            created_at: "t".into(),
            used_by: used_by.map(Into::into),
            width: None,
            height: None,
            scan,
        };
        let code = |r: Result<(), ChatError>| r.map_err(|e| e.code());
        // Sending: a pending one may go; an unsafe or unscannable one may not, but its replay is
        // answered.
        let send = |scan, used_by| code(record(scan, used_by).check_use(&conv, &alice, "k1", true));
        assert_eq!(send(Some(Scan::Pending), None), Ok(()));
        assert_eq!(send(Some(Scan::Clean), None), Ok(()));
        assert_eq!(send(Some(Scan::Unsafe), None), Err("attachment_unsafe"));
        assert_eq!(
            send(Some(Scan::Unscannable), None),
            Err("attachment_unscannable")
        );
        assert_eq!(send(Some(Scan::Unsafe), Some("k1")), Ok(()));
        // Serving, scanning on: only clean ones, and those uploaded while it was off.
        let on = AttachmentPolicy::default().with_scanning(true);
        assert_eq!(code(on.may_serve("id1", None)), Ok(()));
        assert_eq!(code(on.may_serve("id1", Some(Scan::Clean))), Ok(()));
        let pending = on.may_serve("id1", Some(Scan::Pending)).unwrap_err();
        assert_eq!(
            (pending.code(), pending.retry_after()),
            ("attachment_pending", Some(2))
        );
        assert_eq!(
            code(on.may_serve("id1", Some(Scan::Unsafe))),
            Err("attachment_unsafe")
        );
        assert_eq!(
            code(on.may_serve("id1", Some(Scan::Unscannable))),
            Err("attachment_unscannable")
        );
        // Scanning off: a pending one is served (no verdict will come), never an unsafe one.
        let off = AttachmentPolicy::default();
        assert_eq!(code(off.may_serve("id1", Some(Scan::Pending))), Ok(()));
        assert_eq!(
            code(off.may_serve("id1", Some(Scan::Unsafe))),
            Err("attachment_unsafe")
        );
    }

    #[test]
    fn guardduty_results_map_to_verdicts() {
        assert_eq!(Scan::of_guardduty("NO_THREATS_FOUND"), Scan::Clean);
        assert_eq!(Scan::of_guardduty("THREATS_FOUND"), Scan::Unsafe);
        for other in [
            "UNSUPPORTED",
            "ACCESS_DENIED",
            "FAILED",
            "SOMETHING_NEW",
            "",
        ] {
            assert_eq!(Scan::of_guardduty(other), Scan::Unscannable, "{other}");
        }
        let json = serde_json::to_string(&Scan::Unscannable).unwrap();
        assert_eq!(json, format!("\"{}\"", Scan::Unscannable.as_str()));
    }
}
