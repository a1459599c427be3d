//! Serves the demo chat page (clients/demo, built by `npm run build` in clients/js) as static
//! files: `/` is `index.html`; nothing outside the folder is reachable.

use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, StatusCode};

use crate::http::{response, Body};

pub(crate) async fn serve(dir: &Path, method: &Method, path: &str) -> hyper::Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return response(StatusCode::METHOD_NOT_ALLOWED, "GET only");
    }
    let Some(file) = resolve(dir, path) else {
        return response(StatusCode::NOT_FOUND, "not found");
    };
    match tokio::fs::read(&file).await {
        Ok(bytes) => {
            let mut r = response(StatusCode::OK, Bytes::from(bytes));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(&file)));
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            r
        }
        Err(_) => response(StatusCode::NOT_FOUND, "not found"),
    }
}

/// The file a request path names inside `dir`, if it names one there.
fn resolve(dir: &Path, path: &str) -> Option<PathBuf> {
    let relative = path.split('?').next()?.trim_start_matches('/');
    let relative = if relative.is_empty() {
        "index.html"
    } else {
        relative
    };
    let mut file = dir.to_path_buf();
    for part in Path::new(relative).components() {
        match part {
            Component::Normal(p) => file.push(p),
            _ => return None,
        }
    }
    Some(file)
}

fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") | Some("mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("map") | Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_folder() {
        let dir = Path::new("/srv/demo");
        assert_eq!(resolve(dir, "/"), Some(dir.join("index.html")));
        assert_eq!(resolve(dir, "/app.js?v=1"), Some(dir.join("app.js")));
        assert_eq!(resolve(dir, "/../secret"), None);
        assert_eq!(resolve(dir, "/a/../../b"), None);
        assert_eq!(content_type(Path::new("x.css")), "text/css; charset=utf-8");
    }
}
