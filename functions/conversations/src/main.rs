#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let sessions = conversations::Sessions::from_env().await?;
    chat_http::http::serve(move |app, req| conversations::handle_with(app, req, sessions.clone()))
        .await
}
