//! Sending notifications (docs/api.md §33): the delay queue's job per window (SQS), and the
//! delivery to devices — Amazon SNS mobile push deployed, the push sink on the local stack.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use aws_sdk_sns::types::MessageAttributeValue;
use futures::stream::{self, StreamExt};
use serde_json::json;

use super::items::{ConversationItem, DeviceItem, MemberItem};
use super::keys;
use super::notify::{NotifySettings, PlatformArns};
use super::ChatStore;
use chat_domain::error::ChatError;
use chat_domain::notify::{
    decide, matured_through, notification, told_of, window_start, window_waits_until, Newest,
    Notification, NotifyWindow, Platform, WindowMessage,
};
use chat_domain::{ConversationId, ConversationType, UserId};

/// Members of one window worked on at once.
const MEMBERS_IN_FLIGHT: usize = 16;

/// Where notifications go.
#[derive(Debug, Clone)]
pub enum Pusher {
    /// The local push sink: `POST {url}/notifications` with the notification and the device.
    Sink(String),
    /// SNS mobile push: an endpoint per device, made at its first notification.
    Sns(aws_sdk_sns::Client, PlatformArns),
}

/// What one window's job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowReport {
    pub members_notified: usize,
    pub sent: usize,
    pub devices_removed: usize,
}

/// Opens windows and queues their jobs (the inbox indexer), and runs them (the notifier).
#[derive(Debug, Clone)]
pub struct Notifier {
    pub store: ChatStore,
    pub sqs: aws_sdk_sqs::Client,
    pub settings: NotifySettings,
}

impl Notifier {
    /// A conversation's message `seq` reached the stream: opens its window if none is open and
    /// queues the window's job, delayed by `NotifyDelaySeconds`. DynamoDB: 1 UpdateItem; SQS: 1
    /// SendMessage when it opened the window. A failed SendMessage closes the window again (the
    /// stream batch is retried).
    pub async fn message_arrived(&self, id: &ConversationId, seq: u64) -> Result<bool, ChatError> {
        let now = chat_domain::time::unix_millis(chat_domain::time::now());
        self.open_window(id, seq, now, now).await
    }

    /// Opens the conversation's window from `from_seq`, its first message sent at
    /// `first_at_ms`, if none is open, and queues its job for that message's delay: true when it
    /// opened one. DynamoDB: 1 UpdateItem; SQS: 1 SendMessage when it opened the window. A
    /// failed SendMessage closes the window again (the caller's batch is retried).
    async fn open_window(
        &self,
        id: &ConversationId,
        from_seq: u64,
        first_at_ms: u64,
        now_ms: u64,
    ) -> Result<bool, ChatError> {
        let Some(queue) = &self.settings.queue_url else {
            return Ok(false);
        };
        let delay_ms = u64::from(self.settings.delay_seconds) * 1000;
        // A window whose job was never queued (a crash between the two calls) is stale after
        // the delay plus SQS's longest redelivery of a few minutes.
        let stale = now_ms + delay_ms + 15 * 60 * 1000;
        if !self
            .store
            .open_notify_window(id, from_seq, now_ms, stale)
            .await?
        {
            return Ok(false);
        }
        let window = NotifyWindow {
            conversation_id: id.clone(),
            from_seq,
            opened_at_ms: first_at_ms.min(now_ms),
        };
        // SQS delays in whole seconds: rounded up, so the message's delay is over by then.
        let due = first_at_ms.saturating_add(delay_ms);
        let seconds = due.saturating_sub(now_ms).div_ceil(1000) as u32;
        if let Err(e) = self.queue_job(queue, &window, seconds).await {
            let _ = self.store.close_notify_window(&window, "unqueued").await;
            return Err(e);
        }
        Ok(true)
    }

    /// Queues `window`'s job, delayed by `seconds`. SQS: 1 SendMessage.
    async fn queue_job(
        &self,
        queue: &str,
        window: &NotifyWindow,
        seconds: u32,
    ) -> Result<(), ChatError> {
        let body = serde_json::to_string(window).map_err(ChatError::internal)?;
        let sent = self
            .sqs
            .send_message()
            .queue_url(queue)
            .message_body(body)
            .delay_seconds(seconds as i32)
            .send()
            .await;
        sent.map(|_| ()).map_err(|e| {
            ChatError::internal(format!(
                "SendMessage: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            ))
        })
    }

    /// Whether `window`'s job waits for its newest message's own delay (`window_waits_until`):
    /// then its job is queued again for that moment, and the window stays open (its messages
    /// meanwhile are the window's too). DynamoDB: 1 GetItem; SQS: 1 SendMessage when it waits.
    async fn waits(&self, window: &NotifyWindow) -> Result<bool, ChatError> {
        if window.opened_at_ms == 0 {
            return Ok(false);
        }
        let id = &window.conversation_id;
        let Some(newest_at) = self.store.last_message_at_ms(id).await? else {
            return Ok(false);
        };
        let now = chat_domain::time::unix_millis(chat_domain::time::now());
        let delay_ms = u64::from(self.settings.delay_seconds) * 1000;
        let Some(until) = window_waits_until(window.opened_at_ms, newest_at, now, delay_ms) else {
            return Ok(false);
        };
        let Some(queue) = &self.settings.queue_url else {
            return Ok(false);
        };
        // SQS delays in whole seconds: rounded up, so the message's delay is over by then.
        let seconds = (until - now).div_ceil(1000).max(1) as u32;
        self.queue_job(queue, window, seconds).await?;
        Ok(true)
    }

    /// A window's delay is over: its job `job` (the queue message's id) closes it, then notifies each member for whom its messages are
    /// still unread and who has not muted the conversation, once, on each of its devices.
    /// A member is told of the window's messages it has not read, not deleted since and not
    /// from someone it blocks (`told_of`), with the newest of them as the preview; none that an
    /// earlier window's job counted (`window_start`); only messages whose own delay is over
    /// (`matured_through`): younger ones are carried over to a window of their own
    /// (`open_window`). DynamoDB: 1 UpdateItem (the close),
    /// `load_conversation`, 1 UpdateItem (what it covers), 1 Query of the window's messages, in a group 1
    /// BatchGetItem of block keys per 100 (member, sender) pairs, and per member notified 1
    /// Query of its devices and the badge's reads (`badge`).
    pub async fn window_due(
        &self,
        window: &NotifyWindow,
        job: &str,
        pusher: &Pusher,
    ) -> Result<WindowReport, ChatError> {
        let report = WindowReport::default();
        // Its newest message's own delay is not over: the window waits for it (found by
        // probing: a message sent just before the window's end was notified at once, and its
        // read within its delay cancelled nothing).
        if self.waits(window).await? {
            return Ok(report);
        }
        let Some(covered) = self.store.close_notify_window(window, job).await? else {
            return Ok(report);
        };
        // A message counted by the last window's job may have opened this one (it reached the
        // indexer just after that job closed its window): told of once, not again.
        let from_seq = window_start(window.from_seq, covered);
        let Some((conversation, members)) = self
            .store
            .load_conversation(&window.conversation_id)
            .await?
        else {
            return Ok(report);
        };
        if conversation.last_message.is_none() || conversation.last_seq < from_seq {
            return Ok(report);
        }
        let id = &conversation.conversation_id;
        // Only messages whose own delay is over are told of (a window at its cap, or a message
        // that arrived while this check runs); the younger ones go to a window of their own.
        let now_ms = chat_domain::time::unix_millis(chat_domain::time::now());
        let delay_ms = u64::from(self.settings.delay_seconds) * 1000;
        let at_ms =
            |t: &str| chat_domain::time::parse_rfc3339(t).map(chat_domain::time::unix_millis);
        // A job without its opening time (queued before that field) never waits: nor does it
        // hold messages back.
        let all_matured = window.opened_at_ms == 0
            || conversation
                .last_message_at
                .as_deref()
                .and_then(at_ms)
                .is_some_and(|t| t.saturating_add(delay_ms) <= now_ms);
        let mut messages = None;
        let mut through = conversation.last_seq;
        let mut carry = None;
        if !all_matured {
            let read = self
                .store
                .messages_between(id, from_seq, conversation.last_seq)
                .await?;
            let created: Vec<(u64, u64)> = read
                .iter()
                .map(|m| (m.seq, at_ms(&m.created_at).unwrap_or(u64::MAX)))
                .collect();
            through = matured_through(&created, from_seq, now_ms, delay_ms);
            let next_at = created.iter().find(|(seq, _)| *seq > through).map(|c| c.1);
            carry = Some((through + 1, next_at.unwrap_or(now_ms)));
            messages = Some(read);
        }
        let report = if through < from_seq {
            report
        } else {
            self.tell(&conversation, &members, from_seq, through, messages, pusher)
                .await?
        };
        // After the telling: a job that fails before it is delivered again and tells (its
        // close recognises it), which it could not once another window is open.
        // A message that reached the indexer after the close may have opened the next window
        // already; it starts after what this one covered (`window_start`), so covers them too.
        if let Some((next, first_at)) = carry {
            self.open_window(id, next, first_at, now_ms).await?;
        }
        Ok(report)
    }

    /// `window_due`'s notifications of the window's messages `from_seq..=through`, each member's
    /// once on each of its devices.
    async fn tell(
        &self,
        conversation: &ConversationItem,
        members: &[MemberItem],
        from_seq: u64,
        through: u64,
        messages: Option<Vec<chat_domain::model::Message>>,
        pusher: &Pusher,
    ) -> Result<WindowReport, ChatError> {
        let mut report = WindowReport::default();
        let id = &conversation.conversation_id;
        // Before anyone is told: the next window starts after what this one counts. Best
        // effort: without it the next window may tell of a message twice, never of none.
        if let Err(e) = self.store.cover_notify_window(id, through).await {
            tracing::warn!(error = ?e, "notification window's coverage not recorded");
        }
        let now = chat_domain::time::now_rfc3339();
        let due: Vec<_> = members
            .iter()
            .filter(|m| {
                let muted = m.notifications.as_ref().is_some_and(|n| n.is_muted(&now));
                decide(m.last_read_seq, through, from_seq, muted).is_some()
            })
            .map(|m| (m.member_id.clone(), m.last_read_seq))
            .collect();
        if due.is_empty() {
            return Ok(report);
        }
        let mut messages = match messages {
            Some(read) => read,
            None => self.store.messages_between(id, from_seq, through).await?,
        };
        messages.retain(|m| m.seq >= from_seq && m.seq <= through);
        // In a group, a member is not told of messages from those it blocks (docs/api.md §28):
        // 1 BatchGetItem of block keys per 100 (member, sender) pairs.
        let blocked = match conversation.kind {
            ConversationType::Group => self.blocks_of_senders(&due, &messages).await?,
            ConversationType::Direct => HashSet::new(),
        };
        let weighed: Vec<WindowMessage> = messages
            .iter()
            .map(|m| WindowMessage {
                seq: m.seq,
                sender: &m.sender_id,
                deleted: m.deleted,
            })
            .collect();
        let group_title = match conversation.kind {
            ConversationType::Group => conversation.title.as_deref(),
            ConversationType::Direct => None,
        };
        let due: Vec<(UserId, u64, u64)> = due
            .into_iter()
            .filter_map(|(member, last_read)| {
                let blocks = |sender: &UserId| blocked.contains(&(member.clone(), sender.clone()));
                let (count, seq) = told_of(&weighed, from_seq, last_read, blocks)?;
                Some((member, seq, count))
            })
            .collect();
        let messages = &messages;
        // Members at once: a big group's window is done within a second of its delay.
        let done: Vec<Result<WindowReport, ChatError>> = stream::iter(due)
            .map(|(member, seq, count)| {
                let conversation = &*conversation;
                async move {
                    let Some(newest) = messages.iter().find(|m| m.seq == seq) else {
                        return Ok(WindowReport::default());
                    };
                    let newest = Newest {
                        seq,
                        sender: &newest.sender_id,
                        body: &newest.body,
                        group_title,
                    };
                    let mut report = WindowReport::default();
                    let devices = self.store.device_items(&member).await?;
                    if devices.is_empty() {
                        return Ok(report);
                    }
                    let badge = self.store.badge(&member).await?;
                    let n = notification(
                        self.settings.content,
                        &conversation.conversation_id,
                        &newest,
                        count,
                        badge,
                    );
                    report.members_notified += 1;
                    for device in &devices {
                        match self.push(pusher, device, &n).await {
                            Ok(true) => report.sent += 1,
                            Ok(false) => {
                                let token = Some(device.token.as_str());
                                self.store
                                    .delete_device_if(&device.user_id, &device.device_id, token)
                                    .await?;
                                report.devices_removed += 1;
                            }
                            Err(e) => {
                                tracing::warn!(error = ?e, "a notification was not delivered")
                            }
                        }
                    }
                    Ok(report)
                }
            })
            .buffer_unordered(MEMBERS_IN_FLIGHT)
            .collect()
            .await;
        for r in done {
            let r = r?;
            report.members_notified += r.members_notified;
            report.sent += r.sent;
            report.devices_removed += r.devices_removed;
        }
        crate::telemetry::count("NotificationsSent", report.sent as u64);
        Ok(report)
    }

    /// Which of the `due` members block which senders of `messages` (blocker, blocked).
    async fn blocks_of_senders(
        &self,
        due: &[(UserId, u64)],
        messages: &[chat_domain::model::Message],
    ) -> Result<HashSet<(UserId, UserId)>, ChatError> {
        let senders: BTreeSet<&UserId> = messages.iter().map(|m| &m.sender_id).collect();
        let pairs: Vec<(&UserId, &UserId)> = due
            .iter()
            .flat_map(|(m, _)| senders.iter().map(move |s| (m, *s)))
            .filter(|(m, s)| m != s)
            .collect();
        Ok(self.store.blocks_among(&pairs).await?.into_iter().collect())
    }

    /// Sends one notification to one device: false when the device is gone (its SNS endpoint is
    /// disabled).
    async fn push(
        &self,
        pusher: &Pusher,
        device: &DeviceItem,
        n: &Notification,
    ) -> Result<bool, ChatError> {
        match pusher {
            Pusher::Sink(url) => {
                let record = json!({
                    "platform": device.platform.as_str(), "token": device.token,
                    "title": n.title, "body": n.body, "badge": n.badge, "data": n.data,
                    "sentAt": chat_domain::time::now_rfc3339(),
                });
                post_json(url, "/notifications", &record.to_string()).await?;
                Ok(true)
            }
            Pusher::Sns(sns, arns) => self.publish(sns, arns, device, n).await,
        }
    }

    async fn publish(
        &self,
        sns: &aws_sdk_sns::Client,
        arns: &PlatformArns,
        device: &DeviceItem,
        n: &Notification,
    ) -> Result<bool, ChatError> {
        let Some(app) = arns.of(device.platform) else {
            return Ok(true); // No platform application for it in this deployment.
        };
        let endpoint = match &device.endpoint_arn {
            Some(arn) => arn.clone(),
            None => self.make_endpoint(sns, app, device).await?,
        };
        let message = sns_message(device.platform, n);
        let published = sns
            .publish()
            .target_arn(&endpoint)
            .message_structure("json")
            .message(message)
            .message_attributes(
                "AWS.SNS.MOBILE.APNS.PUSH_TYPE",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("alert")
                    .build()
                    .map_err(ChatError::internal)?,
            )
            .send()
            .await;
        match published {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(
                        aws_sdk_sns::operation::publish::PublishError::EndpointDisabledException(_)
                    )
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(sns_error("Publish", e)),
        }
    }
}

impl Notifier {
    /// A device's first notification makes its SNS endpoint, enabled. A token SNS already has an
    /// endpoint for (a device registered again, or by another user) is answered "already exists
    /// with the same Token, but different attributes" when that endpoint was disabled: it is
    /// enabled again, since its app has just registered the token anew. SNS: 1
    /// CreatePlatformEndpoint (+ 1 SetEndpointAttributes for a disabled one); DynamoDB: 1
    /// UpdateItem.
    async fn make_endpoint(
        &self,
        sns: &aws_sdk_sns::Client,
        app: &str,
        device: &DeviceItem,
    ) -> Result<String, ChatError> {
        let made = sns
            .create_platform_endpoint()
            .platform_application_arn(app)
            .token(&device.token)
            .attributes("Enabled", "true")
            .send()
            .await;
        let arn = match made {
            Ok(made) => made.endpoint_arn.unwrap_or_default(),
            Err(e) => {
                let Some(arn) = e
                    .as_service_error()
                    .filter(|s| s.is_invalid_parameter_exception())
                    .and_then(|s| existing_endpoint(s.meta().message()?))
                else {
                    return Err(sns_error("CreatePlatformEndpoint", e));
                };
                sns.set_endpoint_attributes()
                    .endpoint_arn(&arn)
                    .attributes("Enabled", "true")
                    .attributes("Token", &device.token)
                    .send()
                    .await
                    .map_err(|e| sns_error("SetEndpointAttributes", e))?;
                arn
            }
        };
        self.store.set_device_endpoint(device, &arn).await?;
        Ok(arn)
    }
}

/// The endpoint named by CreatePlatformEndpoint's "Endpoint <arn> already exists with the same
/// Token, but different attributes".
pub fn existing_endpoint(message: &str) -> Option<String> {
    if !message.contains("already exists") {
        return None;
    }
    let start = message.find("arn:")?;
    let arn: String = message[start..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    Some(arn.trim_end_matches(['.', ',']).to_owned())
}

fn sns_error<E: std::error::Error + Send + Sync + 'static, R: std::fmt::Debug>(
    op: &str,
    e: aws_sdk_sns::error::SdkError<E, R>,
) -> ChatError {
    ChatError::internal(format!(
        "{op}: {}",
        aws_sdk_sns::error::DisplayErrorContext(&e)
    ))
}

/// SNS's per-platform message (`MessageStructure=json`).
fn sns_message(platform: Platform, n: &Notification) -> String {
    let apns = json!({"aps": {"alert": {"title": n.title, "body": n.body}, "badge": n.badge,
                              "sound": "default"},
                      "conversationId": n.data.conversation_id, "seq": n.data.seq});
    let fcm = json!({"notification": {"title": n.title, "body": n.body},
                     "data": {"conversationId": n.data.conversation_id,
                              "seq": n.data.seq.to_string(), "badge": n.badge.to_string()}});
    let key = match platform {
        Platform::Apns => "APNS",
        Platform::ApnsSandbox => "APNS_SANDBOX",
        Platform::Fcm => "GCM",
    };
    let payload = if key == "GCM" { fcm } else { apns };
    json!({ "default": n.body, key: payload.to_string() }).to_string()
}

/// One HTTP/1.1 POST of a JSON body to a local `http://host:port` (the push sink); fails unless
/// answered 2xx.
pub async fn post_json(base: &str, path: &str, body: &str) -> Result<(), ChatError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| ChatError::Unavailable)?
        .map_err(|e| ChatError::internal(format!("push sink: {e}")))?;
    let status = String::from_utf8_lossy(&answer);
    if status.starts_with("HTTP/1.1 2") || status.starts_with("HTTP/1.0 2") {
        Ok(())
    } else {
        Err(ChatError::internal(format!(
            "push sink answered {}",
            status.lines().next().unwrap_or("nothing")
        )))
    }
}

impl ChatStore {
    /// Records a device's SNS endpoint (made at its first notification). 1 UpdateItem, only
    /// while the device still holds the token.
    pub async fn set_device_endpoint(&self, d: &DeviceItem, arn: &str) -> Result<(), ChatError> {
        let r = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::device_key(&d.user_id, &d.device_id)))
            .update_expression("SET endpointArn = :a")
            .condition_expression("#t = :t")
            .expression_attribute_names("#t", "token")
            .expression_attribute_values(":a", super::attrs::s(arn))
            .expression_attribute_values(":t", super::attrs::s(&d.token))
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(super::sdk_error("UpdateItem", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_endpoint_is_the_arn_sns_names_as_already_existing() {
        let arn = "arn:aws:sns:us-east-1:123456789012:endpoint/GCM/chat/5e3e9847-3183-3f18-a7e8-671c3a57d4b3";
        let answer = format!(
            "Invalid parameter: Token Reason: Endpoint {arn} already exists with the same Token, but different attributes."
        );
        assert_eq!(existing_endpoint(&answer), Some(arn.to_owned()));
        assert_eq!(
            existing_endpoint(&format!("Endpoint {arn}. already exists")),
            Some(arn.to_owned()),
            "trailing punctuation is not the ARN's"
        );
        // Other invalid parameters, even naming an ARN, are not this answer.
        assert_eq!(
            existing_endpoint(&format!(
                "Invalid parameter: PlatformApplicationArn Reason: {arn} is not valid"
            )),
            None
        );
        assert_eq!(
            existing_endpoint("Invalid parameter: Token Reason: malformed"),
            None
        );
        assert_eq!(existing_endpoint("Endpoint already exists"), None);
    }
}
