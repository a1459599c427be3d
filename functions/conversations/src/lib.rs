//! The conversation routes (docs/api.md §6–§9), one function:
//! `createConversation` — `POST /conversations`,
//! `getConversation` — `GET /conversations/{conversationId}`,
//! `addMembers` — `POST /conversations/{conversationId}/members`,
//! `removeMember` — `DELETE /conversations/{conversationId}/members/{userId}`,
//! `presence` — `POST /presence`, `setPresenceVisibility` — `PUT /me/presence` (§38)
//! (`chat_http::routes`); and, through the catch-all routes, `404` for what the API does
//! not have.

use chat_domain::requests::{
    conversation_id_param, parse_add_members, user_id_param, CreateConversation,
};
use chat_domain::typing::{parse_presence_query, parse_presence_visibility};
use chat_domain::ChatError;
use chat_http::http::{self, App};
use chat_http::routes::Operation;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let operation = http::operation(&req).ok_or(ChatError::NotFound)?;
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
        Operation::Presence => {
            let users = parse_presence_query(http::body(&req)?)?;
            let now = chat_domain::time::unix_seconds(chat_domain::time::now());
            let presence = app.connections.presence_of(&users, now).await?;
            http::json(200, &serde_json::json!({ "presence": presence }))
        }
        Operation::SetPresenceVisibility => {
            let visible = parse_presence_visibility(http::body(&req)?)?;
            app.connections
                .set_presence_visible(&caller, visible)
                .await?;
            http::json(200, &serde_json::json!({ "visible": visible }))
        }
        // Not this function's: the catch-all routes bring every path the API does not have here.
        _ => Err(ChatError::NotFound),
    }
}
