#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::http::serve(history_fn::handle).await
}
