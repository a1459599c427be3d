//! `local-gateway`: the local WebSocket API, Management API and stream pipeline (see lib.rs).
//!
//! Environment: `CHAT_WS_PORT` (9001), `CHAT_MANAGEMENT_PORT` (9002), `CHAT_GATEWAY_START`
//! (TRIM_HORIZON | LATEST) and the handlers' settings (`Config::from_env`: `CHAT_AUTH_MODE=local`,
//! `CHAT_LOCAL_JWT_SECRET`, `DYNAMODB_ENDPOINT`, `KINESIS_ENDPOINT`, table and stream names).

use std::process::ExitCode;

use local_gateway::{Gateway, GatewayConfig};

#[tokio::main]
async fn main() -> ExitCode {
    chat_store::telemetry::init(false, None);
    let config = match GatewayConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("local-gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let chat = config.chat.clone();
    let gateway = match Gateway::start(config).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("local-gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dynamodb = chat.dynamodb_endpoint.as_deref().unwrap_or("AWS");
    let kinesis = chat.kinesis_endpoint.as_deref().unwrap_or(dynamodb);
    if let Some(url) = &gateway.rest_url {
        println!("local-gateway: REST API        {url} (CORS, errors in the API's shape)");
    }
    println!(
        "local-gateway: WebSocket API   {}?token=<JWT>",
        gateway.ws_url
    );
    if let Some(url) = &gateway.demo_url {
        println!("local-gateway: demo page       {url}");
    }
    println!(
        "local-gateway: Management API  {} (paths also without the stage prefix)",
        gateway.management_url
    );
    println!(
        "local-gateway: pipeline        {} stream ({dynamodb}) -> relay -> {} ({kinesis}) -> fanout",
        chat.chat_table, chat.event_stream
    );
    println!(
        "local-gateway: auth            {:?}; Ctrl-C stops",
        chat.auth
    );
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("local-gateway: {e}");
    }
    println!("local-gateway: stopping");
    gateway.shutdown().await;
    println!("local-gateway: stopped");
    ExitCode::SUCCESS
}
