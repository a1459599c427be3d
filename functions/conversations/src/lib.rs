//! The conversation routes (docs/api.md §6–§9), one function:
//! `createConversation` — `POST /conversations`,
//! `getConversation` — `GET /conversations/{conversationId}`,
//! `addMembers` — `POST /conversations/{conversationId}/members`,
//! `removeMember` — `DELETE /conversations/{conversationId}/members/{userId}`,
//! `updateConversation` — `PATCH /conversations/{conversationId}`,
//! `addAdmin`, `removeAdmin` — `PUT`, `DELETE /conversations/{conversationId}/admins/{userId}`
//! (`chat_http::routes`); and, through the catch-all routes, `404` for what the API does
//! not have.

use chat_domain::requests::{
    conversation_id_param, parse_add_members, parse_update_conversation, user_id_param,
    CreateConversation,
};
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
        Operation::UpdateConversation => {
            let id = conversation_id()?;
            let seconds = parse_update_conversation(http::body(&req)?)?;
            http::json(
                200,
                &app.store.update_conversation(&caller, &id, seconds).await?,
            )
        }
        Operation::AddAdmin | Operation::RemoveAdmin => {
            let id = conversation_id()?;
            let target = user_id_param(http::path_param(&req, "userId").as_deref())?;
            let add = operation == Operation::AddAdmin;
            http::json(200, &app.store.set_admin(&caller, &id, &target, add).await?)
        }
        // Not this function's: the catch-all routes bring every path the API does not have here.
        _ => Err(ChatError::NotFound),
    }
}
