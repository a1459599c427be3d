//! `sendMessage` — `POST /conversations/{conversationId}/messages` (docs/api.md §10): 201 with
//! the new message, 200 with the original on a replay of its `clientMsgId`.

use chat_domain::requests::{conversation_id_param, SendMessage};
use chat_domain::ChatError;
use chat_http::http::{self, App};
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    let message = SendMessage::parse(http::body(&req)?)?.from_origin(http::origin(&req)?);
    let (mut message, created) = app.store.send_message(&caller, &id, &message).await?;
    app.store.sign_attachments([&mut message]).await?;
    http::json(if created { 201 } else { 200 }, &message)
}
