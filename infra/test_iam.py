"""IAM, proven by the test suite: every AWS call a function made in the tests is allowed by that
function's policy in template.yaml, and every grant is used by some test (or listed below with
its reason).

    CHAT_IAM_LOG=.local/iam-calls cargo test ...        (the functions record what they need)
    CHAT_IAM_LOG=.local/iam-calls .venv/bin/python -m unittest infra/test_iam.py

IAM is not enforced locally, so this is how a missing grant shows before a deploy. The functions'
AWS clients record, with `CHAT_IAM_LOG` set, one JSON line per distinct need (crates/store/src/iam_log.rs):
`{"function": "<binary>", "action": "dynamodb:PutItem", "resource": "table/ChatTable",
"leadingKey": "C#"}`. Policies are read from template.yaml (inline statements, and SAM policy
templates resolved with aws-sam-translator's own definitions); resources are compared in the same
short form (`table/<name>`, `stream/<name>`, `queue/<name>`, `POST/@connections/*`, an SNS ARN's
part after the account: `endpoint/*`), names being the logical ids the local stack creates its
tables and streams under.
"""
from __future__ import annotations

import copy
import fnmatch
import glob
import json
import os
import sys
import unittest
from typing import Any, Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import create_resources  # noqa: E402  (the CloudFormation-aware YAML loader, Fn::ForEach expanded)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Grants no function code uses, each with why it is there. Lambda's event source mappings read
# the streams and write to the on-failure queues with the function's own role.
MAPPING_READS_DYNAMODB_STREAM = "the event source mapping reads the table's stream with the function's role"
MAPPING_READS_KINESIS = "the event source mapping reads the Kinesis stream with the function's role"
ON_FAILURE = "the event source mapping sends what it gives up on to the on-failure queue with the function's role"
UNUSED_WITH_REASON: dict[tuple[str, str], str] = {
    **{(f, a): MAPPING_READS_DYNAMODB_STREAM
       for f in ("relay", "inbox-index")
       for a in ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator",
                 "dynamodb:ListStreams")},
    **{("fanout", a): MAPPING_READS_KINESIS
       for a in ("kinesis:DescribeStream", "kinesis:DescribeStreamSummary", "kinesis:GetRecords",
                 "kinesis:GetShardIterator", "kinesis:ListShards", "kinesis:DescribeStreamConsumer",
                 "kinesis:SubscribeToShard")},
    **{(f, "sqs:SendMessage"): ON_FAILURE for f in ("relay", "fanout", "inbox-index")},
    ("notifier", "dynamodb:BatchWriteItem"): "the badge's inbox reads delete stale inbox entries "
    "they meet (as inbox does): a race the notification tests do not force",
    ("ws-connection", "dynamodb:GetItem"): "re-reads the user's presence when a concurrent $connect "
    "changed it between the registration and its pruning (ConnectionStore::register): a race the "
    "tests do not force",
}


# --- template → policies -----------------------------------------------------------------------

def load_template(path: str) -> dict[str, Any]:
    """The template as the stack has it (its Fn::ForEach loops written out)."""
    return create_resources.load_template(path)


def _sam_policy_templates() -> dict[str, Any]:
    """aws-sam-translator's policy templates (what `sam deploy` expands them to)."""
    import samtranslator  # from aws-sam-cli (infra/requirements.txt)

    path = os.path.join(os.path.dirname(samtranslator.__file__), "policy_templates_data",
                        "policy_templates.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)["Templates"]


def _substitute(value: Any, params: dict[str, Any]) -> Any:
    """A policy template's definition with its parameters (`{"Ref": "TableName"}`) filled in."""
    if isinstance(value, dict):
        if set(value) == {"Ref"} and value["Ref"] in params:
            return params[value["Ref"]]
        return {k: _substitute(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, params) for v in value]
    return value


class Resolver:
    """Resolves a statement's Resource to the short form the functions record."""

    def __init__(self, template: dict[str, Any]):
        self.resources = template["Resources"]

    def short(self, logical_id: str, attribute: str | None = None) -> str:
        res = self.resources.get(logical_id)
        kind = res["Type"] if res else ""
        if kind == "AWS::DynamoDB::Table":
            return f"table/{logical_id}/stream/*" if attribute == "StreamArn" else f"table/{logical_id}"
        if kind == "AWS::Kinesis::Stream":
            return f"stream/{logical_id}"
        if kind == "AWS::Kinesis::StreamConsumer":
            stream = res["Properties"]["StreamARN"]["Fn::GetAtt"][0]
            return f"stream/{stream}/consumer/*"
        if kind == "AWS::SQS::Queue":
            return f"queue/{logical_id}"
        if kind == "AWS::SNS::Topic":
            return f"topic/{logical_id}"
        if kind == "AWS::S3::Bucket":
            # The local stack names a bucket by its logical id in lower case, as S3 names must be
            # (create_resources.bucket_name).
            return f"bucket/{logical_id.lower()}"
        return f"?{logical_id}.{attribute}"

    def resource(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return [r for v in value for r in self.resource(v)]
        if isinstance(value, str):
            return [value]
        if "Ref" in value:
            return [self.short(value["Ref"])]
        if "Fn::GetAtt" in value:
            logical_id, attribute = value["Fn::GetAtt"]
            return [self.short(logical_id, attribute)]
        if "Fn::Sub" in value:
            text, names = value["Fn::Sub"], {}
            if isinstance(text, list):
                text, names = text
            return [self._sub(text, names)]
        raise ValueError(f"cannot resolve resource {value!r}")

    def _sub(self, text: str, names: dict[str, Any]) -> str:
        # An ARN written out: keep what identifies the resource, as the functions record it.
        if "/@connections" in text:  # ...:${WebSocketApi}/${WebSocketStage}/POST/@connections/*
            before, after = text.split("/@connections", 1)
            return f"{before.rsplit('/', 1)[-1]}/@connections{after}"
        if ":table/${" in text:  # a SAM policy template's table ARN
            name, rest = text.split(":table/${", 1)[1].split("}", 1)
            (short,) = self.resource(names.get(name, {"Ref": name}))
            return (short if short.startswith("table/") else f"table/{short}") + rest
        if ":sns:${AWS::Region}:${AWS::AccountId}:" in text:  # app/*, endpoint/*: after the account
            return text.split(":${AWS::AccountId}:", 1)[1]
        if text.startswith("${") and "}" in text:  # ${ChatTable.Arn}/index/*
            ref, rest = text[2:].split("}", 1)
            logical_id, _, attribute = ref.partition(".")
            return self.short(logical_id, attribute or None) + rest
        return text


def policies(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Allow statements by function binary: `{"actions": [...], "resources": [...], "condition": {...}}`."""
    resolver = Resolver(template)
    sam = _sam_policy_templates()
    out: dict[str, list[dict[str, Any]]] = {}
    for res in template["Resources"].values():
        if res.get("Type") != "AWS::Serverless::Function":
            continue
        binary = res["Metadata"]["BuildProperties"]["Binary"]
        statements = []
        for policy in res["Properties"].get("Policies", []):
            if isinstance(policy, str):
                raise AssertionError(f"{binary}: managed policy {policy} (grant exact actions instead)")
            for name, params in policy.items():
                if name == "Statement":
                    statements += params
                elif name in sam:
                    definition = _substitute(copy.deepcopy(sam[name]["Definition"]), params or {})
                    statements += definition["Statement"]
                else:
                    raise AssertionError(f"{binary}: unknown policy {name}")
        out[binary] = [
            {
                "actions": s["Action"] if isinstance(s["Action"], list) else [s["Action"]],
                "resources": resolver.resource(s["Resource"]),
                "condition": s.get("Condition"),
                "sid": s.get("Sid", ""),
            }
            for s in statements if s.get("Effect", "Allow") == "Allow"
        ]
    return out


# --- needs vs grants ---------------------------------------------------------------------------

def load_needs(directory: str) -> dict[str, set[tuple[str, str, str | None]]]:
    needs: dict[str, set[tuple[str, str, str | None]]] = {}
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    n = json.loads(line)
                    needs.setdefault(n["function"], set()).add(
                        (n["action"], n["resource"], n.get("leadingKey")))
    return needs


def _condition_allows(condition: dict[str, Any] | None, leading_key: str | None) -> bool:
    if not condition:
        return True
    for operator, tests in condition.items():
        for key, patterns in tests.items():
            patterns = patterns if isinstance(patterns, list) else [patterns]
            if operator == "ForAllValues:StringLike" and key == "dynamodb:LeadingKeys":
                if leading_key is None or not any(fnmatch.fnmatchcase(leading_key, p) for p in patterns):
                    return False
            else:
                return False  # a condition this check does not know: never assume it allows
    return True


def allowing(statements: list[dict[str, Any]], need: tuple[str, str, str | None]) -> list[tuple[int, str, str]]:
    """The (statement, action, resource) grants that allow `need`."""
    action, resource, leading_key = need
    found = []
    for i, s in enumerate(statements):
        if not _condition_allows(s["condition"], leading_key):
            continue
        for a in s["actions"]:
            if fnmatch.fnmatchcase(action, a):
                for r in s["resources"]:
                    if fnmatch.fnmatchcase(resource, r):
                        found.append((i, a, r))
    return found


def missing(statements: list[dict[str, Any]], needs: Iterable[tuple[str, str, str | None]]) -> list[tuple]:
    return sorted(n for n in needs if not allowing(statements, n))


def unused(function: str, statements: list[dict[str, Any]], needs: Iterable[tuple[str, str, str | None]]) -> list[tuple[str, str, str]]:
    used = {g for n in needs for g in allowing(statements, n)}
    out = []
    for i, s in enumerate(statements):
        for a in s["actions"]:
            for r in s["resources"]:
                if (i, a, r) not in used and (function, a) not in UNUSED_WITH_REASON:
                    out.append((s["sid"], a, r))
    return out


def without(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    """The policy with one action removed from every statement."""
    return [{**s, "actions": [a for a in s["actions"] if a != action]} for s in statements]


class IamTest(unittest.TestCase):
    calls_dir = os.environ.get("CHAT_IAM_LOG") or os.path.join(ROOT, ".local", "iam-calls")

    @classmethod
    def setUpClass(cls):
        cls.policies = policies(load_template(os.path.join(ROOT, "template.yaml")))
        cls.needs = load_needs(cls.calls_dir)
        if not cls.needs:
            message = f"no recorded calls in {cls.calls_dir}: run the Rust tests with CHAT_IAM_LOG set first"
            if os.environ.get("CHAT_IAM_LOG"):
                raise AssertionError(message)  # infra/test.sh recorded them: none is a failure
            raise unittest.SkipTest(message)

    def test_every_function_was_recorded(self):
        self.assertEqual(sorted(self.needs), sorted(self.policies),
                         "every deployed function's calls are recorded by the tests, and only theirs")

    def test_every_call_is_allowed_by_its_functions_policy(self):
        report = {f: missing(self.policies[f], n) for f, n in self.needs.items() if f in self.policies}
        self.assertEqual({f: m for f, m in report.items() if m}, {}, "actions the deployed functions would be denied")

    def test_every_grant_is_used_or_has_a_reason(self):
        report = {f: unused(f, s, self.needs.get(f, ())) for f, s in self.policies.items()}
        self.assertEqual({f: u for f, u in report.items() if u}, {}, "grants no test uses (remove them, or list why)")

    def test_removing_any_needed_grant_fails_the_check(self):
        """Shown for every function and every action it needs: without it, `missing` reports it."""
        for function, needs in self.needs.items():
            for action in sorted({a for a, _, _ in needs}):
                with self.subTest(function=function, action=action):
                    self.assertTrue(missing(without(self.policies[function], action), needs),
                                    f"{function} without {action} would still pass")


class ResolverTest(unittest.TestCase):
    """The check's own rules on small inputs (no recorded calls needed)."""

    def test_leading_keys_condition(self):
        s = [{"actions": ["dynamodb:BatchWriteItem"], "resources": ["table/T"], "sid": "",
              "condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["I#*"]}}}]
        self.assertEqual(missing(s, [("dynamodb:BatchWriteItem", "table/T", "I#")]), [])
        self.assertTrue(missing(s, [("dynamodb:BatchWriteItem", "table/T", "C#")]))

    def test_resources_of_the_template(self):
        template = load_template(os.path.join(ROOT, "template.yaml"))
        r = Resolver(template)
        self.assertEqual(r.resource({"Fn::GetAtt": ["ChatTable", "StreamArn"]}), ["table/ChatTable/stream/*"])
        self.assertEqual(r.resource({"Fn::Sub": "${ChatTable.Arn}/index/*"}), ["table/ChatTable/index/*"])
        self.assertEqual(
            r.resource({"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${WebSocketApi}/${WebSocketStage}/POST/@connections/*"}),
            ["POST/@connections/*"])
        self.assertEqual(
            r.resource({"Fn::Sub": "arn:${AWS::Partition}:sns:${AWS::Region}:${AWS::AccountId}:endpoint/*"}),
            ["endpoint/*"])

    def test_sam_policy_templates_resolve_to_their_actions(self):
        template = {"Resources": {
            "T": {"Type": "AWS::DynamoDB::Table"},
            "F": {"Type": "AWS::Serverless::Function", "Metadata": {"BuildProperties": {"Binary": "f"}},
                  "Properties": {"Policies": [{"DynamoDBReadPolicy": {"TableName": {"Ref": "T"}}}]}}}}
        (s, *_) = policies(template)["f"]
        self.assertIn("dynamodb:Query", s["actions"])
        self.assertNotIn("dynamodb:PutItem", s["actions"])
        self.assertEqual(missing(policies(template)["f"], [("dynamodb:Query", "table/T", None)]), [])


if __name__ == "__main__":
    unittest.main()
