//! Attachments (docs/api.md §34–§36, docs/data-model.md §10): a record per upload in the chat
//! table (`pk = A#<attachmentId>, sk = A`, TTL'd until a message uses it) and the bytes in the
//! attachments bucket under `a/<conversationId>/<attachmentId>`. The bytes never pass through a
//! function: uploads and downloads are presigned S3 requests (feature `attachments`).

use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, TransactWriteItem};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::Client;
use serde::Serialize;

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{from_item, to_item};
use super::{keys, sdk_error, ChatStore};
use chat_domain::attachments::{
    object_key, thumbnail_key, unknown_attachment, Attachment, AttachmentPolicy, AttachmentRecord,
    CreateAttachment, Scan, SCAN_TAG,
};
use chat_domain::error::ChatError;
use chat_domain::model::Message;
use chat_domain::time::{now, rfc3339, unix_seconds};
use chat_domain::{ConversationId, UserId};

/// How long an upload's presigned request is valid.
const UPLOAD_TTL: Duration = Duration::from_secs(15 * 60);
/// How long a download URL is valid (SPEC §14: at least 15 minutes; fresh on every read).
const DOWNLOAD_TTL: Duration = Duration::from_secs(60 * 60);
/// A record never used by a message expires (TTL) after this long; its object is tagged
/// `UNATTACHED_TAG` by the upload itself, which the bucket's lifecycle rule expires after 1 day.
const UNUSED_TTL_SECS: i64 = 24 * 3600;
/// The tag every upload carries until a message uses it (template.yaml's lifecycle rule).
pub const UNATTACHED_TAG: &str = "chat-unattached=1";
/// The tags of a deleted attachment's tombstone: the bucket's policy refuses to read an object
/// tagged `chat-deleted=1` (template.yaml), and its lifecycle rule expires the unattached ones.
pub const DELETED_TAGS: &str = "chat-deleted=1&chat-unattached=1";

/// The attachments bucket and what uploads may be.
#[derive(Clone, Debug)]
pub struct Attachments {
    s3: Client,
    bucket: String,
    policy: AttachmentPolicy,
}

impl Attachments {
    pub fn new(s3: Client, bucket: impl Into<String>, policy: AttachmentPolicy) -> Self {
        Attachments {
            s3,
            bucket: bucket.into(),
            policy,
        }
    }
}

/// `createAttachment`'s answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedAttachment {
    pub attachment_id: String,
    pub upload: Upload,
}

/// A presigned request the client sends the bytes with.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Upload {
    pub method: String,
    pub url: String,
    /// The headers it was signed with: the client sends exactly these.
    pub headers: std::collections::BTreeMap<String, String>,
    pub expires_at: String,
}

fn attachment_key(attachment_id: &str) -> Item {
    keys::key(format!("A#{attachment_id}"), "A")
}

/// A presigned request valid for `ttl` from now, and when it stops working: signed at a whole
/// second, as its `X-Amz-Date` says (a time with milliseconds would be up to 1 s later than S3's
/// end of it; found by probing).
fn presign_config(ttl: Duration) -> Result<(PresigningConfig, String), ChatError> {
    let signed = now().replace_nanosecond(0).map_err(ChatError::internal)?;
    let config = PresigningConfig::builder()
        .start_time(signed.into())
        .expires_in(ttl)
        .build()
        .map_err(ChatError::internal)?;
    Ok((config, rfc3339(signed + ttl)))
}

/// Tries of the thumbnail's record update against a send's transaction on it (TransactionConflict).
const RECORD_ATTEMPTS: u32 = 8;

impl ChatStore {
    /// The attachments bucket (None: attachments are not configured: 400).
    fn attachments(&self) -> Result<&Attachments, ChatError> {
        self.attachments
            .as_ref()
            .ok_or_else(|| ChatError::invalid("attachments are not enabled on this deployment"))
    }

    /// What uploads may be (template parameters `MaxAttachmentBytes`, `AttachmentContentTypes`,
    /// `ScanUploads`).
    pub fn attachment_policy(&self) -> Result<&AttachmentPolicy, ChatError> {
        Ok(&self.attachments()?.policy)
    }

    /// The attachments bucket's name (None: attachments are off).
    pub fn attachments_bucket(&self) -> Option<&str> {
        self.attachments.as_ref().map(|a| a.bucket.as_str())
    }

    /// Whether uploads are scanned for malware (`ScanUploads`, docs/api.md §36).
    pub fn scan_uploads(&self) -> bool {
        self.attachments
            .as_ref()
            .is_some_and(|a| a.policy.scan_uploads)
    }

    /// `createAttachment`: a record of the upload, and the presigned PUT that fixes its size,
    /// content type and tag, and may not overwrite an object (`If-None-Match: *`): an upload is
    /// written once, so a sent file cannot be replaced by other bytes (nor a scanned one under its
    /// verdict). While scanning is on, the record says `scan: pending`. DynamoDB: 1 GetItem
    /// (membership) + 1 PutItem.
    pub async fn create_attachment(
        &self,
        caller: &UserId,
        id: &ConversationId,
        request: &CreateAttachment,
    ) -> Result<CreatedAttachment, ChatError> {
        let a = self.attachments()?;
        self.require_member_of(id, caller).await?;
        let created = now();
        let record = AttachmentRecord {
            attachment_id: uuid::Uuid::new_v4().to_string(),
            conversation_id: id.clone(),
            owner_id: caller.clone(),
            file_name: request.file_name.clone(),
            content_type: request.content_type.clone(),
            size: request.size,
            created_at: rfc3339(created),
            used_by: None,
            width: None,
            height: None,
            scan: a.policy.scan_uploads.then_some(Scan::Pending),
        };
        let key = attachment_key(&record.attachment_id);
        let (pk, sk) = (s_of(&key, keys::PK), s_of(&key, keys::SK));
        let mut item = to_item(&record, pk, sk)?;
        let ttl = unix_seconds(created) + UNUSED_TTL_SECS;
        item.insert("ttl".into(), AttributeValue::N(ttl.to_string()));
        self.db
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| sdk_error("PutItem", e))?;
        let (config, expires_at) = presign_config(UPLOAD_TTL)?;
        let presigned =
            a.s3.put_object()
                .bucket(&a.bucket)
                .key(object_key(id, &record.attachment_id))
                .content_type(&record.content_type)
                .content_length(record.size as i64)
                // Stored and served as sent, never decoded on the way: an encoding the
                // signature did not cover (S3 keeps it) made clients decode gzip bytes a scanner
                // had seen as such (found by probing: EICAR, gzipped).
                .content_encoding("identity")
                .tagging(UNATTACHED_TAG)
                .if_none_match("*")
                .presigned(config)
                .await
                .map_err(|e| ChatError::internal(format!("presign PUT: {e}")))?;
        // The SDK adds Lambda's trace id (`x-amzn-trace-id`, unsigned) to every request: the
        // client needs none of it, and it is ours.
        let mut headers: std::collections::BTreeMap<String, String> = presigned
            .headers()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("x-amzn-trace-id"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        // What the signature covers, said explicitly (S3 refuses another value of either).
        headers.insert("content-type".into(), record.content_type.clone());
        headers.insert("content-length".into(), record.size.to_string());
        headers.insert("content-encoding".into(), "identity".into());
        Ok(CreatedAttachment {
            attachment_id: record.attachment_id,
            upload: Upload {
                method: presigned.method().to_owned(),
                url: presigned.uri().to_owned(),
                headers,
                expires_at,
            },
        })
    }

    /// `getAttachment`: a fresh presigned GET of an attachment of this conversation, for a
    /// member, unless its scan refuses it (`AttachmentPolicy::may_serve`). One not sent yet is
    /// its uploader's alone, and only once uploaded (found by probing: any member could fetch an
    /// upload never sent, and one never uploaded was `attachment_pending` for ever). DynamoDB: 1
    /// BatchGetItem (the member item and the record). S3, only while the record says `pending`:
    /// 1 GetObjectTagging (the scan's tag, there before its event reached the record); for one
    /// not sent, 1 HeadObject before.
    pub async fn attachment_url(
        &self,
        caller: &UserId,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<String, ChatError> {
        let a = self.attachments()?;
        let wanted = vec![keys::member_key(id, caller), attachment_key(attachment_id)];
        let found = self.batch_get(wanted, true).await?;
        let member = found
            .iter()
            .any(|i| i.get(keys::PK) != Some(&s(format!("A#{attachment_id}"))));
        if !member {
            return Err(ChatError::NotFound);
        }
        let r = match records(found)?.into_iter().next() {
            Some(r)
                if &r.conversation_id == id && (r.used_by.is_some() || &r.owner_id == caller) =>
            {
                r
            }
            _ => return Err(ChatError::AttachmentNotFound),
        };
        if r.used_by.is_none() && !self.uploaded(a, id, attachment_id).await? {
            return Err(ChatError::AttachmentNotFound);
        }
        if let Err(refused) = a.policy.may_serve(attachment_id, r.scan) {
            let ChatError::AttachmentPending(_) = refused else {
                return Err(refused);
            };
            // The scan's tag is written before its event reaches the record.
            let tagged = self.scan_tag(a, id, attachment_id).await?;
            a.policy
                .may_serve(attachment_id, Some(tagged.unwrap_or(Scan::Pending)))?;
        }
        Ok(self
            .sign_get(a, id, &r.attachment_id, &r.content_type)
            .await?
            .0)
    }

    /// Whether an upload's object is in the bucket. S3: 1 HeadObject.
    async fn uploaded(
        &self,
        a: &Attachments,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<bool, ChatError> {
        let out =
            a.s3.head_object()
                .bucket(&a.bucket)
                .key(object_key(id, attachment_id))
                .send()
                .await;
        Ok(or_unreadable("HeadObject", out)?.is_some())
    }

    /// The verdict in an upload's scan tag (None: no tag yet, or no object). S3: 1
    /// GetObjectTagging.
    async fn scan_tag(
        &self,
        a: &Attachments,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<Option<Scan>, ChatError> {
        let out =
            a.s3.get_object_tagging()
                .bucket(&a.bucket)
                .key(object_key(id, attachment_id))
                .send()
                .await;
        let Some(tags) = or_missing("GetObjectTagging", out)? else {
            return Ok(None);
        };
        Ok(tags
            .tag_set()
            .iter()
            .find(|t| t.key() == SCAN_TAG)
            .map(|t| Scan::of_guardduty(t.value())))
    }

    /// The download URL of an attachment of `content_type`: one a browser would run as a page
    /// is saved instead (`opens_as_a_page`: S3 answers it with `Content-Disposition:
    /// attachment`, signed into the URL).
    async fn sign_get(
        &self,
        a: &Attachments,
        id: &ConversationId,
        attachment_id: &str,
        content_type: &str,
    ) -> Result<(String, String), ChatError> {
        let saved = chat_domain::attachments::opens_as_a_page(content_type);
        self.sign_get_key(a, object_key(id, attachment_id), saved)
            .await
    }

    async fn sign_get_key(
        &self,
        a: &Attachments,
        key: String,
        saved: bool,
    ) -> Result<(String, String), ChatError> {
        let (config, expires_at) = presign_config(DOWNLOAD_TTL)?;
        let get = a.s3.get_object().bucket(&a.bucket).key(key);
        let get = match saved {
            true => get.response_content_disposition("attachment"),
            false => get,
        };
        let presigned = get
            .presigned(config)
            .await
            .map_err(|e| ChatError::internal(format!("presign GET: {e}")))?;
        Ok((presigned.uri().to_owned(), expires_at))
    }

    /// Fills in every attachment's fresh `url` (signing is local: no request), and its
    /// thumbnail's: only for one its scan lets be served (`AttachmentPolicy::may_serve`); the
    /// others carry their `scan` and no URL.
    pub async fn sign_attachments<'m>(
        &self,
        messages: impl IntoIterator<Item = &'m mut Message>,
    ) -> Result<(), ChatError> {
        for m in messages {
            self.sign_attachment_list(&m.conversation_id, &mut m.attachments)
                .await?;
        }
        Ok(())
    }

    /// `sign_attachments` of one message's attachments, `list` (a push's: the fanout signs
    /// those of the message it pushes).
    pub async fn sign_attachment_list(
        &self,
        id: &ConversationId,
        list: &mut [Attachment],
    ) -> Result<(), ChatError> {
        let Some(a) = self.attachments.as_ref() else {
            return Ok(());
        };
        for att in list.iter_mut() {
            if a.policy.may_serve(&att.attachment_id, att.scan).is_err() {
                continue;
            }
            let (url, expires) = self
                .sign_get(a, id, &att.attachment_id, &att.content_type)
                .await?;
            att.url = Some(url);
            att.url_expires_at = Some(expires);
            // Dimensions are recorded only with a thumbnail written (`record_thumbnail`).
            if att.width.is_some() {
                let key = thumbnail_key(id, &att.attachment_id);
                att.thumbnail_url = Some(self.sign_get_key(a, key, false).await?.0);
            }
        }
        Ok(())
    }

    /// The attachments of a send, checked (`AttachmentRecord::check_use`) from their records
    /// in `found` and their objects in S3: each object's unattached tag is removed, which is
    /// also the proof that it was uploaded (no object: not uploaded). S3: 1 DeleteObjectTagging
    /// per attachment, at once.
    pub(crate) async fn attachments_for_send(
        &self,
        ids: &[String],
        found: Vec<Item>,
        id: &ConversationId,
        sender: &UserId,
        client_msg_key: &str,
    ) -> Result<Vec<Attachment>, ChatError> {
        let a = self.attachments()?;
        let records = records(found)?;
        let mut ordered = Vec::with_capacity(ids.len());
        for want in ids {
            let r = records
                .iter()
                .find(|r| &r.attachment_id == want)
                .ok_or_else(|| unknown_attachment(want))?;
            r.check_use(id, sender, client_msg_key, true)?;
            ordered.push(r);
        }
        let untag = ordered.iter().map(|r| async move {
            if self.untag(a, id, &r.attachment_id).await? {
                Ok(())
            } else {
                r.check_use(id, sender, client_msg_key, false)
            }
        });
        futures::future::try_join_all(untag).await?;
        Ok(ordered.iter().map(|r| r.attachment()).collect())
    }

    /// Removes an upload's tags (false: no such object). S3: 1 DeleteObjectTagging.
    async fn untag(
        &self,
        a: &Attachments,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<bool, ChatError> {
        let out =
            a.s3.delete_object_tagging()
                .bucket(&a.bucket)
                .key(object_key(id, attachment_id))
                .send()
                .await;
        Ok(or_missing("DeleteObjectTagging", out)?.is_some())
    }

    /// The keys of a send's attachment records (read with its conversation head).
    pub(crate) fn attachment_keys(ids: &[String]) -> Vec<Item> {
        ids.iter().map(|i| attachment_key(i)).collect()
    }

    /// A send's claim of its attachments, one action each: used by its `clientMsgId` key (or
    /// already by it: a replay), its TTL removed. In the send's own transaction when alone; in
    /// one of their own before a queued send is enqueued.
    pub(crate) fn claim_items(
        &self,
        ids: &[String],
        client_msg_key: &str,
        copies: &[Attachment],
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        ids.iter()
            .enumerate()
            .map(|(n, i)| {
                let mut values = vec![(":key", s(client_msg_key.to_owned()))];
                let mut names = vec![("#ttl", "ttl")];
                let mut condition =
                    "attribute_exists(pk) AND (attribute_not_exists(usedBy) OR usedBy = :key)"
                        .to_owned();
                // The message's copy is the record as read: a thumbnail or verdict recorded since
                // (which found no message to copy it to) fails the claim, and the send reads again.
                if let Some(copy) = copies.get(n) {
                    if copy.width.is_none() {
                        condition.push_str(" AND attribute_not_exists(width)");
                    }
                    if copy.scan == Some(Scan::Pending) {
                        condition.push_str(" AND #scan = :pending");
                        names.push(("#scan", "scan"));
                        values.push((":pending", s(Scan::Pending.as_str().to_owned())));
                    }
                }
                super::tx::update_named(
                    &self.table,
                    attachment_key(i),
                    "SET usedBy = :key REMOVE #ttl",
                    Some(&condition),
                    &values,
                    &names,
                )
            })
            .collect()
    }

    /// After a queued send's commit: its message's copies of its attachments get what their
    /// records gained since the send read them (a thumbnail's `width` and `height`, a scan's
    /// verdict), which no one could copy while the send waited in the queue: a recorder finds
    /// the record used but no message yet. From the commit on, recorders update the message
    /// themselves. DynamoDB, only when a copy lacks a size or a verdict: 1 BatchGetItem, + 1
    /// UpdateItem of the message per attachment that gained something.
    pub(crate) async fn refresh_attachment_copies(
        &self,
        message: &mut Message,
    ) -> Result<(), ChatError> {
        let stale = |a: &Attachment| a.width.is_none() || a.scan == Some(Scan::Pending);
        if !message.attachments.iter().any(stale) {
            return Ok(());
        }
        let ids: Vec<String> = message
            .attachments
            .iter()
            .map(|a| a.attachment_id.clone())
            .collect();
        let found = self
            .batch_get(ChatStore::attachment_keys(&ids), true)
            .await?;
        for record in records(found)? {
            let Some(index) = message
                .attachments
                .iter()
                .position(|a| a.attachment_id == record.attachment_id)
            else {
                continue;
            };
            let copy = &mut message.attachments[index];
            let mut fields = Vec::new();
            if copy.width.is_none() {
                if let (Some(w), Some(h)) = (record.width, record.height) {
                    fields.push(("width", n(u64::from(w))));
                    fields.push(("height", n(u64::from(h))));
                    (copy.width, copy.height) = (Some(w), Some(h));
                }
            }
            if copy.scan == Some(Scan::Pending) && record.scan.is_some_and(|v| v != Scan::Pending) {
                let verdict = record.scan.unwrap_or(Scan::Pending);
                fields.push(("scan", s(verdict.as_str().to_owned())));
                copy.scan = Some(verdict);
            }
            if !fields.is_empty() {
                let (id, seq) = (&message.conversation_id, message.seq);
                self.update_message_copy(id, seq, index, &record.attachment_id, &fields)
                    .await?;
            }
        }
        Ok(())
    }
}

impl ChatStore {
    /// A deletion's removal of its message's attachment records, in the deletion's own
    /// transaction: the stable link answers 404 from then on.
    pub(crate) fn attachment_erasure_parts(
        &self,
        message: &Message,
    ) -> Result<Vec<TransactWriteItem>, ChatError> {
        message
            .attachments
            .iter()
            .map(|a| {
                super::tx::delete_unconditionally(&self.table, attachment_key(&a.attachment_id))
            })
            .collect()
    }

    /// Erases a deleted message's attachments' objects, once the deletion committed: each upload
    /// is overwritten by an empty tombstone (`DELETED_TAGS`), its thumbnail deleted. Not deleted:
    /// the upload's presigned PUT stays valid for a while after the message's deletion, and
    /// `If-None-Match: *` refuses it only while the key holds an object (a deleted key let a
    /// sender put the bytes back, served again by the URLs members held: found by probing).
    /// The bucket's policy refuses reads of a tombstone; its lifecycle rule deletes it after a day,
    /// long after every upload request expired. S3: 1 PutObject per upload and 1 DeleteObject per
    /// thumbnail, at once (a missing thumbnail is no error).
    pub(crate) async fn erase_attachment_objects(
        &self,
        id: &ConversationId,
        attachment_ids: &[String],
    ) -> Result<(), ChatError> {
        if attachment_ids.is_empty() {
            return Ok(());
        }
        let a = self.attachments()?;
        let tombstones = attachment_ids.iter().map(|att| async move {
            a.s3.put_object()
                .bucket(&a.bucket)
                .key(object_key(id, att))
                .tagging(DELETED_TAGS)
                .body(Vec::new().into())
                .send()
                .await
                .map(|_| ())
                .map_err(|e| s3_error("PutObject", e))
        });
        let thumbnails = attachment_ids
            .iter()
            .map(|att| a.delete(thumbnail_key(id, att)));
        futures::future::try_join(
            futures::future::try_join_all(tombstones),
            futures::future::try_join_all(thumbnails),
        )
        .await?;
        Ok(())
    }
}

impl Attachments {
    /// S3: 1 DeleteObject (a missing object is no error).
    async fn delete(&self, key: String) -> Result<(), ChatError> {
        self.s3
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| s3_error("DeleteObject", e))
    }
}

/// The thumbnailer's calls (functions/thumbnails): it reads an upload, writes its thumbnail
/// under `t/`, and records the original's dimensions.
impl ChatStore {
    /// The bytes of an upload, at most `max` of them (None: no such object, or its tombstone: its
    /// message was deleted meanwhile; or larger than `max`). S3: 1 GetObject.
    pub async fn attachment_bytes(
        &self,
        id: &ConversationId,
        attachment_id: &str,
        max: u64,
    ) -> Result<Option<Vec<u8>>, ChatError> {
        let a = self.attachments()?;
        let out =
            a.s3.get_object()
                .bucket(&a.bucket)
                .key(object_key(id, attachment_id))
                .send()
                .await;
        let Some(out) = or_unreadable("GetObject", out)? else {
            return Ok(None);
        };
        // An upload has at least 1 byte: an empty object is a tombstone.
        if out
            .content_length()
            .is_some_and(|n| n <= 0 || n as u64 > max)
        {
            return Ok(None);
        }
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| ChatError::internal(format!("GetObject body: {e}")))?;
        Ok(Some(bytes.to_vec()))
    }

    /// Writes an attachment's thumbnail (`t/<conversationId>/<attachmentId>`). S3: 1 PutObject.
    pub async fn put_thumbnail(
        &self,
        id: &ConversationId,
        attachment_id: &str,
        bytes: Vec<u8>,
        content_type: &str,
    ) -> Result<(), ChatError> {
        let a = self.attachments()?;
        a.s3.put_object()
            .bucket(&a.bucket)
            .key(thumbnail_key(id, attachment_id))
            .content_type(content_type)
            .body(bytes.into())
            .send()
            .await
            .map_err(|e| s3_error("PutObject", e))?;
        Ok(())
    }

    /// Whether an upload's attachment still exists (its record: created before its upload URL,
    /// removed with its message). DynamoDB: 1 strongly consistent GetItem of a key (1 read unit).
    pub async fn attachment_exists(&self, attachment_id: &str) -> Result<bool, ChatError> {
        let out = self
            .db
            .get_item()
            .table_name(&self.table)
            .set_key(Some(attachment_key(attachment_id)))
            .projection_expression("pk")
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e))?;
        Ok(out.item.is_some())
    }

    /// Erases an upload whose attachment no longer exists, and its thumbnail
    /// (`erase_attachment_objects`). S3: 1 PutObject and 1 DeleteObject, at once.
    pub async fn erase_orphan_upload(
        &self,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<(), ChatError> {
        self.erase_attachment_objects(id, &[attachment_id.to_owned()])
            .await
    }

    /// Deletes an upload never sent, and its thumbnail, once its record expired: 24 h after its
    /// upload request, long expired. S3: 2 DeleteObject, at once.
    pub async fn delete_expired_upload(
        &self,
        id: &ConversationId,
        attachment_id: &str,
    ) -> Result<(), ChatError> {
        let a = self.attachments()?;
        futures::future::try_join(
            a.delete(object_key(id, attachment_id)),
            a.delete(thumbnail_key(id, attachment_id)),
        )
        .await?;
        Ok(())
    }

    /// Records that an attachment's thumbnail exists, with its original's `width` × `height`
    /// (`record_on_attachment`); false: the attachment was deleted (the caller removes the
    /// thumbnail). DynamoDB: as `record_on_attachment`.
    pub async fn record_thumbnail(
        &self,
        id: &ConversationId,
        attachment_id: &str,
        width: u32,
        height: u32,
    ) -> Result<bool, ChatError> {
        let fields = [
            ("width", n(u64::from(width))),
            ("height", n(u64::from(height))),
        ];
        Ok(self
            .record_on_attachment(id, attachment_id, &fields)
            .await?
            .is_some())
    }

    /// Records a malware scan's verdict (docs/api.md §36) as `scan` (`record_on_attachment`).
    /// When a message uses the attachment, its object's tags are then removed once more: a
    /// scanner adds its tag by reading the tags and writing them back with its own, so one that
    /// read them before the send removed the unattached tag puts that tag back, and the bucket's
    /// lifecycle rule would delete a sent file (the send, for its part, untags again after its
    /// commit: `untag_after_send`). False: the attachment was deleted. DynamoDB: as
    /// `record_on_attachment`; S3, when a message uses it: + 1 DeleteObjectTagging.
    pub async fn record_scan(
        &self,
        id: &ConversationId,
        attachment_id: &str,
        scan: Scan,
    ) -> Result<bool, ChatError> {
        let fields = [("scan", s(scan.as_str().to_owned()))];
        let Some(record) = self
            .record_on_attachment(id, attachment_id, &fields)
            .await?
        else {
            return Ok(false);
        };
        if get_s(&record, "usedBy").is_some() {
            self.untag(self.attachments()?, id, attachment_id).await?;
        }
        Ok(true)
    }

    /// After a send committed, while scanning is on: its attachments whose scan was still
    /// pending lose their tags once more, for the same reason as in `record_scan` (a verdict
    /// tagged between the send's untag and its commit; a verdict after the commit finds the
    /// record used). S3: 1 DeleteObjectTagging per such attachment, at once; none otherwise.
    pub(crate) async fn untag_after_send(&self, message: &Message) -> Result<(), ChatError> {
        let Some(a) = self.attachments.as_ref() else {
            return Ok(());
        };
        if !a.policy.scan_uploads {
            return Ok(());
        }
        let pending = message
            .attachments
            .iter()
            .filter(|att| att.scan == Some(Scan::Pending))
            .map(|att| self.untag(a, &message.conversation_id, &att.attachment_id));
        futures::future::try_join_all(pending).await?;
        Ok(())
    }

    /// Sets `fields` on an attachment's record, conditioned on the record still existing (a
    /// deleted attachment is not resurrected: None), and, when a message already carries it, on
    /// that message's copy (conditioned on the message still existing). Returns the record as
    /// updated. DynamoDB: 1 UpdateItem; when a message uses it, + 2 GetItem (its send key, the
    /// message's attachments) + 1 UpdateItem.
    async fn record_on_attachment(
        &self,
        id: &ConversationId,
        attachment_id: &str,
        fields: &[(&str, AttributeValue)],
    ) -> Result<Option<Item>, ChatError> {
        let mut attempt = 0;
        let out = loop {
            attempt += 1;
            let mut update = self
                .db
                .update_item()
                .table_name(&self.table)
                .set_key(Some(attachment_key(attachment_id)))
                .update_expression(set_fields("", fields))
                .condition_expression("attribute_exists(pk) AND conversationId = :c")
                .expression_attribute_values(":c", s(id.as_str().to_owned()))
                .return_values(ReturnValue::AllNew);
            for (name, value) in fields {
                update = update
                    .expression_attribute_names(format!("#{name}"), *name)
                    .expression_attribute_values(format!(":{name}"), value.clone());
            }
            let out = update.send().await;
            // The send claiming this record in its transaction at this moment: a moment later it
            // has committed (then `usedBy` says where its message is) or not.
            match &out {
                Err(e) if super::throttled(e) && attempt < RECORD_ATTEMPTS => {
                    tokio::time::sleep(chat_domain::retry::backoff(attempt + 1)).await;
                }
                _ => break out,
            }
        };
        let record = match out {
            Ok(o) => o.attributes.unwrap_or_default(),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(sdk_error("UpdateItem", e)),
        };
        // Not sent yet: the send copies the fields from the record.
        let Some(used_by) = get_s(&record, "usedBy") else {
            return Ok(Some(record));
        };
        let Some(key) = self
            .item_fields(keys::send_key(id, used_by), Some("seq"))
            .await?
        else {
            // Queued, or archived already: the record keeps the fields.
            return Ok(Some(record));
        };
        let Some(seq) = get_n(&key, "seq") else {
            return Ok(Some(record));
        };
        let message = self
            .item_fields(keys::message_key(id, seq), Some("attachments"))
            .await?;
        let index = message
            .as_ref()
            .and_then(|m| m.get("attachments"))
            .and_then(|l| l.as_l().ok())
            .and_then(|l| {
                l.iter().position(|a| {
                    a.as_m()
                        .is_ok_and(|m| get_s(m, "attachmentId") == Some(attachment_id))
                })
            });
        if let Some(i) = index {
            self.update_message_copy(id, seq, i, attachment_id, fields)
                .await?;
        }
        Ok(Some(record))
    }

    /// Sets `fields` on the copy of attachment `attachment_id`, the `index`th of message `seq`
    /// (conditioned on it being there: a message deleted meanwhile is left alone, its deletion
    /// removes the objects). DynamoDB: 1 UpdateItem.
    async fn update_message_copy(
        &self,
        id: &ConversationId,
        seq: u64,
        index: usize,
        attachment_id: &str,
        fields: &[(&str, AttributeValue)],
    ) -> Result<(), ChatError> {
        let mut update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::message_key(id, seq)))
            .update_expression(set_fields(&format!("attachments[{index}]."), fields))
            .condition_expression(format!("attachments[{index}].attachmentId = :a"))
            .expression_attribute_values(":a", s(attachment_id.to_owned()));
        for (name, value) in fields {
            update = update
                .expression_attribute_names(format!("#{name}"), *name)
                .expression_attribute_values(format!(":{name}"), value.clone());
        }
        super::connections::done_unless_failed("UpdateItem", update.send().await)
    }
}

/// `SET <prefix>#name = :name, …` for `fields` (by `#name`: `scan` is one of DynamoDB's reserved
/// words).
fn set_fields(prefix: &str, fields: &[(&str, AttributeValue)]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|(name, _)| format!("{prefix}#{name} = :{name}"))
        .collect();
    format!("SET {}", parts.join(", "))
}

/// An S3 call's output; None: S3's 404 (no such object).
fn or_missing<T, E: std::error::Error + 'static>(
    call: &str,
    out: Result<T, aws_sdk_s3::error::SdkError<E>>,
) -> Result<Option<T>, ChatError> {
    match out {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(None),
        Err(e) => Err(s3_error(call, e)),
    }
}

/// `or_missing` for a read of an object: 403 is no object too (without ListBucket, not granted,
/// S3 answers a missing key so; the bucket policy so a deleted attachment's tombstone).
fn or_unreadable<T, E: std::error::Error + 'static>(
    call: &str,
    out: Result<T, aws_sdk_s3::error::SdkError<E>>,
) -> Result<Option<T>, ChatError> {
    match out {
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 403) => Ok(None),
        out => or_missing(call, out),
    }
}

/// S3 that did not answer, answered unreadably or failed itself (5xx, `SlowDown`) is
/// unavailable, as DynamoDB is then (`sdk_error`): `503`, or `429` before the request wrote
/// anything (found by fault probing: a send with an attachment, S3 frozen, was `500`).
fn s3_error<E: std::error::Error + 'static>(
    call: &str,
    e: aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> ChatError {
    let server_failed = e.raw_response().is_some_and(|r| r.status().as_u16() >= 500);
    if server_failed || super::unanswered(&e) {
        tracing::warn!(call, error = %aws_sdk_s3::error::DisplayErrorContext(&e), "S3 unavailable");
        return ChatError::Unavailable;
    }
    ChatError::internal(format!(
        "{call}: {}",
        aws_sdk_s3::error::DisplayErrorContext(&e)
    ))
}

fn s_of(key: &Item, name: &str) -> String {
    match key.get(name) {
        Some(AttributeValue::S(v)) => v.clone(),
        _ => String::new(),
    }
}

/// The attachment records among `items`.
fn records(items: Vec<Item>) -> Result<Vec<AttachmentRecord>, ChatError> {
    items
        .into_iter()
        .filter(|i| matches!(i.get(keys::PK), Some(AttributeValue::S(pk)) if pk.starts_with("A#")))
        .map(from_item)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::config::http::HttpResponse;
    use aws_sdk_s3::error::{ErrorMetadata, SdkError};
    use aws_sdk_s3::operation::get_object::GetObjectError;
    use aws_sdk_s3::primitives::SdkBody;

    fn answered(status: u16) -> SdkError<GetObjectError, HttpResponse> {
        let response = HttpResponse::new(status.try_into().unwrap(), SdkBody::empty());
        SdkError::service_error(GetObjectError::generic(ErrorMetadata::default()), response)
    }

    /// S3 without an answer, or failing itself, is no fault of ours: `Unavailable` (a `503`, or a
    /// `429` before anything was written), never `500 internal`.
    #[test]
    fn s3_that_does_not_answer_or_fails_itself_is_unavailable() {
        let frozen: SdkError<GetObjectError, HttpResponse> = SdkError::timeout_error("frozen");
        assert_eq!(s3_error("GetObject", frozen), ChatError::Unavailable);
        assert_eq!(s3_error("GetObject", answered(503)), ChatError::Unavailable);
        assert_eq!(s3_error("GetObject", answered(500)), ChatError::Unavailable);
        assert!(matches!(
            s3_error("GetObject", answered(403)),
            ChatError::Internal(_)
        ));
    }
}
