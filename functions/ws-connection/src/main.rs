use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    chat_shared::config::init_tracing();
    let ws = ws_connection_fn::WsConnection::from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<_>| {
        let ws = ws.clone();
        async move { Ok::<_, lambda_runtime::Error>(ws.handle(event.payload).await) }
    }))
    .await
}
