//! Everything the Lambda functions share, grouped by concern:
//!
//! | module | holds |
//! |---|---|
//! | `domain` | the chat's rules, pure: ids, membership rules, bounds, watermark, inbox order, API objects |
//! | `api` | the HTTP edge: request parsing, the one error → response mapping, `serve` |
//! | `auth` | who is calling: JWT verification (HS256 locally, RS256 via the issuer's keys) |
//! | `store` | DynamoDB: the chat table (one module per concern) and the connections table |
//! | `events` | push events, how they come from the table's stream, relay and fanout planning |
//! | `config`, `error`, `retry`, `telemetry`, `time` | configuration read once at init, the one error type, bounded retries, logs and metrics, clocks |
//! | `iam_log` | the IAM actions each function's calls need, recorded for the tests' IAM check |
//! | `lambda` | the Lambda scaffold: init, the event functions' `run`, the partial batch response |
//!
//! Only `api` speaks `lambda_http`, and `lambda` `lambda_runtime`; `domain` does no I/O.

pub mod api;
pub mod auth;
pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod iam_log;
pub mod lambda;
pub mod retry;
pub mod store;
pub mod telemetry;
pub mod time;

pub use config::Config;
pub use domain::{ConversationId, UserId};
pub use error::ChatError;
pub use store::{ChatStore, ConnectionStore};
