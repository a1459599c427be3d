//! `GET /inbox?limit=&cursor=`: the caller's conversations, newest activity first.

use chat_shared::http::{self, App, Query};
use chat_shared::requests::{page_limit, QueryParams, DEFAULT_INBOX_LIMIT};
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    inbox(&app, &req).await.unwrap_or_else(|e| http::error(&e))
}

async fn inbox(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let query = Query::of(req);
    let limit = page_limit(&query, DEFAULT_INBOX_LIMIT)?;
    Ok(http::json(
        200,
        &app.store
            .inbox(&caller, limit, query.first("cursor"))
            .await?,
    ))
}
