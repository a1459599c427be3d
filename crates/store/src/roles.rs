//! A group's managers and its slow mode (docs/api.md §25, §26): `updateConversation`,
//! `addAdmin`, `removeAdmin` on the conversation item, and the slow-mode slot a send claims on
//! the sender's member item.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::attrs::{get_n, get_s, n, s, Item};
use super::items::{from_item, ConversationItem};
use super::{keys, sdk_error, ChatStore};
use chat_domain::conversation::{check_owner, check_slow_mode_change, is_manager};
use chat_domain::error::ChatError;
use chat_domain::model::Conversation;
use chat_domain::rate::slow_mode_wait;
use chat_domain::retry::backoff;
use chat_domain::{ConversationId, ConversationType, UserId};

/// Who a slow mode exempts and how long it is, as the send path last read it (`head`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlowRule {
    pub seconds: u64,
    pub owner: Option<UserId>,
    pub admins: Vec<UserId>,
}

impl SlowRule {
    /// From a conversation item's `slowModeSeconds`, `ownerId`, `adminIds`.
    pub(crate) fn of(item: &Item) -> SlowRule {
        let admins = item
            .get("adminIds")
            .and_then(|v| v.as_l().ok())
            .map(|l| {
                l.iter()
                    .filter_map(|v| v.as_s().ok().and_then(|u| UserId::parse(u)))
                    .collect()
            })
            .unwrap_or_default();
        SlowRule {
            seconds: get_n(item, "slowModeSeconds").unwrap_or(0),
            owner: get_s(item, "ownerId").and_then(UserId::parse),
            admins,
        }
    }

    /// Whether `sender` waits between sends.
    fn applies_to(&self, sender: &UserId) -> bool {
        self.seconds > 0 && !is_manager(sender, self.owner.as_ref(), &self.admins)
    }
}

/// The slow-mode rules this instance read last, per conversation (bounded: forgotten wholesale
/// past 10,000). A send that queues without reading the conversation uses them.
#[derive(Debug, Default)]
pub(crate) struct SlowRules(Mutex<HashMap<ConversationId, SlowRule>>);

impl SlowRules {
    pub(crate) fn saw(&self, id: &ConversationId, rule: SlowRule) {
        if let Ok(mut m) = self.0.lock() {
            if m.len() >= 10_000 {
                m.clear();
            }
            m.insert(id.clone(), rule);
        }
    }

    fn get(&self, id: &ConversationId) -> SlowRule {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(id).cloned())
            .unwrap_or_default()
    }
}

/// A slot a send claimed: the sender's `lastSentAt` before and after.
pub(crate) struct Claim {
    before: Option<u64>,
    mine: u64,
}

fn now_ms() -> u64 {
    chat_domain::time::unix_millis(chat_domain::time::now())
}

impl ChatStore {
    /// `updateConversation`: sets a group's slow mode (owner or admins; 0 turns it off).
    /// DynamoDB: 1 BatchGetItem (the conversation, the caller's member item), 1 UpdateItem, then
    /// `get_conversation`'s reads for the answer.
    pub async fn update_conversation(
        &self,
        caller: &UserId,
        id: &ConversationId,
        slow_mode_seconds: u64,
    ) -> Result<Conversation, ChatError> {
        let mut retry = self.retry();
        while retry.next_now() {
            let (conversation, _) = self.for_member(caller, id, None).await?;
            check_slow_mode_change(
                caller,
                conversation.kind,
                conversation.owner_id.as_ref(),
                &conversation.admin_ids,
            )?;
            // On the caller's role as read: one taken away meanwhile reads again (then `403`).
            let set = self
                .conversation_update(
                    id,
                    "SET slowModeSeconds = :s",
                    "ownerId = :caller OR contains(adminIds, :caller)",
                )
                .expression_attribute_values(":s", n(slow_mode_seconds))
                .expression_attribute_values(":caller", s(caller.as_str()))
                .send()
                .await;
            let Err(e) = set else {
                return self.get_conversation(caller, id).await;
            };
            if !self.lost_race(&e).await {
                return Err(sdk_error("UpdateItem", e));
            }
        }
        Err(ChatError::Throttled)
    }

    /// `addAdmin` (`add`) and `removeAdmin`: the owner names or removes an admin, who must be a
    /// member to be named. Idempotent. DynamoDB: 1 BatchGetItem, 1 conditional UpdateItem (on the
    /// admins as read: a concurrent change reads and writes again, at once, as long as the
    /// request's budget lasts: each lost race is another's change landing; found by probing: 8
    /// grants at once got `429` after 3 tries), then `get_conversation`'s.
    pub async fn set_admin(
        &self,
        caller: &UserId,
        id: &ConversationId,
        target: &UserId,
        add: bool,
    ) -> Result<Conversation, ChatError> {
        let mut retry = self.retry();
        while retry.next_now() {
            let (conversation, target_is_member) =
                self.for_member(caller, id, Some(target)).await?;
            if conversation.kind == ConversationType::Direct {
                return Err(ChatError::Conflict(
                    "a direct conversation has no admins".into(),
                ));
            }
            check_owner(caller, conversation.owner_id.as_ref())?;
            if add && !target_is_member {
                return Err(ChatError::NotFound);
            }
            let old = conversation.admin_ids;
            let mut new: Vec<UserId> = old.iter().filter(|u| *u != target).cloned().collect();
            if add && conversation.owner_id.as_ref() != Some(target) {
                new.push(target.clone());
            }
            if new == old {
                return self.get_conversation(caller, id).await;
            }
            let list = |l: &[UserId]| AttributeValue::L(l.iter().map(|u| s(u.as_str())).collect());
            let (expression, mut condition) = if new.is_empty() {
                ("REMOVE adminIds", "ownerId = :caller".to_owned())
            } else {
                ("SET adminIds = :new", "ownerId = :caller".to_owned())
            };
            condition.push_str(if old.is_empty() {
                " AND attribute_not_exists(adminIds)"
            } else {
                " AND adminIds = :old"
            });
            // On the membership as read too: a leave, removal or ban of the target meanwhile
            // (which takes it off the list it saw) makes this read again (found by probing: a grant
            // racing a ban kept the banned user an admin, added back as one).
            condition
                .push_str(" AND (membersVersion = :mv OR attribute_not_exists(membersVersion))");
            let mut update = self
                .conversation_update(id, expression, &condition)
                .expression_attribute_values(":caller", s(caller.as_str()));
            if !new.is_empty() {
                update = update.expression_attribute_values(":new", list(&new));
            }
            if !old.is_empty() {
                update = update.expression_attribute_values(":old", list(&old));
            }
            update = update.expression_attribute_values(":mv", n(conversation.members_version));
            let Err(e) = update.send().await else {
                return self.get_conversation(caller, id).await;
            };
            if !self.lost_race(&e).await {
                return Err(sdk_error("UpdateItem", e));
            }
        }
        Err(ChatError::Throttled)
    }

    /// The conversation, for a caller that is a member (else `NotFound`), and whether `target`
    /// is one (`removeMember` too). DynamoDB: 1 strongly consistent BatchGetItem.
    pub(crate) async fn for_member(
        &self,
        caller: &UserId,
        id: &ConversationId,
        target: Option<&UserId>,
    ) -> Result<(ConversationItem, bool), ChatError> {
        let mut wanted = vec![keys::conversation_key(id), keys::member_key(id, caller)];
        // BatchGetItem refuses duplicate keys.
        if let Some(t) = target.filter(|t| *t != caller) {
            wanted.push(keys::member_key(id, t));
        }
        let found = self.batch_get(wanted, true).await?;
        let by_sk = |sk: &str| found.iter().find(|i| get_s(i, keys::SK) == Some(sk));
        let conversation: ConversationItem = by_sk(keys::CONVERSATION_SK)
            .cloned()
            .map(from_item)
            .transpose()?
            .ok_or(ChatError::NotFound)?;
        if by_sk(&keys::member_sk(caller)).is_none() {
            return Err(ChatError::NotFound);
        }
        let target_is_member = target.is_some_and(|t| by_sk(&keys::member_sk(t)).is_some());
        Ok((conversation, target_is_member))
    }

    /// Slow mode: claims the sender's slot for this period (`lastSentAt` on its member item), or
    /// refuses with the seconds left. None when no slow mode applies to the sender (as this
    /// instance last read the conversation). DynamoDB: none then; else 1 conditional UpdateItem,
    /// which also proves membership (a non-member: `NotFound`). The slot names the send that
    /// took it (`lastSentKey`, its `clientMsgId`): a retry of that send (after a `503`, whose
    /// slot is kept) takes it again, so that it learns its outcome (SPEC: retry to learn it).
    pub(crate) async fn claim_slow_mode(
        &self,
        id: &ConversationId,
        sender: &UserId,
        client_msg_key: &str,
    ) -> Result<Option<Claim>, ChatError> {
        let rule = self.slow_rules.get(id);
        if !rule.applies_to(sender) {
            return Ok(None);
        }
        let period = Duration::from_secs(rule.seconds);
        let now = now_ms();
        let cutoff = now.saturating_sub(period.as_millis() as u64);
        let out = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(id, sender)))
            .update_expression("SET lastSentAt = :now, lastSentKey = :key")
            .condition_expression(
                "attribute_exists(pk) AND (attribute_not_exists(lastSentAt) OR lastSentAt <= :cutoff \
                 OR lastSentKey = :key)",
            )
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":cutoff", n(cutoff))
            .expression_attribute_values(":key", AttributeValue::S(client_msg_key.to_owned()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match out {
            Ok(out) => Ok(Some(Claim {
                before: out.attributes.as_ref().and_then(|a| get_n(a, "lastSentAt")),
                mine: now,
            })),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let Some(item) = c.item() else {
                        return Err(ChatError::NotFound);
                    };
                    let wait = slow_mode_wait(period, get_n(item, "lastSentAt"), now);
                    Err(ChatError::SlowMode {
                        retry_after: wait.unwrap_or(1),
                    })
                }
                _ => Err(sdk_error("UpdateItem", e)),
            },
        }
    }

    /// Gives a claimed slot back after a send that stored nothing (best effort: only while it is
    /// still this send's). DynamoDB: 1 conditional UpdateItem.
    pub(crate) async fn release_slow_mode(
        &self,
        id: &ConversationId,
        sender: &UserId,
        claim: Claim,
    ) {
        let update = self
            .db
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::member_key(id, sender)))
            .condition_expression("lastSentAt = :mine")
            .expression_attribute_values(":mine", n(claim.mine));
        let update = match claim.before {
            Some(before) => update
                .update_expression("SET lastSentAt = :before")
                .expression_attribute_values(":before", n(before)),
            None => update.update_expression("REMOVE lastSentAt"),
        };
        if let Err(e) = update.send().await {
            tracing::debug!(error = %e, "slow-mode slot not released");
        }
    }
}

impl ChatStore {
    /// Whether a conditional update of the conversation item lost to another change of it: its
    /// condition (the item changed since it was read), or a transaction on the item at that
    /// moment (a send's, a membership change's), which it first waits out a little. Read again
    /// and retry then.
    async fn lost_race<R>(
        &self,
        e: &aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>,
    ) -> bool {
        if e.code() == Some("TransactionConflictException") {
            self.deadline().sleep(backoff(2)).await;
            return true;
        }
        e.as_service_error()
            .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
    }
}
