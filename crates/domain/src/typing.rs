//! Typing and presence (SPEC §16, docs/api.md §37, §38): ephemeral, never in history, never
//! unread, never notified. The rules here are pure; the store keeps the state
//! (`chat_store::typing`), the WebSocket function moves the frames.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ChatError;
use crate::requests::Fields;
use crate::{ConversationId, UserId};

/// A typist stops this long after their last accepted `start` unless refreshed.
pub const TYPING_TTL_MS: i64 = 6_000;
/// A connection's `start`s closer than this to its last accepted one are ignored.
pub const START_INTERVAL_MS: i64 = 2_000;
/// At most one typing frame per conversation per second (so per recipient).
pub const FRAME_INTERVAL_MS: i64 = 1_000;
/// Pushes are claimed this much more than [`FRAME_INTERVAL_MS`] apart: less the clocks' margin,
/// what a push's reads and posts may take after [`SETTLE_MS`] before its claim is moved on
/// ([`renewed_claim`]): 50 ms, enough for a direct conversation's one or two posts.
pub const FRAME_SLACK_MS: i64 = 100;
/// A push's claimant reads the set this long after its claim, and every change written before
/// then is in what it sends: a burst of starts (20 typists refreshing at once) is one frame, not
/// a frame of its first few and another of the rest a second later.
pub const SETTLE_MS: i64 = 150;
/// Typists a frame names; `count` says how many type in all.
pub const LISTED_TYPISTS: usize = 3;
/// The largest client frame read; bigger ones are answered with `payload_too_large`.
pub const MAX_FRAME_BYTES: usize = 4 * 1024;
/// Users one `POST /presence` may ask about.
pub const MAX_PRESENCE_USERS: usize = 100;
/// At most one presence push per user per this period.
pub const PRESENCE_PUSH_INTERVAL_MS: i64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypingState {
    Start,
    Stop,
}

/// A client's `{"action":"typing","conversationId","state"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypingFrame {
    pub conversation: ConversationId,
    pub state: TypingState,
}

/// What a client frame asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame {
    Typing(TypingFrame),
    /// A keep-alive (`{"action":"ping"}`, or anything without an action): nothing to do.
    Ping,
}

/// Parses a client's WebSocket frame. Errors are answered to that connection only.
pub fn parse_client_frame(body: &[u8]) -> Result<ClientFrame, ChatError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(ChatError::PayloadTooLarge(format!(
            "frame is larger than {MAX_FRAME_BYTES} bytes"
        )));
    }
    let fields = Fields::parse(body)?;
    match fields.optional_str("action")? {
        None | Some("ping") => Ok(ClientFrame::Ping),
        Some("typing") => {
            let conversation = fields
                .required_str("conversationId")
                .map(ConversationId::parse)?
                .ok_or_else(|| ChatError::invalid("field `conversationId` is not a valid id"))?;
            let state = match fields.required_str("state")? {
                "start" => TypingState::Start,
                "stop" => TypingState::Stop,
                _ => return Err(ChatError::invalid("field `state` must be start or stop")),
            };
            Ok(ClientFrame::Typing(TypingFrame {
                conversation,
                state,
            }))
        }
        Some(other) => Err(ChatError::invalid(format!(
            "unknown action `{}`",
            other.chars().take(40).collect::<String>()
        ))),
    }
}

/// The answer to a bad frame, sent to its connection alone.
pub fn error_frame(e: &ChatError) -> Value {
    let mut v = e.to_json();
    v["type"] = Value::from("error");
    v
}

/// Whether a `start` at `now_ms` is accepted after the connection's last accepted one.
pub fn start_accepted(last_start_ms: Option<i64>, now_ms: i64) -> bool {
    last_start_ms.is_none_or(|last| now_ms - last >= START_INTERVAL_MS)
}

/// The latest start time a previous `start` may have for a new one to be accepted at `now_ms`.
pub fn start_cutoff(now_ms: i64) -> i64 {
    now_ms - START_INTERVAL_MS
}

/// One connection's typing in a conversation, as stored (one small item each, so that a `start`
/// writes one item of well under 1 KB whatever the other typists' ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypingEntry {
    pub connection: String,
    pub user: UserId,
    /// The connection's last accepted `start` (unix ms, the time the frame came).
    pub started_ms: i64,
    /// Its `stop` after that start, if any.
    pub stopped_ms: Option<i64>,
}

impl TypingEntry {
    /// Whether it shows its user typing at `now_ms`: started less than 6 s ago and not stopped.
    pub fn typing_at(&self, now_ms: i64) -> bool {
        self.stopped_ms.is_none() && now_ms - self.started_ms < TYPING_TTL_MS
    }

    /// When its last change (start or stop) was stamped.
    pub fn changed_ms(&self) -> i64 {
        self.stopped_ms
            .map_or(self.started_ms, |s| s.max(self.started_ms))
    }
}

/// Who types now: the users with an entry that shows them typing (any of their connections), in
/// the order they started (earliest first), each once.
pub fn typing_now(entries: &[TypingEntry], now_ms: i64) -> Vec<UserId> {
    let mut first: BTreeMap<&UserId, i64> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.typing_at(now_ms)) {
        let s = first.entry(&e.user).or_insert(e.started_ms);
        *s = (*s).min(e.started_ms);
    }
    let mut users: Vec<(i64, &UserId)> = first.into_iter().map(|(u, s)| (s, u)).collect();
    users.sort();
    users.into_iter().map(|(_, u)| u.clone()).collect()
}

/// How far two invocations' clocks may be apart (Lambda hosts keep theirs synchronised to well
/// under a millisecond; this is the margin over that). Every comparison of one invocation's time
/// with another's allows it.
pub const CLOCK_MARGIN_MS: i64 = 50;

/// Whether a writer whose change was written by `done_ms` (its clock when the write returned) may
/// leave the push to the writer of another entry: one stamped at least [`CLOCK_MARGIN_MS`] after
/// that, so written after this change, and so pushed by a claim that reads the set after this
/// change too (or by that writer's own). A change stamped earlier, or only just after, may have
/// been written, read and pushed before this one landed, so this writer goes on. (Only the last
/// writer of a second claims the push: 20 typists do not wake 20 claims, each a billed write
/// even when it fails.)
pub fn later_change(entries: &[TypingEntry], done_ms: i64) -> bool {
    entries
        .iter()
        .any(|e| e.changed_ms() >= done_ms + CLOCK_MARGIN_MS)
}

/// Stopped or expired entries are left in place (a connection that types again overwrites its
/// own, TTL removes it) until a claim finds this many: then they cost about a read unit (4 KB)
/// per read of the set, and the push's claimant removes them, 1 write unit each.
pub const PRUNE_INACTIVE_AT: usize = 16;

/// The entries a push's claimant removes: every inactive one, once there are
/// [`PRUNE_INACTIVE_AT`] of them.
pub fn prunable(entries: &[TypingEntry], now_ms: i64) -> Vec<&TypingEntry> {
    let inactive: Vec<&TypingEntry> = entries.iter().filter(|e| !e.typing_at(now_ms)).collect();
    if inactive.len() >= PRUNE_INACTIVE_AT {
        inactive
    } else {
        Vec::new()
    }
}

/// The conversation's last push as its claim recorded it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastPush {
    /// When it was claimed (ms): the next claim comes a second later at the earliest.
    pub claimed_ms: Option<i64>,
    /// When its claimant read the set it sent, at the earliest (ms).
    pub read_ms: Option<i64>,
}

/// What a writer whose change was written by `done_ms` does about its push, reading the entries
/// and the last push at `now_ms`: nothing when a claim reads the set after its change (that push
/// has it) or a later change's writer takes it over ([`later_change`]); else claim the push now,
/// or when the last push's second is over (then read again).
pub fn push_due(entries: &[TypingEntry], last: LastPush, done_ms: i64, now_ms: i64) -> Broadcast {
    let covered = last
        .read_ms
        .is_some_and(|read| read >= done_ms + CLOCK_MARGIN_MS);
    if covered || later_change(entries, done_ms) {
        return Broadcast::Nothing;
    }
    match last.claimed_ms {
        Some(at) if now_ms < at + FRAME_INTERVAL_MS + FRAME_SLACK_MS => {
            Broadcast::At(at + FRAME_INTERVAL_MS + FRAME_SLACK_MS)
        }
        _ => Broadcast::Now,
    }
}

/// The time a push's claim (`claimed_ms`) should say once its posts ended at `posted_ms`, when
/// they ran late: the next push is claimed [`FRAME_INTERVAL_MS`] + [`FRAME_SLACK_MS`] after the
/// claim at the earliest and posts [`SETTLE_MS`] after its own claim at the earliest, so it reaches
/// no recipient within a second of this push's last post. (A push of a big group posts for a few
/// hundred ms; one a second after the claim would reach the first recipients of its order less than
/// a second after this one reached its last.)
pub fn renewed_claim(claimed_ms: i64, posted_ms: i64) -> Option<i64> {
    let as_if = posted_ms + CLOCK_MARGIN_MS - SETTLE_MS - FRAME_SLACK_MS;
    (as_if > claimed_ms).then_some(as_if)
}

/// Whether the push whose claimant read the set at `last_read_ms` may have shown `member` someone
/// typing: an entry of another user that showed typing then, or has changed since (its earlier
/// state is not kept; a stop or a close leaves the entry, marked stopped). A member shown nobody
/// then and now is not sent the (empty) set again.
pub fn may_have_shown_someone(
    entries: &[TypingEntry],
    member: &UserId,
    last_read_ms: Option<i64>,
) -> bool {
    let Some(read) = last_read_ms else {
        return false;
    };
    entries.iter().any(|e| {
        &e.user != member && (e.changed_ms() + CLOCK_MARGIN_MS > read || e.typing_at(read))
    })
}

/// A start's expiry check (docs/api.md §37, "Expiry"): queued when the start is accepted and due
/// when it would expire, so that the others are told a typist who went quiet without `stop` has
/// stopped (their clients drop nobody by themselves). Each accepted start queues its own; the
/// check of a start refreshed since finds a later one there and leaves the push to its check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpiryCheck {
    pub conversation_id: ConversationId,
    pub connection: String,
    /// The accepted start's stamp (unix ms, as its entry records it).
    pub started_at: i64,
}

/// How long an expiry check waits in its queue: the typing time (SQS counts whole seconds; the
/// check never runs early, it waits out what is left of the start's time).
pub const EXPIRY_CHECK_DELAY_SECS: i32 = (TYPING_TTL_MS / 1000) as i32;

/// The change a due check pushes: its start's expiry, when that start is still the connection's
/// last and was not stopped (a stop's writer pushed it). None: started again since, stopped, or
/// gone (pruned after expiring: a push has shown it expired).
pub fn expired_start(entries: &[TypingEntry], check: &ExpiryCheck) -> Option<i64> {
    entries
        .iter()
        .find(|e| e.connection == check.connection)
        .filter(|e| e.started_ms == check.started_at && e.stopped_ms.is_none())
        .map(|e| e.started_ms + TYPING_TTL_MS)
}

/// When the conversation's typing frame (or a user's presence push) goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broadcast {
    Now,
    /// Due, but a frame went out less than the interval ago: at this time.
    At(i64),
    /// What the members hold is current, or another invocation sends it.
    Nothing,
}

/// `{"type":"typing","conversationId","typing":[≤ 3 ids],"count"}` for `recipient`: the others
/// who type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypingEvent {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub conversation_id: ConversationId,
    pub typing: Vec<UserId>,
    pub count: usize,
}

pub fn typing_event(
    conversation: &ConversationId,
    typing: &[UserId],
    recipient: &UserId,
) -> TypingEvent {
    let others: Vec<&UserId> = typing.iter().filter(|u| *u != recipient).collect();
    TypingEvent {
        kind: "typing",
        conversation_id: conversation.clone(),
        typing: others
            .iter()
            .take(LISTED_TYPISTS)
            .map(|u| (*u).clone())
            .collect(),
        count: others.len(),
    }
}

/// One user's presence as `POST /presence` and the `presence` push show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    pub user_id: UserId,
    pub online: bool,
    /// When their last connection closed (RFC 3339); null while online, hidden, or never seen.
    pub last_active_at: Option<String>,
}

/// A user's presence from what the connections table holds: their unexpired connections, when
/// a connection last closed, and whether they hide it.
pub fn presence_of(
    user: UserId,
    live_connections: usize,
    last_closed: Option<String>,
    hidden: bool,
) -> Presence {
    let online = live_connections > 0 && !hidden;
    Presence {
        user_id: user,
        online,
        last_active_at: if online || hidden { None } else { last_closed },
    }
}

/// Whether a user's presence push goes out: when `online` differs from what their peers were last
/// told (`sent`), at once, or once [`PRESENCE_PUSH_INTERVAL_MS`] after the last push.
pub fn presence_push(
    online: bool,
    sent: Option<bool>,
    sent_at_ms: Option<i64>,
    now_ms: i64,
) -> Broadcast {
    match (sent, sent_at_ms) {
        (Some(s), _) if s == online => Broadcast::Nothing,
        // Never told: an offline user is what peers assume.
        (None, _) if !online => Broadcast::Nothing,
        (_, Some(at)) if now_ms - at < PRESENCE_PUSH_INTERVAL_MS => {
            Broadcast::At(at + PRESENCE_PUSH_INTERVAL_MS)
        }
        _ => Broadcast::Now,
    }
}

/// `{"type":"presence","userId","online","lastActiveAt"}`.
pub fn presence_event(p: &Presence) -> Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    v["type"] = Value::from("presence");
    v
}

/// `POST /presence` `{"userIds":[…]}`: 1–100 valid ids (deduplicated, order kept). The bound is
/// on the list as sent (docs/openapi.yaml's `maxItems`), repeats included.
pub fn parse_presence_query(body: &[u8]) -> Result<Vec<UserId>, ChatError> {
    let fields = Fields::parse(body)?;
    let sent = fields.array_len("userIds");
    let ids = fields.user_ids("userIds", true)?;
    if ids.is_empty() {
        return Err(ChatError::invalid(
            "field `userIds` must name at least one user",
        ));
    }
    if sent > MAX_PRESENCE_USERS {
        return Err(ChatError::invalid(format!(
            "field `userIds` may name at most {MAX_PRESENCE_USERS} users"
        )));
    }
    Ok(ids)
}

/// `PUT /me/presence` `{"visible":bool}`.
pub fn parse_presence_visibility(body: &[u8]) -> Result<bool, ChatError> {
    Fields::parse(body)?.required_bool("visible")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    fn conv() -> ConversationId {
        ConversationId::direct(&u("alice"), &u("bob"))
    }

    #[test]
    fn frames_parse_or_are_refused() {
        let c = conv();
        let ok = format!(r#"{{"action":"typing","conversationId":"{c}","state":"start"}}"#);
        assert_eq!(
            parse_client_frame(ok.as_bytes()),
            Ok(ClientFrame::Typing(TypingFrame {
                conversation: c.clone(),
                state: TypingState::Start
            }))
        );
        let stop = ok.replace("start", "stop");
        assert!(matches!(
            parse_client_frame(stop.as_bytes()),
            Ok(ClientFrame::Typing(TypingFrame {
                state: TypingState::Stop,
                ..
            }))
        ));
        assert_eq!(parse_client_frame(b"{}"), Ok(ClientFrame::Ping));
        assert_eq!(
            parse_client_frame(br#"{"action":"ping"}"#),
            Ok(ClientFrame::Ping)
        );
        for bad in [
            &b"not json"[..],
            b"[1]",
            br#"{"action":"dance"}"#,
            br#"{"action":"typing","state":"start"}"#,
            br#"{"action":"typing","conversationId":"x y","state":"start"}"#,
        ] {
            assert_eq!(parse_client_frame(bad).map_err(|e| e.status()), Err(400));
        }
        let bad_state = ok.replace("start", "maybe");
        assert!(parse_client_frame(bad_state.as_bytes()).is_err());
        let huge = vec![b' '; MAX_FRAME_BYTES + 1];
        assert_eq!(parse_client_frame(&huge).map_err(|e| e.status()), Err(413));
        let e = error_frame(&ChatError::invalid("x"));
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["code"], "invalid_request");
    }

    #[test]
    fn one_start_per_two_seconds_per_connection() {
        assert!(start_accepted(None, 1_000));
        assert!(!start_accepted(Some(1_000), 2_999));
        assert!(start_accepted(Some(1_000), 3_000));
        assert_eq!(start_cutoff(3_000), 1_000);
    }

    fn entry(c: &str, user: &str, started: i64, stopped: Option<i64>) -> TypingEntry {
        TypingEntry {
            connection: c.into(),
            user: u(user),
            started_ms: started,
            stopped_ms: stopped,
        }
    }

    #[test]
    fn typists_expire_six_seconds_after_their_last_start_or_at_their_stop() {
        let entries = vec![
            entry("c1", "bob", 10_000, None),
            entry("c2", "alice", 5_000, None),
            entry("c3", "bob", 12_000, None),
            entry("c4", "carol", 3_999, None),
            entry("c5", "dave", 9_000, Some(9_500)),
        ];
        assert_eq!(typing_now(&entries, 10_000), vec![u("alice"), u("bob")]);
        // alice's 5 s start expires at 11 s; carol's was expired from 9.999 s; dave stopped.
        assert_eq!(typing_now(&entries, 11_000), vec![u("bob")]);
        assert_eq!(typing_now(&entries, 18_000), Vec::<UserId>::new());
        assert_eq!(entries[4].changed_ms(), 9_500);
        assert_eq!(entries[0].changed_ms(), 10_000);
        // A stop stamped before a later start (another invocation's clock) is not the change.
        assert_eq!(entry("c", "a", 2_000, Some(1_990)).changed_ms(), 2_000);
    }

    #[test]
    fn only_a_change_stamped_after_this_write_returned_takes_the_push_over() {
        let entries = vec![
            entry("mine", "a", 1_000, None),
            entry("other", "b", 1_100, None),
        ];
        // This write returned at 1_020: b's change, stamped 80 ms later, read the set after it.
        assert!(later_change(&entries, 1_020));
        // This write returned at 1_080: b stamped its change 20 ms later, within the clocks'
        // margin, so it may have read the set before this write landed.
        assert!(!later_change(&entries, 1_080));
        // Stamped later than this change but written before it returned (this write was slow):
        // b's set may lack it. A rule of "a later stamp pushes" would drop this change.
        assert!(!later_change(&entries, 1_500));
        assert!(later_change(&entries, 1_100 - CLOCK_MARGIN_MS));
        let stopped = vec![entry("other", "b", 500, Some(1_100))];
        assert!(later_change(&stopped, 1_020));
        assert!(!later_change(&[], 0));
    }

    #[test]
    fn inactive_entries_are_pruned_once_they_cost_a_read_unit() {
        let mut entries = vec![entry("live", "a", 10_000, None)];
        for i in 0..PRUNE_INACTIVE_AT - 1 {
            let stopped = (i % 2 == 0).then_some(2_000);
            entries.push(entry(&format!("c{i}"), "b", 1_000, stopped));
        }
        assert!(prunable(&entries, 10_000).is_empty());
        entries.push(entry("last", "c", 3_999, None));
        let pruned = prunable(&entries, 10_000);
        assert_eq!(pruned.len(), PRUNE_INACTIVE_AT);
        assert!(pruned.iter().all(|e| e.connection != "live"));
    }

    #[test]
    fn a_change_is_pushed_by_a_claim_that_reads_after_it_at_most_once_a_second() {
        let entries = vec![entry("mine", "a", 10_000, None)];
        let never = LastPush::default();
        assert_eq!(push_due(&entries, never, 10_010, 10_020), Broadcast::Now);
        let last = LastPush {
            claimed_ms: Some(9_500),
            read_ms: Some(9_500 + SETTLE_MS),
        };
        // Claimed 0.5 s ago, read before this change landed: due when the second is over.
        let due = 9_500 + FRAME_INTERVAL_MS + FRAME_SLACK_MS;
        assert_eq!(push_due(&entries, last, 10_010, 10_020), Broadcast::At(due));
        assert_eq!(push_due(&entries, last, 10_010, due), Broadcast::Now);
        // A claim that reads the set after this write returned (with the clocks' margin) has it.
        let reading = LastPush {
            claimed_ms: Some(9_990),
            read_ms: Some(9_990 + SETTLE_MS),
        };
        assert_eq!(
            push_due(&entries, reading, 10_010, 10_020),
            Broadcast::Nothing
        );
        let just_before = LastPush {
            claimed_ms: Some(9_900),
            read_ms: Some(10_010 + CLOCK_MARGIN_MS - 1),
        };
        assert_eq!(
            push_due(&entries, just_before, 10_010, 10_020),
            Broadcast::At(9_900 + FRAME_INTERVAL_MS + FRAME_SLACK_MS)
        );
        // A later writer takes it over.
        let later = vec![
            entry("mine", "a", 10_000, None),
            entry("next", "b", 10_100, None),
        ];
        assert_eq!(push_due(&later, last, 10_010, 11_000), Broadcast::Nothing);
    }

    #[test]
    fn a_push_that_posted_late_moves_its_claim_on() {
        // Posted within the slack after the settle: the claim stands.
        let quick = 1_000 + SETTLE_MS + FRAME_SLACK_MS - CLOCK_MARGIN_MS;
        assert_eq!(renewed_claim(1_000, quick), None);
        // Posted until 1.4 s: the next push is claimed 1.4 s + a second − settle at the earliest,
        // so it posts a second after this one's last post (and the clocks' margin).
        let late = 1_400;
        let renewed = renewed_claim(1_000, late).unwrap();
        let next_claim = renewed + FRAME_INTERVAL_MS + FRAME_SLACK_MS;
        assert_eq!(
            next_claim + SETTLE_MS,
            late + FRAME_INTERVAL_MS + CLOCK_MARGIN_MS
        );
        // Unrenewed, the same holds for a push that posted quickly.
        let next = 1_000 + FRAME_INTERVAL_MS + FRAME_SLACK_MS + SETTLE_MS;
        assert!(next >= quick + FRAME_INTERVAL_MS + CLOCK_MARGIN_MS);
    }

    #[test]
    fn a_member_shown_nobody_before_and_now_is_not_sent_the_empty_set() {
        let (a, b) = (u("a"), u("b"));
        // a types alone: b is shown a; a is shown nobody, now and at the last push (read at 5 s).
        let alone = vec![entry("ca", "a", 4_000, None)];
        assert!(!may_have_shown_someone(&alone, &a, Some(5_000)));
        assert!(may_have_shown_someone(&alone, &b, Some(5_000)));
        assert!(!may_have_shown_someone(&alone, &b, None));
        // b stopped after that push read the set: a may have been shown b.
        let stopped = vec![
            entry("ca", "a", 4_000, None),
            entry("cb", "b", 3_000, Some(5_500)),
        ];
        assert!(may_have_shown_someone(&stopped, &a, Some(5_000)));
        // b had stopped (or expired) long before it.
        let long_ago = vec![
            entry("cb", "b", 1_000, Some(1_500)),
            entry("cc", "c", -2_000, None),
        ];
        assert!(!may_have_shown_someone(&long_ago, &a, Some(5_000)));
    }

    #[test]
    fn frames_list_three_others_and_count_them_all() {
        let c = conv();
        let typing: Vec<UserId> = ["a", "b", "c", "d", "e"].iter().map(|s| u(s)).collect();
        let e = typing_event(&c, &typing, &u("b"));
        assert_eq!(e.typing, vec![u("a"), u("c"), u("d")]);
        assert_eq!(e.count, 4);
        let v = serde_json::to_value(typing_event(&c, &typing, &u("z"))).unwrap();
        assert_eq!(v["type"], "typing");
        assert_eq!(v["count"], 5);
        assert_eq!(v["typing"].as_array().unwrap().len(), 3);
        assert_eq!(v["conversationId"], c.as_str());
    }

    #[test]
    fn presence_hidden_shows_offline_without_last_active() {
        let at = Some("2026-12-03T10:00:00Z".to_string());
        let p = presence_of(u("a"), 2, at.clone(), false);
        assert!(p.online && p.last_active_at.is_none());
        let p = presence_of(u("a"), 0, at.clone(), false);
        assert_eq!((p.online, p.last_active_at.clone()), (false, at.clone()));
        let p = presence_of(u("a"), 2, at.clone(), true);
        assert_eq!((p.online, p.last_active_at.clone()), (false, None));
        let v = presence_event(&presence_of(u("a"), 0, at, false));
        assert_eq!(v["type"], "presence");
        assert_eq!(v["userId"], "a");
        assert_eq!(v["lastActiveAt"], "2026-12-03T10:00:00Z");
    }

    #[test]
    fn presence_is_pushed_on_change_at_most_once_per_ten_seconds() {
        assert_eq!(presence_push(true, None, None, 0), Broadcast::Now);
        assert_eq!(presence_push(false, None, None, 0), Broadcast::Nothing);
        assert_eq!(
            presence_push(true, Some(true), Some(0), 50_000),
            Broadcast::Nothing
        );
        assert_eq!(
            presence_push(false, Some(true), Some(1_000), 4_000),
            Broadcast::At(11_000)
        );
        assert_eq!(
            presence_push(false, Some(true), Some(1_000), 11_000),
            Broadcast::Now
        );
    }

    #[test]
    fn presence_queries_are_bounded() {
        let ids: Vec<String> = (0..100).map(|i| format!("\"u{i}\"")).collect();
        let body = format!(r#"{{"userIds":[{}]}}"#, ids.join(","));
        assert_eq!(parse_presence_query(body.as_bytes()).unwrap().len(), 100);
        let body = format!(r#"{{"userIds":[{},"u100"]}}"#, ids.join(","));
        assert_eq!(
            parse_presence_query(body.as_bytes()).map_err(|e| e.status()),
            Err(400)
        );
        // 101 entries naming one user: the list as sent is over the bound.
        let body = format!(r#"{{"userIds":[{}]}}"#, vec!["\"u1\""; 101].join(","));
        assert_eq!(
            parse_presence_query(body.as_bytes()).map_err(|e| e.status()),
            Err(400)
        );
        assert!(parse_presence_query(br#"{"userIds":["bad id!"]}"#).is_err());
        assert!(parse_presence_query(br#"{}"#).is_err());
        assert!(parse_presence_query(br#"{"userIds":[]}"#).is_err());
        assert_eq!(
            parse_presence_visibility(br#"{"visible":false}"#),
            Ok(false)
        );
        assert!(parse_presence_visibility(br#"{"visible":"no"}"#).is_err());
    }

    #[test]
    fn an_expiry_check_pushes_only_the_start_it_was_queued_for() {
        let check = |started_at| ExpiryCheck {
            conversation_id: conv(),
            connection: "c1".into(),
            started_at,
        };
        let body = serde_json::to_string(&check(1_000)).unwrap();
        assert_eq!(
            serde_json::from_str::<ExpiryCheck>(&body).unwrap(),
            check(1_000)
        );
        assert!(body.contains(r#""startedAt":1000"#), "{body}");
        let typing = [
            entry("c1", "alice", 1_000, None),
            entry("c2", "bob", 500, None),
        ];
        assert_eq!(expired_start(&typing, &check(1_000)), Some(7_000));
        // Started again since: that start's own check pushes its expiry.
        let refreshed = [entry("c1", "alice", 3_100, None)];
        assert_eq!(expired_start(&refreshed, &check(1_000)), None);
        assert_eq!(expired_start(&refreshed, &check(3_100)), Some(9_100));
        // Stopped (its writer pushed), or pruned (a push showed it expired).
        let stopped = [entry("c1", "alice", 1_000, Some(2_000))];
        assert_eq!(expired_start(&stopped, &check(1_000)), None);
        assert_eq!(expired_start(&typing[1..], &check(1_000)), None);
        assert_eq!(EXPIRY_CHECK_DELAY_SECS as i64 * 1000, TYPING_TTL_MS);
    }
}
