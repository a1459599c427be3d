//! The REST API's routes, in one place: every operation (by its `operationId` in
//! docs/openapi.yaml), its method, path template and the function that serves it.
//!
//! What else names routes says the same, and `crates/http/tests/routes.rs` checks it: template.yaml's
//! HttpApi events (deployed), `[workspace.metadata.lambda.watch.router]` in Cargo.toml (local)
//! and docs/openapi.yaml. Everything that routes in code uses this table: the conversations
//! function's dispatch and path parameters (`chat_http::http`), the local REST edge and the tests'
//! in-process router.

/// An operation of the REST API (docs/api.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    CreateConversation,
    GetConversation,
    AddMembers,
    RemoveMember,
    SendMessage,
    History,
    MarkRead,
    ReadStates,
    Inbox,
    EditMessage,
    DeleteMessage,
    AddReaction,
    RemoveReaction,
    Reactions,
    Changes,
    BanMember,
    UnbanMember,
    BlockUser,
    UnblockUser,
    Blocks,
    ReportMessage,
    ModerationReports,
    SuspendUser,
    UnsuspendUser,
    Presence,
    SetPresenceVisibility,
    CreateAttachment,
    GetAttachment,
    UpdateConversation,
    AddAdmin,
    RemoveAdmin,
    RegisterDevice,
    Devices,
    UnregisterDevice,
    SetNotifications,
}

/// One route: an operation at `method` `path` (a template: `{name}` is a path parameter),
/// served by the function (binary) `function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub operation: Operation,
    /// Its `operationId` in docs/openapi.yaml.
    pub id: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub function: &'static str,
}

const fn route(
    operation: Operation,
    id: &'static str,
    method: &'static str,
    path: &'static str,
    function: &'static str,
) -> Route {
    Route {
        operation,
        id,
        method,
        path,
        function,
    }
}

use Operation::*;

/// Every route of the API.
#[rustfmt::skip]
pub const ROUTES: [Route; 35] = [
    route(CreateConversation, "createConversation", "POST", "/conversations", "conversations"),
    route(GetConversation, "getConversation", "GET", "/conversations/{conversationId}", "conversations"),
    route(AddMembers, "addMembers", "POST", "/conversations/{conversationId}/members", "conversations"),
    route(RemoveMember, "removeMember", "DELETE", "/conversations/{conversationId}/members/{userId}", "conversations"),
    route(SendMessage, "sendMessage", "POST", "/conversations/{conversationId}/messages", "send-message"),
    route(History, "history", "GET", "/conversations/{conversationId}/messages", "history"),
    route(MarkRead, "markRead", "POST", "/conversations/{conversationId}/read", "mark-read"),
    route(ReadStates, "readStates", "GET", "/conversations/{conversationId}/reads", "read-states"),
    route(Inbox, "inbox", "GET", "/inbox", "inbox"),
    route(EditMessage, "editMessage", "PATCH", "/conversations/{conversationId}/messages/{seq}", "message-changes"),
    route(DeleteMessage, "deleteMessage", "DELETE", "/conversations/{conversationId}/messages/{seq}", "message-changes"),
    route(AddReaction, "addReaction", "PUT", "/conversations/{conversationId}/messages/{seq}/reactions/{reaction}", "message-changes"),
    route(RemoveReaction, "removeReaction", "DELETE", "/conversations/{conversationId}/messages/{seq}/reactions/{reaction}", "message-changes"),
    route(Reactions, "reactions", "GET", "/conversations/{conversationId}/messages/{seq}/reactions", "message-changes"),
    route(Changes, "changes", "GET", "/conversations/{conversationId}/changes", "message-changes"),
    route(BanMember, "banMember", "POST", "/conversations/{conversationId}/bans/{userId}", "conversations"),
    route(UnbanMember, "unbanMember", "DELETE", "/conversations/{conversationId}/bans/{userId}", "conversations"),
    route(BlockUser, "blockUser", "PUT", "/me/blocks/{userId}", "conversations"),
    route(UnblockUser, "unblockUser", "DELETE", "/me/blocks/{userId}", "conversations"),
    route(Blocks, "blocks", "GET", "/me/blocks", "conversations"),
    route(ReportMessage, "reportMessage", "POST", "/conversations/{conversationId}/messages/{seq}/reports", "message-changes"),
    route(ModerationReports, "moderationReports", "GET", "/moderation/reports", "conversations"),
    route(SuspendUser, "suspendUser", "PUT", "/moderation/suspensions/{userId}", "conversations"),
    route(UnsuspendUser, "unsuspendUser", "DELETE", "/moderation/suspensions/{userId}", "conversations"),
    route(Presence, "presence", "POST", "/presence", "conversations"),
    route(SetPresenceVisibility, "setPresenceVisibility", "PUT", "/me/presence", "conversations"),
    route(CreateAttachment, "createAttachment", "POST", "/conversations/{conversationId}/attachments", "attachments"),
    route(GetAttachment, "getAttachment", "GET", "/conversations/{conversationId}/attachments/{attachmentId}", "attachments"),
    route(UpdateConversation, "updateConversation", "PATCH", "/conversations/{conversationId}", "conversations"),
    route(AddAdmin, "addAdmin", "PUT", "/conversations/{conversationId}/admins/{userId}", "conversations"),
    route(RemoveAdmin, "removeAdmin", "DELETE", "/conversations/{conversationId}/admins/{userId}", "conversations"),
    route(RegisterDevice, "registerDevice", "PUT", "/devices/{deviceId}", "devices"),
    route(Devices, "devices", "GET", "/devices", "devices"),
    route(UnregisterDevice, "unregisterDevice", "DELETE", "/devices/{deviceId}", "devices"),
    route(SetNotifications, "setNotifications", "PUT", "/conversations/{conversationId}/notifications", "devices"),
];

impl Operation {
    pub fn route(self) -> &'static Route {
        ROUTES
            .iter()
            .find(|r| r.operation == self)
            .expect("every operation has a route")
    }

    /// Its `operationId` (docs/openapi.yaml).
    pub fn id(self) -> &'static str {
        self.route().id
    }
}

/// The path parameters of a matched request, as they stand in its path (percent-encoded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathParams(Vec<(&'static str, String)>);

impl PathParams {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.0.iter().map(|(n, v)| (*n, v.as_str()))
    }
}

fn segments(path: &str) -> impl Iterator<Item = &str> + Clone {
    path.split('/').filter(|s| !s.is_empty())
}

impl Route {
    /// `POST /conversations/{conversationId}/members`, as API Gateway names a route.
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// The names of its path parameters, in order.
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        segments(self.path).filter_map(param_name)
    }

    /// Whether `path` is this route's (segment by segment; empty segments, as of a trailing
    /// slash, do not count), with its path parameters.
    pub fn matches(&self, path: &str) -> Option<PathParams> {
        let (mut template, mut given) = (segments(self.path), segments(path));
        let mut params = Vec::new();
        loop {
            match (template.next(), given.next()) {
                (None, None) => return Some(PathParams(params)),
                (Some(t), Some(g)) => match param_name(t) {
                    Some(name) => params.push((name, g.to_owned())),
                    None if t == g => {}
                    None => return None,
                },
                _ => return None,
            }
        }
    }

    /// [`Route::matches`] for a path that may have a prefix ahead of the API's own (a stage
    /// name): the match starts at the first segment that is the template's first.
    pub fn matches_behind_prefix(&self, path: &str) -> Option<PathParams> {
        let first = segments(self.path).next()?;
        let start = path
            .match_indices('/')
            .map(|(i, _)| i)
            .chain([0])
            .filter(|&i| segments(&path[i..]).next() == Some(first))
            .min()?;
        self.matches(&path[start..])
    }
}

fn param_name(segment: &'static str) -> Option<&'static str> {
    segment.strip_prefix('{')?.strip_suffix('}')
}

/// The route of `method` `path` as API Gateway and the local router match them.
pub fn find(method: &str, path: &str) -> Option<(&'static Route, PathParams)> {
    ROUTES
        .iter()
        .filter(|r| r.method.eq_ignore_ascii_case(method))
        .find_map(|r| r.matches(path).map(|p| (r, p)))
}

/// [`find`] as a function sees a request: behind a stage prefix too.
pub fn locate(method: &str, path: &str) -> Option<(&'static Route, PathParams)> {
    ROUTES
        .iter()
        .filter(|r| r.method.eq_ignore_ascii_case(method))
        .find_map(|r| r.matches_behind_prefix(path).map(|p| (r, p)))
}

/// Percent-escapes decoded (`%40` → `@`), or None when the text is not percent-encoded UTF-8: a
/// `%` not followed by two hex digits, or escapes of bytes that are not UTF-8 (`%FF`). A client
/// that encodes `@` or `:` in a path (as `encodeURIComponent` does) names the same id; a
/// malformed one names nothing (no valid id contains `%`), and a reaction is never changed
/// into another (`%FF` and `%C3` would both be U+FFFD).
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
            let (h, l) = (hex(bytes.get(i + 1))?, hex(bytes.get(i + 2))?);
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "g-00000000000000000000000000000001";

    #[test]
    fn decodes_percent_escapes() {
        assert_eq!(percent_decode("a%40b%3Ac").as_deref(), Some("a@b:c"));
        assert_eq!(percent_decode("a%40").as_deref(), Some("a@"));
        assert_eq!(percent_decode("%F0%9F%91%8D").as_deref(), Some("👍"));
        assert_eq!(percent_decode("👍").as_deref(), Some("👍"));
        for malformed in ["100%", "%4", "%zz", "a%", "%ff", "%C3", "%E2%82", "%c0%af"] {
            assert_eq!(percent_decode(malformed), None, "{malformed}");
        }
    }

    #[test]
    fn every_operation_has_one_route() {
        for (i, r) in ROUTES.iter().enumerate() {
            assert_eq!(r.operation.route(), r);
            assert!(
                !ROUTES[..i]
                    .iter()
                    .any(|o| o.key() == r.key() || o.id == r.id),
                "{r:?}"
            );
        }
    }

    #[test]
    fn requests_find_their_route_and_parameters() {
        let op = |m: &str, p: &str| find(m, p).map(|(r, _)| r.operation);
        let c = format!("/conversations/{ID}");
        for (method, path, operation) in [
            ("POST", "/conversations".to_owned(), CreateConversation),
            ("POST", "/conversations/".to_owned(), CreateConversation),
            ("get", c.clone(), GetConversation),
            ("POST", format!("{c}/members/"), AddMembers),
            ("POST", format!("{c}/messages"), SendMessage),
            ("GET", format!("{c}/messages"), History),
            ("POST", format!("{c}/read"), MarkRead),
            ("GET", format!("{c}/reads"), ReadStates),
            ("GET", "/inbox".to_owned(), Inbox),
        ] {
            assert_eq!(op(method, &path), Some(operation), "{method} {path}");
        }
        let (route, params) =
            find("DELETE", &format!("/conversations/{ID}/members/a%7Cb")).unwrap();
        assert_eq!(route.operation, RemoveMember);
        assert_eq!(
            route.params().collect::<Vec<_>>(),
            ["conversationId", "userId"]
        );
        assert_eq!(
            (params.get("conversationId"), params.get("userId")),
            (Some(ID), Some("a%7Cb"))
        );
        // A user called "members" or "conversations" is still a user.
        for user in ["members", "conversations"] {
            let (r, p) = find("DELETE", &format!("/conversations/{ID}/members/{user}")).unwrap();
            assert_eq!((r.operation, p.get("userId")), (RemoveMember, Some(user)));
        }
        for (m, p) in [
            ("GET", "/conversations".to_owned()),
            ("GET", format!("/conversations/{ID}/members")),
            ("POST", format!("/conversations/{ID}")),
            ("DELETE", format!("/conversations/{ID}/members")),
            ("DELETE", format!("/conversations/{ID}")),
            ("PUT", "/inbox".to_owned()),
            ("GET", "/inbox/x".to_owned()),
            ("GET", format!("/prod/conversations/{ID}")),
            ("GET", "/".to_owned()),
        ] {
            assert_eq!(op(m, &p), None, "{m} {p}");
        }
    }

    #[test]
    fn a_function_finds_its_route_behind_a_stage_prefix() {
        let op = |m: &str, p: &str| locate(m, p).map(|(r, p)| (r.operation, p));
        let (o, p) = op("GET", &format!("/prod/conversations/{ID}")).unwrap();
        assert_eq!((o, p.get("conversationId")), (GetConversation, Some(ID)));
        let (o, p) = op(
            "DELETE",
            &format!("/prod/conversations/{ID}/members/conversations"),
        )
        .unwrap();
        assert_eq!((o, p.get("userId")), (RemoveMember, Some("conversations")));
        assert_eq!(op("GET", "/prod/inbox").map(|(o, _)| o), Some(Inbox));
        // The match starts at the first segment the template starts with.
        assert_eq!(
            op(
                "GET",
                &format!("/conversations/{ID}/members/conversations/x")
            ),
            None
        );
        assert_eq!(op("GET", "/prod"), None);
    }
}
