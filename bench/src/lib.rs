//! The benchmark's scenarios (`cargo run -p chat-bench --bin bench`), each a module that returns
//! a markdown table for docs/benchmarks.md.

pub mod archive;
pub mod chaos;
pub mod cost;
pub mod flood;
pub mod hot;
pub mod inbox;
pub mod ops;
pub mod push;
pub mod target;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use chat_tests::capacity::{self, item_json};
use chat_tests::{Call, Resp, TestApp};
use serde_json::Value;

/// One request of a scenario: method, path, the user who makes it, its JSON body.
pub type Request = (&'static str, String, String, Option<Value>);

/// One request as `user`, in process (the REST handlers, invoked as API Gateway would).
pub async fn call_as(
    t: &TestApp,
    method: &str,
    path: &str,
    user: &str,
    body: Option<&Value>,
) -> Resp {
    let body = body.map(Value::to_string);
    t.call(method, path, Some(user), body.as_deref()).await
}

/// The value after `flag` in `args` (`--api URL` → `URL`).
pub fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

/// A markdown table.
pub struct Table {
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: Vec<&'static str>) -> Self {
        Table {
            header,
            rows: Vec::new(),
        }
    }

    pub fn print(&self) {
        println!("| {} |", self.header.join(" | "));
        let align: Vec<&str> = self
            .header
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---" } else { "---:" })
            .collect();
        println!("|{}|", align.join("|"));
        for r in &self.rows {
            println!("| {} |", r.join(" | "));
        }
        println!();
    }
}

/// The `p`-th percentile of latencies, in milliseconds.
pub fn percentile(latencies: &[Duration], p: f64) -> f64 {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Write units of recorded calls (successful ones, and all of them), with the sizes of updated,
/// deleted and checked items read back from the table.
pub async fn write_units(t: &TestApp, calls: &[Call]) -> (u64, u64) {
    write_units_in(t, "ChatTable", calls).await
}

/// `write_units` for calls that write to `table` (e.g. the connections table).
pub async fn write_units_in(t: &TestApp, table: &str, calls: &[Call]) -> (u64, u64) {
    let bodies: Vec<&[u8]> = calls.iter().filter_map(|c| c.write.as_deref()).collect();
    let keys = capacity::keys_to_measure(&bodies);
    let mut sizes = HashMap::new();
    for chunk in keys.chunks(100) {
        let request = KeysAndAttributes::builder()
            .set_keys(Some(
                chunk
                    .iter()
                    .map(|(pk, sk)| {
                        HashMap::from([
                            ("pk".to_owned(), AttributeValue::S(pk.clone())),
                            ("sk".to_owned(), AttributeValue::S(sk.clone())),
                        ])
                    })
                    .collect(),
            ))
            .build()
            .unwrap();
        let out =
            t.db.batch_get_item()
                .request_items(table, request)
                .send()
                .await
                .unwrap();
        for item in out
            .responses
            .unwrap_or_default()
            .remove(table)
            .unwrap_or_default()
        {
            let json: serde_json::Value = item_json(&item);
            let (pk, sk) = (
                json["pk"]["S"].as_str().unwrap(),
                json["sk"]["S"].as_str().unwrap(),
            );
            sizes.insert(
                format!("{pk}|{sk}"),
                capacity::item_size(json.as_object().unwrap()),
            );
        }
    }
    let requests: Vec<(&[u8], bool)> = calls
        .iter()
        .filter_map(|c| c.write.as_deref().map(|w| (w, c.ok)))
        .collect();
    (
        capacity::write_units_of(&requests, &sizes, false),
        capacity::write_units_of(&requests, &sizes, true),
    )
}
