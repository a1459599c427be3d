//! The control API under `/strict/` (documented in the crate docs).

use crate::faults::FaultSpec;
use crate::proxy::State;
use crate::wire::Resp;
use crate::Rules;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Method, Request, Response, StatusCode};
use serde_json::{json, Value};

fn reply(status: StatusCode, body: Value) -> Resp {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static headers are valid")
}

fn bad(message: impl std::fmt::Display) -> Resp {
    reply(
        StatusCode::BAD_REQUEST,
        json!({"error": message.to_string()}),
    )
}

pub(crate) async fn handle(state: &State, req: Request<Incoming>) -> Resp {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad(e),
    };
    let input = || -> Result<Value, String> {
        let body: &[u8] = if body.is_empty() { b"{}" } else { &body };
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    match (method, path.as_str()) {
        (Method::GET, "/strict/config") => reply(StatusCode::OK, json!(state.rules())),
        (Method::POST, "/strict/config") => {
            // Any subset of the fields: laid over the current rules.
            let mut merged = json!(state.rules());
            match input() {
                Ok(Value::Object(patch)) => patch.into_iter().for_each(|(k, v)| merged[k] = v),
                Ok(_) => return bad("a JSON object is expected"),
                Err(e) => return bad(e),
            }
            match serde_json::from_value::<Rules>(merged) {
                Ok(rules) => {
                    state.set_rules(rules.clone());
                    reply(StatusCode::OK, json!(rules))
                }
                Err(e) => bad(e),
            }
        }
        (Method::POST, "/strict/faults") => {
            let specs = match input() {
                Ok(Value::Array(list)) => {
                    serde_json::from_value::<Vec<FaultSpec>>(Value::Array(list))
                }
                Ok(one) => serde_json::from_value::<FaultSpec>(one).map(|f| vec![f]),
                Err(e) => return bad(e),
            };
            match specs {
                Ok(specs) => {
                    specs.into_iter().for_each(|f| state.faults.add(f));
                    reply(StatusCode::OK, json!({"faults": state.faults.pending()}))
                }
                Err(e) => bad(e),
            }
        }
        (Method::GET, "/strict/faults") => {
            reply(StatusCode::OK, json!({"faults": state.faults.pending()}))
        }
        (Method::DELETE, "/strict/faults") => {
            state.faults.clear();
            reply(StatusCode::OK, json!({"faults": []}))
        }
        (Method::GET, "/strict/partitions") => reply(StatusCode::OK, state.record()),
        (Method::POST, "/strict/freeze") | (Method::POST, "/strict/thaw") => {
            let was = state.freeze.set(path == "/strict/freeze");
            reply(
                StatusCode::OK,
                json!({"frozen": state.freeze.is_frozen(), "wasFrozen": was}),
            )
        }
        (Method::GET, "/strict/freeze") => {
            reply(StatusCode::OK, json!({"frozen": state.freeze.is_frozen()}))
        }
        (Method::POST, "/strict/reset") => {
            state.reset();
            reply(StatusCode::OK, json!({"reset": true}))
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "unknown control path"}),
        ),
    }
}
