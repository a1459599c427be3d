//! `inbox` — `GET /inbox?limit=&cursor=` (docs/api.md §14): the caller's conversations, newest
//! activity first.

use chat_domain::requests::{page_limit, QueryParams, DEFAULT_INBOX_LIMIT};
use chat_domain::ChatError;
use chat_http::http::{self, App, Query};
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let query = Query::of(&req);
    let limit = page_limit(&query, DEFAULT_INBOX_LIMIT)?;
    let page = app
        .store
        .inbox(&caller, limit, query.one("cursor")?)
        .await?;
    http::json(200, &page)
}
