//! Offline notifications' storage (docs/api.md §31–§33, docs/data-model.md §9): devices and who
//! holds each token, members' notification settings, and each conversation's open delay window.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{from_item, DeviceItem, TokenOwnerItem};
use super::{keys, sdk_error, tx, ChatStore, TxOutcome};
use chat_domain::error::ChatError;
use chat_domain::notify::{
    devices_to_evict, Device, DeviceRegistration, NotificationSettings, NotifyWindow,
};
use chat_domain::{ConversationId, UserId};

/// `setNotifications`' answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NotificationsResult {
    pub conversation_id: ConversationId,
    pub notifications: NotificationSettings,
}

impl DeviceItem {
    pub fn device(&self) -> Device {
        Device {
            device_id: self.device_id.clone(),
            platform: self.platform,
            token: self.token.clone(),
            registered_at: self.registered_at.clone(),
        }
    }
}

fn is_condition_failed<R>(e: &aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>) -> bool {
    matches!(
        e.as_service_error(),
        Some(UpdateItemError::ConditionalCheckFailedException(_))
    )
}

/// The item a failed condition found (asked for with ReturnValuesOnConditionCheckFailure =
/// ALL_OLD): `Ok(None)` when there was none, `Err` when the call failed otherwise.
fn condition_failed_item<R>(
    e: aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>,
) -> Result<Option<Item>, ChatError>
where
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match e.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
            Ok(failed.item().cloned())
        }
        _ => Err(sdk_error("UpdateItem", e)),
    }
}

impl ChatStore {
    /// A user's devices, oldest registration first. 1 strongly consistent Query.
    pub async fn device_items(&self, user: &UserId) -> Result<Vec<DeviceItem>, ChatError> {
        let mut devices: Vec<DeviceItem> = self
            .query_partition(keys::devices_pk(user), None, None)
            .await?
            .into_iter()
            .map(from_item)
            .collect::<Result<_, _>>()?;
        devices.sort_by(|a, b| a.registered_at.cmp(&b.registered_at));
        Ok(devices)
    }

    /// `devices`. 1 Query.
    pub async fn devices(&self, user: &UserId) -> Result<Vec<Device>, ChatError> {
        Ok(self
            .device_items(user)
            .await?
            .iter()
            .map(DeviceItem::device)
            .collect())
    }

    /// `registerDevice`: the device (re)registered now. A token held by another device (another
    /// user's, or another id of this user's) leaves it; beyond `MAX_DEVICES` the least recently
    /// registered go. `endpoint_arn`: its SNS platform endpoint, where deployed. The device and
    /// the token's holder are written in one transaction conditioned on the holder as read, so
    /// two users registering one token at once never both keep it: the second reads again and
    /// takes it from the first. DynamoDB: per attempt 1 GetItem of the token's holder, 1
    /// DeleteItem of the device holding it, 1 TransactWriteItems (device, holder); then
    /// `evict_beyond_cap`'s Query and deletes.
    pub async fn register_device(
        &self,
        user: &UserId,
        device_id: &str,
        registration: &DeviceRegistration,
        endpoint_arn: Option<String>,
    ) -> Result<Device, ChatError> {
        let device = DeviceItem {
            user_id: user.clone(),
            device_id: device_id.to_owned(),
            platform: registration.platform,
            token: registration.token.clone(),
            registered_at: chat_domain::time::now_rfc3339(),
            endpoint_arn,
        };
        let holder_key = keys::token_owner_key(registration.platform.as_str(), &registration.token);
        let mut retry = self.retry();
        let mut lost = false;
        while if lost {
            retry.next_now()
        } else {
            retry.next().await
        } {
            let read = self.item_fields(holder_key.clone(), None).await?;
            let read: Option<TokenOwnerItem> = read.map(from_item).transpose()?;
            let version = read.as_ref().map_or(0, |h| h.holder_version);
            let condition = match &read {
                None => "attribute_not_exists(pk)",
                Some(_) if version == 0 => {
                    "attribute_exists(pk) AND attribute_not_exists(holderVersion)"
                }
                Some(_) => "holderVersion = :v",
            };
            if let Some(holder) = read.filter(|h| h.user_id != *user || h.device_id != device_id) {
                // Only if that device still holds this token (it may have been registered again
                // with another one since).
                self.delete_device_if(
                    &holder.user_id,
                    &holder.device_id,
                    Some(&registration.token),
                )
                .await?;
            }
            let holder = TokenOwnerItem {
                user_id: user.clone(),
                device_id: device_id.to_owned(),
                holder_version: version + 1,
            };
            let mut holder_item: Item =
                serde_dynamo::to_item(&holder).map_err(ChatError::internal)?;
            holder_item.extend(holder_key.clone());
            let values = [(":v", n(version))];
            let values: &[_] = if version == 0 { &[] } else { &values };
            let parts = vec![
                tx::put(&self.table, device.to_item()?, None, &[])?,
                tx::put(&self.table, holder_item, Some(condition), values)?,
            ];
            match self.transact(parts).await? {
                TxOutcome::Committed => {
                    self.evict_beyond_cap(user).await?;
                    return Ok(device.device());
                }
                // Registered by someone else meanwhile: read the holder again, at once (they
                // made progress); a conflict waits its backoff first.
                TxOutcome::Cancelled(_) => lost = true,
                TxOutcome::Conflict => lost = false,
            }
        }
        Err(ChatError::Throttled)
    }

    /// After a registration (and the move of a token it took from another device): the user's
    /// devices beyond the `MAX_DEVICES` most recently registered (`devices_to_evict`), each
    /// deleted only if not registered again since it was read. Counted after the registration,
    /// so that registrations at once end with the 10 newest, and a token moving between two of
    /// the user's devices evicts nobody. DynamoDB: 1 Query, 1 DeleteItem per device that goes.
    async fn evict_beyond_cap(&self, user: &UserId) -> Result<(), ChatError> {
        let devices: Vec<(String, String)> = self
            .device_items(user)
            .await?
            .into_iter()
            .map(|d| (d.device_id, d.registered_at))
            .collect();
        for evicted in devices_to_evict(&devices) {
            let read = devices.iter().find(|(id, _)| *id == evicted).map(|d| &d.1);
            let r = self
                .db
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(keys::device_key(user, &evicted)))
                .condition_expression("registeredAt = :r")
                .expression_attribute_values(":r", s(read.cloned().unwrap_or_default()))
                .send()
                .await;
            match r {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(_))
                    ) => {}
                Err(e) => return Err(sdk_error("DeleteItem", e)),
            }
        }
        Ok(())
    }

    /// Deletes a device (only while it holds `token`, when given); returns what was deleted.
    /// 1 DeleteItem.
    pub async fn delete_device_if(
        &self,
        user: &UserId,
        device_id: &str,
        token: Option<&str>,
    ) -> Result<Option<DeviceItem>, ChatError> {
        let mut delete = self
            .db
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(keys::device_key(user, device_id)))
            .return_values(ReturnValue::AllOld);
        if let Some(t) = token {
            delete = delete
                .condition_expression("#t = :t")
                .expression_attribute_names("#t", "token")
                .expression_attribute_values(":t", s(t));
        }
        match delete.send().await {
            Ok(out) => out.attributes.map(from_item).transpose(),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(sdk_error("DeleteItem", e)),
        }
    }

    /// `unregisterDevice`: idempotent. DynamoDB: 1 DeleteItem (the token's holder item is left;
    /// it names a device that no longer holds the token, which the next registration of the
    /// token checks).
    pub async fn unregister_device(
        &self,
        user: &UserId,
        device_id: &str,
    ) -> Result<Option<DeviceItem>, ChatError> {
        self.delete_device_if(user, device_id, None).await
    }

    /// `setNotifications`: the caller's settings of a conversation it is a member of (else
    /// `NotFound`). 1 UpdateItem of the member item, on condition that it exists.
    pub async fn set_notifications(
        &self,
        caller: &UserId,
        id: &ConversationId,
        settings: &NotificationSettings,
    ) -> Result<NotificationsResult, ChatError> {
        let value = serde_dynamo::to_attribute_value(settings).map_err(ChatError::internal)?;
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(id, caller)))
            .update_expression("SET notifications = :v")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":v", value)
            .send()
            .await;
        match update {
            Ok(_) => Ok(NotificationsResult {
                conversation_id: id.clone(),
                notifications: settings.clone(),
            }),
            Err(e) if is_condition_failed(&e) => Err(ChatError::NotFound),
            Err(e) => Err(sdk_error("UpdateItem", e)),
        }
    }

    /// Opens the conversation's delay window at message `seq`, unless one is open: true when this
    /// call opened it, or found it open from this very message (then a delayed job must be queued
    /// for it). A window left open past `stale_at_ms` (its job was never queued) counts as closed.
    /// 1 UpdateItem.
    pub async fn open_notify_window(
        &self,
        id: &ConversationId,
        seq: u64,
        now_ms: u64,
        stale_at_ms: u64,
    ) -> Result<bool, ChatError> {
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::notify_window_key(id)))
            .update_expression("SET openUntil = :until, fromSeq = :seq")
            .condition_expression("attribute_not_exists(openUntil) OR openUntil < :now")
            .expression_attribute_values(":until", n(stale_at_ms))
            .expression_attribute_values(":seq", n(seq))
            .expression_attribute_values(":now", n(now_ms))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match update {
            Ok(_) => Ok(true),
            // Open from this message: this call's own write, whose answer was lost and which the
            // SDK sent again, or a redelivery of the stream record, whose job may never have been
            // queued (found by probing: one lost answer left the conversation without
            // notifications for 15 minutes). Queued again: a window's second job sends nothing,
            // its close is its first's (`close_notify_window`).
            Err(e) => {
                Ok(condition_failed_item(e)?
                    .is_some_and(|open| get_n(&open, "fromSeq") == Some(seq)))
            }
        }
    }

    /// Closes the window its job `job` (the queue message's id) names: `Some(covered)` when this
    /// job closed it, with the highest seq a job already covered (`coveredTo`, 0 when none);
    /// `None` when another job of the window closed it (a window may have two: sends nothing
    /// again) or another window is open. Messages after this open the next window. 1 UpdateItem.
    pub async fn close_notify_window(
        &self,
        window: &NotifyWindow,
        job: &str,
    ) -> Result<Option<u64>, ChatError> {
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::notify_window_key(&window.conversation_id)))
            .update_expression("SET closedBy = :job REMOVE openUntil")
            .condition_expression("attribute_exists(openUntil) AND fromSeq = :seq")
            .expression_attribute_values(":seq", n(window.from_seq))
            .expression_attribute_values(":job", s(job))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let covered = |item: &Item| get_n(item, "coveredTo").unwrap_or(0);
        match update {
            Ok(out) => Ok(Some(out.attributes.as_ref().map_or(0, covered))),
            // Closed by this job: its answer was lost and the SDK sent it again (found by
            // probing: the window's notification was dropped), or the job is delivered again
            // after a failure; what it already told is covered (`cover_notify_window`).
            Err(e) => Ok(condition_failed_item(e)?
                .filter(|closed| {
                    get_s(closed, "closedBy") == Some(job)
                        && get_n(closed, "fromSeq") == Some(window.from_seq)
                        && closed.get("openUntil").is_none()
                })
                .as_ref()
                .map(covered)),
        }
    }

    /// Records that a closed window's job covers the conversation's messages up to `last_seq`
    /// (`coveredTo`, never lowered), so that the next window, opened by a message that reached
    /// the indexer after the close but was counted by this job, does not tell of it again.
    /// 1 UpdateItem.
    pub async fn cover_notify_window(
        &self,
        id: &ConversationId,
        last_seq: u64,
    ) -> Result<(), ChatError> {
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::notify_window_key(id)))
            .update_expression("SET coveredTo = :seq")
            .condition_expression("attribute_not_exists(coveredTo) OR coveredTo < :seq")
            .expression_attribute_values(":seq", n(last_seq))
            .send()
            .await;
        // Already as far (a job delivered again): nothing to do.
        super::connections::done_unless_failed("UpdateItem", update)
    }

    /// The member's badge: how many of its conversations have unread messages, counted from its
    /// memberships as they are now (strongly consistent reads of each conversation and member
    /// item, through the inbox's pages), each once (`Badge`: found by probing, 130 conversations
    /// written to at once made badges of up to 166). DynamoDB: `inbox`'s calls per 100
    /// conversations.
    pub async fn badge(&self, user: &UserId) -> Result<u64, ChatError> {
        let mut cursor: Option<String> = None;
        let mut badge = chat_domain::notify::Badge::default();
        loop {
            let page = self
                .inbox(
                    user,
                    chat_domain::requests::MAX_PAGE_LIMIT,
                    cursor.as_deref(),
                )
                .await?;
            for c in &page.conversations {
                badge.entry(c.conversation_id.as_str(), c.last_seq, c.unread_count > 0);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(badge.count()),
            }
        }
    }
}

/// The notification settings of a deployment (`Config::notify`).
#[derive(Debug, Clone, Default)]
pub struct NotifySettings {
    pub queue_url: Option<String>,
    pub sqs_endpoint: Option<String>,
    pub delay_seconds: u32,
    pub content: chat_domain::notify::Content,
    pub push_sink_url: Option<String>,
    /// The SNS platform application of each platform (template parameters; empty: that platform's
    /// devices get nothing).
    pub platform_arns: PlatformArns,
}

#[derive(Debug, Clone, Default)]
pub struct PlatformArns {
    pub apns: Option<String>,
    pub apns_sandbox: Option<String>,
    pub fcm: Option<String>,
}

impl PlatformArns {
    pub fn of(&self, p: chat_domain::notify::Platform) -> Option<&str> {
        use chat_domain::notify::Platform;
        match p {
            Platform::Apns => self.apns.as_deref(),
            Platform::ApnsSandbox => self.apns_sandbox.as_deref(),
            Platform::Fcm => self.fcm.as_deref(),
        }
    }
}

/// SQS's longest message delay.
pub const MAX_DELAY_SECONDS: u32 = 900;

impl NotifySettings {
    pub fn from_env(var: fn(&str) -> Option<String>) -> Result<Self, String> {
        let delay_seconds = match var("NOTIFY_DELAY_SECONDS") {
            None => 15,
            Some(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|d| *d <= MAX_DELAY_SECONDS)
                .ok_or(format!(
                    "NOTIFY_DELAY_SECONDS must be 0-900 seconds, not {v:?}"
                ))?,
        };
        let content = match var("NOTIFICATION_CONTENT") {
            None => chat_domain::notify::Content::Full,
            Some(v) => chat_domain::notify::Content::parse(v.trim()).ok_or(format!(
                "NOTIFICATION_CONTENT must be full, sender or none, not {v:?}"
            ))?,
        };
        Ok(NotifySettings {
            queue_url: var("CHAT_NOTIFY_QUEUE_URL"),
            sqs_endpoint: var("SQS_ENDPOINT"),
            delay_seconds,
            content,
            push_sink_url: var("CHAT_PUSH_SINK_URL"),
            platform_arns: PlatformArns {
                apns: var("APNS_PLATFORM_APPLICATION_ARN"),
                apns_sandbox: var("APNS_SANDBOX_PLATFORM_APPLICATION_ARN"),
                fcm: var("FCM_PLATFORM_APPLICATION_ARN"),
            },
        })
    }
}
