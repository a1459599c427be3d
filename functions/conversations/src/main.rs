#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::api::http::serve(conversations::handle).await
}
