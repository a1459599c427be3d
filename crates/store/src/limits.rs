//! Per-user rate limits across all instances (docs/api.md §24; the rule: `chat_domain::rate`).
//!
//! A user's two buckets are one item of the connections table, `pk = U#<userId>, sk = L`
//! (`sendTat`, `requestTat`: microseconds; `expiresAt`: TTL), next to the user's presence: a table
//! with no stream, so that a limit's writes never reach the relay or the inbox index. Each bucket
//! is one number updated by one conditional UpdateItem; the instance remembers the newest value
//! it saw, which refuses a request over the limit with no call at all (the stored value only ever
//! grows) and guesses which of the two updates applies (a wrong guess costs one more call).
//!
//! - Sends (`Kind::Send`): every send is debited exactly, one write unit each.
//! - All requests (`Kind::Request`): debited by sampling, one request in `sample` writes the
//!   tokens of every request its instance admitted since its last debit (charged even when the
//!   bucket is short: they were admitted), so that a read costs 1/`sample` write unit on average,
//!   not one; the shared bucket sees every admitted request, so no instance grants the full rate
//!   on its own (docs/api.md §24 says how close it keeps to the limit).
//!
//! A suspension marks the item too (`suspended`, with no TTL while it lasts), and every update
//! is conditioned on its absence: a suspended user's sends (and sampled requests) are refused at
//! once by every instance, with no read more: a send under limits skips the request edge's
//! suspension read (`ChatStore::is_suspended`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::attrs::{get_n, n, Item};
use super::{sdk_error, ChatStore};
use chat_domain::error::ChatError;
use chat_domain::rate::{Bucket, Take, Unsampled, REPLAY_LOOKUPS};
use chat_domain::UserId;

/// The limits an operator sets (template parameters, `CHAT_*_RATE`; README "Configuration").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    pub sends: Bucket,
    pub requests: Bucket,
    /// One request in this many debits the all-requests bucket (with as many tokens).
    pub sample: u32,
}

impl RateLimits {
    pub const OFF: RateLimits = RateLimits {
        sends: Bucket::OFF,
        requests: Bucket::OFF,
        sample: 1,
    };

    /// The defaults of SPEC §17: sends 10 a second with a burst of 20; 50 requests a second.
    pub const DEFAULT: RateLimits = RateLimits {
        sends: Bucket {
            per_second: 10,
            burst: 20,
        },
        requests: Bucket {
            per_second: 50,
            burst: 50,
        },
        sample: 16,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Send,
    Request,
}

impl Kind {
    fn attribute(self) -> &'static str {
        match self {
            Kind::Send => "sendTat",
            Kind::Request => "requestTat",
        }
    }
}

/// Where the buckets live and what this instance saw of them.
#[derive(Debug)]
pub(crate) struct Limiter {
    pub(crate) limits: RateLimits,
    table: String,
    /// The newest `tat` seen per user and bucket; forgotten wholesale past 10,000.
    seen: Mutex<HashMap<(UserId, Kind), u64>>,
    /// Per user, this instance's bucket of lookups of refused sends' keys (`REPLAY_LOOKUPS`).
    lookups: Mutex<HashMap<UserId, u64>>,
    /// Per user, the requests this instance admitted without a debit since its last one.
    owed: Mutex<HashMap<UserId, u32>>,
}

impl Limiter {
    const MAX: usize = 10_000;
    /// A bucket's item outlives its last use by this long (then its TTL removes it).
    const KEEP_SECONDS: u64 = 3_600;

    pub(crate) fn new(limits: RateLimits, table: String) -> Arc<Limiter> {
        Arc::new(Limiter {
            limits,
            table,
            seen: Mutex::default(),
            lookups: Mutex::default(),
            owed: Mutex::default(),
        })
    }

    fn bucket(&self, kind: Kind) -> Bucket {
        match kind {
            Kind::Send => self.limits.sends,
            Kind::Request => self.limits.requests,
        }
    }

    fn seen(&self, user: &UserId, kind: Kind) -> Option<u64> {
        let m = self.seen.lock().ok()?;
        m.get(&(user.clone(), kind)).copied()
    }

    fn saw(&self, user: &UserId, kind: Kind, tat: u64) {
        if let Ok(mut m) = self.seen.lock() {
            if m.len() >= Self::MAX {
                m.clear();
            }
            let e = m.entry((user.clone(), kind)).or_default();
            *e = (*e).max(tat);
        }
    }

    /// Counts `n` requests admitted without a debit (or owed again by a debit not written).
    fn owe(&self, user: &UserId, n: u32) {
        if let Ok(mut m) = self.owed.lock() {
            if m.len() >= Self::MAX {
                m.clear();
            }
            *m.entry(user.clone()).or_default() += n;
        }
    }

    /// The requests admitted without a debit since the last one.
    fn owed(&self, user: &UserId) -> u32 {
        let m = self.owed.lock();
        m.ok().and_then(|m| m.get(user).copied()).unwrap_or(0)
    }

    /// What a debit is to pay for, taken.
    fn take_owed(&self, user: &UserId) -> u32 {
        let m = self.owed.lock();
        m.ok().and_then(|mut m| m.remove(user)).unwrap_or(0)
    }
}

fn now_us() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    t.map_or(0, |d| d.as_micros() as u64)
}

/// The attribute of a user's limits item that a suspension sets (module docs).
const SUSPENDED_MARK: &str = "suspended";

/// A user's limits item: next to its presence (`U#<userId>`), sort key `L`.
fn limits_key(user: &UserId) -> Item {
    super::keys::key(super::keys::user_connections_pk(user), "L")
}

impl ChatStore {
    /// Marks `user`'s limits item suspended (`on`), or takes the mark away: what `set_suspension`
    /// does after writing or deleting the suspension itself. Nothing without limits. DynamoDB:
    /// 1 UpdateItem of the connections table.
    pub(crate) async fn mark_suspended(&self, user: &UserId, on: bool) -> Result<(), ChatError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        self.set_mark(user, &limiter.table, on).await
    }

    async fn set_mark(&self, user: &UserId, table: &str, on: bool) -> Result<(), ChatError> {
        let update = self
            .db
            .update_item()
            .table_name(table)
            .set_key(Some(limits_key(user)))
            .expression_attribute_names("#s", SUSPENDED_MARK);
        // Suspended, the item outlives its TTL (a mark removed by TTL would leave the user's
        // sends to the instances' memory); lifted, it expires as any other.
        let update = if on {
            update
                .update_expression("SET #s = :yes REMOVE expiresAt")
                .expression_attribute_values(
                    ":yes",
                    aws_sdk_dynamodb::types::AttributeValue::Bool(true),
                )
        } else {
            let expires = now_us() / 1_000_000 + Limiter::KEEP_SECONDS;
            update
                .update_expression("REMOVE #s SET expiresAt = :exp")
                .expression_attribute_values(":exp", n(expires))
        };
        update
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("UpdateItem", e))
    }

    /// A limits update met the suspension mark: whether the user is suspended now (the
    /// suspension itself, strongly consistent). A mark left by a lift that failed half-way is
    /// taken away, and the caller tries again. DynamoDB: 1 GetItem (+ 1 UpdateItem).
    async fn suspended_by_mark(&self, user: &UserId, table: &str) -> Result<bool, ChatError> {
        if self.is_suspended_now(user).await? {
            return Ok(true);
        }
        self.set_mark(user, table, false).await?;
        Ok(false)
    }

    /// Whether a send the limits refused may look up its key (is it a retry of a stored send?):
    /// a few a second per user on this instance (`REPLAY_LOOKUPS`), so that a flood of refused
    /// sends does not become a flood of reads of its conversation's partition. No I/O.
    pub(crate) fn may_look_up_refused(&self, user: &UserId) -> bool {
        let Some(limiter) = &self.limiter else {
            return true;
        };
        let Ok(mut lookups) = limiter.lookups.lock() else {
            return true;
        };
        if lookups.len() >= Limiter::MAX {
            lookups.clear();
        }
        let tat = lookups.get(user).copied();
        match REPLAY_LOOKUPS.admit(tat, now_us()) {
            Some(t) => {
                lookups.insert(user.clone(), t);
                true
            }
            None => false,
        }
    }

    /// This store with per-user rate limits kept in `table` (the connections table).
    pub fn with_rate_limits(self, limits: RateLimits, table: impl Into<String>) -> Self {
        ChatStore {
            limiter: Some(Limiter::new(limits, table.into())),
            ..self
        }
    }

    /// Whether the send limit is on: then a send's limit write also refuses a suspended user.
    pub fn limits_sends(&self) -> bool {
        self.limiter
            .as_ref()
            .is_some_and(|l| l.limits.sends.is_on())
    }

    /// Whether the all-requests limit is on (the edge then identifies the caller first).
    pub fn limits_requests(&self) -> bool {
        self.limiter
            .as_ref()
            .is_some_and(|l| l.limits.requests.is_on())
    }

    /// The send limit, for `user`'s next send: `RateLimited` when over it. DynamoDB: none when
    /// off or when this instance already knows the user is over; else 1 conditional UpdateItem
    /// (+ 1 more when the guess of which update applies was wrong).
    pub async fn limit_send(&self, user: &UserId) -> Result<(), ChatError> {
        self.take(user, Kind::Send, 1).await.0
    }

    /// The all-requests limit, at the request edge: `RateLimited` when over it. DynamoDB: none
    /// for `sample − 1` requests in `sample` while this instance's view is not near the limit
    /// (and none when known to be over); else as
    /// `limit_send`, debiting this request and those this instance admitted since its last
    /// debit (`Bucket::debit`).
    pub async fn limit_request(&self, user: &UserId) -> Result<(), ChatError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        let sample = limiter.limits.sample.max(1);
        let drawn = uuid::Uuid::new_v4()
            .as_u128()
            .is_multiple_of(u128::from(sample));
        // Not drawn: decided here, without a write, by the bucket as this instance last saw it
        // (full, when it has not seen it yet), unless that view is near the limit.
        if !drawn {
            let now = now_us();
            let tat = limiter.seen(user, Kind::Request).unwrap_or(now);
            let owed = limiter.owed(user);
            match limiter.limits.requests.unsampled(tat, owed, now, sample) {
                Unsampled::Admit => {
                    limiter.owe(user, 1);
                    return Ok(());
                }
                Unsampled::Refuse { retry_after } => {
                    return Err(ChatError::RateLimited { retry_after })
                }
                // Near the limit: the stored bucket decides, as for a drawn request.
                Unsampled::Draw => {}
            }
        }
        let owed = limiter.take_owed(user);
        let (verdict, charged) = self.take(user, Kind::Request, owed).await;
        if !charged {
            limiter.owe(user, owed);
        }
        verdict
    }

    /// Debits `weight` tokens from `user`'s send bucket, or for the all-requests bucket the
    /// request and the `weight` owed (`Bucket::debit`); or refuses. And whether the tokens were
    /// written (a refused request may still have paid for those admitted before it).
    async fn take(&self, user: &UserId, kind: Kind, weight: u32) -> (Result<(), ChatError>, bool) {
        let Some(limiter) = &self.limiter else {
            return (Ok(()), false);
        };
        let bucket = limiter.bucket(kind);
        if !bucket.is_on() {
            return (Ok(()), false);
        }
        let mut tat = limiter.seen(user, kind);
        // A guess that meets another instance's write is corrected from the value the failed
        // condition returns; a user whose every try loses is flooding: refused.
        for _ in 0..10 {
            let now = now_us();
            let decision = match kind {
                Kind::Send => bucket.take(tat, now, weight),
                Kind::Request => bucket.debit(tat, now, weight),
            };
            let (expression, condition, values, cost) = match decision {
                Take::Over { retry_after } => {
                    return (Err(ChatError::RateLimited { retry_after }), false)
                }
                Take::Fresh { to } => (
                    "SET #t = :to, expiresAt = :exp",
                    "(attribute_not_exists(#t) OR #t <= :now) AND attribute_not_exists(suspended)",
                    vec![(":to", n(to)), (":now", n(now))],
                    None,
                ),
                Take::Behind { cost, slack } => (
                    "SET #t = #t + :cost, expiresAt = :exp",
                    "#t > :now AND #t <= :latest AND attribute_not_exists(suspended)",
                    vec![
                        (":cost", n(cost)),
                        (":now", n(now)),
                        (":latest", n(now + slack)),
                    ],
                    None,
                ),
                Take::Charge { cost } => (
                    "SET #t = #t + :cost, expiresAt = :exp",
                    "#t > :now AND attribute_not_exists(suspended)",
                    vec![(":cost", n(cost)), (":now", n(now))],
                    Some(cost),
                ),
            };
            let mut update = self
                .db
                .update_item()
                .table_name(&limiter.table)
                .set_key(Some(limits_key(user)))
                .update_expression(expression)
                .condition_expression(condition)
                .expression_attribute_names("#t", kind.attribute())
                .expression_attribute_values(":exp", n(now / 1_000_000 + Limiter::KEEP_SECONDS))
                .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            for (name, value) in values {
                update = update.expression_attribute_values(name, value);
            }
            match update.send().await {
                Ok(out) => {
                    let written = out
                        .attributes
                        .as_ref()
                        .and_then(|a| get_n(a, kind.attribute()));
                    if let Some(t) = written {
                        limiter.saw(user, kind, t);
                    }
                    // A charge admits its own request as the bucket was before it.
                    let admitted = match (cost, written) {
                        (Some(cost), Some(t)) => bucket
                            .admits(t.saturating_sub(cost), now)
                            .map_err(|_| ChatError::RateLimited {
                                retry_after: bucket.refused_by(t, now).unwrap_or(1),
                            }),
                        _ => Ok(()),
                    };
                    return (admitted, true);
                }
                Err(e) => {
                    let failed = e.as_service_error().and_then(|se| match se {
                        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => Some(c.item()),
                        _ => None,
                    });
                    if failed
                        .flatten()
                        .is_some_and(|i| i.contains_key(SUSPENDED_MARK))
                    {
                        match self.suspended_by_mark(user, &limiter.table).await {
                            Ok(true) => return (Err(ChatError::Suspended), false),
                            Ok(false) => continue,
                            Err(e) => return (Err(e), false),
                        }
                    }
                    let old = failed.map(|i| i.and_then(|i| get_n(i, kind.attribute())));
                    match old {
                        Some(found) => {
                            if let Some(t) = found {
                                limiter.saw(user, kind, t);
                            }
                            tat = found;
                        }
                        // No answer (or DynamoDB's own failure): the bucket may or may not
                        // have been debited, but the request has done nothing yet.
                        None => {
                            let error = super::nothing_done(sdk_error("UpdateItem", e));
                            return (Err(error), false);
                        }
                    }
                }
            }
        }
        (Err(ChatError::RateLimited { retry_after: 1 }), false)
    }
}
