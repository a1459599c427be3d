//! Reading and writing DynamoDB attribute values.

use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

use crate::error::ChatError;

pub type Item = HashMap<String, AttributeValue>;

pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub fn list_s<'a>(vs: impl IntoIterator<Item = &'a str>) -> AttributeValue {
    AttributeValue::L(vs.into_iter().map(s).collect())
}

pub fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

pub fn get_n(item: &Item, name: &str) -> Option<u64> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

pub fn get_list_s(item: &Item, name: &str) -> Vec<String> {
    item.get(name)
        .and_then(|v| v.as_l().ok())
        .map(|l| l.iter().filter_map(|v| v.as_s().ok().cloned()).collect())
        .unwrap_or_default()
}

pub fn get_map<'a>(item: &'a Item, name: &str) -> Option<&'a Item> {
    item.get(name).and_then(|v| v.as_m().ok())
}

pub fn req_s(item: &Item, name: &str) -> Result<String, ChatError> {
    get_s(item, name)
        .map(str::to_owned)
        .ok_or_else(|| ChatError::internal(format!("item lacks string attribute {name}")))
}

pub fn req_n(item: &Item, name: &str) -> Result<u64, ChatError> {
    get_n(item, name)
        .ok_or_else(|| ChatError::internal(format!("item lacks number attribute {name}")))
}
