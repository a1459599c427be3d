//! `POST /conversations/{id}/messages`: 201 with the new message, 200 with the original on a
//! replay of its `clientMsgId`.

use chat_shared::http::{self, App};
use chat_shared::requests::SendMessage;
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    send(&app, &req).await.unwrap_or_else(|e| http::error(&e))
}

async fn send(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let id = http::path_param(req, "conversationId").ok_or(ChatError::NotFound)?;
    let message = SendMessage::parse(http::body(req)?)?;
    let (message, created) = app.store.send_message(&caller, &id, &message).await?;
    Ok(http::json(if created { 201 } else { 200 }, &message))
}
