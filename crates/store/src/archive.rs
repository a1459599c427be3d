//! The archive tier (docs/data-model.md §7 "Tiers"): a conversation's old messages as chunks in an
//! S3 bucket, each chunk one gzip-compressed JSON Lines object of the API's message objects, in
//! `seq` order, so that a conversation's chunks are also its export.
//!
//! Chunk boundaries are fixed: chunk `k` holds seqs `k × CHUNK + 1 ..= (k + 1) × CHUNK`, or, while
//! it is the conversation's last archived chunk, a prefix of them (a partial chunk). Its key names
//! the seqs it holds, `<conversationId>/<first>-<last>.jsonl.gz` (20-digit seqs), and an object is
//! never rewritten with other content under the same key: a longer prefix of the same chunk is a
//! new object. So the key of the chunk holding any seq `s ≤ archivedThrough` follows from
//! `archivedThrough` alone (`chunk_key`), with no listing and no index.

use std::io::{Read, Write};

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use chat_domain::error::ChatError;
use chat_domain::model::Message;
use chat_domain::ConversationId;

/// Seqs per chunk. A page (≤ 101 seqs) spans at most two chunks; at ~100 bytes a message
/// compressed, a full chunk is ~100 KB (S3's infrequent-access classes bill 128 KB at least).
pub const CHUNK: u64 = 1000;

/// The chunk index of a seq (≥ 1).
pub fn chunk_of(seq: u64) -> u64 {
    (seq.max(1) - 1) / CHUNK
}

/// The first seq of chunk `k`.
pub fn chunk_first(k: u64) -> u64 {
    k * CHUNK + 1
}

/// The last seq chunk `k` can hold.
pub fn chunk_end(k: u64) -> u64 {
    (k + 1) * CHUNK
}

/// The object key of the chunk holding `first..=last`.
pub fn object_key(id: &ConversationId, first: u64, last: u64) -> String {
    format!("{id}/{first:020}-{last:020}.jsonl.gz")
}

/// The key of the object that holds `seq` when the conversation is archived through
/// `archived_through`, and the seqs it holds (None: `seq` is not archived).
pub fn chunk_key(
    id: &ConversationId,
    seq: u64,
    archived_through: u64,
) -> Option<(String, u64, u64)> {
    if seq == 0 || seq > archived_through {
        return None;
    }
    let k = chunk_of(seq);
    let (first, last) = (chunk_first(k), chunk_end(k).min(archived_through));
    Some((object_key(id, first, last), first, last))
}

/// A chunk's bytes: gzip of one JSON object per line (the message as the API returns it).
pub fn encode(messages: &[Message]) -> Result<Vec<u8>, ChatError> {
    let mut lines = Vec::with_capacity(messages.len() * 160);
    for m in messages {
        serde_json::to_writer(&mut lines, m).map_err(ChatError::internal)?;
        lines.push(b'\n');
    }
    let mut gz = GzEncoder::new(Vec::with_capacity(lines.len() / 3), Compression::default());
    gz.write_all(&lines).map_err(ChatError::internal)?;
    gz.finish().map_err(ChatError::internal)
}

/// The messages of a chunk's bytes.
pub fn decode(bytes: &[u8]) -> Result<Vec<Message>, ChatError> {
    let mut text = String::new();
    GzDecoder::new(bytes)
        .read_to_string(&mut text)
        .map_err(|e| ChatError::internal(format!("archive chunk: {e}")))?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| ChatError::internal(format!("archive chunk: {e}")))
        })
        .collect()
}

/// Whether `messages` are exactly the seqs `first..=last` of conversation `id`, in order.
pub fn is_run(messages: &[Message], id: &ConversationId, first: u64, last: u64) -> bool {
    messages.len() as u64 == last + 1 - first
        && messages
            .iter()
            .zip(first..)
            .all(|(m, seq)| m.seq == seq && m.conversation_id == *id)
}

/// The archive bucket, reached through one S3 client built at init.
#[derive(Clone, Debug)]
pub struct Archive {
    s3: aws_sdk_s3::Client,
    bucket: String,
}

impl Archive {
    pub fn new(s3: aws_sdk_s3::Client, bucket: impl Into<String>) -> Self {
        Archive {
            s3,
            bucket: bucket.into(),
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The messages of one chunk object (None: no such object). 1 S3 GetObject.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<Message>>, ChatError> {
        Ok(self.get_tagged(key).await?.map(|(messages, _)| messages))
    }

    /// As `get`, with the object's ETag, for a rewrite that must not undo another
    /// (`put_over`). 1 S3 GetObject.
    pub async fn get_tagged(&self, key: &str) -> Result<Option<(Vec<Message>, String)>, ChatError> {
        let out = match self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => out,
            // 403 too: without ListBucket (not granted), S3 answers a missing key so.
            Err(e) if matches!(e.code(), Some("NoSuchKey" | "AccessDenied")) => return Ok(None),
            Err(e) => return Err(s3_error("GetObject", e)),
        };
        let etag = out.e_tag().unwrap_or_default().to_owned();
        let bytes = out.body.collect().await.map_err(|e| {
            tracing::warn!(error = %e, key, "archive read cut short");
            ChatError::Unavailable
        })?;
        Ok(Some((decode(&bytes.into_bytes())?, etag)))
    }

    /// Replaces a chunk object only if it is still the version `etag` names (S3 conditional
    /// write, `If-Match`): false when it changed or is gone meanwhile (another rewrite, or the
    /// archiver removed a superseded chunk), and nothing was written. 1 S3 PutObject.
    pub async fn put_over(&self, key: &str, etag: &str, bytes: Vec<u8>) -> Result<bool, ChatError> {
        match self.put_chunk(key, bytes).if_match(etag).send().await {
            Ok(_) => Ok(true),
            // 412: another version; 404: gone; 409: a conditional write raced this one.
            Err(e)
                if matches!(
                    e.code(),
                    Some("PreconditionFailed" | "NoSuchKey" | "ConditionalRequestConflict")
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(s3_error("PutObject", e)),
        }
    }

    /// Stores a chunk object. 1 S3 PutObject.
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), ChatError> {
        self.put_chunk(key, bytes)
            .send()
            .await
            .map_err(|e| s3_error("PutObject", e))?;
        Ok(())
    }

    /// The PutObject of a chunk (gzip JSON Lines), for `put` and `put_over`.
    fn put_chunk(
        &self,
        key: &str,
        bytes: Vec<u8>,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type("application/x-ndjson")
            .content_encoding("gzip")
            .body(ByteStream::from(bytes))
    }

    /// Deletes a chunk object no seq is found in any more (deleting a missing key succeeds).
    /// 1 S3 DeleteObject.
    pub async fn delete(&self, key: &str) -> Result<(), ChatError> {
        self.s3
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| s3_error("DeleteObject", e))?;
        Ok(())
    }
}

/// An S3 failure: the archive did not answer as it should, which the client sees as `503
/// unavailable` (retry later), never a bare 500. Details go to the log.
fn s3_error<E, R>(op: &str, err: SdkError<E, R>) -> ChatError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    tracing::warn!(op, error = %aws_sdk_s3::error::DisplayErrorContext(&err), "archive call failed");
    ChatError::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;
    use chat_domain::UserId;

    fn message(id: &ConversationId, seq: u64, body: &str) -> Message {
        Message::new(
            id.clone(),
            seq,
            format!("00000000-0000-4000-8000-{seq:012}"),
            UserId::parse("u1").unwrap(),
            body.into(),
            "2026-01-01T00:00:00.000Z".into(),
        )
    }

    #[test]
    fn a_chunk_is_gzip_json_lines_of_the_api_messages() {
        let id = ConversationId::parse("d-00000000000000000000000000000001").unwrap();
        let messages: Vec<Message> = (1..=3)
            .map(|s| message(&id, s, "\"quoted\"\nnewline 日本 <script>"))
            .collect();
        let bytes = encode(&messages).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
        let mut text = String::new();
        GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.lines().count(), 3, "one object per line: {text}");
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["seq"], 1);
        assert_eq!(first["conversationId"], id.as_str());
        assert_eq!(first["body"], "\"quoted\"\nnewline 日本 <script>");
        assert_eq!(decode(&bytes).unwrap(), messages);
        assert!(is_run(&messages, &id, 1, 3));
        assert!(!is_run(&messages, &id, 1, 4));
        assert!(!is_run(&messages[1..], &id, 1, 2));
        assert!(decode(b"not gzip").is_err());
    }

    #[test]
    fn the_key_of_any_archived_seq_follows_from_archived_through() {
        let id = ConversationId::parse("d-00000000000000000000000000000001").unwrap();
        assert_eq!(chunk_key(&id, 5, 0), None);
        assert_eq!(chunk_key(&id, 0, 10), None);
        assert_eq!(chunk_key(&id, 11, 10), None);
        let (key, first, last) = chunk_key(&id, 5, 249).unwrap();
        assert_eq!((first, last), (1, 249));
        assert_eq!(
            key,
            "d-00000000000000000000000000000001/00000000000000000001-00000000000000000249.jsonl.gz"
        );
        // A complete chunk's key does not move when later chunks are archived.
        assert_eq!(
            chunk_key(&id, CHUNK, 2500).unwrap().1..=chunk_key(&id, CHUNK, 2500).unwrap().2,
            1..=CHUNK
        );
        assert_eq!(chunk_key(&id, CHUNK + 1, 2500).unwrap().1, CHUNK + 1);
        assert_eq!(chunk_key(&id, 2400, 2500).unwrap().2, 2500);
        assert_eq!(chunk_of(CHUNK), 0);
        assert_eq!(chunk_of(CHUNK + 1), 1);
    }
}
