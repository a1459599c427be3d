//! Everything the Lambda functions share: the chat domain (rules and DynamoDB storage), identity,
//! events and the HTTP plumbing. Domain code here does not know about Lambda; `http` is the only
//! module that speaks `lambda_http`.

pub mod config;
pub mod connections;
pub mod domain;
pub mod error;
pub mod events;
pub mod http;
pub mod identity;
pub mod jwks;
pub mod keys;
pub mod model;
pub mod requests;
pub mod retry;
pub mod store;
pub mod time;

pub use config::Config;
pub use error::ChatError;
pub use identity::{Authenticator, UserId};
pub use store::ChatStore;
