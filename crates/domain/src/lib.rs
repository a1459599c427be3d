//! The chat's rules, pure (no I/O): identifiers, what a conversation allows, message bounds, the
//! read watermark, inbox order, the decisions of a send (alone, queued, group commit), and the
//! objects the API returns. The store turns these rules into DynamoDB conditions; the HTTP edge
//! turns requests into the types defined here.

pub mod conversation;
pub mod ids;
pub mod inbox;
pub mod message;
pub mod model;
pub mod read_state;
pub mod send;

pub use conversation::ConversationType;
pub use ids::{ConversationId, UserId};
