//! `markRead` — `POST /conversations/{conversationId}/read` `{"seq": N}` (docs/api.md §12):
//! moves the caller's read watermark forward, never back.

use chat_domain::requests::{conversation_id_param, parse_mark_read};
use chat_domain::ChatError;
use chat_http::http::{self, App};
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    let seq = parse_mark_read(http::body(&req)?)?;
    let origin = http::origin(&req)?;
    http::json(
        200,
        &app.store
            .mark_read(&caller, &id, seq, origin.as_deref())
            .await?,
    )
}
