//! Tables' key schemas (learnt from DescribeTable) and what they identify: an item's full primary
//! key, its partition key, the partition a Query reads.

use serde_json::{Map, Value};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Keys {
    pub pk: String,
    pub sk: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Projection {
    All,
    KeysOnly,
    Include(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Index {
    pub name: String,
    pub keys: Keys,
    pub global: bool,
    pub projection: Projection,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schema {
    pub keys: Keys,
    pub indexes: Vec<Index>,
}

fn keys_of(schema: Option<&Value>) -> Option<Keys> {
    let mut keys = Keys::default();
    for k in schema?.as_array()? {
        let name = k.get("AttributeName")?.as_str()?.to_owned();
        match k.get("KeyType")?.as_str()? {
            "HASH" => keys.pk = name,
            _ => keys.sk = Some(name),
        }
    }
    (!keys.pk.is_empty()).then_some(keys)
}

impl Schema {
    /// From a DescribeTable answer (`{"Table": {...}}`).
    pub fn from_describe(v: &Value) -> Option<Schema> {
        let t = v.get("Table")?;
        let mut indexes = Vec::new();
        for (field, global) in [
            ("GlobalSecondaryIndexes", true),
            ("LocalSecondaryIndexes", false),
        ] {
            for ix in t.get(field).and_then(Value::as_array).into_iter().flatten() {
                let p = ix.get("Projection");
                let projection = match p.and_then(|p| p.get("ProjectionType")?.as_str()) {
                    Some("KEYS_ONLY") => Projection::KeysOnly,
                    Some("INCLUDE") => Projection::Include(
                        p.and_then(|p| p.get("NonKeyAttributes")?.as_array())
                            .into_iter()
                            .flatten()
                            .filter_map(|a| Some(a.as_str()?.to_owned()))
                            .collect(),
                    ),
                    _ => Projection::All,
                };
                indexes.push(Index {
                    name: ix.get("IndexName")?.as_str()?.to_owned(),
                    keys: keys_of(ix.get("KeySchema"))?,
                    global,
                    projection,
                });
            }
        }
        Some(Schema {
            keys: keys_of(t.get("KeySchema"))?,
            indexes,
        })
    }

    pub fn index(&self, name: &str) -> Option<&Index> {
        self.indexes.iter().find(|i| i.name == name)
    }

    /// The primary key attributes of a full item.
    pub fn key_of(&self, item: &Map<String, Value>) -> Map<String, Value> {
        let names = std::iter::once(&self.keys.pk).chain(self.keys.sk.as_ref());
        names
            .filter_map(|n| Some((n.clone(), item.get(n)?.clone())))
            .collect()
    }

    /// The size of what a global index stores of `item` (its keys, the table's, projected ones).
    pub fn projected_size(&self, index: &Index, item: &Map<String, Value>) -> usize {
        let keep = |name: &str| match &index.projection {
            Projection::All => true,
            Projection::KeysOnly => false,
            Projection::Include(attrs) => attrs.iter().any(|a| a == name),
        } || [&self.keys, &index.keys]
            .iter()
            .any(|k| k.pk == name || k.sk.as_deref() == Some(name));
        let kept: Map<String, Value> = item
            .iter()
            .filter(|(n, _)| keep(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        crate::units::item_size(&kept)
    }
}

/// A stable identity of an item: its table and full primary key, attribute names sorted.
pub fn item_id(table: &str, key: &Map<String, Value>) -> String {
    let mut parts: Vec<String> = key.iter().map(|(n, v)| format!("{n}={v}")).collect();
    parts.sort();
    format!("{table}\u{1}{}", parts.join("\u{1}"))
}

/// The scalar text of a key value (`{"S":"c1"}` → `c1`), as fault rules and the record name it.
pub fn scalar(v: &Value) -> String {
    match v.as_object().and_then(|o| o.values().next()) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => v.to_string(),
    }
}

/// The partition-key value a Query's key condition names, for the key attribute `pk`: from
/// `KeyConditionExpression` (`#pk = :v AND ...`) or the legacy `KeyConditions`.
pub fn query_partition(req: &Map<String, Value>, pk: &str) -> Option<Value> {
    if let Some(kc) = req.get("KeyConditions").and_then(Value::as_object) {
        return kc.get(pk)?.get("AttributeValueList")?.get(0).cloned();
    }
    let expr = req.get("KeyConditionExpression")?.as_str()?;
    let names = req.get("ExpressionAttributeNames");
    let values = req.get("ExpressionAttributeValues")?;
    let resolve = |token: &str| -> Option<String> {
        if token.starts_with('#') {
            Some(names?.get(token)?.as_str()?.to_owned())
        } else {
            Some(token.to_owned())
        }
    };
    // Clauses are separated by AND; only the partition key's is a plain `=` comparison.
    let mut clauses = vec![String::new()];
    for tok in expr.split_whitespace() {
        if tok.eq_ignore_ascii_case("AND") {
            clauses.push(String::new());
        } else {
            clauses.last_mut()?.push_str(tok);
        }
    }
    for clause in clauses {
        let clause = clause.trim_matches(['(', ')']);
        let Some((l, r)) = clause.split_once('=') else {
            continue;
        };
        if l.ends_with(['<', '>']) || r.starts_with('=') {
            continue;
        }
        for (name, val) in [(l, r), (r, l)] {
            if val.starts_with(':') && resolve(name).as_deref() == Some(pk) {
                return values.get(val).cloned();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_from_describe_table() {
        let d = json!({"Table": {"KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"}],
            "GlobalSecondaryIndexes": [{"IndexName": "byUser", "KeySchema":
                [{"AttributeName": "user", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["title"]}}]}});
        let s = Schema::from_describe(&d).unwrap();
        assert_eq!(s.keys.pk, "pk");
        assert_eq!(s.keys.sk.as_deref(), Some("sk"));
        let ix = s.index("byUser").unwrap();
        assert!(ix.global);
        let item = json!({"pk": {"S": "a"}, "sk": {"S": "b"}, "user": {"S": "u"},
            "title": {"S": "tt"}, "body": {"S": "xxxxxxxxxx"}});
        let item = item.as_object().unwrap();
        // pk+sk+user+title, not body.
        assert_eq!(s.projected_size(ix, item), 3 + 3 + 5 + 7);
        assert_eq!(
            Value::Object(s.key_of(item)),
            json!({"pk": {"S": "a"}, "sk": {"S": "b"}})
        );
    }

    #[test]
    fn item_ids_ignore_attribute_order() {
        let a = json!({"pk": {"S": "a"}, "sk": {"N": "1"}});
        let b = json!({"sk": {"N": "1"}, "pk": {"S": "a"}});
        let c = json!({"sk": {"N": "2"}, "pk": {"S": "a"}});
        let id = |v: &Value| item_id("t", v.as_object().unwrap());
        assert_eq!(id(&a), id(&b));
        assert_ne!(id(&a), id(&c));
        assert_ne!(id(&a), item_id("u", a.as_object().unwrap()));
    }

    #[test]
    fn query_partition_from_key_conditions() {
        let q = |v: Value| query_partition(v.as_object().unwrap(), "pk");
        let v = json!({":p": {"S": "c1"}, ":s": {"N": "3"}});
        let r = q(json!({"KeyConditionExpression": "#k = :p AND #s >= :s",
            "ExpressionAttributeNames": {"#k": "pk", "#s": "sk"}, "ExpressionAttributeValues": v}));
        assert_eq!(r, Some(json!({"S": "c1"})));
        let r = q(json!({"KeyConditionExpression": "sk <= :s and (:p=pk)",
            "ExpressionAttributeValues": v}));
        assert_eq!(r, Some(json!({"S": "c1"})));
        let r = q(json!({"KeyConditionExpression": "sk = :s", "ExpressionAttributeValues": v}));
        assert_eq!(r, None);
        let r = q(
            json!({"KeyConditions": {"pk": {"AttributeValueList": [{"S": "x"}],
            "ComparisonOperator": "EQ"}}}),
        );
        assert_eq!(r, Some(json!({"S": "x"})));
        assert_eq!(scalar(&json!({"S": "c1"})), "c1");
        assert_eq!(scalar(&json!({"N": "5"})), "5");
    }
}
