#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::http::serve(reads_fn::handle).await
}
