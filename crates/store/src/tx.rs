//! Building the parts of a TransactWriteItems. Every part asks for the old item when its condition
//! fails (ReturnValuesOnConditionCheckFailure = ALL_OLD): that answers "why" without another read.

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure as OnFail,
    TransactWriteItem, Update,
};

use super::attrs::Item;
use chat_domain::error::ChatError;

pub type Values<'a> = &'a [(&'a str, AttributeValue)];

fn values(v: Values) -> Option<std::collections::HashMap<String, AttributeValue>> {
    (!v.is_empty()).then(|| {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    })
}

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, ChatError> {
    r.map_err(ChatError::internal)
}

pub fn put(
    table: &str,
    item: Item,
    condition: Option<&str>,
    v: Values,
) -> Result<TransactWriteItem, ChatError> {
    let p = built(
        Put::builder()
            .table_name(table)
            .set_item(Some(item))
            .set_condition_expression(condition.map(str::to_owned))
            .set_expression_attribute_values(values(v))
            .return_values_on_condition_check_failure(OnFail::AllOld)
            .build(),
    )?;
    Ok(TransactWriteItem::builder().put(p).build())
}

pub fn update(
    table: &str,
    key: Item,
    expression: &str,
    condition: Option<&str>,
    v: Values,
) -> Result<TransactWriteItem, ChatError> {
    update_named(table, key, expression, condition, v, &[])
}

/// `update` whose expressions name attributes by placeholder (`#name`, for reserved words such
/// as the table's TTL attribute `ttl`).
pub fn update_named(
    table: &str,
    key: Item,
    expression: &str,
    condition: Option<&str>,
    v: Values,
    names: &[(&str, &str)],
) -> Result<TransactWriteItem, ChatError> {
    let names = (!names.is_empty()).then(|| {
        names
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    });
    let u = built(
        Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(expression)
            .set_condition_expression(condition.map(str::to_owned))
            .set_expression_attribute_values(values(v))
            .set_expression_attribute_names(names)
            .return_values_on_condition_check_failure(OnFail::AllOld)
            .build(),
    )?;
    Ok(TransactWriteItem::builder().update(u).build())
}

pub fn check(
    table: &str,
    key: Item,
    condition: &str,
    v: Values,
) -> Result<TransactWriteItem, ChatError> {
    let c = built(
        ConditionCheck::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(condition)
            .set_expression_attribute_values(values(v))
            .return_values_on_condition_check_failure(OnFail::AllOld)
            .build(),
    )?;
    Ok(TransactWriteItem::builder().condition_check(c).build())
}

pub fn delete(
    table: &str,
    key: Item,
    condition: &str,
    v: Values,
) -> Result<TransactWriteItem, ChatError> {
    let d = built(
        Delete::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(condition)
            .set_expression_attribute_values(values(v))
            .return_values_on_condition_check_failure(OnFail::AllOld)
            .build(),
    )?;
    Ok(TransactWriteItem::builder().delete(d).build())
}

/// A Delete with no condition: it succeeds whether or not the item exists.
pub fn delete_unconditionally(table: &str, key: Item) -> Result<TransactWriteItem, ChatError> {
    let d = built(
        Delete::builder()
            .table_name(table)
            .set_key(Some(key))
            .build(),
    )?;
    Ok(TransactWriteItem::builder().delete(d).build())
}
