//! The HTTP API's access-log line, sized from template.yaml's own `AccessLogSettings.Format`
//! with an example value for each `$context` variable: one line per REST request is billed as
//! log ingestion, so the format the stack deploys is what the cost model prices.

/// An example value per `$context` variable of the format (and of those a format may add back,
/// such as the user agent): a send in a direct conversation, from a browser (the longest user
/// agent of the usual clients), by a Cognito user (a UUID `sub`).
/// Assumed, not measured: the local stack has no API Gateway.
pub const EXAMPLE_VALUES: &[(&str, &str)] = &[
    ("$context.requestId", "QZ3eLjb4IAMEV1A="),
    ("$context.requestTime", "06/Dec/2026:12:34:56 +0000"),
    ("$context.identity.sourceIp", "203.0.113.45"),
    (
        "$context.identity.userAgent",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 \
         (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1",
    ),
    (
        "$context.authorizer.claims.sub",
        "3f8a9c52-7d1e-4b6a-9f0c-2e5d8b7a1c43",
    ),
    ("$context.httpMethod", "POST"),
    ("$context.routeKey", "POST /conversations/{id}/messages"),
    (
        "$context.path",
        "/conversations/d-8f14e45fceea167a5a36dedd4bea2543/messages",
    ),
    ("$context.protocol", "HTTP/1.1"),
    ("$context.status", "201"),
    ("$context.responseLength", "266"),
    ("$context.responseLatency", "31"),
    ("$context.integrationStatus", "201"),
    ("$context.integrationLatency", "29"),
    ("$context.integrationErrorMessage", "-"),
    ("$context.authorizer.error", "-"),
];

/// The HTTP API's access-log format in `template` (the folded `Format: >-` scalar after its
/// `HttpApiAccessLogGroup` destination), its lines joined by a space as YAML folds them.
pub fn http_api_format(template: &str) -> Option<String> {
    let mut lines = template
        .lines()
        .skip_while(|l| !l.contains("DestinationArn: !GetAtt HttpApiAccessLogGroup.Arn"))
        .skip(1);
    let format = lines.next()?;
    if format.trim() != "Format: >-" {
        return None;
    }
    let indent = |l: &str| l.len() - l.trim_start().len();
    let key_indent = indent(format);
    let folded: Vec<&str> = lines
        .take_while(|l| indent(l) > key_indent && !l.trim().is_empty())
        .map(str::trim)
        .collect();
    (!folded.is_empty()).then(|| folded.join(" "))
}

/// The bytes of one line of `format` with the example values. Panics on a variable without an
/// example (a format change must say what its new field holds).
pub fn line_bytes(format: &str) -> usize {
    let mut line = String::new();
    let mut rest = format;
    while let Some(at) = rest.find("$context.") {
        line.push_str(&rest[..at]);
        let name_len = rest[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '$'))
            .unwrap_or(rest.len() - at);
        let name = &rest[at..at + name_len];
        let value = EXAMPLE_VALUES
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no example value for {name} (bench/src/cost/access_log.rs)"))
            .1;
        line.push_str(value);
        rest = &rest[at + name_len..];
    }
    line.push_str(rest);
    line.len()
}

/// The deployed format's line, from the workspace's template.yaml.
pub fn from_template() -> usize {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml");
    let template = std::fs::read_to_string(path).expect("template.yaml");
    line_bytes(&http_api_format(&template).expect("the HTTP API's access-log format"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folded_format_is_read_and_sized() {
        let template = "      AccessLogSettings:
        DestinationArn: !GetAtt HttpApiAccessLogGroup.Arn
        Format: >-
          {\"id\":\"$context.requestId\",
          \"status\":\"$context.status\"}
      Auth:
";
        let format = http_api_format(template).unwrap();
        assert_eq!(
            format,
            r#"{"id":"$context.requestId", "status":"$context.status"}"#
        );
        assert_eq!(
            line_bytes(&format),
            r#"{"id":"QZ3eLjb4IAMEV1A=", "status":"201"}"#.len()
        );
        assert_eq!(http_api_format("Format: >-\n  {}"), None);
    }

    /// The deployed format has an example for each of its variables and is a JSON object once
    /// filled in (what infra/test_template.py also asks of it).
    #[test]
    fn the_templates_format_is_priced() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml");
        let format = http_api_format(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut filled = format.clone();
        for (name, value) in EXAMPLE_VALUES {
            filled = filled.replace(name, value);
        }
        let line: serde_json::Value = serde_json::from_str(&filled).unwrap();
        assert!(line.get("status").is_some(), "{line}");
        assert_eq!(line_bytes(&format), filled.len());
    }
}
