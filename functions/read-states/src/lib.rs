//! `readStates` — `GET /conversations/{conversationId}/reads` (docs/api.md §13): every member's
//! read watermark.

use chat_shared::api::http::{self, App};
use chat_shared::api::requests::conversation_id_param;
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    http::json(200, &app.store.read_states(&caller, &id).await?)
}
