//! `POST /conversations/{id}/read` `{"seq": N}`: moves the caller's read watermark forward.

use chat_shared::http::{self, App};
use chat_shared::requests::parse_mark_read;
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    mark_read(&app, &req)
        .await
        .unwrap_or_else(|e| http::error(&e))
}

async fn mark_read(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let id = http::path_param(req, "conversationId").ok_or(ChatError::NotFound)?;
    let seq = parse_mark_read(http::body(req)?)?;
    Ok(http::json(
        200,
        &app.store.mark_read(&caller, &id, seq).await?,
    ))
}
