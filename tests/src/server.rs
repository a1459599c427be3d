//! The DynamoDB/Kinesis-API server the tests talk to: `DYNAMODB_ENDPOINT` when set (tables are then
//! expected to exist, see infra/create_resources.py), otherwise our moto launcher, started once per
//! test binary on a free port and stopped when the test process exits (it exits when its stdin
//! closes).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

static ENDPOINT: OnceLock<String> = OnceLock::new();
static SERVER: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The Python with the pinned moto: the project's virtualenv (infra/setup.sh), else `python3`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("CHAT_PYTHON") {
        return p.into();
    }
    let venv = workspace_root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

pub fn dynamodb_endpoint() -> String {
    ENDPOINT
        .get_or_init(|| match std::env::var("DYNAMODB_ENDPOINT") {
            Ok(e) if !e.is_empty() => e,
            _ => start_emulator(),
        })
        .clone()
}

fn start_emulator() -> String {
    let root = workspace_root();
    let mut child = Command::new(python())
        .arg(root.join("infra/moto_server.py"))
        .args(["--exit-with-stdin", "--port", "0", "--template"])
        .arg(root.join("template.yaml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start infra/moto_server.py (run infra/setup.sh first)");
    let stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let endpoint = loop {
        let line = lines
            .next()
            .expect("emulator exited before READY")
            .expect("read emulator output");
        if let Some(url) = line.strip_prefix("READY ") {
            break url.trim().to_owned();
        }
    };
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    *SERVER.lock().unwrap() = Some((child, stdin));
    endpoint
}
