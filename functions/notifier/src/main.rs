#[tokio::main]
async fn main() -> Result<(), chat_lambda::Error> {
    chat_lambda::run::<notifier::NotifierFunction>().await
}
