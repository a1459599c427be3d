//! Item sizes and capacity units by DynamoDB's published rules ("DynamoDB item sizes and formats",
//! "Read/write capacity units"), computed on the wire form of items (`{"name": {"S": "..."}}`).

use serde_json::{Map, Value};

/// Size in bytes of an item: for each attribute, its name's UTF-8 bytes plus its value's size.
pub fn item_size(item: &Map<String, Value>) -> usize {
    item.iter()
        .map(|(name, v)| name.len() + value_size(v))
        .sum()
}

/// Size of one attribute value (without its name).
pub fn value_size(v: &Value) -> usize {
    let Some((ty, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    let strs = || {
        inner
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
    };
    match ty.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(0, number_size),
        "B" => inner.as_str().map_or(0, base64_len),
        "BOOL" | "NULL" => 1,
        "SS" => strs().map(str::len).sum(),
        "NS" => strs().map(number_size).sum(),
        "BS" => strs().map(base64_len).sum(),
        // 3 bytes for the container, 1 per element, plus the elements (map keys count as names).
        "L" => {
            let items = inner.as_array().map(Vec::as_slice).unwrap_or_default();
            3 + items.iter().map(|e| 1 + value_size(e)).sum::<usize>()
        }
        "M" => inner.as_object().map_or(3, |m| {
            3 + m
                .iter()
                .map(|(k, e)| 1 + k.len() + value_size(e))
                .sum::<usize>()
        }),
        _ => 0,
    }
}

/// 1 byte per two significant digits (leading and trailing zeros trimmed) plus 1.
fn number_size(n: &str) -> usize {
    let mantissa = n.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.div_ceil(2) + 1
}

/// Raw length of base64 text: binary values are sized by their decoded bytes.
fn base64_len(b64: &str) -> usize {
    let t = b64.trim_end_matches('=');
    t.len() * 3 / 4
}

/// Write units for one item written: 1 per started KB, at least 1.
pub fn write_units(size: usize) -> f64 {
    size.div_ceil(1024).max(1) as f64
}

/// Read units for `size` bytes read: 1 per started 4 KB (at least 1) when strongly
/// consistent, half that when eventually consistent.
pub fn read_units(size: usize, strong: bool) -> f64 {
    let u = size.div_ceil(4096).max(1) as f64;
    if strong {
        u
    } else {
        u / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn size(v: Value) -> usize {
        item_size(v.as_object().unwrap())
    }

    #[test]
    fn attribute_sizes_follow_the_documented_rules() {
        // String: name bytes + UTF-8 bytes ("é" is 2 bytes, "日" 3).
        assert_eq!(size(json!({"id": {"S": "abc"}})), 5);
        assert_eq!(size(json!({"n": {"S": "é日"}})), 6);
        // Number: leading/trailing zeros trimmed, 1 byte per two significant digits, + 1.
        assert_eq!(value_size(&json!({"N": "123.45"})), 4);
        assert_eq!(value_size(&json!({"N": "-000120000"})), 2);
        assert_eq!(value_size(&json!({"N": "0"})), 1);
        // Binary: raw bytes, not base64 text ("aGVsbG8=" is "hello").
        assert_eq!(value_size(&json!({"B": "aGVsbG8="})), 5);
        assert_eq!(value_size(&json!({"BOOL": true})), 1);
        assert_eq!(value_size(&json!({"NULL": true})), 1);
        assert_eq!(value_size(&json!({"SS": ["ab", "c"]})), 3);
        // Empty list/map: 3 bytes; each element 1 byte more, map keys count like names.
        assert_eq!(value_size(&json!({"L": []})), 3);
        assert_eq!(value_size(&json!({"M": {}})), 3);
        assert_eq!(
            value_size(&json!({"L": [{"S": "ab"}, {"N": "1"}]})),
            3 + 3 + 3
        );
        assert_eq!(value_size(&json!({"M": {"k": {"S": "ab"}}})), 3 + 1 + 1 + 2);
    }

    #[test]
    fn capacity_units_match_the_documented_examples() {
        // "A 3.5 KB item read strongly consistent: 1 RCU; eventually consistent: 0.5."
        assert_eq!(read_units(3584, true), 1.0);
        assert_eq!(read_units(3584, false), 0.5);
        // "An 8 KB item: 2 RCU strongly consistent, 1 eventually consistent."
        assert_eq!(read_units(8192, true), 2.0);
        assert_eq!(read_units(8192, false), 1.0);
        // "Query of 10 items of 40 bytes: 400 bytes, rounded up to 4 KB: 1 RCU."
        assert_eq!(read_units(400, true), 1.0);
        // "Writing a 1.5 KB item takes 2 WCU"; any write at least 1; a missing item still 1.
        assert_eq!(write_units(1536), 2.0);
        assert_eq!(write_units(1024), 1.0);
        assert_eq!(write_units(0), 1.0);
        // A 500-character string attribute of a 1-letter name: 501 bytes, 1 WCU.
        let big = json!({"b": {"S": "x".repeat(500)}});
        assert_eq!(write_units(size(big)), 1.0);
    }
}
