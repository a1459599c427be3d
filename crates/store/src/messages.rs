//! `history` (docs/api.md §11), and reading committed messages back for the relay.

use super::attrs::{get_s, Item};
use super::changes::apply_reactions;
use super::items::{from_item, ConversationItem};
use super::{keys, ChatStore, PartitionQuery};
use chat_domain::error::ChatError;
use chat_domain::model::{HistoryPage, Message};
use chat_domain::requests::{HistoryCursor, HistoryQuery};
use chat_domain::{ConversationId, UserId};

impl ChatStore {
    /// `history`. DynamoDB: a BatchGetItem of the conversation (for `lastSeq` and
    /// `archivedThrough`) and the caller's member item, then the Query of the page (more pages
    /// only when the page's messages pass 1 MB) and, at the same time, the Query of the page's
    /// reaction counts: 2 round trips. One after the other: a caller that is not a
    /// member makes nothing read but those two small items (run at once, a non-member could have
    /// 100 messages read per request).
    ///
    /// Across the tiers (docs/data-model.md §7): a page whose seqs are all archived skips the
    /// Query and reads its chunks from S3 instead (≤ 2 GetObject: a page spans at most two
    /// chunks); a page across the boundary makes both reads. A seq of the page that the Query
    /// did not find was archived (possibly since the conversation was read): it is read from
    /// its chunk, found from a fresh `archivedThrough` (+1 GetItem) when the one read is behind.
    /// An archive that does not answer is `Unavailable` (503).
    pub async fn history(
        &self,
        caller: &UserId,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<HistoryPage, ChatError> {
        let wanted = vec![keys::conversation_key(id), keys::member_key(id, caller)];
        let found = self.batch_get(wanted, true).await?;
        let conversation: Option<ConversationItem> = found
            .iter()
            .find(|i| get_s(i, keys::SK) == Some(keys::CONVERSATION_SK))
            .cloned()
            .map(from_item)
            .transpose()?;
        let is_member = found
            .iter()
            .any(|i| get_s(i, keys::SK).is_some_and(|sk| sk.starts_with(keys::MEMBER_SK_PREFIX)));
        let (Some(conversation), true) = (conversation, is_member) else {
            return Err(ChatError::NotFound);
        };
        // The page's counts (docs/data-model.md §8.3), read beside its messages, at once.
        let (from, to) = counts_range(q, conversation.last_seq);
        let counts = self.reactions_between(id, from, to);
        #[cfg(feature = "archive")]
        if let Some(archive) = self.archive.as_ref() {
            let (mut page, counts) =
                tokio::try_join!(self.page_across_tiers(archive, id, q, conversation), counts)?;
            page.messages = apply_reactions(page.messages, &counts);
            return Ok(page);
        }
        let ((messages, has_more), counts) = tokio::try_join!(self.query_messages(id, q), counts)?;
        let mut messages = apply_reactions(messages, &counts);
        // A message committed between the two reads is in the page but not in the lastSeq
        // read before it. Report the larger.
        let last_seq = conversation
            .last_seq
            .max(messages.iter().map(|m| m.seq).max().unwrap_or(0));
        messages.sort_by_key(|m| m.seq);
        Ok(HistoryPage {
            messages,
            last_seq,
            has_more,
        })
    }

    /// `history`'s page when an archive tier is configured: the page's window from both tiers.
    #[cfg(feature = "archive")]
    async fn page_across_tiers(
        &self,
        archive: &super::archive::Archive,
        id: &ConversationId,
        q: HistoryQuery,
        conversation: ConversationItem,
    ) -> Result<HistoryPage, ChatError> {
        let archived = conversation.archived_through;
        let found = if window_is_archived(q, conversation.last_seq, archived) {
            Vec::new()
        } else {
            self.query_messages_untruncated(id, q).await?
        };
        let highest = found.iter().map(|m| m.seq).max().unwrap_or(0);
        let window = page_window(q, conversation.last_seq.max(highest));
        let mut page: std::collections::BTreeMap<u64, Message> = found
            .into_iter()
            .filter(|m| window.contains(&m.seq))
            .map(|m| (m.seq, m))
            .collect();
        let missing: Vec<u64> = window.clone().filter(|s| !page.contains_key(s)).collect();
        if let (Some(&from), Some(&to)) = (missing.first(), missing.last()) {
            for m in self
                .archived_messages(archive, id, from..=to, archived)
                .await?
            {
                page.entry(m.seq).or_insert(m);
            }
            if let Some(lost) = window.clone().find(|s| !page.contains_key(s)) {
                tracing::error!(conversation = %id, seq = lost, "message in neither tier");
                return Err(ChatError::Unavailable);
            }
        }
        let mut messages: Vec<Message> = page.into_values().collect();
        let limit = q.limit as usize;
        let has_more = messages.len() > limit;
        if has_more {
            // The extra one is the farthest in the direction of travel.
            match q.cursor {
                HistoryCursor::After(_) => {
                    messages.truncate(limit);
                }
                _ => {
                    messages.remove(0);
                }
            }
        }
        let last_seq = conversation
            .last_seq
            .max(messages.last().map_or(0, |m| m.seq));
        Ok(HistoryPage {
            messages,
            last_seq,
            has_more,
        })
    }

    /// One archived message, from its chunk (1 S3 GetObject; +1 GetItem of `archivedThrough`
    /// when `archived`, as read, is behind it or its chunk was just superseded). `503` when its
    /// chunk cannot be read.
    #[cfg(feature = "archive")]
    pub(crate) async fn archived_message(
        &self,
        id: &ConversationId,
        seq: u64,
        archived: u64,
    ) -> Result<Message, ChatError> {
        let archive = self.archive.as_ref().ok_or(ChatError::Unavailable)?;
        self.archived_messages(archive, id, seq..=seq, archived)
            .await?
            .into_iter()
            .find(|m| m.seq == seq)
            .ok_or(ChatError::Unavailable)
    }

    #[cfg(not(feature = "archive"))]
    pub(crate) async fn archived_message(
        &self,
        _id: &ConversationId,
        _seq: u64,
        _archived: u64,
    ) -> Result<Message, ChatError> {
        Err(ChatError::internal("archive tier not compiled in"))
    }

    #[cfg(feature = "archive")]
    /// The archived messages `seqs` (all archived), from the ≤ 2 chunks holding them: 1 S3
    /// GetObject per chunk. When `archived` (as read) is behind them, or a partial chunk was
    /// just superseded by a longer one, +1 GetItem of `archivedThrough` and the read again.
    pub(crate) async fn archived_messages(
        &self,
        archive: &super::archive::Archive,
        id: &ConversationId,
        seqs: std::ops::RangeInclusive<u64>,
        mut archived: u64,
    ) -> Result<Vec<Message>, ChatError> {
        for attempt in 0..3 {
            if attempt > 0 || *seqs.end() > archived {
                archived = self.archived_through(id).await?;
            }
            let mut out = Vec::new();
            let mut seq = *seqs.start();
            let mut complete = true;
            while seq <= *seqs.end() {
                let Some((key, _, last)) = super::archive::chunk_key(id, seq, archived) else {
                    complete = false;
                    break;
                };
                match archive.get(&key).await? {
                    Some(chunk) => out.extend(chunk.into_iter().filter(|m| seqs.contains(&m.seq))),
                    None => {
                        complete = false;
                        break;
                    }
                }
                seq = last + 1;
            }
            if complete {
                return Ok(out);
            }
        }
        Ok(Vec::new())
    }

    #[cfg(feature = "archive")]
    /// The conversation's `archivedThrough` (0: nothing archived or no conversation). 1 strongly
    /// consistent GetItem.
    pub(crate) async fn archived_through(&self, id: &ConversationId) -> Result<u64, ChatError> {
        let item = self
            .conversation_fields(id, Some("archivedThrough"))
            .await?;
        Ok(item
            .as_ref()
            .and_then(|i| super::attrs::get_n(i, "archivedThrough"))
            .unwrap_or(0))
    }

    #[cfg(feature = "archive")]
    /// The Query of a page (see `query_messages`), with the extra item that tells whether there
    /// is more kept.
    async fn query_messages_untruncated(
        &self,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<Vec<Message>, ChatError> {
        let (messages, _) = self
            .query_messages(
                id,
                HistoryQuery {
                    limit: q.limit + 1,
                    ..q
                },
            )
            .await?;
        Ok(messages)
    }

    /// One page of messages in the direction of travel, and whether more exist beyond it.
    async fn query_messages(
        &self,
        id: &ConversationId,
        q: HistoryQuery,
    ) -> Result<(Vec<Message>, bool), ChatError> {
        let limit = q.limit as usize;
        let (from, to, forward) = match q.cursor {
            HistoryCursor::Newest => (
                keys::FIRST_MESSAGE_SK.to_owned(),
                keys::LAST_MESSAGE_SK.to_owned(),
                false,
            ),
            HistoryCursor::Before(b) if b <= 1 => return Ok((vec![], false)),
            HistoryCursor::Before(b) => (
                keys::FIRST_MESSAGE_SK.to_owned(),
                keys::message_sk(b - 1),
                false,
            ),
            HistoryCursor::After(a) if a == u64::MAX => return Ok((vec![], false)),
            HistoryCursor::After(a) => (
                keys::message_sk(a + 1),
                keys::LAST_MESSAGE_SK.to_owned(),
                true,
            ),
        };
        // One more than the page tells whether there is more.
        let mut items: Vec<Item> = Vec::with_capacity(limit + 1);
        let page = PartitionQuery {
            pk: keys::conversation_pk(id),
            range: Some((from, to)),
            page: Some(limit as i32 + 1),
            descending: !forward,
            ..Default::default()
        };
        self.query_each(page, |item| {
            items.push(item);
            Ok(items.len() <= limit)
        })
        .await?;
        let has_more = items.len() > limit;
        items.truncate(limit);
        let messages = items
            .into_iter()
            .map(from_item::<Message, _>)
            .collect::<Result<_, _>>()?;
        Ok((messages, has_more))
    }

    /// Messages `from..=to` of a conversation, in seq order (those that exist). DynamoDB: 1
    /// strongly consistent Query (more pages past 1 MB).
    pub async fn messages_between(
        &self,
        id: &ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<Message>, ChatError> {
        let range = (keys::message_sk(from), keys::message_sk(to));
        self.conversation_range(id, range, None)
            .await?
            .into_iter()
            .map(from_item::<Message, _>)
            .collect()
    }
}

/// The seqs whose counts a page needs: the page's window as `lastSeq` (as read) puts it, and,
/// paging from the newest (or from a `beforeSeq` beyond `lastSeq`), every message committed
/// since. A `beforeSeq` far above `lastSeq` pages from the newest message, so its window starts
/// `limit` below `lastSeq`, not below `beforeSeq`.
fn counts_range(q: HistoryQuery, last_seq: u64) -> (u64, u64) {
    let limit = u64::from(q.limit);
    let from_top = |top: u64| (top + 1).saturating_sub(limit).max(1);
    match q.cursor {
        HistoryCursor::Newest => (from_top(last_seq), u64::MAX),
        HistoryCursor::Before(b) => {
            let top = b.saturating_sub(1);
            (from_top(top.min(last_seq)), top)
        }
        HistoryCursor::After(a) => (a.saturating_add(1), a.saturating_add(limit + 1)),
    }
}

#[cfg(feature = "archive")]
/// Whether every seq a page can show is archived (through `archived`), so that the Query of the
/// table can be skipped: the page reads its chunks only.
fn window_is_archived(q: HistoryQuery, last_seq: u64, archived: u64) -> bool {
    if archived == 0 {
        return false;
    }
    match q.cursor {
        HistoryCursor::Newest => last_seq <= archived,
        HistoryCursor::Before(b) => b.saturating_sub(1) <= archived,
        HistoryCursor::After(a) => a.saturating_add(1 + u64::from(q.limit)) <= archived,
    }
}

#[cfg(feature = "archive")]
/// The seqs a page shows, plus the one beyond it that tells `hasMore` (seqs are gap-free, so
/// they follow from `last_seq`, the highest seq known to exist).
fn page_window(q: HistoryQuery, last_seq: u64) -> std::ops::RangeInclusive<u64> {
    let limit = u64::from(q.limit);
    let down = |top: u64| top.saturating_sub(limit).max(1)..=top;
    match q.cursor {
        HistoryCursor::Newest => down(last_seq),
        HistoryCursor::Before(b) => down(b.saturating_sub(1).min(last_seq)),
        HistoryCursor::After(a) => {
            a.saturating_add(1)..=a.saturating_add(1).saturating_add(limit).min(last_seq)
        }
    }
}

#[cfg(all(test, feature = "archive"))]
mod tests {
    use super::*;

    fn q(cursor: HistoryCursor, limit: u32) -> HistoryQuery {
        HistoryQuery { cursor, limit }
    }

    #[test]
    fn a_page_window_is_the_page_and_one_more() {
        assert_eq!(page_window(q(HistoryCursor::Newest, 50), 250), 200..=250);
        assert_eq!(page_window(q(HistoryCursor::Newest, 50), 30), 1..=30);
        assert!(page_window(q(HistoryCursor::Newest, 50), 0).is_empty());
        assert_eq!(
            page_window(q(HistoryCursor::Before(101), 50), 250),
            50..=100
        );
        assert_eq!(
            page_window(q(HistoryCursor::Before(900), 50), 250),
            200..=250
        );
        assert!(page_window(q(HistoryCursor::Before(1), 50), 250).is_empty());
        assert_eq!(page_window(q(HistoryCursor::After(10), 50), 250), 11..=61);
        assert_eq!(
            page_window(q(HistoryCursor::After(240), 50), 250),
            241..=250
        );
        assert!(page_window(q(HistoryCursor::After(250), 50), 250).is_empty());
        assert!(page_window(q(HistoryCursor::After(u64::MAX), 50), 250).is_empty());
    }

    #[test]
    fn only_a_page_wholly_archived_skips_the_table() {
        // (cursor, lastSeq, archivedThrough, skips the table)
        let cases = [
            (HistoryCursor::Newest, 0, 0, false),
            (HistoryCursor::Newest, 250, 249, false),
            (HistoryCursor::Newest, 250, 250, true),
            (HistoryCursor::Before(250), 250, 249, true),
            (HistoryCursor::Before(251), 250, 249, false),
            (HistoryCursor::After(198), 250, 249, true),
            (HistoryCursor::After(199), 250, 249, false),
        ];
        for (cursor, last_seq, archived, skips) in cases {
            assert_eq!(
                window_is_archived(q(cursor, 50), last_seq, archived),
                skips,
                "{cursor:?} at lastSeq {last_seq}, archived through {archived}"
            );
        }
    }
}
