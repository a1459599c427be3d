#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::http::serve(conversations_fn::handle).await
}
