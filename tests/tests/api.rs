//! The REST API end to end: real handlers, real DynamoDB-API server (one per test binary).

#[path = "api/attachments.rs"]
mod attachments;
#[path = "api/auth.rs"]
mod auth;
#[path = "api/changes.rs"]
mod changes;
#[path = "api/conversations.rs"]
mod conversations;
#[path = "api/faults.rs"]
mod faults;
#[path = "api/identities.rs"]
mod identities;
#[path = "api/inbox.rs"]
mod inbox;
#[path = "api/limits.rs"]
mod limits;
#[path = "api/messages.rs"]
mod messages;
#[path = "api/non_members.rs"]
mod non_members;
#[path = "api/reads.rs"]
mod reads;
#[path = "api/roles.rs"]
mod roles;
#[path = "api/round_trips.rs"]
mod round_trips;
#[path = "api/safety.rs"]
mod safety;
#[path = "api/scanning.rs"]
mod scanning;
#[path = "api/upgrade.rs"]
mod upgrade;
