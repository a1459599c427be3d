//! `POST /conversations`, `GET /conversations/{id}`, `POST /conversations/{id}/members`,
//! `DELETE /conversations/{id}/members/{userId}`.

use chat_shared::http::{self, App};
use chat_shared::requests::{parse_add_members, CreateConversation};
use chat_shared::ChatError;
use lambda_http::http::Method;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    route(&app, &req).await.unwrap_or_else(|e| http::error(&e))
}

async fn route(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let id = http::path_param(req, "conversationId");
    let member = http::path_param(req, "userId");
    let on_members = req.uri().path().trim_end_matches('/').ends_with("/members");
    match (req.method(), id, member) {
        (&Method::POST, None, None) => {
            let (conversation, created) =
                match CreateConversation::parse(http::body(req)?, &caller)? {
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
            Ok(http::json(if created { 201 } else { 200 }, &conversation))
        }
        (&Method::GET, Some(id), None) if !on_members => Ok(http::json(
            200,
            &app.store.get_conversation(&caller, &id).await?,
        )),
        (&Method::POST, Some(id), None) if on_members => {
            let users = parse_add_members(http::body(req)?)?;
            Ok(http::json(
                200,
                &app.store.add_members(&caller, &id, &users).await?,
            ))
        }
        (&Method::DELETE, Some(id), Some(user)) => {
            app.store.remove_member(&caller, &id, &user).await?;
            Ok(http::no_content())
        }
        _ => Err(ChatError::NotFound),
    }
}
