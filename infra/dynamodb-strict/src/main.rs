//! `dynamodb-strict --listen 127.0.0.1:PORT --dynamodb URL [--other URL]`: the rules come from
//! `CHAT_STRICT_*` (see the library docs); prints `READY http://…` once listening.

fn usage() -> ! {
    eprintln!("usage: dynamodb-strict [--listen ADDR] [--dynamodb URL] [--other URL]");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut config = dynamodb_strict::StrictConfig::from_env().unwrap_or_else(|e| {
        eprintln!("dynamodb-strict: {e}");
        std::process::exit(2)
    });
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" => config.listen = value.parse().unwrap_or_else(|_| usage()),
            "--dynamodb" => config.dynamodb = value,
            "--other" => config.other = Some(value),
            _ => usage(),
        }
    }
    let running = dynamodb_strict::start(config).await.unwrap_or_else(|e| {
        eprintln!("dynamodb-strict: {e}");
        std::process::exit(1)
    });
    println!("READY {}", running.url());
    std::future::pending::<()>().await;
}
