//! `readStates` — `GET /conversations/{conversationId}/reads` (docs/api.md §13): every member's
//! read watermark.

use chat_domain::requests::conversation_id_param;
use chat_domain::ChatError;
use chat_http::http::{self, App};
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    http::json(200, &app.store.read_states(&caller, &id).await?)
}
