#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::http::serve(read_fn::handle).await
}
