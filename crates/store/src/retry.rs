//! Time bounds of a request: one deadline shared by every retry of it, and the attempts within it
//! (their waits: the domain's backoff, `chat_domain::retry`).
//!
//! The bound is time, not a count: how many attempts a contended operation needs depends on how
//! many writers compete and how fast the database answers, while what a client can wait for, and
//! what Lambda allows (REST functions time out after 10 s), is a duration. A request that runs out
//! of time (its budget: [`Timeouts`]) answers `429 throttled` with `Retry-After` (or `503` when the database itself did not
//! answer), never the gateway's bare timeout.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::{
    FinalizerInterceptorContextMut, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::OrchestratorError;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use chat_domain::retry::backoff;

/// An SDK interceptor (on every DynamoDB client) that keeps a call's unknown outcome known: when
/// an attempt got no answer, an unreadable one or DynamoDB's own 5xx (what it asked may have been
/// done) and the SDK's later attempts were refused for throughput, the call fails as unanswered
/// (`503`: retry to learn the outcome), not as throttled (`429`: "nothing happened, then or
/// later", which the first attempt may have broken). Found by probing: a block, a ban, a report
/// or an edit that landed was answered 429, and pushed.
#[derive(Debug, Clone, Copy)]
pub struct UnknownOutcomes;

/// Put in the call's config bag by an attempt whose outcome is unknown.
#[derive(Debug, Clone)]
struct OutcomeUnknown;

impl Storable for OutcomeUnknown {
    type Storer = StoreReplace<Self>;
}

/// Whether an attempt's answer says "refused for throughput" (the `THROTTLING` codes), from the
/// error type in its JSON body.
fn refused_for_throughput(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    crate::THROTTLING
        .iter()
        .any(|code| text.contains(&format!("#{code}\"")) || text.contains(&format!("\"{code}\"")))
}

impl Intercept for UnknownOutcomes {
    fn name(&self) -> &'static str {
        "UnknownOutcomes"
    }

    fn read_after_attempt(
        &self,
        ctx: &FinalizerInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let unknown = match ctx.response() {
            Some(response) => response.status().is_server_error(),
            None => matches!(ctx.output_or_error(), Some(Err(_))),
        };
        if unknown {
            cfg.interceptor_state().store_put(OutcomeUnknown);
        }
        Ok(())
    }

    fn modify_before_completion(
        &self,
        ctx: &mut FinalizerInterceptorContextMut<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<OutcomeUnknown>().is_none() {
            return Ok(());
        }
        let throttled = ctx
            .response()
            .and_then(|r| r.body().bytes())
            .is_some_and(refused_for_throughput);
        if let (true, Some(outcome @ Err(_))) = (throttled, ctx.output_or_error_mut()) {
            let unknown = "an earlier attempt got no answer, then the database refused the retries";
            *outcome = Err(OrchestratorError::connector(ConnectorError::other(
                unknown.into(),
                None,
            )));
        }
        Ok(())
    }
}

/// How long a REST request may keep retrying, and how long one DynamoDB call attempt may take.
/// Against AWS a request must answer well inside the functions' 10 s timeout; a local emulator
/// answers one request at a time, so under load it needs far longer for the same work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub request_budget: Duration,
    pub dynamodb_attempt: Duration,
}

impl Timeouts {
    pub const AWS: Timeouts = Timeouts {
        request_budget: Duration::from_secs(6),
        dynamodb_attempt: Duration::from_millis(1500),
    };
    pub const LOCAL: Timeouts = Timeouts {
        request_budget: Duration::from_secs(20),
        dynamodb_attempt: Duration::from_secs(10),
    };
}

/// When a request must stop starting new attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Deadline(Instant::now() + budget)
    }

    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// Sleeps `d`, or less if the deadline comes first; false once the deadline has passed.
    pub async fn sleep(&self, d: Duration) -> bool {
        tokio::time::sleep(d.min(self.remaining())).await;
        !self.passed()
    }
}

/// Attempts of one operation within a deadline: `while retry.next().await { … }`, then give up
/// with `Throttled`.
#[derive(Debug)]
pub struct Retry {
    deadline: Deadline,
    attempt: u32,
}

impl Retry {
    pub fn until(deadline: Deadline) -> Self {
        Retry {
            deadline,
            attempt: 0,
        }
    }

    /// Waits before the next attempt (backoff); false once the deadline has passed.
    pub async fn next(&mut self) -> bool {
        self.attempt += 1;
        if self.attempt == 1 {
            return !self.deadline.passed();
        }
        self.deadline.sleep(backoff(self.attempt)).await
    }

    /// The next attempt without waiting: the previous one lost to someone who made progress (a
    /// failed condition), so there is nothing to wait for.
    pub fn next_now(&mut self) -> bool {
        self.attempt += 1;
        !self.deadline.passed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retries_end_at_the_deadline() {
        let mut fresh = Retry::until(Deadline::after(Duration::from_secs(5)));
        assert!(fresh.next().await, "the first attempt runs");
        assert!(fresh.next().await, "a retry within the deadline runs");
        assert!(fresh.next_now());
        let mut spent = Retry::until(Deadline::after(Duration::ZERO));
        assert!(!spent.next().await, "nothing runs past the deadline");
        assert!(!spent.next_now());
    }

    #[tokio::test]
    async fn a_sleep_never_outlasts_the_deadline() {
        let d = Deadline::after(Duration::from_millis(30));
        let started = Instant::now();
        assert!(!d.sleep(Duration::from_secs(10)).await);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
