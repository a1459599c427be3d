#[tokio::main]
async fn main() -> Result<(), chat_shared::lambda::Error> {
    chat_shared::lambda::run::<ws_connection::WsConnection>().await
}
