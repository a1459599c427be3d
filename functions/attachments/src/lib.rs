//! The attachment routes (docs/api.md §34–§35), one function:
//! `createAttachment` — `POST /conversations/{conversationId}/attachments`: a presigned upload,
//! `getAttachment` — `GET /conversations/{conversationId}/attachments/{attachmentId}`: 302 to a
//! fresh presigned download.

use chat_domain::attachments::{attachment_id_param, CreateAttachment};
use chat_domain::requests::conversation_id_param;
use chat_domain::ChatError;
use chat_http::http::{self, App};
use chat_http::routes::Operation;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    let store = &app.store;
    match http::operation(&req).ok_or(ChatError::NotFound)? {
        Operation::CreateAttachment => {
            let request = CreateAttachment::parse(http::body(&req)?, store.attachment_policy()?)?;
            http::json(201, &store.create_attachment(&caller, &id, &request).await?)
        }
        Operation::GetAttachment => {
            let raw = http::path_param(&req, "attachmentId").unwrap_or_default();
            let attachment = attachment_id_param(&raw);
            http::redirect(&store.attachment_url(&caller, &id, &attachment).await?)
        }
        _ => Err(ChatError::NotFound),
    }
}
