#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    chat_shared::api::http::serve(read_states::handle).await
}
