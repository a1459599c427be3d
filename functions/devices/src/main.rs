#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_http::http::serve(devices::handle).await
}
