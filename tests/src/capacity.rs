//! DynamoDB capacity units computed the way DynamoDB bills them, from item sizes: the emulator's
//! own ConsumedCapacity figures are constants, so the bench works them out from the requests it
//! recorded (`CallLog`) and the items as stored.
//!
//! Item size: the sum over attributes of the name's UTF-8 length plus the value's size (string:
//! UTF-8 bytes; number: about one byte per two significant digits plus one; binary: bytes;
//! boolean/null: 1; list/map: 3 bytes plus each element's size, plus one byte per element and,
//! for maps, each key's length). A write costs one unit per started KB of the item (for an update
//! or a delete, the larger of the item before and after), twice that inside a transaction; a
//! strongly consistent read one unit per started 4 KB (a Query sums its items first).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

/// The size DynamoDB counts for an item in DynamoDB JSON (`{"name": {"S": "…"}, …}`).
pub fn item_size(item: &serde_json::Map<String, Value>) -> usize {
    item.iter()
        .map(|(name, v)| name.len() + value_size(v))
        .sum()
}

fn value_size(v: &Value) -> usize {
    let Some((kind, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    match kind.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => {
            let digits = inner
                .as_str()
                .unwrap_or("")
                .trim_start_matches(['-', '0'])
                .replace('.', "")
                .len();
            digits.div_ceil(2) + 1
        }
        "B" => inner
            .as_str()
            .map_or(0, |b| b.trim_end_matches('=').len() * 3 / 4),
        "BOOL" | "NULL" => 1,
        "SS" | "NS" | "BS" => inner.as_array().map_or(0, |a| {
            a.iter().map(|x| x.as_str().map_or(0, str::len)).sum()
        }),
        "L" => {
            3 + inner
                .as_array()
                .map_or(0, |a| a.iter().map(|x| 1 + value_size(x)).sum::<usize>())
        }
        "M" => {
            3 + inner.as_object().map_or(0, |m| {
                m.iter()
                    .map(|(k, x)| 1 + k.len() + value_size(x))
                    .sum::<usize>()
            })
        }
        _ => 0,
    }
}

pub fn write_units(size: usize) -> u64 {
    size.div_ceil(1024).max(1) as u64
}

pub fn read_units(size: usize) -> u64 {
    size.div_ceil(4096).max(1) as u64
}

/// `pk|sk` of a key or item in DynamoDB JSON.
fn key_of(item: &serde_json::Map<String, Value>) -> Option<String> {
    let part = |n: &str| item.get(n)?.get("S")?.as_str().map(str::to_owned);
    Some(format!("{}|{}", part("pk")?, part("sk")?))
}

/// Write units of recorded write requests. `sizes` gives the stored size of items that were
/// updated, deleted or condition-checked (their requests carry only the key); items put by the
/// requests themselves are measured from the requests. Requests that failed (a cancelled
/// transaction, a failed condition) are counted too when `include_failed`: DynamoDB charges them.
pub fn write_units_of(
    requests: &[(&[u8], bool)],
    sizes: &HashMap<String, usize>,
    include_failed: bool,
) -> u64 {
    let mut put_sizes: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    let size_of = |key: Option<String>, put_sizes: &HashMap<String, usize>| {
        key.and_then(|k| sizes.get(&k).or_else(|| put_sizes.get(&k)).copied())
            .unwrap_or(0)
    };
    for (body, ok) in requests {
        let Ok(req) = serde_json::from_slice::<Value>(body) else {
            continue;
        };
        if let Some(parts) = req.get("TransactItems").and_then(Value::as_array) {
            for part in parts {
                let Some((kind, op)) = part.as_object().and_then(|o| o.iter().next()) else {
                    continue;
                };
                let size = match (kind.as_str(), op.get("Item").and_then(Value::as_object)) {
                    ("Put", Some(item)) => {
                        let s = item_size(item);
                        if let Some(k) = key_of(item) {
                            put_sizes.insert(k, s);
                        }
                        s
                    }
                    _ => size_of(
                        op.get("Key").and_then(Value::as_object).and_then(key_of),
                        &put_sizes,
                    ),
                };
                if *ok || include_failed {
                    total += 2 * write_units(size);
                }
            }
        } else if let Some(item) = req.get("Item").and_then(Value::as_object) {
            let s = item_size(item);
            if let Some(k) = key_of(item) {
                put_sizes.insert(k, s);
            }
            if *ok || include_failed {
                total += write_units(s);
            }
        } else if let Some(key) = req.get("Key").and_then(Value::as_object) {
            if *ok || include_failed {
                total += write_units(size_of(key_of(key), &put_sizes));
            }
        } else if let Some(tables) = req.get("RequestItems").and_then(Value::as_object) {
            for writes in tables.values().filter_map(Value::as_array) {
                for w in writes {
                    if let Some(item) = w.pointer("/PutRequest/Item").and_then(Value::as_object) {
                        total += write_units(item_size(item));
                    } else if let Some(key) =
                        w.pointer("/DeleteRequest/Key").and_then(Value::as_object)
                    {
                        total += write_units(size_of(key_of(key), &put_sizes));
                    }
                }
            }
        }
    }
    total
}

/// The keys (`pk|sk`) of items that recorded write requests update, delete or check, whose sizes
/// the caller should look up in the table.
pub fn keys_to_measure(requests: &[&[u8]]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for body in requests {
        let Ok(req) = serde_json::from_slice::<Value>(body) else {
            continue;
        };
        let mut push = |key: Option<&Value>| {
            if let Some(k) = key.and_then(Value::as_object) {
                if let (Some(pk), Some(sk)) = (
                    k.get("pk").and_then(|v| v.get("S")).and_then(Value::as_str),
                    k.get("sk").and_then(|v| v.get("S")).and_then(Value::as_str),
                ) {
                    out.push((pk.to_owned(), sk.to_owned()));
                }
            }
        };
        if let Some(parts) = req.get("TransactItems").and_then(Value::as_array) {
            for part in parts {
                if let Some((_, op)) = part.as_object().and_then(|o| o.iter().next()) {
                    push(op.get("Key"));
                }
            }
        } else {
            push(req.get("Key"));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// An SDK item in DynamoDB JSON (for sizing).
pub fn item_json(item: &HashMap<String, AttributeValue>) -> serde_json::Value {
    serde_json::Value::Object(
        item.iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &AttributeValue) -> serde_json::Value {
    use serde_json::json;
    match v {
        AttributeValue::S(s) => json!({"S": s}),
        AttributeValue::N(n) => json!({"N": n}),
        AttributeValue::Bool(b) => json!({"BOOL": b}),
        AttributeValue::Null(_) => json!({"NULL": true}),
        AttributeValue::L(l) => json!({"L": l.iter().map(value_json).collect::<Vec<_>>()}),
        AttributeValue::M(m) => json!({"M": item_json(m)}),
        AttributeValue::Ss(s) => json!({"SS": s}),
        AttributeValue::Ns(s) => json!({"NS": s}),
        AttributeValue::B(b) => json!({"B": "x".repeat((b.as_ref().len() * 4).div_ceil(3))}),
        _ => json!({"NULL": true}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_follow_dynamodbs_rules() {
        let item = json!({"pk": {"S": "C#g-1"}, "n": {"N": "12345"}, "ok": {"BOOL": true}});
        // 2+5, 1+(3+1), 2+1
        assert_eq!(item_size(item.as_object().unwrap()), 7 + 5 + 3);
        let map = json!({"m": {"M": {"ab": {"S": "xyz"}}}});
        assert_eq!(item_size(map.as_object().unwrap()), 1 + 3 + 1 + 2 + 3);
        assert_eq!(write_units(1), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
        assert_eq!(read_units(4097), 2);
    }

    #[test]
    fn transactions_cost_twice_per_item() {
        let put = json!({"TransactItems": [
            {"Put": {"Item": {"pk": {"S": "C#a"}, "sk": {"S": "S#1"}, "body": {"S": "x".repeat(1500)}}}},
            {"Update": {"Key": {"pk": {"S": "C#a"}, "sk": {"S": "C"}}}}
        ]})
        .to_string();
        let sizes = HashMap::from([("C#a|C".to_owned(), 300)]);
        let body = put.as_bytes();
        assert_eq!(write_units_of(&[(body, true)], &sizes, false), 2 * 2 + 2);
        assert_eq!(write_units_of(&[(body, false)], &sizes, false), 0);
        assert_eq!(write_units_of(&[(body, false)], &sizes, true), 6);
        assert_eq!(keys_to_measure(&[body]), vec![("C#a".into(), "C".into())]);
    }
}
