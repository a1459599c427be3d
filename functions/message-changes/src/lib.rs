//! The message-change routes (docs/api.md §18–§23), one function:
//! `editMessage` — `PATCH /conversations/{conversationId}/messages/{seq}`,
//! `deleteMessage` — `DELETE /conversations/{conversationId}/messages/{seq}`,
//! `addReaction` / `removeReaction` — `PUT` / `DELETE …/messages/{seq}/reactions/{reaction}`,
//! `reactions` — `GET …/messages/{seq}/reactions`,
//! `changes` — `GET /conversations/{conversationId}/changes`,
//! `reportMessage` — `POST …/messages/{seq}/reports` (`chat_http::routes`).

use chat_domain::changes::{
    message_seq_param, parse_delete, ChangesQuery, EditMessage, Reaction, ReactorsQuery,
};
use chat_domain::requests::conversation_id_param;
use chat_domain::safety::ReportRequest;
use chat_domain::ChatError;
use chat_http::http::{self, App, Query};
use chat_http::routes::Operation;
use lambda_http::{Body, Request, Response};

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    let identity = app.identity(&req)?;
    let caller = identity.user.clone();
    let operation = http::operation(&req).ok_or(ChatError::NotFound)?;
    let id = conversation_id_param(http::path_param(&req, "conversationId").as_deref())?;
    if operation == Operation::Changes {
        let q = ChangesQuery::parse(&Query::of(&req))?;
        let mut page = app.store.changes(&caller, &id, q).await?;
        let messages: Vec<_> = page.changes.iter_mut().map(message_of).collect();
        app.store.sign_attachments(messages).await?;
        return http::json(200, &page);
    }
    let seq = message_seq_param(http::path_param(&req, "seq").as_deref())?;
    let reaction = || {
        let raw = http::path_param(&req, "reaction").unwrap_or_default();
        Reaction::parse(&raw, "path parameter")
    };
    let store = &app.store;
    match operation {
        Operation::EditMessage => {
            let edit = EditMessage::parse(http::body(&req)?)?;
            let mut edited = store.edit_message(&caller, &id, seq, &edit).await?;
            store.sign_attachments([&mut edited]).await?;
            http::json(200, &edited)
        }
        Operation::DeleteMessage => {
            let key = parse_delete(&Query::of(&req))?;
            let moderator = identity.moderator;
            let deleted = store.delete_message(&caller, &id, seq, &key, moderator);
            http::json(200, &deleted.await?)
        }
        Operation::ReportMessage => {
            let report = ReportRequest::parse(http::body(&req)?)?;
            http::json(202, &store.report(&caller, &id, seq, &report).await?)
        }
        Operation::AddReaction | Operation::RemoveReaction => {
            let add = operation == Operation::AddReaction;
            http::json(
                200,
                &store.react(&caller, &id, seq, &reaction()?, add).await?,
            )
        }
        Operation::Reactions => {
            let q = ReactorsQuery::parse(&Query::of(&req))?;
            http::json(200, &store.reactors(&caller, &id, seq, q).await?)
        }
        _ => Err(ChatError::NotFound),
    }
}

fn message_of(c: &mut chat_domain::model::ChangeEntry) -> &mut chat_domain::model::Message {
    &mut c.message
}
