//! The conversation routes (docs/api.md §6–§9), one function:
//! `createConversation` — `POST /conversations`,
//! `getConversation` — `GET /conversations/{conversationId}`,
//! `addMembers` — `POST /conversations/{conversationId}/members`,
//! `removeMember` — `DELETE /conversations/{conversationId}/members/{userId}`,
//! `banMember` / `unbanMember` — `POST` / `DELETE /conversations/{conversationId}/bans/{userId}`,
//! `blockUser` / `unblockUser` — `PUT` / `DELETE /me/blocks/{userId}`, `blocks` — `GET /me/blocks`,
//! `moderationReports` — `GET /moderation/reports`,
//! `suspendUser` / `unsuspendUser` — `PUT` / `DELETE /moderation/suspensions/{userId}`,
//! `presence` — `POST /presence`, `setPresenceVisibility` — `PUT /me/presence` (§38),
//! `updateConversation` — `PATCH /conversations/{conversationId}`,
//! `addAdmin`, `removeAdmin` — `PUT`, `DELETE /conversations/{conversationId}/admins/{userId}`

//! (`chat_http::routes`); and, through the catch-all routes, `404` for what the API does
//! not have.

use aws_config::SdkConfig;
use chat_domain::requests::{
    conversation_id_param, parse_add_members, parse_update_conversation, user_id_param,
    CreateConversation,
};
use chat_domain::safety::{
    check_block_target, PageQuery, DEFAULT_BLOCKS_LIMIT, DEFAULT_REPORTS_LIMIT,
};
use chat_domain::typing::{parse_presence_query, parse_presence_visibility};
use chat_domain::ChatError;
use chat_http::http::{self, App, Identity, Query};
use chat_http::routes::Operation;
use chat_store::presence_push::Pusher;
use chat_store::{Config, ConnectionStore};
use lambda_http::{Body, Request, Response};

/// What closes a suspended user's open WebSocket connections (docs/api.md §30): its connections
/// (the connections table) and the Management API's `DeleteConnection`. None where no WebSocket
/// API is configured (`WS_MANAGEMENT_ENDPOINT`).
#[derive(Clone, Debug)]
pub struct Sessions {
    pub connections: ConnectionStore,
    pub management: aws_sdk_apigatewaymanagement::Client,
    /// `PUT /me/presence` tells the caller's online direct peers, as a connection change does.
    pub presence: Pusher,
}

impl Sessions {
    pub fn of(config: &Config, sdk: &SdkConfig) -> Option<Sessions> {
        let management = config.management_client(sdk)?;
        let connections = config.connection_store(sdk);
        Some(Sessions {
            presence: Pusher::new(
                config.chat_store(sdk),
                connections.clone(),
                Some(management.clone()),
            ),
            connections,
            management,
        })
    }

    pub async fn from_env() -> Result<Option<Sessions>, lambda_http::Error> {
        let config = Config::from_env()?;
        Ok(Sessions::of(&config, &config.sdk_config().await))
    }

    /// `user`'s visibility changed: the push, when due, goes out before the answer; one held back
    /// by the 10 s waits in a task, not in the request (as `$connect`'s does). A failed push is
    /// logged, not answered: the visibility is stored and `POST /presence` shows it.
    async fn visibility_changed(&self, user: &chat_domain::UserId) {
        match self.presence.presence_once(user).await {
            Ok(None) => {}
            Ok(Some(wait)) => {
                let (presence, user) = (self.presence.clone(), user.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    if let Err(e) = presence.presence_changed(&user).await {
                        tracing::warn!(user = %user, error = %e, "presence not pushed");
                    }
                });
            }
            Err(e) => tracing::warn!(user = %user, error = %e, "presence not pushed"),
        }
    }
}

pub async fn handle(app: App, req: Request) -> Result<Response<Body>, ChatError> {
    handle_with(app, req, None).await
}

/// `handle`, closing a suspended user's connections through `sessions`.
pub async fn handle_with(
    app: App,
    req: Request,
    sessions: Option<Sessions>,
) -> Result<Response<Body>, ChatError> {
    let identity = app.identity(&req)?;
    let caller = identity.user.clone();
    let operation = http::operation(&req).ok_or(ChatError::NotFound)?;
    let conversation_id =
        || conversation_id_param(http::path_param(&req, "conversationId").as_deref());
    match operation {
        Operation::CreateConversation => {
            let (conversation, created) =
                match CreateConversation::parse(http::body(&req)?, &caller)? {
                    CreateConversation::Direct { peer } => {
                        app.store.create_direct(&caller, &peer).await?
                    }
                    CreateConversation::Group {
                        title,
                        members,
                        client_request_id,
                    } => {
                        app.store
                            .create_group(&caller, &title, &members, client_request_id.as_deref())
                            .await?
                    }
                };
            http::json(if created { 201 } else { 200 }, &conversation)
        }
        Operation::GetConversation => {
            let id = conversation_id()?;
            http::json(200, &app.store.get_conversation(&caller, &id).await?)
        }
        Operation::AddMembers => {
            let id = conversation_id()?;
            let users = parse_add_members(http::body(&req)?)?;
            http::json(200, &app.store.add_members(&caller, &id, &users).await?)
        }
        Operation::RemoveMember => {
            let id = conversation_id()?;
            let target = user_id_param(http::path_param(&req, "userId").as_deref())?;
            app.store.remove_member(&caller, &id, &target).await?;
            http::no_content()
        }
        Operation::UpdateConversation => {
            let id = conversation_id()?;
            let seconds = parse_update_conversation(http::body(&req)?)?;
            http::json(
                200,
                &app.store.update_conversation(&caller, &id, seconds).await?,
            )
        }
        Operation::AddAdmin | Operation::RemoveAdmin => {
            let id = conversation_id()?;
            let target = user_id_param(http::path_param(&req, "userId").as_deref())?;
            let add = operation == Operation::AddAdmin;
            http::json(200, &app.store.set_admin(&caller, &id, &target, add).await?)
        }
        Operation::Presence => {
            let users = parse_presence_query(http::body(&req)?)?;
            let now = chat_domain::time::unix_seconds(chat_domain::time::now());
            let presence = app.connections.presence_of(&users, now).await?;
            http::json(200, &serde_json::json!({ "presence": presence }))
        }
        Operation::SetPresenceVisibility => {
            let visible = parse_presence_visibility(http::body(&req)?)?;
            app.connections
                .set_presence_visible(&caller, visible)
                .await?;
            if let Some(s) = &sessions {
                s.visibility_changed(&caller).await;
            }
            http::json(200, &serde_json::json!({ "visible": visible }))
        }
        // Bans, blocks, moderation; the catch-all routes bring every path the API does not have
        // here too (404).
        _ => safety(&app, &req, operation, &identity, sessions.as_ref()).await,
    }
}

/// Bans, blocks and moderation (docs/api.md §27, §28, §30).
async fn safety(
    app: &App,
    req: &Request,
    operation: Operation,
    identity: &Identity,
    sessions: Option<&Sessions>,
) -> Result<Response<Body>, ChatError> {
    let caller = &identity.user;
    let user = || user_id_param(http::path_param(req, "userId").as_deref());
    let store = &app.store;
    match operation {
        Operation::BanMember | Operation::UnbanMember => {
            let id = conversation_id_param(http::path_param(req, "conversationId").as_deref())?;
            let on = operation == Operation::BanMember;
            store.set_ban(caller, &id, &user()?, on).await?;
            http::no_content()
        }
        Operation::BlockUser | Operation::UnblockUser => {
            let target = user()?;
            check_block_target(caller, &target)?;
            let on = operation == Operation::BlockUser;
            store.set_block(caller, &target, on).await?;
            http::no_content()
        }
        Operation::Blocks => {
            let page = PageQuery::parse(&Query::of(req), DEFAULT_BLOCKS_LIMIT, "B#")?;
            http::json(200, &store.blocks(caller, &page).await?)
        }
        Operation::ModerationReports => {
            identity.moderator()?;
            let page = PageQuery::parse(&Query::of(req), DEFAULT_REPORTS_LIMIT, "O#")?;
            http::json(200, &store.reports(&page).await?)
        }
        Operation::SuspendUser | Operation::UnsuspendUser => {
            let on = operation == Operation::SuspendUser;
            let (target, moderator) = (user()?, identity.moderator()?);
            if on {
                chat_domain::safety::check_suspension_target(moderator, &target)?;
            }
            store.set_suspension(moderator, &target, on).await?;
            if let (true, Some(s)) = (on, sessions) {
                s.connections.close_all(&s.management, &target).await?;
            }
            http::no_content()
        }

        _ => Err(ChatError::NotFound),
    }
}
