use lambda_runtime::{service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let thumbnailer = thumbnails::Thumbnailer::from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let thumbnailer = thumbnailer.clone();
        async move {
            let outcomes = thumbnailer.handle(&event.payload).await?;
            Ok::<_, lambda_runtime::Error>(serde_json::json!({"objects": outcomes.len()}))
        }
    }))
    .await
}
