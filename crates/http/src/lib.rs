//! The HTTP and auth edge: the only crate that speaks `lambda_http`.
//!
//! | module | holds |
//! |---|---|
//! | `routes` | the route table: each operation's method, path and function |
//! | `http` | the REST functions' plumbing: the caller, parameters, `serve`, and the one place where a `ChatError` becomes an HTTP response (docs/api.md §2); feature `rest` |
//! | `auth` | who is calling: JWT verification (HS256 locally, RS256 via the issuer's keys) |
//!
//! Requests are parsed into domain types by `chat_domain::requests`; storage is `chat_store`.

pub mod auth;
#[cfg(feature = "rest")]
pub mod http;
pub mod routes;
