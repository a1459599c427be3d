//! The chat's rules, pure (no I/O, no AWS or Lambda dependency): identifiers, what a conversation
//! allows, message bounds, the read watermark, inbox order, the decisions of a send (alone,
//! queued, group commit), the objects the API returns, requests and their validation, push
//! events and their planning, the backoff of retries, clocks' formats and the one error type.
//! The store (`chat-store`) turns these rules into DynamoDB conditions; the HTTP edge
//! (`chat-http`) turns requests into the types defined here.
//!
//! | module | holds |
//! |---|---|
//! | `ids`, `conversation`, `message`, `read_state`, `inbox`, `model` | the rules and the API's objects |
//! | `safety` | blocking, reports, moderators and suspensions (docs/api.md §27–§30) |
//! | `attachments` | uploads' size and type allowlist, which attachments a send may use (docs/api.md §34–§36) |
//! | `changes` | edits, deletions and reactions: their requests and rules (`changeSeq`, docs/data-model.md §8) |
//! | `send` | the decisions of a send: alone, queued, group commit |
//! | `requests` | request bodies and parameters, parsed and validated into the types above |
//! | `events` | push events, the relay's and the fanout's planning, redelivery, failure policy |
//! | `typing` | typing frames and presence: their requests, expiry, throttling and events |
//! | `rate` | per-user rate limits (a token bucket as one number) and slow mode |
//! | `error`, `retry`, `time` | the one error type, backoff with jitter, wall-clock formats |
//! | `log_sampling` | which routine log lines are written (errors and slow ones always) |

pub mod attachments;
pub mod changes;
pub mod conversation;
pub mod error;
pub mod events;
pub mod ids;
pub mod inbox;
pub mod log_sampling;
pub mod message;
pub mod model;
pub mod notify;
pub mod rate;
pub mod read_state;
pub mod requests;
pub mod retry;
pub mod safety;
pub mod send;
pub mod time;
pub mod typing;

pub use conversation::ConversationType;
pub use error::ChatError;
pub use ids::{ConversationId, UserId};
