use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    chat_shared::config::init_tracing();
    let relay = relay_fn::Relay::from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<_>| {
        let relay = relay.clone();
        async move { Ok::<_, lambda_runtime::Error>(relay.handle(event.payload).await) }
    }))
    .await
}
