//! The IAM actions a function's AWS calls need, recorded for the tests (README "IAM"): IAM is not
//! enforced locally, so with `CHAT_IAM_LOG=<dir>` every client built by `Config` writes one JSON
//! line per distinct (function, action, resource, leading key) to `<dir>/<function>-<pid>.jsonl`,
//! and `infra/test_iam.py` checks each against that function's policy in template.yaml. Off (no
//! interceptor at all) unless the variable is set.
//!
//! Actions are IAM's, not the API's: a TransactWriteItems is authorized per part (PutItem,
//! UpdateItem, DeleteItem, ConditionCheckItem), a TransactGetItems as GetItem per part, and every
//! Management API call as `execute-api:ManageConnections` on `<METHOD>/@connections/*`, an S3
//! call as its object action on `bucket/<name>/*`, and an SNS call on the part of its ARN after
//! the account (`endpoint/GCM/<app>/<id>`).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::error::BoxError;
use serde_json::{json, Value};

use crate::telemetry::{BeforeTransmit, ReadBeforeTransmit};

/// Both tables' partition key attribute (template.yaml): the `dynamodb:LeadingKeys` of a write.
const PARTITION_KEY: &str = "pk";

/// One grant a call needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Need {
    /// `dynamodb:PutItem`, `kinesis:PutRecords`, `execute-api:ManageConnections`, …
    pub action: String,
    /// `table/ChatTable`, `table/ChatTable/index/X`, `stream/EventStream`, `POST/@connections/*`.
    pub resource: String,
    /// The partition key's prefix up to its first `#` (`I#`), for item-level DynamoDB actions.
    pub leading_key: Option<String>,
}

/// What a DynamoDB request (JSON 1.0 body) needs, by IAM's rules.
pub fn dynamodb_needs(operation: &str, body: &Value) -> Vec<Need> {
    let table = |t: &Value| format!("table/{}", t.as_str().unwrap_or("?"));
    let item_need = |action: &str, part: &Value, item: &str| Need {
        action: format!("dynamodb:{action}"),
        resource: table(&part["TableName"]),
        leading_key: leading_key(&part[item]),
    };
    let mut needs = Vec::new();
    match operation {
        "TransactWriteItems" => {
            for part in body["TransactItems"].as_array().into_iter().flatten() {
                for (kind, action, item) in [
                    ("Put", "PutItem", "Item"),
                    ("Update", "UpdateItem", "Key"),
                    ("Delete", "DeleteItem", "Key"),
                    ("ConditionCheck", "ConditionCheckItem", "Key"),
                ] {
                    if part.get(kind).is_some() {
                        needs.push(item_need(action, &part[kind], item));
                    }
                }
            }
        }
        "TransactGetItems" => {
            for part in body["TransactItems"].as_array().into_iter().flatten() {
                needs.push(item_need("GetItem", &part["Get"], "Key"));
            }
        }
        "BatchWriteItem" | "BatchGetItem" => {
            for (name, requests) in body["RequestItems"].as_object().into_iter().flatten() {
                let resource = format!("table/{name}");
                let keys: Vec<Option<String>> = if operation == "BatchGetItem" {
                    vec![None]
                } else {
                    requests
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|r| {
                            leading_key(&r["PutRequest"]["Item"])
                                .or_else(|| leading_key(&r["DeleteRequest"]["Key"]))
                        })
                        .collect()
                };
                for leading_key in keys {
                    needs.push(Need {
                        action: format!("dynamodb:{operation}"),
                        resource: resource.clone(),
                        leading_key,
                    });
                }
            }
        }
        _ => {
            let mut resource = table(&body["TableName"]);
            if let Some(index) = body["IndexName"].as_str() {
                resource = format!("{resource}/index/{index}");
            }
            let item = if operation == "PutItem" {
                "Item"
            } else {
                "Key"
            };
            needs.push(Need {
                action: format!("dynamodb:{operation}"),
                resource,
                leading_key: leading_key(&body[item]),
            });
        }
    }
    needs
}

fn leading_key(item: &Value) -> Option<String> {
    let pk = item[PARTITION_KEY]["S"].as_str()?;
    Some(match pk.find('#') {
        Some(i) => pk[..=i].to_owned(),
        None => pk.to_owned(),
    })
}

/// What a Kinesis request needs: its action on the stream it names.
pub fn kinesis_needs(operation: &str, body: &Value) -> Vec<Need> {
    let stream = body["StreamName"].as_str().map(str::to_owned).or_else(|| {
        body["StreamARN"]
            .as_str()
            .and_then(|arn| arn.rsplit('/').next())
            .map(str::to_owned)
    });
    vec![Need {
        action: format!("kinesis:{operation}"),
        resource: format!("stream/{}", stream.as_deref().unwrap_or("?")),
        leading_key: None,
    }]
}

/// What an S3 request needs: its object action on the objects under the key's first segment
/// (`bucket/<name>/<prefix>/*`; a key without one: `bucket/<name>/*`), so that grants by prefix
/// are proven too. Path-style (`/<bucket>/<key>`, the local stand-in) or virtual-hosted
/// (`<bucket>.s3.…`).
pub fn s3_needs(method: &str, uri: &str) -> Vec<Need> {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (bucket, key) = match host.split_once(".s3.") {
        Some((bucket, _)) => (bucket, path),
        None => path.split_once('/').unwrap_or((path, "")),
    };
    let prefix = match key.split_once('/') {
        Some((first, _)) => format!("bucket/{bucket}/{first}/*"),
        None => format!("bucket/{bucket}/*"),
    };
    let tagging = query
        .split('&')
        .any(|p| p == "tagging" || p.starts_with("tagging="));
    let action = match method {
        "GET" | "HEAD" if tagging => "s3:GetObjectTagging",
        "PUT" if tagging => "s3:PutObjectTagging",
        "DELETE" if tagging => "s3:DeleteObjectTagging",
        "GET" | "HEAD" => "s3:GetObject",
        "PUT" => "s3:PutObject",
        "DELETE" => "s3:DeleteObject",
        other => {
            return vec![Need {
                action: format!("unknown:s3:{other}"),
                resource: format!("bucket/{bucket}"),
                leading_key: None,
            }]
        }
    };
    vec![Need {
        action: action.into(),
        resource: prefix,
        leading_key: None,
    }]
}

/// What an SNS request needs (the query protocol: a form body naming its `Action`): `sns:<Action>`
/// on the resource its ARN parameter names, as the part of the ARN after the account
/// (`app/GCM/<name>`, `endpoint/GCM/<name>/<id>`; a topic as `topic/<name>`).
pub fn sns_needs(body: &[u8]) -> Vec<Need> {
    let params: std::collections::HashMap<String, String> =
        form_urlencoded::parse(body).into_owned().collect();
    let action = params.get("Action").map_or("?", String::as_str);
    let arn = [
        "PlatformApplicationArn",
        "EndpointArn",
        "TargetArn",
        "TopicArn",
    ]
    .iter()
    .find_map(|p| params.get(*p));
    let resource = match arn.and_then(|a| a.splitn(6, ':').nth(5)) {
        Some(r) if r.contains('/') => r.to_owned(),
        Some(topic) => format!("topic/{topic}"),
        None => "*".to_owned(),
    };
    vec![Need {
        action: format!("sns:{action}"),
        resource,
        leading_key: None,
    }]
}

/// Whether a signed request is for `service` (its SigV4 credential scope names the service; a
/// presigned one has it in its query, `X-Amz-Credential=…%2Fs3%2Faws4_request`).
fn signed_for(authorization: &str, service: &str) -> bool {
    authorization.contains(&format!("/{service}/aws4_request"))
}

/// What this process has written already, by file: every client of a function (tests build many)
/// writes each need once.
static SEEN: Mutex<Option<HashSet<(PathBuf, Need)>>> = Mutex::new(None);

/// The interceptor: one per client, naming the function whose role the client acts for.
pub type RecordIamNeeds = BeforeTransmit<IamNeeds>;

impl RecordIamNeeds {
    pub fn new(dir: &Path, function: &str) -> RecordIamNeeds {
        let _ = std::fs::create_dir_all(dir);
        let file = dir.join(format!("{function}-{}.jsonl", std::process::id()));
        BeforeTransmit(IamNeeds {
            function: function.into(),
            file: file.into(),
        })
    }
}

/// What `RecordIamNeeds` reads requests with: the function and its file.
#[derive(Debug, Clone)]
pub struct IamNeeds {
    function: Arc<str>,
    file: Arc<Path>,
}

impl IamNeeds {
    fn record(&self, needs: Vec<Need>) {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let seen = seen.get_or_insert_with(HashSet::new);
        let fresh: Vec<Need> = needs
            .into_iter()
            .filter(|n| seen.insert((self.file.to_path_buf(), n.clone())))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let mut out = String::new();
        for n in fresh {
            let line = json!({"function": &*self.function, "action": n.action,
                              "resource": n.resource, "leadingKey": n.leading_key});
            out.push_str(&line.to_string());
            out.push('\n');
        }
        // Several clients of one function append to the same file; one write per batch of lines.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
        {
            let _ = f.write_all(out.as_bytes());
        }
    }
}

impl ReadBeforeTransmit for IamNeeds {
    const NAME: &'static str = "RecordIamNeeds";

    fn read(&self, req: &HttpRequest) -> Result<(), BoxError> {
        let target = req.headers().get("x-amz-target").unwrap_or_default();
        let body: Value = req
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        let authorization = req.headers().get("authorization").unwrap_or_default();
        let needs = match target.split_once('.') {
            Some(("DynamoDB_20120810", op)) => dynamodb_needs(op, &body),
            Some(("Kinesis_20131202", op)) => kinesis_needs(op, &body),
            Some(("AmazonSQS", op)) => vec![Need {
                action: format!("sqs:{op}"),
                resource: format!(
                    "queue/{}",
                    body["QueueUrl"]
                        .as_str()
                        .and_then(|u| u.rsplit('/').next())
                        .unwrap_or("?")
                ),
                leading_key: None,
            }],
            _ if signed_for(authorization, "sns") => {
                sns_needs(req.body().bytes().unwrap_or_default())
            }
            // Sent signed, or presigned for a client to send (the signer's grants authorize it).
            _ if signed_for(authorization, "s3") || req.uri().contains("%2Fs3%2Faws4_request") => {
                let mut needs = s3_needs(req.method(), req.uri());
                // An object put with tags needs PutObjectTagging too.
                if req.method() == "PUT" && req.headers().get("x-amz-tagging").is_some() {
                    let tagging = Need {
                        action: "s3:PutObjectTagging".into(),
                        ..needs[0].clone()
                    };
                    needs.push(tagging);
                }
                needs
            }
            // The Management API is REST: POST/GET/DELETE /@connections/{id}.
            _ if req.uri().contains("/@connections/") => vec![Need {
                action: "execute-api:ManageConnections".into(),
                resource: format!("{}/@connections/*", req.method()),
                leading_key: None,
            }],
            _ => vec![Need {
                action: format!("unknown:{target}"),
                resource: req.uri().to_owned(),
                leading_key: None,
            }],
        };
        self.record(needs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(action: &str, resource: &str, key: Option<&str>) -> Need {
        Need {
            action: action.into(),
            resource: resource.into(),
            leading_key: key.map(str::to_owned),
        }
    }

    #[test]
    fn a_transaction_needs_each_part_as_its_own_action() {
        let body = json!({"TransactItems": [
            {"Update": {"TableName": "T", "Key": {"pk": {"S": "C#1"}, "sk": {"S": "C"}}}},
            {"Put": {"TableName": "T", "Item": {"pk": {"S": "C#1"}, "sk": {"S": "M#1"}}}},
            {"ConditionCheck": {"TableName": "T", "Key": {"pk": {"S": "C#1"}, "sk": {"S": "U"}}}},
            {"Delete": {"TableName": "T", "Key": {"pk": {"S": "P"}, "sk": {"S": "x"}}}},
        ]});
        assert_eq!(
            dynamodb_needs("TransactWriteItems", &body),
            vec![
                need("dynamodb:UpdateItem", "table/T", Some("C#")),
                need("dynamodb:PutItem", "table/T", Some("C#")),
                need("dynamodb:ConditionCheckItem", "table/T", Some("C#")),
                need("dynamodb:DeleteItem", "table/T", Some("P")),
            ]
        );
    }

    #[test]
    fn batch_writes_name_every_leading_key_and_queries_their_index() {
        let body = json!({"RequestItems": {"T": [
            {"PutRequest": {"Item": {"pk": {"S": "I#u1"}, "sk": {"S": "x"}}}},
            {"DeleteRequest": {"Key": {"pk": {"S": "I#u2"}, "sk": {"S": "y"}}}},
        ]}});
        let needs = dynamodb_needs("BatchWriteItem", &body);
        assert_eq!(needs.len(), 2);
        assert!(needs.iter().all(|n| n.leading_key.as_deref() == Some("I#")));
        let q = json!({"TableName": "T", "IndexName": "byUser", "KeyConditionExpression": "x"});
        assert_eq!(
            dynamodb_needs("Query", &q),
            vec![need("dynamodb:Query", "table/T/index/byUser", None)]
        );
    }

    #[test]
    fn kinesis_needs_name_the_stream_by_name_or_arn() {
        let arn = json!({"StreamARN": "arn:aws:kinesis:us-east-1:1:stream/Events"});
        assert_eq!(
            kinesis_needs("PutRecords", &arn),
            vec![need("kinesis:PutRecords", "stream/Events", None)]
        );
    }

    #[test]
    fn s3_needs_name_the_object_action_and_the_bucket() {
        assert_eq!(
            s3_needs("GET", "http://127.0.0.1:4566/archivebucket/d-1/a.jsonl.gz"),
            vec![need("s3:GetObject", "bucket/archivebucket/d-1/*", None)]
        );
        assert_eq!(
            s3_needs(
                "PUT",
                "https://chat-archive-1.s3.us-east-1.amazonaws.com/d-1/a?x-id=PutObject"
            ),
            vec![need("s3:PutObject", "bucket/chat-archive-1/d-1/*", None)]
        );
        assert_eq!(
            s3_needs(
                "DELETE",
                "http://127.0.0.1:1/attachmentsbucket/a/d-1/x?tagging"
            ),
            vec![need(
                "s3:DeleteObjectTagging",
                "bucket/attachmentsbucket/a/*",
                None
            )]
        );
        assert_eq!(
            s3_needs("DELETE", "http://localhost:4566/b/k")[0].action,
            "s3:DeleteObject"
        );
        assert!(signed_for(
            "AWS4-HMAC-SHA256 Credential=local/20261201/us-east-1/s3/aws4_request, SignedHeaders=host",
            "s3"
        ));
        assert!(!signed_for(
            "AWS4-HMAC-SHA256 Credential=local/20261201/us-east-1/dynamodb/aws4_request",
            "s3"
        ));
    }

    #[test]
    fn sns_needs_name_the_action_and_the_arn_after_the_account() {
        let create = b"Action=CreatePlatformEndpoint&Version=2010-03-31&PlatformApplicationArn=\
arn%3Aaws%3Asns%3Aus-east-1%3A123456789012%3Aapp%2FGCM%2Fchat&Token=t%2B1&Attributes.entry.1.key=Enabled";
        assert_eq!(
            sns_needs(create),
            vec![need("sns:CreatePlatformEndpoint", "app/GCM/chat", None)]
        );
        let publish = b"Action=Publish&TargetArn=arn%3Aaws%3Asns%3Aus-east-1%3A1%3Aendpoint%2FAPNS%2Fchat%2Fe-1&Message=%7B%7D";
        assert_eq!(
            sns_needs(publish),
            vec![need("sns:Publish", "endpoint/APNS/chat/e-1", None)]
        );
        let enable = b"Action=SetEndpointAttributes&EndpointArn=arn%3Aaws%3Asns%3Aus-east-1%3A1%3Aendpoint%2FGCM%2Fchat%2Fe-2";
        assert_eq!(
            sns_needs(enable),
            vec![need(
                "sns:SetEndpointAttributes",
                "endpoint/GCM/chat/e-2",
                None
            )]
        );
        assert_eq!(
            sns_needs(b"Action=Publish&TopicArn=arn%3Aaws%3Asns%3Aus-east-1%3A1%3AAlarms"),
            vec![need("sns:Publish", "topic/Alarms", None)]
        );
    }

    #[test]
    fn each_need_is_written_once() {
        let dir = std::env::temp_dir().join(format!("iam-log-{}", uuid::Uuid::new_v4()));
        let rec = RecordIamNeeds::new(&dir, "f");
        let n = need("dynamodb:GetItem", "table/T", Some("C#"));
        rec.0.record(vec![n.clone(), n.clone()]);
        RecordIamNeeds::new(&dir, "f").0.record(vec![n]);
        let text = std::fs::read_to_string(&rec.0.file).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
