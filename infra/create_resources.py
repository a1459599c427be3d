#!/usr/bin/env python3
"""Create the DynamoDB tables and Kinesis streams of a SAM/CloudFormation template locally.

    python infra/create_resources.py --endpoint http://127.0.0.1:4566 --template template.yaml

Every `AWS::DynamoDB::Table`, `AWS::Kinesis::Stream` and `AWS::SQS::Queue` resource is created
under its logical id (e.g. `ChatTable`, `RelayFailureQueue`), so local code can use the logical ids
as physical names; every `AWS::S3::Bucket` under its logical id in lower case (S3's names are),
e.g. `archivebucket`, on the Kinesis endpoint (moto serves S3 there too). Other resources are ignored. Existing ones are left alone (idempotent). Only
documented DynamoDB, Kinesis and SQS API calls are used, so this works against any DynamoDB-API
endpoint (moto, DynamoDB Local, ...); streams and queues go to the Kinesis endpoint.

`load_template` is the CloudFormation-aware YAML loader the other infra scripts and checks share:
it writes out the template's `Fn::ForEach` loops as the `AWS::LanguageExtensions` transform does
(`expand_language_extensions`), so every reader sees the resources the stack has.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Callable

import boto3
import yaml
from botocore.exceptions import ClientError

TABLE_TYPE = "AWS::DynamoDB::Table"
STREAM_TYPE = "AWS::Kinesis::Stream"
QUEUE_TYPE = "AWS::SQS::Queue"
BUCKET_TYPE = "AWS::S3::Bucket"
# The properties used locally; only these are resolved, so intrinsic functions elsewhere (tags,
# KMS keys, ...) need no local value.
USED_PROPERTIES = {
    TABLE_TYPE: ("AttributeDefinitions", "KeySchema", "BillingMode", "ProvisionedThroughput",
                 "GlobalSecondaryIndexes", "LocalSecondaryIndexes", "StreamSpecification",
                 "TimeToLiveSpecification", "PointInTimeRecoverySpecification"),
    STREAM_TYPE: ("StreamModeDetails", "ShardCount", "RetentionPeriodHours"),
    QUEUE_TYPE: ("MessageRetentionPeriod",),
}


# --- template reading -------------------------------------------------------------------------

class _CfnLoader(yaml.SafeLoader):
    """SafeLoader that accepts every tag: `!Ref X` -> {"Ref": X}, `!Sub s` -> {"Fn::Sub": s}, ..."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):  # short form `!GetAtt A.B`
        value = value.split(".", 1)
    if suffix == "Condition":
        return {"Condition": value}
    return {"Fn::" + suffix: value}


_CfnLoader.add_multi_constructor("!", _construct_tag)


def load_template(path: str, expand: bool = True) -> dict[str, Any]:
    """The template as a dict (short-form tags as their long form); with `expand`, after the
    AWS::LanguageExtensions transform (its Fn::ForEach loops written out)."""
    with open(path, encoding="utf-8") as f:
        template = yaml.load(f, Loader=_CfnLoader) or {}  # noqa: S506 - SafeLoader subclass
    return expand_language_extensions(template) if expand else template


# --- AWS::LanguageExtensions: Fn::ForEach ------------------------------------------------------

LANGUAGE_EXTENSIONS = "AWS::LanguageExtensions"
FOREACH = "Fn::ForEach::"
# The sections a loop may stand in (at any depth, e.g. inside a resource's properties).
FOREACH_SECTIONS = ("Conditions", "Resources", "Outputs")


def transforms(template: dict[str, Any]) -> list[str]:
    value = template.get("Transform") or []
    return [value] if isinstance(value, str) else list(value)


def _has_foreach(value: Any) -> bool:
    if isinstance(value, dict):
        return any(str(k).startswith(FOREACH) or _has_foreach(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_foreach(v) for v in value)


def expand_language_extensions(template: dict[str, Any]) -> dict[str, Any]:
    """The template after the AWS::LanguageExtensions transform, as far as Fn::ForEach goes:

        Fn::ForEach::<LoopName>: [Identifier, [Item, ...], {OutputKey: OutputValue, ...}]

    stands for one copy of the fragment per item, merged into the mapping that holds the loop,
    each copy with `${Identifier}` replaced by the item and `&{Identifier}` by the item without
    its non-alphanumeric characters (in keys and strings, Fn::Sub strings included), and
    `{"Ref": Identifier}` by the item itself. Every OutputKey names the identifier; keys must not
    collide. The collection is a list, a Ref to a CommaDelimitedList parameter (its Default) or
    an Fn::FindInMap. Loops may nest. A Ref or Fn::GetAtt whose logical id is an Fn::Sub with
    nothing left to substitute (`Ref: !Sub "${Fn}Function"`) gets the plain logical id, as the
    transform resolves it. Any other language extension is left as it is. The transform is
    removed from `Transform`, which keeps the ones after it (AWS::Serverless-2016-10-31)."""
    if LANGUAGE_EXTENSIONS not in transforms(template):
        if any(_has_foreach(template.get(s)) for s in FOREACH_SECTIONS):
            raise ValueError(f"Fn::ForEach needs the {LANGUAGE_EXTENSIONS} transform in Transform")
        return template
    out = dict(template)
    for section in FOREACH_SECTIONS:
        if section in out:
            out[section] = _expand(out[section], template)
    rest = [t for t in transforms(template) if t != LANGUAGE_EXTENSIONS]
    if rest:
        out["Transform"] = rest[0] if len(rest) == 1 else rest
    else:
        out.pop("Transform", None)
    return out


def _expand(value: Any, template: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [_expand(v, template) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (fn, arg), = value.items()
        if fn in ("Ref", "Fn::GetAtt"):
            return {fn: _plain_logical_id(fn, _expand(arg, template))}
    out: dict[str, Any] = {}

    def put(key: str, item: Any, loop: str) -> None:
        if key in out:
            raise ValueError(f"{loop}: {key!r} is defined twice")
        out[key] = item

    for key, item in value.items():
        if not str(key).startswith(FOREACH):
            put(key, _expand(item, template), key)
            continue
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and isinstance(item[2], dict)):
            raise ValueError(f"{key}: expected [Identifier, Collection, {{OutputKey: OutputValue}}]")
        identifier, collection, fragment = item
        placeholders = ("${" + identifier + "}", "&{" + identifier + "}")
        for output_key in fragment:
            if not str(output_key).startswith(FOREACH) and not any(p in str(output_key) for p in placeholders):
                raise ValueError(f"{key}: OutputKey {output_key!r} must contain ${{{identifier}}} or &{{{identifier}}}")
        for element in _collection(key, collection, template):
            copy = _expand(_substitute(fragment, identifier, element), template)
            for output_key, output_value in copy.items():
                put(output_key, output_value, key)
    return out


def _plain_logical_id(fn: str, arg: Any) -> Any:
    """`Fn::Sub` of a string with no `${...}` left, where a Ref or GetAtt names a logical id."""

    def plain(v: Any) -> Any:
        if isinstance(v, dict) and list(v) == ["Fn::Sub"] and isinstance(v["Fn::Sub"], str) \
                and "${" not in v["Fn::Sub"]:
            return v["Fn::Sub"]
        return v

    if fn == "Fn::GetAtt" and isinstance(arg, list):
        return [plain(arg[0]), *arg[1:]]
    return plain(arg)


def _collection(loop: str, collection: Any, template: dict[str, Any]) -> list[str]:
    if isinstance(collection, dict) and list(collection) == ["Ref"]:
        spec = (template.get("Parameters") or {}).get(collection["Ref"]) or {}
        if spec.get("Type") != "CommaDelimitedList" or "Default" not in spec:
            raise ValueError(f"{loop}: the collection must Ref a CommaDelimitedList parameter with a Default")
        collection = [v.strip() for v in str(spec["Default"]).split(",")]
    elif isinstance(collection, dict) and list(collection) == ["Fn::FindInMap"]:
        name, top, second = collection["Fn::FindInMap"][:3]
        collection = template["Mappings"][name][top][second]
    if not isinstance(collection, list) or not all(isinstance(v, (str, int, float)) for v in collection):
        raise ValueError(f"{loop}: the collection must be a list of strings, not {collection!r}")
    return [str(v) for v in collection]


def _substitute(value: Any, identifier: str, element: str) -> Any:
    if isinstance(value, str):
        stripped = re.sub(r"[^A-Za-z0-9]", "", element)
        return value.replace("${" + identifier + "}", element).replace("&{" + identifier + "}", stripped)
    if isinstance(value, list):
        return [_substitute(v, identifier, element) for v in value]
    if isinstance(value, dict):
        if value == {"Ref": identifier}:
            return element
        return {_substitute(k, identifier, element): _substitute(v, identifier, element)
                for k, v in value.items()}
    return value


class _NoValue:
    """Marker for AWS::NoValue: the property is dropped."""


class Resolver:
    """Evaluates the few intrinsic functions that make sense for local table/stream properties
    (Ref to parameters and pseudo parameters, Sub, Join, Select, FindInMap, If and the condition
    functions).
    Parameters take their Default unless given in `parameters`."""

    def __init__(self, template: dict[str, Any], region: str, parameters: dict[str, str] | None = None):
        self.template = template
        self.refs: dict[str, Any] = {
            "AWS::Region": region,
            "AWS::AccountId": "123456789012",
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": "local",
            "AWS::NoValue": _NoValue,
        }
        for name, spec in (template.get("Parameters") or {}).items():
            if "Default" in (spec or {}):
                self.refs[name] = spec["Default"]
        self.refs.update(parameters or {})

    def ref(self, name: str) -> Any:
        if name not in self.refs:
            raise ValueError(f"cannot resolve Ref {name!r} locally (parameter without Default?)")
        return self.refs[name]

    def condition(self, name: str) -> bool:
        return bool(self.resolve((self.template.get("Conditions") or {})[name]))

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [v for v in (self.resolve(v) for v in value) if v is not _NoValue]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (fn, arg), = value.items()
            handler: Callable[[Any], Any] | None = getattr(self, "_" + fn.replace("::", "_"), None)
            if handler is not None:
                return handler(arg)
            if fn.startswith("Fn::"):
                raise ValueError(f"intrinsic function {fn} is not supported locally")
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NoValue}

    def _Ref(self, arg: Any) -> Any:
        return self.ref(arg)

    def _Condition(self, arg: Any) -> bool:
        return self.condition(arg)

    def _Fn_Sub(self, arg: Any) -> str:
        text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))

        def var(m: re.Match[str]) -> str:
            name = m.group(1)
            if name.startswith("!"):  # ${!Literal}
                return "${" + name[1:] + "}"
            return str(extra[name] if name in extra else self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", var, text)

    def _Fn_Join(self, arg: Any) -> str:
        sep, parts = arg
        return str(sep).join(str(p) for p in self.resolve(parts))

    def _Fn_FindInMap(self, arg: Any) -> Any:
        name, top, second = self.resolve(arg)[:3]
        return (self.template.get("Mappings") or {})[name][top][second]

    def _Fn_Select(self, arg: Any) -> Any:
        index, items = self.resolve(arg)
        return items[int(index)]

    def _Fn_If(self, arg: Any) -> Any:
        name, then, otherwise = arg
        return self.resolve(then if self.condition(name) else otherwise)

    def _Fn_Equals(self, arg: Any) -> bool:
        a, b = self.resolve(arg)
        return str(a) == str(b)

    def _Fn_Not(self, arg: Any) -> bool:
        return not self.resolve(arg)[0]

    def _Fn_And(self, arg: Any) -> bool:
        return all(self.resolve(arg))

    def _Fn_Or(self, arg: Any) -> bool:
        return any(self.resolve(arg))


# --- resource creation ------------------------------------------------------------------------

def _client(service: str, endpoint: str, region: str) -> Any:
    # Dummy credentials unless real ones are in the environment: this also keeps botocore's
    # credential chain from probing config files or an instance metadata service.
    creds = {}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    return boto3.client(service, endpoint_url=endpoint, region_name=region, **creds)


def _error_code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def _table_request(name: str, props: dict[str, Any]) -> dict[str, Any]:
    """CreateTable parameters from the CloudFormation properties (CFN-only keys dropped)."""
    index_keys = ("IndexName", "KeySchema", "Projection", "ProvisionedThroughput", "OnDemandThroughput")
    req: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PROVISIONED"),
    }
    if req["BillingMode"] == "PROVISIONED":
        req["ProvisionedThroughput"] = props.get(
            "ProvisionedThroughput", {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5})
    for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
        if props.get(kind):
            req[kind] = [{k: v for k, v in ix.items() if k in index_keys} for ix in props[kind]]
    view_type = (props.get("StreamSpecification") or {}).get("StreamViewType")
    if view_type:
        req["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": view_type}
    return req


# How long the create calls wait for a new table or stream to be usable.
_WAIT = {"Delay": 1, "MaxAttempts": 120}


def _exists(describe: Callable[[], Any],
            missing: Callable[[str], bool] = lambda code: code == "ResourceNotFoundException") -> bool:
    """Whether `describe()` finds the resource; an error other than `missing` is raised."""
    try:
        describe()
        return True
    except ClientError as e:
        if not missing(_error_code(e)):
            raise
        return False


def create_table(ddb: Any, name: str, props: dict[str, Any], log: Callable[[str], None]) -> bool:
    """Creates the table unless it exists; returns True when it was created."""
    if _exists(lambda: ddb.describe_table(TableName=name)):
        return False
    try:
        ddb.create_table(**_table_request(name, props))
    except ClientError as e:
        if _error_code(e) == "ResourceInUseException":  # created concurrently
            return False
        raise
    ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig=_WAIT)

    ttl = props.get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled"):
        ddb.update_time_to_live(TableName=name, TimeToLiveSpecification={
            "AttributeName": ttl["AttributeName"], "Enabled": True})
    pitr = props.get("PointInTimeRecoverySpecification") or {}
    if pitr.get("PointInTimeRecoveryEnabled"):
        try:
            ddb.update_continuous_backups(TableName=name, PointInTimeRecoverySpecification={
                "PointInTimeRecoveryEnabled": True})
        except ClientError as e:  # optional locally; some emulators lack it
            log(f"note: point-in-time recovery not enabled on {name}: {_error_code(e)}")
    log(f"created table {name}")
    return True


def create_stream(kinesis: Any, name: str, props: dict[str, Any], log: Callable[[str], None]) -> bool:
    """Creates the Kinesis stream unless it exists; returns True when it was created."""
    if _exists(lambda: kinesis.describe_stream_summary(StreamName=name)):
        return False
    mode = (props.get("StreamModeDetails") or {}).get("StreamMode", "PROVISIONED")
    try:
        if "ShardCount" in props or mode != "ON_DEMAND":
            kinesis.create_stream(StreamName=name, ShardCount=int(props.get("ShardCount", 1)))
        else:
            try:
                kinesis.create_stream(StreamName=name, StreamModeDetails={"StreamMode": "ON_DEMAND"})
            except ClientError as e:
                if _error_code(e) == "ResourceInUseException":
                    raise
                log(f"note: ON_DEMAND not accepted for {name} ({_error_code(e)}), using 4 shards")
                kinesis.create_stream(StreamName=name, ShardCount=4)
    except ClientError as e:
        if _error_code(e) == "ResourceInUseException":
            return False
        raise
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig=_WAIT)

    hours = int(props.get("RetentionPeriodHours", 24))
    if hours > 24:
        kinesis.increase_stream_retention_period(StreamName=name, RetentionPeriodHours=hours)
        kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig=_WAIT)
    shards = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["OpenShardCount"]
    log(f"created stream {name} ({mode}, {shards} shards)")
    return True


def create_queue(sqs: Any, name: str, props: dict[str, Any], log: Callable[[str], None]) -> bool:
    if _exists(lambda: sqs.get_queue_url(QueueName=name),
               lambda code: "NonExistentQueue" in code or code == "QueueDoesNotExist"):
        return False
    # A redrive policy names another queue's ARN (an intrinsic function here): locally a job that
    # keeps failing is just logged by the poller.
    attributes = {k: str(v) for k, v in props.items() if k != "RedrivePolicy"}
    sqs.create_queue(QueueName=name, Attributes=attributes)
    log(f"created queue {name}")
    return True


def bucket_name(logical_id: str) -> str:
    """The local name of a template bucket: its logical id in lower case."""
    return logical_id.lower()


def create_bucket(s3: Any, name: str, log: Callable[[str], None]) -> bool:
    if _exists(lambda: s3.head_bucket(Bucket=name), lambda code: code in ("404", "NoSuchBucket", "NotFound")):
        return False
    s3.create_bucket(Bucket=name)
    log(f"created bucket {name}")
    return True


def create_resources(
    endpoint: str,
    template_path: str,
    region: str = "us-east-1",
    kinesis_endpoint: str | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Creates the template's tables and streams; returns the logical ids it created.
    `kinesis_endpoint` defaults to `endpoint`; an empty string skips the Kinesis streams."""
    template = load_template(template_path)
    resolver = Resolver(template, region)
    ddb = _client("dynamodb", endpoint, region)
    kinesis_endpoint = endpoint if kinesis_endpoint is None else kinesis_endpoint
    kinesis = _client("kinesis", kinesis_endpoint, region) if kinesis_endpoint else None
    sqs = _client("sqs", kinesis_endpoint, region) if kinesis_endpoint else None
    s3 = _client("s3", kinesis_endpoint, region) if kinesis_endpoint else None
    created = []
    for name, res in (template.get("Resources") or {}).items():
        kind = (res or {}).get("Type")
        if kind == BUCKET_TYPE and s3 is not None:
            if create_bucket(s3, bucket_name(name), log):
                created.append(name)
            continue
        if kind not in (TABLE_TYPE, STREAM_TYPE, QUEUE_TYPE):
            continue
        if res.get("Condition") and not resolver.condition(res["Condition"]):
            continue
        raw = res.get("Properties") or {}
        props = resolver.resolve({k: raw[k] for k in USED_PROPERTIES[kind] if k in raw})
        if kind == TABLE_TYPE:
            done = create_table(ddb, name, props, log)
        elif kind == STREAM_TYPE and kinesis is not None:
            done = create_stream(kinesis, name, props, log)
        elif kind == QUEUE_TYPE and sqs is not None:
            done = create_queue(sqs, name, props, log)
        else:
            continue
        if done:
            created.append(name)
    return created


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="DynamoDB (and Kinesis) endpoint URL")
    parser.add_argument("--template", required=True, help="SAM/CloudFormation template (YAML)")
    parser.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    parser.add_argument("--kinesis-endpoint", default=None,
                        help="Kinesis endpoint URL if not --endpoint; '' skips the streams")
    args = parser.parse_args(argv)
    created = create_resources(args.endpoint, args.template, args.region, args.kinesis_endpoint)
    if not created:
        print("all tables, streams and queues already exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
