//! `history` — `GET /conversations/{conversationId}/messages?beforeSeq=&afterSeq=&limit=`
//! (docs/api.md §11): a page of messages in `seq` order.

use chat_domain::requests::{conversation_id_param, HistoryQuery};
use chat_domain::ChatError;
use chat_http::http::{self, App, Query};
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let caller = app.caller(&req)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    let query = HistoryQuery::parse(&Query::of(&req))?;
    let mut page = app.store.history(&caller, &id, query).await?;
    app.store.sign_attachments(&mut page.messages).await?;
    http::json(200, &page)
}
