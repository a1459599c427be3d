//! `s3-gate --listen 127.0.0.1:PORT --s3 URL [--notify URL] [--scan MS|manual] [--scan-notify URL]`:
//! the secret key presigned requests are checked with is `AWS_SECRET_ACCESS_KEY` (default
//! `local`, the local stack's); `--scan` turns on the stand-in malware scanner (each upload scanned
//! MS milliseconds after it, or only on `POST /_scan/<bucket>/<key>` with `manual`), whose result
//! events go to `--scan-notify`; prints `READY http://…` once listening.

fn usage() -> ! {
    eprintln!(
        "usage: s3-gate [--listen ADDR] --s3 URL [--notify URL] [--scan MS|manual] [--scan-notify URL]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut config = s3_gate::GateConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        s3: String::new(),
        secret: std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "local".into()),
        notify: None,
        scan: None,
    };
    let mut scan_notify = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" => config.listen = value.parse().unwrap_or_else(|_| usage()),
            "--s3" => config.s3 = value,
            "--notify" => config.notify = Some(value),
            "--scan" => {
                let delay = match value.as_str() {
                    "manual" => None,
                    ms => Some(std::time::Duration::from_millis(
                        ms.parse().unwrap_or_else(|_| usage()),
                    )),
                };
                config.scan = Some(s3_gate::ScanConfig {
                    delay,
                    notify: None,
                });
            }
            "--scan-notify" => scan_notify = Some(value),
            _ => usage(),
        }
    }
    if config.s3.is_empty() {
        usage();
    }
    if let Some(scan) = config.scan.as_mut() {
        scan.notify = scan_notify;
    }
    let running = s3_gate::start(config).await.unwrap_or_else(|e| {
        eprintln!("s3-gate: {e}");
        std::process::exit(1)
    });
    println!("READY {}", running.url());
    std::future::pending::<()>().await;
}
