use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let handler = inbox_index::InboxIndex::from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<_>| {
        let handler = handler.clone();
        async move { Ok::<_, lambda_runtime::Error>(handler.handle(event.payload).await) }
    }))
    .await
}
