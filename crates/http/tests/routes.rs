//! The route table (`chat_http::routes`) says what the three other places that name the
//! REST routes say: template.yaml's HttpApi events (method, path → the function's binary, the
//! deployed catch-all routes aside), `[workspace.metadata.lambda.watch.router]` in Cargo.toml
//! (method, path → function) and docs/openapi.yaml (method, path → operationId).

use std::collections::BTreeSet;
use std::path::Path;

use chat_http::routes::ROUTES;
use serde_yaml::Value as Yaml;

/// (METHOD, path, function or operationId).
type Routes = BTreeSet<(String, String, String)>;

/// The deployed catch-all routes (404 in the API's shape), in no other place.
const CATCH_ALL_PATHS: [&str; 2] = ["/{proxy+}", "/"];

fn read(relative: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn entry(method: &str, path: &str, target: &str) -> (String, String, String) {
    (method.to_uppercase(), path.to_owned(), target.to_owned())
}

fn str_at<'a>(value: &'a Yaml, keys: &[&str]) -> Option<&'a str> {
    keys.iter().try_fold(value, |v, k| v.get(k))?.as_str()
}

fn template_routes(text: &str) -> Result<Routes, String> {
    let template: Yaml = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let resources = template["Resources"].as_mapping().ok_or("no Resources")?;
    let mut routes = Routes::new();
    for function in resources.values() {
        let Some(binary) = str_at(function, &["Metadata", "BuildProperties", "Binary"]) else {
            continue;
        };
        let events = function["Properties"]["Events"].as_mapping();
        for event in events.into_iter().flat_map(|e| e.values()) {
            if str_at(event, &["Type"]) != Some("HttpApi") {
                continue;
            }
            let method = str_at(event, &["Properties", "Method"]).unwrap_or("ANY");
            let path = str_at(event, &["Properties", "Path"]).unwrap_or("/");
            if !CATCH_ALL_PATHS.contains(&path) {
                routes.insert(entry(method, path, binary));
            }
        }
    }
    Ok(routes)
}

fn router_routes(text: &str) -> Result<Routes, String> {
    let cargo: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let router = cargo["workspace"]["metadata"]["lambda"]["watch"]["router"]
        .as_table()
        .ok_or("no [workspace.metadata.lambda.watch.router]")?;
    let mut routes = Routes::new();
    for (path, targets) in router {
        for target in targets.as_array().ok_or("a route is a list of targets")? {
            let method = target
                .get("method")
                .and_then(|m| m.as_str())
                .unwrap_or("ANY");
            let function = target["function"]
                .as_str()
                .ok_or("a target names its function")?;
            routes.insert(entry(method, path, function));
        }
    }
    Ok(routes)
}

fn openapi_routes(text: &str) -> Result<Routes, String> {
    let doc: Yaml = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let paths = doc["paths"].as_mapping().ok_or("no paths")?;
    let mut routes = Routes::new();
    for (path, item) in paths {
        let path = path.as_str().ok_or("a path is a string")?;
        for (method, operation) in item.as_mapping().into_iter().flatten() {
            if let (Some(method), Some(id)) = (method.as_str(), str_at(operation, &["operationId"]))
            {
                routes.insert(entry(method, path, id));
            }
        }
    }
    Ok(routes)
}

/// What the route table and one other place disagree on, in words (nothing when they agree).
fn compare(place: &str, table: &Routes, theirs: Result<Routes, String>) -> Vec<String> {
    let theirs = match theirs {
        Ok(routes) => routes,
        Err(e) => return vec![format!("{place}: {e}")],
    };
    let only = |a: &Routes, b: &Routes| a.difference(b).cloned().collect::<Vec<_>>();
    let (missing, extra) = (only(table, &theirs), only(&theirs, table));
    if missing.is_empty() && extra.is_empty() {
        return vec![];
    }
    vec![format!(
        "{place} and crates/http/src/routes.rs differ:\n  in the route table only: {missing:?}\n  \
         in {place} only: {extra:?}"
    )]
}

/// Every disagreement between the route table and the three texts.
fn disagreements(template: &str, cargo: &str, openapi: &str) -> Vec<String> {
    let by_function = ROUTES
        .iter()
        .map(|r| entry(r.method, r.path, r.function))
        .collect();
    let by_id = ROUTES
        .iter()
        .map(|r| entry(r.method, r.path, r.id))
        .collect();
    let mut found = compare("template.yaml", &by_function, template_routes(template));
    found.extend(compare("Cargo.toml", &by_function, router_routes(cargo)));
    found.extend(compare(
        "docs/openapi.yaml",
        &by_id,
        openapi_routes(openapi),
    ));
    found
}

struct Sources {
    template: String,
    cargo: String,
    openapi: String,
}

fn sources() -> Sources {
    Sources {
        template: read("template.yaml"),
        cargo: read("Cargo.toml"),
        openapi: read("docs/openapi.yaml"),
    }
}

#[test]
fn the_route_table_is_what_the_template_the_router_and_the_openapi_document_say() {
    let s = sources();
    let found = disagreements(&s.template, &s.cargo, &s.openapi);
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert_eq!(template_routes(&s.template).unwrap().len(), ROUTES.len());
}

/// One edit of `text`, which must be there.
fn edited(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the text any more");
    text.replacen(from, to, 1)
}

#[test]
fn a_route_any_of_them_has_otherwise_fails() {
    let s = sources();
    let check = |template: &str, cargo: &str, openapi: &str, place: &str| {
        let found = disagreements(template, cargo, openapi);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with(place), "{found:?}");
    };
    // Another path, another method, another function, another operationId, one route less.
    let path = edited(&s.template, r#"Path: "/inbox""#, r#"Path: "/inboxes""#);
    check(&path, &s.cargo, &s.openapi, "template.yaml");
    let method = edited(
        &s.template,
        r#"Method: DELETE, Path: "/conversations/{conversationId}/members"#,
        r#"Method: POST, Path: "/conversations/{conversationId}/members"#,
    );
    check(&method, &s.cargo, &s.openapi, "template.yaml");
    let function = edited(
        &s.cargo,
        r#"function = "history""#,
        r#"function = "send-message""#,
    );
    check(&s.template, &function, &s.openapi, "Cargo.toml");
    let router = edited(
        &s.cargo,
        r#""/inbox" = [{ method = "GET", function = "inbox" }]"#,
        "",
    );
    check(&s.template, &router, &s.openapi, "Cargo.toml");
    let id = edited(
        &s.openapi,
        "operationId: markRead",
        "operationId: markAsRead",
    );
    check(&s.template, &s.cargo, &id, "docs/openapi.yaml");
    check(&s.template, &s.cargo, "paths: [", "docs/openapi.yaml");
}
