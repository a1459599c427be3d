//! The HTTP edge of the REST functions: the route table (`routes`), requests parsed into domain
//! types (`requests`) and the one place where results become HTTP responses (`http`).

pub mod http;
pub mod requests;
pub mod routes;
