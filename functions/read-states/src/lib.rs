//! `GET /conversations/{id}/reads`: every member's read watermark.

use chat_shared::http::{self, App};
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    read_states(&app, &req)
        .await
        .unwrap_or_else(|e| http::error(&e))
}

async fn read_states(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let id = http::path_param(req, "conversationId").ok_or(ChatError::NotFound)?;
    Ok(http::json(200, &app.store.read_states(&caller, &id).await?))
}
