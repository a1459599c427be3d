//! Typing and presence (SPEC §16, docs/api.md §37, §38): ephemeral, never in history, never
//! unread, never notified. The rules here are pure; the store keeps the state
//! (`chat_store::typing`), the WebSocket function moves the frames.

use std::collections::BTreeMap;

use serde::Serialize;
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
/// While someone types, the set is sent again once this old, so that a client, which clears a
/// set it was not sent again within [`TYPING_TTL_MS`], keeps showing it (refreshes come every
/// ≤ 3 s, so the gap between two frames stays under 6 s).
pub const RESEND_AFTER_MS: i64 = 2_000;
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

/// Who types now: the users with an unexpired entry (any of their connections), in the order
/// they started (earliest first), each once.
pub fn typing_now(entries: &[(UserId, i64)], now_ms: i64) -> Vec<UserId> {
    let mut first: BTreeMap<&UserId, i64> = BTreeMap::new();
    for (user, started) in entries {
        if now_ms - started < TYPING_TTL_MS {
            let e = first.entry(user).or_insert(*started);
            *e = (*e).min(*started);
        }
    }
    let mut users: Vec<(i64, &UserId)> = first.into_iter().map(|(u, s)| (s, u)).collect();
    users.sort();
    users.into_iter().map(|(_, u)| u.clone()).collect()
}

/// The entries a cleanup may remove: expired, nobody's current typing and no rate limit left.
pub fn expired_entries(entries: &[(String, UserId, i64)], now_ms: i64) -> Vec<&str> {
    entries
        .iter()
        .filter(|(_, _, started)| now_ms - started >= TYPING_TTL_MS)
        .map(|(c, _, _)| c.as_str())
        .collect()
}

/// The set as last sent, stored to compare: the ids, comma separated.
pub fn signature(typing: &[UserId]) -> String {
    typing
        .iter()
        .map(UserId::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

/// When the conversation's typing frame goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broadcast {
    Now,
    /// Changed, but a frame went out less than a second ago: at this time.
    At(i64),
    /// What the members hold is current.
    Nothing,
}

/// Whether the current set (`current`, by [`signature`]) must be sent, given what was sent last
/// and when.
pub fn broadcast(
    current: &str,
    sent: Option<&str>,
    sent_at_ms: Option<i64>,
    now_ms: i64,
) -> Broadcast {
    let changed = sent != Some(current) && !(sent.is_none() && current.is_empty());
    let age = sent_at_ms.map_or(i64::MAX, |t| now_ms - t);
    let stale = !current.is_empty() && age >= RESEND_AFTER_MS;
    if !changed && !stale {
        Broadcast::Nothing
    } else if age >= FRAME_INTERVAL_MS {
        Broadcast::Now
    } else {
        Broadcast::At(sent_at_ms.unwrap_or(now_ms) + FRAME_INTERVAL_MS)
    }
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

/// `POST /presence` `{"userIds":[…]}`: 1–100 valid ids (deduplicated, order kept).
pub fn parse_presence_query(body: &[u8]) -> Result<Vec<UserId>, ChatError> {
    let ids = Fields::parse(body)?.user_ids("userIds", true)?;
    if ids.is_empty() {
        return Err(ChatError::invalid(
            "field `userIds` must name at least one user",
        ));
    }
    if ids.len() > MAX_PRESENCE_USERS {
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

    #[test]
    fn typists_expire_six_seconds_after_their_last_start() {
        let entries = vec![
            (u("bob"), 10_000),
            (u("alice"), 5_000),
            (u("bob"), 12_000),
            (u("carol"), 3_999),
        ];
        assert_eq!(typing_now(&entries, 10_000), vec![u("alice"), u("bob")]);
        // alice's 5 s start expires at 11 s; carol's was expired from 9.999 s.
        assert_eq!(typing_now(&entries, 11_000), vec![u("bob")]);
        assert_eq!(typing_now(&entries, 18_000), Vec::<UserId>::new());
        let rows = vec![
            ("c1".to_string(), u("a"), 1_000),
            ("c2".into(), u("b"), 6_000),
        ];
        assert_eq!(expired_entries(&rows, 7_000), vec!["c1"]);
    }

    #[test]
    fn at_most_one_frame_a_second_and_the_set_resent_while_typing() {
        let ab = signature(&[u("a"), u("b")]);
        assert_eq!(ab, "a,b");
        assert_eq!(broadcast("a", None, None, 5_000), Broadcast::Now);
        assert_eq!(broadcast("", None, None, 5_000), Broadcast::Nothing);
        assert_eq!(
            broadcast("a", Some("a"), Some(4_500), 5_000),
            Broadcast::Nothing
        );
        assert_eq!(
            broadcast(&ab, Some("a"), Some(4_500), 5_000),
            Broadcast::At(5_500)
        );
        assert_eq!(
            broadcast(&ab, Some("a"), Some(4_000), 5_000),
            Broadcast::Now
        );
        assert_eq!(
            broadcast("", Some("a"), Some(4_800), 5_000),
            Broadcast::At(5_800)
        );
        // Unchanged but 2 s old while someone types: sent again, so clients keep showing it.
        assert_eq!(
            broadcast("a", Some("a"), Some(3_000), 5_000),
            Broadcast::Now
        );
        assert_eq!(broadcast("", Some(""), Some(0), 5_000), Broadcast::Nothing);
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
        assert!(parse_presence_query(br#"{"userIds":["bad id!"]}"#).is_err());
        assert!(parse_presence_query(br#"{}"#).is_err());
        assert!(parse_presence_query(br#"{"userIds":[]}"#).is_err());
        assert_eq!(
            parse_presence_visibility(br#"{"visible":false}"#),
            Ok(false)
        );
        assert!(parse_presence_visibility(br#"{"visible":"no"}"#).is_err());
    }
}
