//! `GET /conversations/{id}/messages?beforeSeq=&afterSeq=&limit=`: a page of history in `seq`
//! order.

use chat_shared::http::{self, App, Query};
use chat_shared::requests::HistoryQuery;
use chat_shared::ChatError;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Response<Body> {
    history(&app, &req)
        .await
        .unwrap_or_else(|e| http::error(&e))
}

async fn history(app: &App, req: &Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(req)?;
    let id = http::path_param(req, "conversationId").ok_or(ChatError::NotFound)?;
    let query = HistoryQuery::parse(&Query::of(req))?;
    Ok(http::json(
        200,
        &app.store.history(&caller, &id, query).await?,
    ))
}
