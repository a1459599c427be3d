//! Offline notifications (docs/api.md §31–§33): devices, per-member notification settings, the
//! delayed "still unread?" decision, coalescing and the payload. Pure: the store turns these into
//! DynamoDB conditions, the notifier into SQS and SNS calls.

use serde::{Deserialize, Serialize};

use crate::error::ChatError;
use crate::requests::Fields;
use crate::time::parse_rfc3339;
use crate::{ConversationId, UserId};

/// Devices per user: an 11th replaces the least recently registered.
pub const MAX_DEVICES: usize = 10;
/// A device token's bound (APNs tokens are 64 hex characters, FCM's ~160; SNS takes up to 4 KB).
pub const MAX_TOKEN_CHARS: usize = 4096;
/// A device id's bound (the client's own id for an installation).
pub const MAX_DEVICE_ID_CHARS: usize = 128;
/// The characters of the newest message a `full` notification shows.
pub const PREVIEW_CHARS: usize = 100;
/// The preview of a message without text (its attachments'), rather than an empty line (found
/// by probing: a photo's notification said nothing).
pub const ATTACHMENT_PREVIEW: &str = "Sent an attachment";

fn invalid(msg: impl Into<String>) -> ChatError {
    ChatError::invalid(msg)
}

/// Where a device's notifications go (an SNS platform application each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    Apns,
    ApnsSandbox,
    Fcm,
}

impl Platform {
    pub fn parse(s: &str) -> Option<Platform> {
        Some(match s {
            "apns" => Platform::Apns,
            "apns_sandbox" => Platform::ApnsSandbox,
            "fcm" => Platform::Fcm,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Apns => "apns",
            Platform::ApnsSandbox => "apns_sandbox",
            Platform::Fcm => "fcm",
        }
    }
}

/// The `{deviceId}` of a path: 1–128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn device_id_param(raw: Option<&str>) -> Result<String, ChatError> {
    match raw {
        Some(id)
            if !id.is_empty()
                && id.len() <= MAX_DEVICE_ID_CHARS
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b)) =>
        {
            Ok(id.to_owned())
        }
        _ => Err(invalid(format!(
            "path parameter `deviceId` must be 1-{MAX_DEVICE_ID_CHARS} characters of A-Z, a-z, 0-9, '.', '_', ':', '-'"
        ))),
    }
}

/// `registerDevice`'s body: `{"platform", "token"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRegistration {
    pub platform: Platform,
    pub token: String,
}

impl DeviceRegistration {
    pub fn parse(body: &[u8]) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        let platform = f.required_str("platform")?;
        let platform = Platform::parse(platform).ok_or_else(|| {
            invalid("field `platform` must be one of \"apns\", \"apns_sandbox\", \"fcm\"")
        })?;
        let token = f.required_str("token")?;
        if token.trim().is_empty() {
            return Err(invalid("field `token` must not be empty"));
        }
        if token.chars().count() > MAX_TOKEN_CHARS
            || token.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(invalid(format!(
                "field `token` must be at most {MAX_TOKEN_CHARS} characters, without spaces or control characters"
            )));
        }
        Ok(DeviceRegistration {
            platform,
            token: token.to_owned(),
        })
    }
}

/// A registered device as `devices` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub device_id: String,
    pub platform: Platform,
    pub token: String,
    pub registered_at: String,
}

/// The devices an 11th registration pushes out: given the user's devices as read after it was
/// written, as `(deviceId, registeredAt)`, all but the `MAX_DEVICES` most recently registered
/// (ties by id). Each registration's look evicts only devices that are not among the 10 newest
/// of all (10 newer ones are in its view), and the last one sees all: so registrations at once
/// end with exactly the 10 newest, whichever order they are seen in.
pub fn devices_to_evict(devices: &[(String, String)]) -> Vec<String> {
    let mut by_age: Vec<&(String, String)> = devices.iter().collect();
    by_age.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    let excess = devices.len().saturating_sub(MAX_DEVICES);
    by_age
        .into_iter()
        .take(excess)
        .map(|d| d.0.clone())
        .collect()
}

/// Whether a member wants notifications of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    #[default]
    All,
    None,
}

/// A member's notification settings of one conversation (`notifications` on the conversation and
/// its inbox entry).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotificationSettings {
    pub level: Level,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muted_until: Option<String>,
}

impl NotificationSettings {
    /// `setNotifications`' body: `{"level": "all"|"none", "mutedUntil"?: RFC 3339}`.
    pub fn parse(body: &[u8]) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        let level = match f.required_str("level")? {
            "all" => Level::All,
            "none" => Level::None,
            _ => return Err(invalid("field `level` must be \"all\" or \"none\"")),
        };
        let muted_until = match f.optional_str("mutedUntil")? {
            None => None,
            Some(s) => {
                let t = parse_rfc3339(s).ok_or_else(|| {
                    invalid(
                        "field `mutedUntil` must be an RFC 3339 time, e.g. 2026-12-03T18:00:00Z",
                    )
                })?;
                Some(crate::time::rfc3339(t))
            }
        };
        Ok(NotificationSettings { level, muted_until })
    }

    /// Nothing is sent: level `none`, or muted until a time after `now` (RFC 3339 UTC with
    /// milliseconds, as `time::rfc3339` writes: such strings compare as times).
    pub fn is_muted(&self, now: &str) -> bool {
        self.level == Level::None || self.muted_until.as_deref().is_some_and(|u| u > now)
    }
}

/// One delay window of a conversation, as its delayed job carries it: the messages from
/// `from_seq` on, checked a delay after the first of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyWindow {
    pub conversation_id: ConversationId,
    pub from_seq: u64,
    /// When the window opened (unix ms; 0 in a job queued before this field: never waits).
    #[serde(default)]
    pub opened_at_ms: u64,
}

/// How long a window may wait for its newest message's own delay, in delays after it opened:
/// a steady stream of messages is still told of, at most this late.
pub const WINDOW_WAITS_AT_MOST: u64 = 2;

/// When a window whose job is due at `now_ms` should be checked instead (None: now). A message
/// is notified only once its own delay is over (SPEC §15: "a delay after a message … a read
/// within the delay cancels it"): while the window's newest message (`newest_at_ms`) is younger
/// than the delay, the whole window waits for it, so that quick messages are still told of in
/// one notification; but never past `WINDOW_WAITS_AT_MOST` delays after the window opened.
pub fn window_waits_until(
    opened_at_ms: u64,
    newest_at_ms: u64,
    now_ms: u64,
    delay_ms: u64,
) -> Option<u64> {
    if opened_at_ms == 0 {
        return None;
    }
    let newest_due = newest_at_ms.saturating_add(delay_ms);
    let latest = opened_at_ms.saturating_add(WINDOW_WAITS_AT_MOST * delay_ms);
    let until = newest_due.min(latest);
    (until > now_ms).then_some(until)
}

/// The decision for one member when the window's delay is over: how many of the window's
/// messages the notification covers (None: no notification). Nothing for what the member has read
/// (`last_read_seq`: a read within the delay, or the member's own send, which moves its watermark)
/// or when muted; otherwise the messages unread in the window, `from_seq..=last_seq`.
pub fn decide(last_read_seq: u64, last_seq: u64, from_seq: u64, muted: bool) -> Option<u64> {
    if muted || last_read_seq >= last_seq || last_seq < from_seq {
        return None;
    }
    Some(last_seq - last_read_seq.max(from_seq.saturating_sub(1)))
}

/// The first seq a window's job may tell of: the one after what the job of the window before
/// counted (`covered`; 0: no window before, then the window's opening message). It is after
/// `from_seq` when a message that reached the indexer just after that job closed its window
/// opened this one, yet was counted; before it when that job left its newest messages, younger
/// than the delay, to the next window (`matured_through`), and a later message opened it.
pub fn window_start(from_seq: u64, covered: u64) -> u64 {
    if covered == 0 {
        from_seq
    } else {
        covered + 1
    }
}

/// The last of a window's messages whose own delay is over at `now_ms` (`created_ms`: each
/// message's seq and time, in seq order; message times never go back): a window's check tells
/// of those only, and leaves the younger ones to a window of their own, so that a read within a
/// message's delay always cancels its notification (found by probing: a window at its cap of
/// twice the delay told of messages 0.05 s old that were read a second later). `from_seq - 1`
/// when none is.
pub fn matured_through(
    created_ms: &[(u64, u64)],
    from_seq: u64,
    now_ms: u64,
    delay_ms: u64,
) -> u64 {
    created_ms
        .iter()
        .take_while(|(_, at)| at.saturating_add(delay_ms) <= now_ms)
        .map(|(seq, _)| *seq)
        .last()
        .unwrap_or(from_seq.saturating_sub(1))
}

/// One message of a window, as the notifier weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowMessage<'a> {
    pub seq: u64,
    pub sender: &'a UserId,
    pub deleted: bool,
}

/// What one member is told of a window's messages (`messages`: those of `decide`'s window): the
/// ones after what it has read, neither deleted since (nothing left to read) nor sent by someone
/// it blocks (`blocks`, docs/api.md §28): how many, and the newest's seq. None: nothing to tell.
pub fn told_of(
    messages: &[WindowMessage<'_>],
    from_seq: u64,
    last_read_seq: u64,
    blocks: impl Fn(&UserId) -> bool,
) -> Option<(u64, u64)> {
    let told: Vec<u64> = messages
        .iter()
        .filter(|m| m.seq >= from_seq && m.seq > last_read_seq)
        .filter(|m| !m.deleted && !blocks(m.sender))
        .map(|m| m.seq)
        .collect();
    Some((told.len() as u64, *told.iter().max()?))
}

/// What a deployment shows of a message in a notification (template `NotificationContent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Content {
    /// The sender and the first 100 characters of the newest message.
    #[default]
    Full,
    /// "New message from …".
    Sender,
    /// "New message".
    None,
}

impl Content {
    pub fn parse(s: &str) -> Option<Content> {
        Some(match s {
            "full" => Content::Full,
            "sender" => Content::Sender,
            "none" => Content::None,
            _ => return None,
        })
    }
}

/// What a notification carries so the app can fetch: the conversation and the newest seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotificationData {
    pub conversation_id: ConversationId,
    pub seq: u64,
}

/// One notification to one member's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    pub title: String,
    pub body: String,
    pub badge: u64,
    pub data: NotificationData,
}

/// The newest message a notification is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest<'a> {
    pub seq: u64,
    pub sender: &'a UserId,
    pub body: &'a str,
    /// The group's title (None: a direct conversation).
    pub group_title: Option<&'a str>,
}

fn first_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

/// The notification of `count` messages whose newest is `newest`, with the member's `badge`.
pub fn notification(
    content: Content,
    conversation_id: &ConversationId,
    newest: &Newest<'_>,
    count: u64,
    badge: u64,
) -> Notification {
    let sender = newest.sender.as_str();
    let who = match newest.group_title {
        Some(title) => format!("{sender} in {title}"),
        None => sender.to_owned(),
    };
    let several = (count > 1).then(|| format!("{count} new messages"));
    let (title, body) = match content {
        Content::Full => {
            // A message without text has attachments (a send's only empty body).
            let preview = match newest.body {
                "" => ATTACHMENT_PREVIEW.to_owned(),
                text => first_chars(text, PREVIEW_CHARS),
            };
            let body = match several {
                Some(n) => format!("{n}: {preview}"),
                None => preview,
            };
            (who, body)
        }
        Content::Sender => {
            let body = match several {
                Some(n) => format!("{n}, the newest from {sender}"),
                None => format!("New message from {sender}"),
            };
            (who, body)
        }
        Content::None => (
            "New message".to_owned(),
            several.unwrap_or_else(|| "New message".to_owned()),
        ),
    };
    Notification {
        title,
        body,
        badge,
        data: NotificationData {
            conversation_id: conversation_id.clone(),
            seq: newest.seq,
        },
    }
}

/// A notification's badge, counted over an inbox walk: the conversations with unread messages.
/// A walk may list a conversation twice when it moves meanwhile (docs/api.md §14): each counts
/// once, as its newest entry says (the higher `lastSeq`; of equal ones, the one read later).
#[derive(Debug, Default)]
pub struct Badge {
    seen: std::collections::HashMap<String, (u64, bool)>,
}

impl Badge {
    /// One inbox entry: its conversation, `lastSeq` and whether its unread count is above 0.
    pub fn entry(&mut self, conversation_id: &str, last_seq: u64, unread: bool) {
        let newest = (last_seq, unread);
        self.seen
            .entry(conversation_id.to_owned())
            .and_modify(|e| {
                if last_seq >= e.0 {
                    *e = newest;
                }
            })
            .or_insert(newest);
    }

    pub fn count(&self) -> u64 {
        self.seen.values().filter(|(_, unread)| *unread).count() as u64
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_badge_counts_each_conversation_once_as_its_newest_entry_says() {
        let mut b = Badge::default();
        b.entry("c1", 4, true);
        b.entry("c2", 7, false);
        b.entry("c3", 2, true);
        // Listed again by a walk they moved past: c2 got a message, c3 was read meanwhile.
        b.entry("c2", 8, true);
        b.entry("c3", 2, false);
        // An older copy read later changes nothing.
        b.entry("c1", 3, false);
        assert_eq!(b.count(), 2);
    }

    use super::*;

    #[test]
    fn registrations_parse_and_bad_input_is_refused() {
        let ok =
            DeviceRegistration::parse(br#"{"platform":"apns_sandbox","token":"ab12"}"#).unwrap();
        assert_eq!(
            (ok.platform, ok.token.as_str()),
            (Platform::ApnsSandbox, "ab12")
        );
        for bad in [
            r#"{"platform":"wns","token":"ab"}"#,
            r#"{"platform":"fcm","token":""}"#,
            r#"{"platform":"fcm","token":"  "}"#,
            r#"{"platform":"fcm","token":"a b"}"#,
            r#"{"platform":"fcm"}"#,
            r#"{"token":"ab"}"#,
            r#"{"platform":1,"token":"ab"}"#,
        ] {
            assert!(DeviceRegistration::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        let long = format!(
            r#"{{"platform":"fcm","token":"{}"}}"#,
            "a".repeat(MAX_TOKEN_CHARS + 1)
        );
        assert!(DeviceRegistration::parse(long.as_bytes()).is_err());
        let longest = format!(
            r#"{{"platform":"fcm","token":"{}"}}"#,
            "a".repeat(MAX_TOKEN_CHARS)
        );
        assert!(DeviceRegistration::parse(longest.as_bytes()).is_ok());
    }

    #[test]
    fn device_ids_are_bounded() {
        assert_eq!(
            device_id_param(Some("iphone-1.a_b:c")).unwrap(),
            "iphone-1.a_b:c"
        );
        for bad in [None, Some(""), Some("a b"), Some("a/b"), Some("é")] {
            assert!(device_id_param(bad).is_err(), "{bad:?}");
        }
        assert!(device_id_param(Some(&"a".repeat(129))).is_err());
        assert!(device_id_param(Some(&"a".repeat(128))).is_ok());
    }

    #[test]
    fn the_eleventh_device_evicts_the_least_recently_registered() {
        let devices = |n: usize| -> Vec<(String, String)> {
            (0..n)
                .map(|i| {
                    (
                        format!("d{i}"),
                        format!("2026-12-03T00:00:{:02}.000Z", 59 - i),
                    )
                })
                .collect()
        };
        assert!(devices_to_evict(&devices(10)).is_empty());
        // 10 and the new one (d0, the newest): the oldest (registered first: d10) goes.
        assert_eq!(devices_to_evict(&devices(11)), vec!["d10".to_owned()]);
        assert_eq!(
            devices_to_evict(&devices(12)),
            vec!["d11".to_owned(), "d10".to_owned()]
        );
        // Seen in any part, a look never evicts one of the 10 newest of all.
        let all = devices(15);
        for seen in [&all[..11], &all[3..], &all[..]] {
            let evicted = devices_to_evict(seen);
            assert!(
                evicted.iter().all(|d| !all[..10].iter().any(|n| &n.0 == d)),
                "{evicted:?}"
            );
        }
    }

    #[test]
    fn settings_parse_and_mute() {
        let none = NotificationSettings::parse(br#"{"level":"none"}"#).unwrap();
        assert!(none.is_muted("2026-12-03T00:00:00.000Z"));
        let until =
            NotificationSettings::parse(br#"{"level":"all","mutedUntil":"2026-12-03T10:00:00Z"}"#)
                .unwrap();
        assert_eq!(
            until.muted_until.as_deref(),
            Some("2026-12-03T10:00:00.000Z")
        );
        assert!(until.is_muted("2026-12-03T09:59:59.999Z"));
        assert!(!until.is_muted("2026-12-03T10:00:00.000Z"));
        assert!(!NotificationSettings::default().is_muted("2026-12-03T00:00:00.000Z"));
        for bad in [
            r#"{"level":"some"}"#,
            r#"{}"#,
            r#"{"level":"all","mutedUntil":"tomorrow"}"#,
            r#"{"level":"all","mutedUntil":5}"#,
            // Past 9999 in UTC (found by probing: a 503), before 0000 (stored as "-001-…").
            r#"{"level":"none","mutedUntil":"9999-12-31T23:00:00-01:00"}"#,
            r#"{"level":"none","mutedUntil":"0000-01-01T00:30:00+01:00"}"#,
        ] {
            assert!(
                NotificationSettings::parse(bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            serde_json::to_value(NotificationSettings::default()).unwrap(),
            serde_json::json!({"level": "all"})
        );
    }

    #[test]
    fn the_decision_counts_what_is_unread_in_the_window() {
        // Window of seqs 4..=6.
        assert_eq!(
            decide(0, 6, 4, false),
            Some(3),
            "older unread: the window's three"
        );
        assert_eq!(decide(4, 6, 4, false), Some(2));
        assert_eq!(decide(6, 6, 4, false), None, "read within the delay");
        assert_eq!(decide(7, 6, 4, false), None);
        assert_eq!(decide(0, 6, 4, true), None, "muted");
        assert_eq!(decide(0, 1, 1, false), Some(1));
    }

    #[test]
    fn a_member_is_told_of_what_it_can_read_from_whom_it_does_not_block() {
        let (a, b, c) = (
            UserId::parse("a").unwrap(),
            UserId::parse("b").unwrap(),
            UserId::parse("c").unwrap(),
        );
        let m = |seq, sender, deleted| WindowMessage {
            seq,
            sender,
            deleted,
        };
        // Window of seqs 4..=7: c, b, c, b.
        let window = [
            m(4, &c, false),
            m(5, &b, false),
            m(6, &c, false),
            m(7, &b, false),
        ];
        let nobody = |_: &UserId| false;
        assert_eq!(told_of(&window, 4, 0, nobody), Some((4, 7)));
        assert_eq!(told_of(&window, 4, 5, nobody), Some((2, 7)), "read up to 5");
        let blocks_b = |u: &UserId| *u == b;
        assert_eq!(
            told_of(&window, 4, 0, blocks_b),
            Some((2, 6)),
            "c's two, the newest c's"
        );
        assert_eq!(told_of(&window, 4, 6, blocks_b), None, "only b's unread");
        assert_eq!(told_of(&window[1..2], 4, 0, blocks_b), None);
        let deleted = [m(4, &c, false), m(5, &a, true)];
        assert_eq!(
            told_of(&deleted, 4, 0, nobody),
            Some((1, 4)),
            "not a tombstone"
        );
        assert_eq!(told_of(&deleted[1..], 4, 0, nobody), None);
        assert_eq!(
            told_of(&window, 5, 0, nobody),
            Some((3, 7)),
            "the window's own"
        );
    }

    #[test]
    fn a_check_tells_of_the_messages_whose_delay_is_over() {
        let delay = 2_000;
        let window = [(5, 10_000), (6, 10_500), (7, 11_900), (8, 12_000)];
        assert_eq!(matured_through(&window, 5, 9_000, delay), 4, "none yet");
        assert_eq!(matured_through(&window, 5, 12_000, delay), 5);
        assert_eq!(matured_through(&window, 5, 13_899, delay), 6);
        assert_eq!(matured_through(&window, 5, 13_900, delay), 7);
        assert_eq!(matured_through(&window, 5, 14_000, delay), 8, "all");
        assert_eq!(matured_through(&[], 5, 14_000, delay), 4);
    }

    #[test]
    fn a_window_starts_after_what_the_one_before_counted() {
        assert_eq!(window_start(5, 0), 5, "no window before");
        assert_eq!(window_start(5, 4), 5, "the one before ended below");
        assert_eq!(
            window_start(5, 2),
            3,
            "the one before left 3 and 4, younger, to this one"
        );
        assert_eq!(window_start(5, 6), 7, "the one before counted 5 and 6");
        // Nothing left: the conversation's last seq (6) is below the start.
        assert_eq!(decide(0, 6, window_start(5, 6), false), None);
        assert_eq!(decide(0, 7, window_start(5, 6), false), Some(1));
    }

    #[test]
    fn payloads_follow_the_content_setting() {
        let c = ConversationId::parse("d-00000000000000000000000000000001").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let long = "x".repeat(150);
        let newest = Newest {
            seq: 7,
            sender: &alice,
            body: &long,
            group_title: None,
        };
        let full = notification(Content::Full, &c, &newest, 1, 2);
        assert_eq!(full.title, "alice");
        assert_eq!(
            full.body,
            "x".repeat(100),
            "the first 100 characters, no more"
        );
        assert_eq!((full.badge, full.data.seq), (2, 7));
        let three = notification(
            Content::Full,
            &c,
            &Newest {
                body: "hi",
                ..newest.clone()
            },
            3,
            1,
        );
        assert_eq!(three.body, "3 new messages: hi");
        let photo = Newest {
            body: "",
            ..newest.clone()
        };
        assert_eq!(
            notification(Content::Full, &c, &photo, 1, 1).body,
            "Sent an attachment"
        );
        let sender = notification(Content::Sender, &c, &newest, 1, 1);
        assert_eq!(sender.body, "New message from alice");
        assert!(!sender.body.contains('x'));
        let none = notification(
            Content::None,
            &c,
            &Newest {
                group_title: Some("Team"),
                ..newest.clone()
            },
            1,
            1,
        );
        assert_eq!(
            (none.title.as_str(), none.body.as_str()),
            ("New message", "New message")
        );
        let group = notification(
            Content::Sender,
            &c,
            &Newest {
                group_title: Some("Team"),
                ..newest
            },
            2,
            1,
        );
        assert_eq!(group.title, "alice in Team");
        assert_eq!(
            serde_json::to_value(&group.data).unwrap(),
            serde_json::json!({"conversationId": c.as_str(), "seq": 7})
        );
    }
    /// A message late in a window makes the window wait for that message's own delay (found by
    /// probing: it was notified 0.3 s after it was sent, and its read 0.7 s later cancelled
    /// nothing), however long the window was open, up to twice the delay.
    #[test]
    fn a_window_waits_for_its_newest_messages_delay_up_to_twice_the_delay() {
        let delay = 2_000;
        // Opened at 0, the job due at 2,000: its newest message from 1,910 waits until 3,910.
        assert_eq!(window_waits_until(1, 1_910, 2_000, delay), Some(3_910));
        // Newest as old as the delay, or older: now.
        assert_eq!(window_waits_until(1, 1, 2_001, delay), None);
        assert_eq!(window_waits_until(1, 0, 2_000, delay), None);
        // A steady stream: never past two delays after the window opened.
        assert_eq!(window_waits_until(1_000, 4_900, 3_000, delay), Some(5_000));
        assert_eq!(window_waits_until(1_000, 4_990, 5_000, delay), None);
        // A job from before the field: now.
        assert_eq!(window_waits_until(0, 1_910, 2_000, delay), None);
        // The window's JSON without it reads as 0.
        let old: NotifyWindow = serde_json::from_str(
            r#"{"conversationId":"d-00000000000000000000000000000001","fromSeq":3}"#,
        )
        .unwrap();
        assert_eq!((old.from_seq, old.opened_at_ms), (3, 0));
    }
}
