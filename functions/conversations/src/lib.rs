//! The conversation routes (docs/api.md §6–§9), one function:
//! `createConversation` — `POST /conversations`,
//! `getConversation` — `GET /conversations/{conversationId}`,
//! `addMembers` — `POST /conversations/{conversationId}/members`,
//! `removeMember` — `DELETE /conversations/{conversationId}/members/{userId}`.

use chat_shared::api::http::{self, App};
use chat_shared::api::requests::{
    conversation_id_param, parse_add_members, user_id_param, CreateConversation,
};
use chat_shared::ChatError;
use lambda_http::http::Method;
use lambda_http::{Body, Request, Response};

/// The operations this function serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    CreateConversation,
    GetConversation,
    AddMembers,
    RemoveMember,
}

impl Operation {
    /// Which operation a request is: its method and the path below `/conversations` (one of
    /// ``, `/{conversationId}`, `/{conversationId}/members`, `/{conversationId}/members/{userId}`).
    /// None for anything else (the API's routes never send anything else here).
    pub fn of(method: &Method, path: &str) -> Option<Operation> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // The first `conversations` segment: a stage prefix may come before it, a user id named
        // "conversations" after it.
        let below = segments.iter().position(|s| *s == "conversations")?;
        match (method, &segments[below + 1..]) {
            (&Method::POST, []) => Some(Operation::CreateConversation),
            (&Method::GET, [_]) => Some(Operation::GetConversation),
            (&Method::POST, [_, "members"]) => Some(Operation::AddMembers),
            (&Method::DELETE, [_, "members", _]) => Some(Operation::RemoveMember),
            _ => None,
        }
    }
}

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let operation = Operation::of(req.method(), req.uri().path()).ok_or(ChatError::NotFound)?;
    let conversation_id =
        || conversation_id_param(http::path_param(&req, "conversationId").as_deref());
    match operation {
        Operation::CreateConversation => {
            let (conversation, created) =
                match CreateConversation::parse(http::body(&req)?, &caller)? {
                    CreateConversation::Direct { peer } => {
                        app.store.create_direct(&caller, &peer).await?
                    }
                    CreateConversation::Group {
                        title,
                        members,
                        client_request_id,
                    } => {
                        app.store
                            .create_group(&caller, &title, &members, client_request_id.as_deref())
                            .await?
                    }
                };
            http::json(if created { 201 } else { 200 }, &conversation)
        }
        Operation::GetConversation => {
            let id = conversation_id()?;
            http::json(200, &app.store.get_conversation(&caller, &id).await?)
        }
        Operation::AddMembers => {
            let id = conversation_id()?;
            let users = parse_add_members(http::body(&req)?)?;
            http::json(200, &app.store.add_members(&caller, &id, &users).await?)
        }
        Operation::RemoveMember => {
            let id = conversation_id()?;
            let target = user_id_param(http::path_param(&req, "userId").as_deref())?;
            app.store.remove_member(&caller, &id, &target).await?;
            http::no_content()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "g-00000000000000000000000000000001";

    #[test]
    fn routes_by_method_and_path() {
        let op = |m: Method, p: &str| Operation::of(&m, p);
        assert_eq!(
            op(Method::POST, "/conversations"),
            Some(Operation::CreateConversation)
        );
        assert_eq!(
            op(Method::POST, "/conversations/"),
            Some(Operation::CreateConversation)
        );
        assert_eq!(
            op(Method::GET, &format!("/conversations/{ID}")),
            Some(Operation::GetConversation)
        );
        assert_eq!(
            op(Method::POST, &format!("/conversations/{ID}/members")),
            Some(Operation::AddMembers)
        );
        assert_eq!(
            op(Method::POST, &format!("/conversations/{ID}/members/")),
            Some(Operation::AddMembers)
        );
        assert_eq!(
            op(Method::DELETE, &format!("/conversations/{ID}/members/u1")),
            Some(Operation::RemoveMember)
        );
        // A user called "members" or "conversations" is still a user.
        assert_eq!(
            op(
                Method::DELETE,
                &format!("/conversations/{ID}/members/members")
            ),
            Some(Operation::RemoveMember)
        );
        assert_eq!(
            op(
                Method::DELETE,
                &format!("/conversations/{ID}/members/conversations")
            ),
            Some(Operation::RemoveMember)
        );
        // Behind a stage prefix.
        assert_eq!(
            op(Method::GET, &format!("/prod/conversations/{ID}")),
            Some(Operation::GetConversation)
        );
        for (m, p) in [
            (Method::GET, "/conversations".to_owned()),
            (Method::GET, format!("/conversations/{ID}/members")),
            (Method::POST, format!("/conversations/{ID}")),
            (Method::DELETE, format!("/conversations/{ID}/members")),
            (Method::DELETE, format!("/conversations/{ID}")),
            (Method::POST, format!("/conversations/{ID}/messages")),
            (Method::GET, "/inbox".to_owned()),
        ] {
            assert_eq!(op(m.clone(), &p), None, "{m} {p}");
        }
    }
}
