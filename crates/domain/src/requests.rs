//! Parsing what clients send into the domain's types (docs/api.md §2, §16). Every rejection
//! names the offending field; the bounds themselves are domain rules; nothing here touches storage.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

use crate::attachments::parse_attachment_ids;
use crate::conversation::{check_member_bound, check_title};
use crate::error::ChatError;
use crate::message::check_body;
use crate::{ConversationId, UserId};

pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
pub const MAX_PAGE_LIMIT: u32 = 100;
pub const DEFAULT_HISTORY_LIMIT: u32 = 50;
pub const DEFAULT_INBOX_LIMIT: u32 = 20;

fn invalid(msg: impl Into<String>) -> ChatError {
    ChatError::invalid(msg)
}

/// A JSON object request body.
pub struct Fields(Map<String, Value>);

/// A request body's top-level object, refused when a field appears twice: JSON leaves what that
/// means to the reader (ours would take the last, a proxy in front the first), and an
/// idempotency key two readers see differently is no key.
struct Object(Map<String, Value>);

/// How a field's own fault is told apart from the body's (its message is passed on as it is).
const FIELD: &str = "field `";

impl<'de> serde::Deserialize<'de> for Object {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Object;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Object, A::Error> {
                let mut map = Map::new();
                while let Some(name) = a.next_key::<String>()? {
                    if map.contains_key(&name) {
                        return Err(serde::de::Error::custom(format!(
                            "{FIELD}{name}` appears more than once"
                        )));
                    }
                    // A value JSON allows but we cannot hold (`1e400`) names its field.
                    let value = a.next_value().map_err(|e: A::Error| {
                        let e = e.to_string();
                        let e = e.split(" at line ").next().unwrap_or_default();
                        serde::de::Error::custom(format!("{FIELD}{name}` is not valid JSON: {e}"))
                    })?;
                    map.insert(name, value);
                }
                Ok(Object(map))
            }
        }
        d.deserialize_map(Fields)
    }
}

impl Fields {
    pub fn parse(body: &[u8]) -> Result<Fields, ChatError> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(ChatError::PayloadTooLarge(format!(
                "request body is larger than {MAX_REQUEST_BYTES} bytes"
            )));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(invalid("request body is required (a JSON object)"));
        }
        match serde_json::from_slice::<Object>(body) {
            Ok(Object(map)) => Ok(Fields(map)),
            Err(e) if e.is_data() && e.to_string().starts_with(FIELD) => {
                Err(invalid(format!("{e}")))
            }
            Err(e) if e.is_data() => Err(invalid("request body must be a JSON object")),
            Err(e) => Err(invalid(format!("request body is not valid JSON: {e}"))),
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn required_str(&self, name: &str) -> Result<&str, ChatError> {
        match self.get(name) {
            None => Err(invalid(format!("missing field `{name}`"))),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(invalid(format!("field `{name}` must be a string"))),
        }
    }

    pub fn optional_str(&self, name: &str) -> Result<Option<&str>, ChatError> {
        match self.get(name) {
            None => Ok(None),
            Some(_) => self.required_str(name).map(Some),
        }
    }

    pub fn required_seq(&self, name: &str) -> Result<u64, ChatError> {
        match self.get(name) {
            None => Err(invalid(format!("missing field `{name}`"))),
            Some(v) => whole_number(v)
                .ok_or_else(|| invalid(format!("field `{name}` must be a non-negative integer"))),
        }
    }

    /// A whole number of any size, for a field whose bound the caller checks: past `u64` it
    /// saturates, so that the bound refuses it as too large rather than as malformed.
    pub fn required_size(&self, name: &str) -> Result<u64, ChatError> {
        match self.get(name) {
            Some(Value::Number(n))
                if n.as_u64().is_none()
                    && n.as_f64().is_some_and(|f| f >= 1.8e19 && f.fract() == 0.0) =>
            {
                Ok(u64::MAX)
            }
            _ => self.required_seq(name),
        }
    }

    pub fn required_bool(&self, name: &str) -> Result<bool, ChatError> {
        match self.get(name) {
            None => Err(invalid(format!("missing field `{name}`"))),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(format!("field `{name}` must be true or false"))),
        }
    }

    /// An optional array of strings (absent: empty).
    pub fn optional_strings(&self, name: &str) -> Result<Vec<&str>, ChatError> {
        let must = || invalid(format!("field `{name}` must be an array of strings"));
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => {
                items.iter().map(|v| v.as_str().ok_or_else(must)).collect()
            }
            Some(_) => Err(must()),
        }
    }

    /// An array of user ids, deduplicated, order kept.
    /// How many entries the array `name` has as sent (0: absent or not an array).
    pub fn array_len(&self, name: &str) -> usize {
        self.get(name).and_then(Value::as_array).map_or(0, Vec::len)
    }

    pub fn user_ids(&self, name: &str, required: bool) -> Result<Vec<UserId>, ChatError> {
        let items = match self.get(name) {
            None if required => return Err(invalid(format!("missing field `{name}`"))),
            None => return Ok(Vec::new()),
            Some(Value::Array(items)) => items,
            Some(_) => {
                return Err(invalid(format!(
                    "field `{name}` must be an array of user ids"
                )))
            }
        };
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for item in items {
            let id = item
                .as_str()
                .and_then(UserId::parse)
                .ok_or_else(|| invalid(format!("field `{name}` contains an invalid user id")))?;
            if seen.insert(id.clone()) {
                out.push(id);
            }
        }
        Ok(out)
    }
}

/// The `{conversationId}` of a path. An id this service never hands out names no conversation:
/// `404`, like any unknown one.
pub fn conversation_id_param(raw: Option<&str>) -> Result<ConversationId, ChatError> {
    raw.and_then(ConversationId::parse)
        .ok_or(ChatError::NotFound)
}

/// The `{userId}` of a path.
pub fn user_id_param(raw: Option<&str>) -> Result<UserId, ChatError> {
    raw.and_then(UserId::parse)
        .ok_or_else(|| invalid("path parameter `userId` is not a valid user id"))
}

/// A client-generated id: a UUID in its canonical 36-character form, compared case-insensitively.
pub fn parse_uuid(field: &str, s: &str) -> Result<String, ChatError> {
    let ok = s.len() == 36 && uuid::Uuid::try_parse(s).is_ok();
    if ok {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(invalid(format!("field `{field}` must be a UUID")))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateConversation {
    Direct {
        peer: UserId,
    },
    Group {
        title: String,
        /// Other members; the caller is added as owner.
        members: Vec<UserId>,
        client_request_id: Option<String>,
    },
}

impl CreateConversation {
    pub fn parse(body: &[u8], caller: &UserId) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        match f.required_str("type")? {
            "direct" => {
                let peer = UserId::parse(f.required_str("peerId")?)
                    .ok_or_else(|| invalid("field `peerId` is not a valid user id"))?;
                if &peer == caller {
                    return Err(invalid("field `peerId` must not be the caller"));
                }
                Ok(CreateConversation::Direct { peer })
            }
            "group" => {
                let title = f.required_str("title")?;
                check_title(title)?;
                let mut members = f.user_ids("memberIds", false)?;
                members.retain(|m| m != caller);
                check_member_bound(members.len() + 1)?;
                let client_request_id = f
                    .optional_str("clientRequestId")?
                    .map(|s| parse_uuid("clientRequestId", s))
                    .transpose()?;
                Ok(CreateConversation::Group {
                    title: title.to_owned(),
                    members,
                    client_request_id,
                })
            }
            _ => Err(invalid("field `type` must be \"direct\" or \"group\"")),
        }
    }
}

pub fn parse_add_members(body: &[u8]) -> Result<Vec<UserId>, ChatError> {
    let ids = Fields::parse(body)?.user_ids("userIds", true)?;
    if ids.is_empty() {
        return Err(invalid("field `userIds` must not be empty"));
    }
    check_member_bound(ids.len())?;
    Ok(ids)
}

/// A non-negative whole number. JSON has one number type: `120.0` is the integer 120 (as JSON
/// Schema counts it), so a client that serialises numbers as floats is not refused.
fn whole_number(v: &Value) -> Option<u64> {
    let Value::Number(n) = v else { return None };
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 1.8e19)
            .map(|f| f as u64)
    })
}

/// `updateConversation` (docs/api.md §25): `{"slowModeSeconds": 0-120}`.
pub fn parse_update_conversation(body: &[u8]) -> Result<u64, ChatError> {
    let f = Fields::parse(body)?;
    let max = crate::rate::MAX_SLOW_MODE_SECONDS;
    match f.get("slowModeSeconds").and_then(whole_number) {
        Some(seconds) if seconds <= max => Ok(seconds),
        _ => Err(invalid(format!(
            "field `slowModeSeconds` must be a whole number of seconds, 0-{max}"
        ))),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendMessage {
    /// As the client wrote it (returned unchanged).
    pub client_msg_id: String,
    /// Lower-case form: the idempotency key.
    pub client_msg_key: String,
    pub body: String,
    /// Attachment ids (lower case, distinct, at most 10; docs/api.md §34).
    pub attachments: Vec<String>,
    /// The connection the request names as its own (`X-Connection-Id`, `parse_origin`): the
    /// message's push skips it.
    pub origin: Option<String>,
}

impl SendMessage {
    pub fn parse(body: &[u8]) -> Result<Self, ChatError> {
        let f = Fields::parse(body)?;
        let client_msg_id = f.required_str("clientMsgId")?;
        let client_msg_key = parse_uuid("clientMsgId", client_msg_id)?;
        let attachments = parse_attachment_ids(&f)?;
        // With attachments the body may be empty (or absent).
        let text = match f.optional_str("body")? {
            None | Some("") if !attachments.is_empty() => "",
            _ => f.required_str("body")?,
        };
        if !text.is_empty() || attachments.is_empty() {
            check_body(text)?;
        }
        Ok(SendMessage {
            client_msg_id: client_msg_id.to_owned(),
            client_msg_key,
            body: text.to_owned(),
            attachments,
            origin: None,
        })
    }

    /// The same send, from the connection `origin` (`parse_origin`).
    pub fn from_origin(self, origin: Option<String>) -> Self {
        SendMessage { origin, ..self }
    }
}

pub fn parse_mark_read(body: &[u8]) -> Result<u64, ChatError> {
    Fields::parse(body)?.required_seq("seq")
}

/// The header by which a request names the client's own WebSocket connection (docs/api.md
/// §15.4): the push of what it changes (its message, its read receipt) skips that connection,
/// which has the answer already.
pub const ORIGIN_HEADER: &str = "x-connection-id";

/// The longest `X-Connection-Id` taken (API Gateway's ids have 16 characters).
pub const MAX_ORIGIN_CHARS: usize = 128;

/// `X-Connection-Id` as sent (None: absent): 1–128 characters of the base64 alphabets (standard
/// and URL-safe) and `=`, as the `hello` frame gives them (docs/api.md §15.4).
pub fn parse_origin(value: Option<&[u8]>) -> Result<Option<String>, ChatError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || b"+/=_-".contains(b);
    if value.is_empty() || value.len() > MAX_ORIGIN_CHARS || !value.iter().all(allowed) {
        return Err(invalid(format!(
            "header `X-Connection-Id` must be 1-{MAX_ORIGIN_CHARS} characters of \
             A-Z a-z 0-9 + / = _ - (the connectionId of the `hello` frame)"
        )));
    }
    Ok(Some(String::from_utf8_lossy(value).into_owned()))
}

/// Query-string access: each parameter at most once (docs/api.md §1).
pub trait QueryParams {
    /// Every value given for `name`, in order.
    fn values(&self, name: &str) -> Vec<&str>;

    /// The value of `name`, if given; given twice or more: `400` naming it (which one would
    /// count is anyone's guess).
    fn one(&self, name: &str) -> Result<Option<&str>, ChatError> {
        match self.values(name)[..] {
            [] => Ok(None),
            [v] => Ok(Some(v)),
            _ => Err(invalid(format!(
                "query parameter `{name}` must be given at most once"
            ))),
        }
    }
}

fn seq_param(q: &dyn QueryParams, name: &str) -> Result<Option<u64>, ChatError> {
    match q.one(name)? {
        None => Ok(None),
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => v
            .parse()
            .map(Some)
            .map_err(|_| invalid(format!("query parameter `{name}` is too large"))),
        Some(_) => Err(invalid(format!(
            "query parameter `{name}` must be a non-negative integer"
        ))),
    }
}

pub fn page_limit(q: &dyn QueryParams, default: u32) -> Result<u32, ChatError> {
    match q.one("limit")? {
        None => Ok(default),
        // Digits only: `parse` would also take a sign (`+5`).
        Some(v) => Some(v)
            .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|l| (1..=MAX_PAGE_LIMIT).contains(l))
            .ok_or_else(|| {
                invalid(format!(
                    "query parameter `limit` must be an integer from 1 to {MAX_PAGE_LIMIT}"
                ))
            }),
    }
}

/// Where a history page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryCursor {
    Newest,
    Before(u64),
    After(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryQuery {
    pub cursor: HistoryCursor,
    pub limit: u32,
}

impl HistoryQuery {
    pub fn parse(q: &dyn QueryParams) -> Result<Self, ChatError> {
        let cursor = match (seq_param(q, "beforeSeq")?, seq_param(q, "afterSeq")?) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "query parameters `beforeSeq` and `afterSeq` cannot be combined",
                ))
            }
            (Some(b), None) => HistoryCursor::Before(b),
            (None, Some(a)) => HistoryCursor::After(a),
            (None, None) => HistoryCursor::Newest,
        };
        Ok(HistoryQuery {
            cursor,
            limit: page_limit(q, DEFAULT_HISTORY_LIMIT)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    impl QueryParams for HashMap<&str, &str> {
        fn values(&self, name: &str) -> Vec<&str> {
            self.get(name).copied().into_iter().collect()
        }
    }

    /// A query string as pairs, repeats and all.
    struct Pairs<'a>(Vec<(&'a str, &'a str)>);

    impl QueryParams for Pairs<'_> {
        fn values(&self, name: &str) -> Vec<&str> {
            self.0
                .iter()
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| *v)
                .collect()
        }
    }

    #[test]
    fn a_query_parameter_given_twice_is_refused_by_its_name() {
        let twice = Pairs(vec![("afterSeq", "1"), ("limit", "5"), ("afterSeq", "2")]);
        let e = HistoryQuery::parse(&twice).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("`afterSeq`"), "{e}");
        let limit_twice = Pairs(vec![("limit", "5"), ("limit", "5")]);
        assert_eq!(page_limit(&limit_twice, 20).unwrap_err().status(), 400);
        let once = Pairs(vec![
            ("afterSeq", "1"),
            ("limit", "5"),
            ("other", "x"),
            ("other", "y"),
        ]);
        assert_eq!(
            HistoryQuery::parse(&once).unwrap(),
            HistoryQuery {
                cursor: HistoryCursor::After(1),
                limit: 5
            }
        );
    }

    fn caller() -> UserId {
        UserId::parse("u1").unwrap()
    }

    fn err_msg<T: std::fmt::Debug>(r: Result<T, ChatError>) -> (u16, String) {
        let e = r.unwrap_err();
        (e.status(), e.to_string())
    }

    #[test]
    fn an_origin_is_a_connection_id_or_a_400() {
        let ok = |v: &str| parse_origin(Some(v.as_bytes())).unwrap();
        assert_eq!(parse_origin(None).unwrap(), None);
        assert_eq!(ok("L0SM9cOFvHcCIhw="), Some("L0SM9cOFvHcCIhw=".into()));
        assert_eq!(ok("a_b-c+d/e"), Some("a_b-c+d/e".into()));
        assert_eq!(ok(&"x".repeat(128)).map(|o| o.len()), Some(128));
        for bad in ["", " ", "a b", "é", "a;b", &"x".repeat(129)] {
            let (status, msg) = err_msg(parse_origin(Some(bad.as_bytes())));
            assert_eq!(status, 400, "{bad:?}");
            assert!(msg.contains("X-Connection-Id"), "{msg}");
        }
        assert_eq!(err_msg(parse_origin(Some(&[0xff, 0x41]))).0, 400);
    }

    #[test]
    fn send_message_bounds() {
        let id = "6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f";
        let ok = |body: &str| {
            SendMessage::parse(
                serde_json::json!({"clientMsgId": id, "body": body})
                    .to_string()
                    .as_bytes(),
            )
        };
        assert!(ok(&"x".repeat(4000)).is_ok());
        assert_eq!(ok(&"x".repeat(4001)).unwrap_err().status(), 413);
        // 4,000 four-byte characters are 16,000 bytes: within both limits.
        assert!(ok(&"😀".repeat(4000)).is_ok());
        // (Characters are at most 4 bytes, so 4,000 of them never pass 16 KiB: both limits hold.)
        assert_eq!(ok(&"日".repeat(4001)).unwrap_err().status(), 413);
        assert_eq!(ok("").unwrap_err().status(), 400);
        assert_eq!(ok(" \n<script>").unwrap().body, " \n<script>");
    }

    #[test]
    fn send_message_fields_named() {
        let (s, m) = err_msg(SendMessage::parse(br#"{"clientMsgId":"nope","body":"x"}"#));
        assert_eq!(s, 400);
        assert!(m.contains("clientMsgId"), "{m}");
        let (_, m) = err_msg(SendMessage::parse(
            br#"{"clientMsgId":"6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f","body":5}"#,
        ));
        assert!(m.contains("body"), "{m}");
        let (_, m) = err_msg(SendMessage::parse(br#"{"body":"x"}"#));
        assert!(m.contains("clientMsgId"), "{m}");
        assert_eq!(err_msg(SendMessage::parse(b"")).0, 400);
        assert_eq!(err_msg(SendMessage::parse(b"{not json")).0, 400);
        assert_eq!(err_msg(SendMessage::parse(b"[1]")).0, 400);
        let upper = SendMessage::parse(
            br#"{"clientMsgId":"6F1C2A1E-98C1-4D6B-9A51-0E4B7C1D2E3F","body":"x"}"#,
        )
        .unwrap();
        assert_eq!(upper.client_msg_key, "6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f");
        assert_eq!(upper.client_msg_id, "6F1C2A1E-98C1-4D6B-9A51-0E4B7C1D2E3F");
        // Simple (unhyphenated) form is not the canonical UUID text.
        assert_eq!(
            err_msg(SendMessage::parse(
                br#"{"clientMsgId":"6f1c2a1e98c14d6b9a510e4b7c1d2e3f","body":"x"}"#
            ))
            .0,
            400
        );
    }

    #[test]
    fn path_ids() {
        let id = "g-00000000000000000000000000000001";
        assert_eq!(conversation_id_param(Some(id)).unwrap().as_str(), id);
        for bad in [None, Some(""), Some("x"), Some(&*"g-0".repeat(400))] {
            assert_eq!(conversation_id_param(bad).unwrap_err().status(), 404);
        }
        assert_eq!(user_id_param(Some("a@b:c")).unwrap().as_str(), "a@b:c");
        let long = "u".repeat(1100);
        for bad in [None, Some("a b"), Some(long.as_str())] {
            let e = user_id_param(bad).unwrap_err();
            assert_eq!(e.status(), 400);
            assert!(e.to_string().contains("userId"));
        }
    }

    #[test]
    fn request_body_limit() {
        let big = format!(r#"{{"seq":1,"pad":"{}"}}"#, "x".repeat(MAX_REQUEST_BYTES));
        assert_eq!(err_msg(parse_mark_read(big.as_bytes())).0, 413);
    }

    /// A field given twice is refused, naming it (found by probing: the last one was taken);
    /// what is not an object, or not JSON, is told apart.
    #[test]
    fn a_repeated_field_is_refused() {
        let id = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        let twice = format!(r#"{{"clientMsgId":"{id}","clientMsgId":"{id}","body":"b"}}"#);
        let (status, message) = err_msg(SendMessage::parse(twice.as_bytes()));
        assert_eq!(status, 400);
        assert!(
            message.contains("`clientMsgId` appears more than once"),
            "{message}"
        );
        let (_, message) = err_msg(parse_mark_read(br#"{"seq":1,"seq":2}"#));
        assert!(message.contains("`seq`"), "{message}");
        for (body, says) in [
            (&b"[1]"[..], "must be a JSON object"),
            (b"5", "must be a JSON object"),
            (b"{\"seq\":1} x", "not valid JSON"),
            (b"{\"seq\":", "not valid JSON"),
            (
                b"{\"seq\":1e400}",
                "field `seq` is not valid JSON: number out of range",
            ),
        ] {
            let (status, message) = err_msg(parse_mark_read(body));
            assert_eq!(status, 400);
            assert!(message.contains(says), "{message}");
        }
        // Nested objects are the fields' own business; one field once is fine.
        assert!(parse_mark_read(br#"{"seq":1,"x":{"a":1,"a":2}}"#).is_ok());
    }

    #[test]
    fn update_conversation_slow_mode_bounds() {
        assert_eq!(
            parse_update_conversation(br#"{"slowModeSeconds":0}"#),
            Ok(0)
        );
        assert_eq!(
            parse_update_conversation(br#"{"slowModeSeconds":120}"#),
            Ok(120)
        );
        assert_eq!(
            parse_update_conversation(br#"{"slowModeSeconds":86.0}"#),
            Ok(86)
        );
        for bad in [
            &br#"{"slowModeSeconds":121}"#[..],
            br#"{"slowModeSeconds":-1}"#,
            br#"{"slowModeSeconds":1.5}"#,
            br#"{"slowModeSeconds":"5"}"#,
            br#"{}"#,
        ] {
            let (status, msg) = err_msg(parse_update_conversation(bad));
            assert_eq!(status, 400);
            assert!(msg.contains("slowModeSeconds"), "{msg}");
        }
    }

    #[test]
    fn mark_read_seq() {
        assert_eq!(parse_mark_read(br#"{"seq":120}"#).unwrap(), 120);
        assert_eq!(parse_mark_read(br#"{"seq":120.0}"#).unwrap(), 120);
        assert_eq!(parse_mark_read(br#"{"seq":1e3}"#).unwrap(), 1000);
        for bad in [
            r#"{"seq":-1}"#,
            r#"{"seq":-1.0}"#,
            r#"{"seq":1.5}"#,
            r#"{"seq":1e30}"#,
            r#"{"seq":"3"}"#,
            r#"{}"#,
            r#"{"seq":null}"#,
        ] {
            let (s, m) = err_msg(parse_mark_read(bad.as_bytes()));
            assert_eq!(s, 400, "{bad}");
            assert!(m.contains("seq"), "{m}");
        }
    }

    #[test]
    fn create_conversation() {
        let c = caller();
        assert_eq!(
            CreateConversation::parse(br#"{"type":"direct","peerId":"u2"}"#, &c).unwrap(),
            CreateConversation::Direct {
                peer: UserId::parse("u2").unwrap()
            }
        );
        assert_eq!(
            err_msg(CreateConversation::parse(
                br#"{"type":"direct","peerId":"u1"}"#,
                &c
            ))
            .0,
            400
        );
        assert_eq!(
            err_msg(CreateConversation::parse(
                br#"{"type":"direct","peerId":"a b"}"#,
                &c
            ))
            .0,
            400
        );
        assert_eq!(
            err_msg(CreateConversation::parse(br#"{"type":"channel"}"#, &c)).0,
            400
        );
        let g = CreateConversation::parse(
            br#"{"type":"group","title":"T","memberIds":["u2","u1","u2"]}"#,
            &c,
        )
        .unwrap();
        let CreateConversation::Group { members, .. } = g else {
            panic!()
        };
        assert_eq!(members, vec![UserId::parse("u2").unwrap()]);
        let long = format!(
            r#"{{"type":"group","title":"{}","memberIds":[]}}"#,
            "t".repeat(201)
        );
        assert_eq!(
            err_msg(CreateConversation::parse(long.as_bytes(), &c)).0,
            400
        );
        assert_eq!(
            err_msg(CreateConversation::parse(
                br#"{"type":"group","title":"","memberIds":[]}"#,
                &c
            ))
            .0,
            400
        );
        let ids: Vec<String> = (0..1000).map(|i| format!("m{i}")).collect();
        let too_many = serde_json::json!({"type":"group","title":"T","memberIds": ids}).to_string();
        assert_eq!(
            err_msg(CreateConversation::parse(too_many.as_bytes(), &c)).0,
            409
        );
        let ids: Vec<String> = (0..999).map(|i| format!("m{i}")).collect();
        let max = serde_json::json!({"type":"group","title":"T","memberIds": ids}).to_string();
        assert!(CreateConversation::parse(max.as_bytes(), &c).is_ok());
    }

    #[test]
    fn history_query() {
        let q = |pairs: &[(&'static str, &'static str)]| {
            HistoryQuery::parse(&pairs.iter().copied().collect::<HashMap<_, _>>())
        };
        assert_eq!(
            q(&[]).unwrap(),
            HistoryQuery {
                cursor: HistoryCursor::Newest,
                limit: 50
            }
        );
        assert_eq!(
            q(&[("beforeSeq", "10"), ("limit", "5")]).unwrap().cursor,
            HistoryCursor::Before(10)
        );
        assert_eq!(
            q(&[("afterSeq", "0")]).unwrap().cursor,
            HistoryCursor::After(0)
        );
        for bad in [
            vec![("beforeSeq", "1"), ("afterSeq", "2")],
            vec![("beforeSeq", "-1")],
            vec![("afterSeq", "x")],
            vec![("limit", "0")],
            vec![("limit", "101")],
            vec![("limit", "")],
            vec![("limit", "+5")],
            vec![("limit", "-0")],
        ] {
            assert_eq!(q(&bad).unwrap_err().status(), 400, "{bad:?}");
        }
    }
}
