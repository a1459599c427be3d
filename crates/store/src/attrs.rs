//! DynamoDB attribute values for expressions, and reading single attributes of partial items
//! (e.g. what a failed condition returned).

use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

pub type Item = HashMap<String, AttributeValue>;

pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
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
