//! Message changes (docs/api.md §13, docs/data-model.md §8): edits, deletions and reactions, and
//! the rules that decide them. A change is numbered by the conversation's second gap-free
//! sequence, `changeSeq`; what a change may do is decided here, from what was read, and the store
//! turns the decision into one transaction.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::ChatError;
use crate::ids::{hex_digest, ConversationId, UserId};
use crate::message::check_body;
use crate::model::{ChangeEntry, Message, ReactionCount};
use crate::requests::{page_limit, parse_uuid, Fields, QueryParams};

pub const MAX_REACTION_CHARS: usize = 32;
/// Distinct reactions one member may have on one message.
pub const MAX_REACTIONS_PER_MEMBER: usize = 20;
pub const DEFAULT_CHANGES_LIMIT: u32 = 50;
pub const DEFAULT_REACTORS_LIMIT: u32 = 50;

/// What a change did (its `type` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChangeKind {
    #[serde(rename = "message.edited")]
    Edited,
    #[serde(rename = "message.deleted")]
    Deleted,
    #[serde(rename = "reaction.added")]
    ReactionAdded,
    #[serde(rename = "reaction.removed")]
    ReactionRemoved,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Edited => "message.edited",
            ChangeKind::Deleted => "message.deleted",
            ChangeKind::ReactionAdded => "reaction.added",
            ChangeKind::ReactionRemoved => "reaction.removed",
        }
    }
}

fn invalid(msg: impl Into<String>) -> ChatError {
    ChatError::invalid(msg)
}

/// One change as the log records it: what, to which message, by whom, when; no content, so a
/// deletion has nothing to erase here. The change log lists it with its message as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    pub conversation_id: ConversationId,
    pub change_seq: u64,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    pub seq: u64,
    pub user_id: UserId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction: Option<String>,
    pub at: String,
}

impl ChangeRecord {
    /// The change as the API lists it, with the message as it is now.
    pub fn entry(&self, message: Message) -> ChangeEntry {
        ChangeEntry {
            change_seq: self.change_seq,
            kind: self.kind,
            seq: self.seq,
            user_id: self.user_id.clone(),
            reaction: self.reaction.clone(),
            at: self.at.clone(),
            message,
        }
    }
}

/// The `{seq}` of a message path: a positive integer (`400` otherwise).
pub fn message_seq_param(raw: Option<&str>) -> Result<u64, ChatError> {
    raw.filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .ok_or_else(|| invalid("path parameter `seq` must be a positive integer"))
}

/// A reaction: an emoji or a short name, 1–32 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Reaction(String);

impl Reaction {
    /// `what` names the parameter in the error (`reaction`).
    pub fn parse(s: &str, what: &str) -> Result<Reaction, ChatError> {
        let chars = s.chars().count();
        if chars == 0 || chars > MAX_REACTION_CHARS || s.chars().any(char::is_control) {
            return Err(invalid(format!(
                "{what} `reaction` must be 1 to {MAX_REACTION_CHARS} characters, without control characters"
            )));
        }
        Ok(Reaction(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `PATCH …/messages/{seq}`: `{"clientChangeId","body"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditMessage {
    /// Lower-case form: the idempotency key.
    pub client_change_key: String,
    pub body: String,
}

impl EditMessage {
    pub fn parse(body: &[u8]) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        let client_change_key = parse_uuid("clientChangeId", f.required_str("clientChangeId")?)?;
        let text = f.required_str("body")?;
        // Empty only for a message with attachments, as a send (`check_edit`).
        if !text.is_empty() {
            check_body(text)?;
        }
        Ok(EditMessage {
            client_change_key,
            body: text.to_owned(),
        })
    }
}

/// `DELETE …/messages/{seq}?clientChangeId=`: its idempotency key (lower case).
pub fn parse_delete(q: &dyn QueryParams) -> Result<String, ChatError> {
    let raw = q
        .one("clientChangeId")?
        .ok_or_else(|| invalid("query parameter `clientChangeId` is required (a UUID)"))?;
    parse_uuid("clientChangeId", raw)
}

/// `GET …/changes?afterChange=&limit=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangesQuery {
    pub after: u64,
    pub limit: u32,
}

impl ChangesQuery {
    pub fn parse(q: &dyn QueryParams) -> Result<Self, ChatError> {
        let after = match q.one("afterChange")? {
            None => 0,
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    invalid("query parameter `afterChange` must be a non-negative integer")
                })?,
        };
        Ok(ChangesQuery {
            after,
            limit: page_limit(q, DEFAULT_CHANGES_LIMIT)?,
        })
    }
    /// A page's `hasMore`: its log Query found more than the page holds, or the change head,
    /// read beside the Query, names a change past the page's last (`page_last`; none: the
    /// query's `after`) that the Query did not see yet (found by probing: `hasMore: false`
    /// under a `lastChange` past the page, and a client paging "while hasMore" stopped short).
    pub fn has_more(
        &self,
        query_found_more: bool,
        last_change: u64,
        page_last: Option<u64>,
    ) -> bool {
        query_found_more || last_change > page_last.unwrap_or(self.after)
    }
}

/// `GET …/messages/{seq}/reactions?reaction=&limit=&cursor=`: who reacted, by user then reaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactorsQuery {
    pub reaction: Option<Reaction>,
    pub limit: u32,
    /// The last (user, reaction) a previous page showed.
    pub after: Option<(UserId, String)>,
}

impl ReactorsQuery {
    pub fn parse(q: &dyn QueryParams) -> Result<Self, ChatError> {
        let reaction = q
            .one("reaction")?
            .map(|r| Reaction::parse(r, "query parameter"))
            .transpose()?;
        let after = q.one("cursor")?.map(decode_reactor_cursor).transpose()?;
        Ok(ReactorsQuery {
            reaction,
            limit: page_limit(q, DEFAULT_REACTORS_LIMIT)?,
            after,
        })
    }
}

/// The opaque cursor of a reactions page: the last (user, reaction) shown.
pub fn reactor_cursor(user: &UserId, reaction: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}\n{reaction}", user.as_str()))
}

fn decode_reactor_cursor(cursor: &str) -> Result<(UserId, String), ChatError> {
    let bad = || invalid("query parameter `cursor` is malformed");
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (user, reaction) = text.split_once('\n').ok_or_else(bad)?;
    let user = UserId::parse(user).ok_or_else(bad)?;
    Reaction::parse(reaction, "query parameter").map_err(|_| bad())?;
    Ok((user, reaction.to_owned()))
}

/// What identifies an edit or a deletion, so that its `clientChangeId` used again for anything
/// else (another body, seq, kind or caller) is a conflict rather than a replay.
pub fn change_fingerprint(kind: ChangeKind, seq: u64, caller: &UserId, body: &str) -> String {
    hex_digest(&[kind.as_str(), &seq.to_string(), caller.as_str(), body])
}

/// A replayed `clientChangeId`: the same change again answers as the first did; anything else
/// is `409`.
pub fn check_replay(stored: &str, fingerprint: &str) -> Result<(), ChatError> {
    if stored == fingerprint {
        Ok(())
    } else {
        Err(ChatError::Conflict(
            "`clientChangeId` was already used for a different change".into(),
        ))
    }
}

/// What an edit or a deletion knows of its message when it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub caller: &'a UserId,
    /// The group's owner (None for a direct conversation).
    pub owner: Option<&'a UserId>,
    /// The group's admins (none for a direct conversation).
    pub admins: &'a [UserId],
    /// The caller's token is a moderator's (docs/api.md §30).
    pub moderator: bool,
    pub message: &'a Message,
    /// Older than the archive age, or already in the archive tier.
    pub archived: bool,
}

/// Whether the caller may edit the message: the sender only (`403`), not once deleted or
/// archived (`409`).
pub fn check_edit(t: &Target, body: &str) -> Result<(), ChatError> {
    if t.caller != &t.message.sender_id {
        return Err(ChatError::Forbidden(
            "only the sender may edit a message".into(),
        ));
    }
    if t.message.deleted {
        return Err(ChatError::Conflict(
            "the message is deleted and cannot be edited".into(),
        ));
    }
    if t.archived {
        return Err(ChatError::Conflict(
            "the message is older than the archive age and cannot be edited".into(),
        ));
    }
    // As for a send: a body may be empty only beside attachments (a caption removed).
    if body.is_empty() && t.message.attachments.is_empty() {
        return Err(ChatError::invalid("field `body` must not be empty"));
    }
    Ok(())
}

/// Whether the caller may delete the message (the sender, the group's owner or an admin, or a
/// moderator: else `403`), and whether that changes anything (deleting a deleted message does
/// not).
pub fn check_delete(t: &Target) -> Result<bool, ChatError> {
    let manager = crate::conversation::is_manager(t.caller, t.owner, t.admins);
    if t.caller != &t.message.sender_id && !manager && !t.moderator {
        return Err(ChatError::Forbidden(
            "only the sender, the group's owner or an admin, or a moderator may delete a message"
                .into(),
        ));
    }
    Ok(!t.message.deleted)
}

/// The message after an edit (`version` + 1).
pub fn edited(m: &Message, body: &str, at: &str) -> Message {
    Message {
        body: body.to_owned(),
        version: m.version + 1,
        edited_at: Some(at.to_owned()),
        ..m.clone()
    }
}

/// The answer to an edit replayed with its `clientChangeId`: the same message the edit
/// answered (its body, `version` and `editedAt`, as recorded with its key), with the counts of
/// now; a message deleted since answers its tombstone (the content is gone for good).
pub fn replayed_edit(now: &Message, body: &str, version: u64, at: Option<&str>) -> Message {
    if now.deleted || version == 0 {
        return now.clone();
    }
    Message {
        body: body.to_owned(),
        version,
        edited_at: at.map(str::to_owned),
        ..now.clone()
    }
}

/// A member's reactions to one message after adding (`add`) or removing `reaction`: None when
/// that changes nothing (already there, or not there). A 21st distinct one is `409`.
pub fn react(
    current: &[String],
    reaction: &Reaction,
    add: bool,
) -> Result<Option<Vec<String>>, ChatError> {
    let has = current.iter().any(|r| r == reaction.as_str());
    match (add, has) {
        (true, true) | (false, false) => Ok(None),
        (true, false) if current.len() >= MAX_REACTIONS_PER_MEMBER => {
            Err(ChatError::Conflict(format!(
                "a member may have at most {MAX_REACTIONS_PER_MEMBER} distinct reactions on a message"
            )))
        }
        (true, false) => Ok(Some(
            current
                .iter()
                .cloned()
                .chain([reaction.as_str().to_owned()])
                .collect(),
        )),
        (false, true) => Ok(Some(
            current
                .iter()
                .filter(|r| *r != reaction.as_str())
                .cloned()
                .collect(),
        )),
    }
}

/// A message's counts after one member's reaction was added (+1) or removed (−1).
pub fn recount(counts: &mut BTreeMap<String, u64>, reaction: &Reaction, add: bool) {
    let n = counts.entry(reaction.as_str().to_owned()).or_insert(0);
    *n = if add { *n + 1 } else { n.saturating_sub(1) };
    if *n == 0 {
        counts.remove(reaction.as_str());
    }
}

/// Counts as the API lists them: most first, then by reaction; none at zero.
pub fn reaction_counts(counts: &BTreeMap<String, u64>) -> Vec<ReactionCount> {
    let mut out: Vec<ReactionCount> = counts
        .iter()
        .filter(|(_, &c)| c > 0)
        .map(|(r, &c)| ReactionCount {
            reaction: r.clone(),
            count: c,
        })
        .collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.reaction.cmp(&b.reaction))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_more_when_its_query_or_the_head_says_so() {
        let q = ChangesQuery {
            after: 10,
            limit: 5,
        };
        assert!(
            q.has_more(true, 15, Some(15)),
            "a full page with one more behind it"
        );
        assert!(
            q.has_more(false, 13, Some(12)),
            "the head saw change 13, the Query did not"
        );
        assert!(
            q.has_more(false, 11, None),
            "an empty page under a newer head"
        );
        assert!(!q.has_more(false, 12, Some(12)), "all of it");
        assert!(!q.has_more(false, 10, None), "nothing after");
        assert!(!q.has_more(false, 3, None), "afterChange past lastChange");
    }
    use std::collections::HashMap;

    fn user(u: &str) -> UserId {
        UserId::parse(u).unwrap()
    }

    fn message(sender: &str) -> Message {
        Message::new(
            ConversationId::parse("g-0000000000000000000000000000000c").unwrap(),
            7,
            "id".into(),
            user(sender),
            "hello".into(),
            "t".into(),
        )
    }

    fn target<'a>(caller: &'a UserId, owner: Option<&'a UserId>, m: &'a Message) -> Target<'a> {
        Target {
            caller,
            owner,
            admins: &[],
            moderator: false,
            message: m,
            archived: false,
        }
    }

    #[test]
    fn only_the_sender_edits_and_not_a_deleted_or_archived_message() {
        let (alice, bob) = (user("alice"), user("bob"));
        let m = message("alice");
        assert!(check_edit(&target(&alice, None, &m), "x").is_ok());
        assert_eq!(
            check_edit(&target(&bob, Some(&bob), &m), "x")
                .unwrap_err()
                .status(),
            403
        );
        let gone = Message {
            deleted: true,
            ..m.clone()
        };
        assert_eq!(
            check_edit(&target(&alice, None, &gone), "x")
                .unwrap_err()
                .status(),
            409
        );
        let old = Target {
            archived: true,
            ..target(&alice, None, &m)
        };
        assert_eq!(check_edit(&old, "x").unwrap_err().status(), 409);
        // An empty body, as for a send, only beside attachments (found by probing: a caption
        // could not be removed).
        assert_eq!(
            check_edit(&target(&alice, None, &m), "")
                .unwrap_err()
                .status(),
            400
        );
        let with = Message {
            attachments: vec![crate::attachments::Attachment::fixture("a")],
            ..m.clone()
        };
        assert!(check_edit(&target(&alice, None, &with), "").is_ok());
        assert!(EditMessage::parse(
            br#"{"clientChangeId":"7c9e6679-7425-40de-944b-e07fc1f90ae7","body":""}"#
        )
        .is_ok());
    }

    #[test]
    fn the_sender_or_the_owner_deletes_and_a_second_deletion_changes_nothing() {
        let (alice, bob, owner) = (user("alice"), user("bob"), user("owner"));
        let m = message("alice");
        assert_eq!(check_delete(&target(&alice, None, &m)), Ok(true));
        assert_eq!(check_delete(&target(&owner, Some(&owner), &m)), Ok(true));
        assert_eq!(
            check_delete(&target(&bob, Some(&owner), &m))
                .unwrap_err()
                .status(),
            403
        );
        let admins = [bob.clone()];
        let by_admin = Target {
            admins: &admins,
            ..target(&bob, Some(&owner), &m)
        };
        assert_eq!(check_delete(&by_admin), Ok(true));
        let by_moderator = Target {
            moderator: true,
            ..target(&bob, None, &m)
        };
        assert_eq!(check_delete(&by_moderator), Ok(true));
        let gone = m.tombstone();
        assert_eq!(check_delete(&target(&alice, None, &gone)), Ok(false));
        assert_eq!(
            (gone.body.as_str(), gone.version, gone.deleted),
            ("", 2, true)
        );
    }

    #[test]
    fn an_edit_bumps_the_version_and_keeps_the_rest() {
        let m = edited(&message("alice"), "new", "t2");
        assert_eq!(
            (m.body.as_str(), m.version, m.edited_at.as_deref(), m.seq),
            ("new", 2, Some("t2"), 7)
        );
        assert_eq!(edited(&m, "again", "t3").version, 3);
    }

    #[test]
    fn a_replayed_edit_answers_as_the_edit_did_unless_deleted_since() {
        let first = edited(&message("alice"), "one", "t1");
        let later = edited(&first, "two", "t2");
        assert_eq!(replayed_edit(&later, "one", 2, Some("t1")), first);
        assert_eq!(replayed_edit(&later, "two", 3, Some("t2")), later);
        let gone = later.tombstone();
        assert_eq!(replayed_edit(&gone, "one", 2, Some("t1")), gone);
    }

    #[test]
    fn reactions_change_only_what_is_not_already_so_and_at_most_twenty() {
        let up = Reaction::parse("👍", "path parameter").unwrap();
        assert_eq!(react(&[], &up, true), Ok(Some(vec!["👍".to_owned()])));
        assert_eq!(react(&["👍".to_owned()], &up, true), Ok(None));
        assert_eq!(react(&[], &up, false), Ok(None));
        assert_eq!(
            react(&["x".to_owned(), "👍".to_owned()], &up, false),
            Ok(Some(vec!["x".to_owned()]))
        );
        let twenty: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        assert_eq!(react(&twenty, &up, true).unwrap_err().status(), 409);
        // Removing one of twenty is always allowed.
        let nineteen = react(&twenty, &Reaction::parse("3", "p").unwrap(), false);
        assert_eq!(nineteen.unwrap().unwrap().len(), 19);
    }

    #[test]
    fn counts_go_up_and_down_and_list_most_first() {
        let (a, b) = (
            Reaction::parse("a", "p").unwrap(),
            Reaction::parse("b", "p").unwrap(),
        );
        let mut counts = BTreeMap::new();
        recount(&mut counts, &a, true);
        recount(&mut counts, &b, true);
        recount(&mut counts, &b, true);
        let listed = reaction_counts(&counts);
        assert_eq!(
            listed
                .iter()
                .map(|c| (c.reaction.as_str(), c.count))
                .collect::<Vec<_>>(),
            vec![("b", 2), ("a", 1)]
        );
        recount(&mut counts, &a, false);
        recount(&mut counts, &a, false);
        assert_eq!(reaction_counts(&counts).len(), 1);
        assert!(!counts.contains_key("a"));
    }

    #[test]
    fn reactions_are_one_to_thirty_two_characters_without_control_characters() {
        assert!(Reaction::parse("👍", "p").is_ok());
        assert!(Reaction::parse(&"😀".repeat(32), "p").is_ok());
        assert_eq!(
            Reaction::parse(&"x".repeat(33), "p").unwrap_err().status(),
            400
        );
        assert!(Reaction::parse("", "p").is_err());
        assert!(Reaction::parse("a\nb", "p").is_err());
    }

    #[test]
    fn requests_are_validated() {
        assert_eq!(message_seq_param(Some("42")), Ok(42));
        for bad in [
            None,
            Some(""),
            Some("0"),
            Some("-1"),
            Some("1.5"),
            Some("x"),
        ] {
            assert_eq!(message_seq_param(bad).unwrap_err().status(), 400, "{bad:?}");
        }
        let id = "6F1C2A1E-98C1-4D6B-9A51-0E4B7C1D2E3F";
        let edit =
            EditMessage::parse(format!(r#"{{"clientChangeId":"{id}","body":"x"}}"#).as_bytes())
                .unwrap();
        assert_eq!(edit.client_change_key, id.to_ascii_lowercase());
        // An empty body is the message's business (`check_edit`: only beside attachments).
        assert!(
            EditMessage::parse(format!(r#"{{"clientChangeId":"{id}","body":""}}"#).as_bytes())
                .is_ok()
        );
        assert_eq!(
            EditMessage::parse(br#"{"clientChangeId":"nope","body":"x"}"#)
                .unwrap_err()
                .status(),
            400
        );
        let q: HashMap<&str, &str> = [("afterChange", "5"), ("limit", "10")].into();
        assert_eq!(
            ChangesQuery::parse(&q),
            Ok(ChangesQuery {
                after: 5,
                limit: 10
            })
        );
        let q: HashMap<&str, &str> = [("afterChange", "-1")].into();
        assert!(ChangesQuery::parse(&q).is_err());
        let q: HashMap<&str, &str> = HashMap::new();
        assert!(parse_delete(&q).is_err());
    }

    #[test]
    fn reactor_cursors_round_trip_and_reject_forgeries() {
        let cursor = reactor_cursor(&user("bob"), "👍");
        let q: HashMap<&str, &str> = [("cursor", cursor.as_str())].into();
        assert_eq!(
            ReactorsQuery::parse(&q).unwrap().after,
            Some((user("bob"), "👍".to_owned()))
        );
        for bad in ["!!", "Ym9i", ""] {
            let q: HashMap<&str, &str> = [("cursor", bad)].into();
            assert_eq!(ReactorsQuery::parse(&q).unwrap_err().status(), 400, "{bad}");
        }
    }

    #[test]
    fn a_fingerprint_tells_kind_seq_caller_and_body_apart() {
        let a = user("a");
        let f = change_fingerprint(ChangeKind::Edited, 1, &a, "x");
        assert!(check_replay(&f, &change_fingerprint(ChangeKind::Edited, 1, &a, "x")).is_ok());
        for other in [
            change_fingerprint(ChangeKind::Deleted, 1, &a, "x"),
            change_fingerprint(ChangeKind::Edited, 2, &a, "x"),
            change_fingerprint(ChangeKind::Edited, 1, &user("b"), "x"),
            change_fingerprint(ChangeKind::Edited, 1, &a, "y"),
        ] {
            assert_eq!(check_replay(&f, &other).unwrap_err().status(), 409);
        }
    }
}
