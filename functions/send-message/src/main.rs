#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::http::serve(send_fn::handle).await
}
