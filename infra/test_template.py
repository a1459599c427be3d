"""Checks that template.yaml and the Cargo workspace describe the same system.

    .venv/bin/python -m unittest infra/test_template.py      (from the repository root)

(a) The HTTP API routes of template.yaml, (METHOD, path) -> function binary, are exactly the
    `[workspace.metadata.lambda.watch.router]` table of Cargo.toml (the local router), except the
    deployed catch-all routes (404 in the API's error shape), which the local router does not have.
(b) Every function is built from the workspace root by Cargo Lambda and its
    BuildProperties.Binary is a `[[bin]]` of a crate under functions/ (and every such binary is
    deployed).
(c) `cfn-lint template.yaml` passes with its informational checks on (skipped only when cfn-lint
    is not installed), and `sam validate --lint` passes.
(d) Data safety: every stateful resource is kept on delete and on replacement, tables have
    deletion protection, the chat table point-in-time recovery, the Kinesis stream and the queues
    encryption at rest.
(e) The APIs: CORS exposes Retry-After; the catch-all answers every method but OPTIONS (left
    to API Gateway's CORS preflight); WebSocket $default runs no function; access logs (JSON) and
    stage throttling on both APIs, the WebSocket stage name a parameter.
(f) Observability, on the template as SAM expands it (Globals merged, the APIs' stages made):
    every function logs JSON to its own log group with retention and emits EMF metrics; every
    alarm notifies the alarm topic; every function, failure queue, table and index, stream and API has its alarms.
(g) A lean template: at most MAX_TEMPLATE_LINES lines, what repeats per function, consumer or table
    written once as Fn::ForEach loops (AWS::LanguageExtensions, listed before the SAM transform).
    The loops give the resources SAM CLI's own expansion gives, and after both transforms every
    function has its log group and its Errors and Throttles alarms, named after its binary.

Every check reads the template as the AWS::LanguageExtensions transform leaves it
(create_resources.load_template writes out the Fn::ForEach loops).

Needs the standard library and PyYAML; (c) and (e) use cfn-lint, aws-sam-cli and its
aws-sam-translator (infra/requirements.txt).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tomllib
import unittest
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import create_resources  # noqa: E402  (the same CloudFormation-aware YAML loader)

INFRA = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(INFRA)
TEMPLATE = os.path.join(REPO, "template.yaml")
CARGO_TOML = os.path.join(REPO, "Cargo.toml")

FUNCTION = "AWS::Serverless::Function"
HTTP_API = "AWS::Serverless::HttpApi"
# (g): the template was 1,860 lines before its per-function copies became loops (issue 17).
MAX_TEMPLATE_LINES = 1400

# The deployed HTTP API's catch-all: these paths, one route per method, to the function whose
# handler answers 404 not_found for anything it does not route. OPTIONS is left out on purpose
# (browsers' CORS preflight requests must reach API Gateway's own CORS answer, not the JWT
# authorizer), and so is ANY, which would include it.
CATCH_ALL_PATHS = ("/{proxy+}", "/")
CATCH_ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
CATCH_ALL_BINARY = "conversations"

# Resource types that hold data. cfn-lint's rule I3011 reads its own list (which also has log
# groups); this is the part of it this template can use, so the test does not depend on
# cfn-lint's internals.
STATEFUL_TYPES = {
    "AWS::DynamoDB::Table", "AWS::DynamoDB::GlobalTable", "AWS::Kinesis::Stream", "AWS::SQS::Queue",
    "AWS::Logs::LogGroup", "AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Cognito::UserPool",
    "AWS::SecretsManager::Secret",
}


def load_template() -> dict[str, Any]:
    return create_resources.load_template(TEMPLATE)


def resources_of(template: dict[str, Any], *types: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v.get("Type") in types}


_EXPANDED: dict[str, Any] | None = None


def expanded_template() -> dict[str, Any]:
    """template.yaml as SAM turns it into CloudFormation (offline: local code is stood in for by an
    S3 location, as `sam validate` does), parameters unresolved."""
    global _EXPANDED
    if _EXPANDED is None:
        try:
            from samtranslator.translator.transform import transform
        except ImportError as e:  # pragma: no cover - the venv always has it (aws-sam-cli)
            raise unittest.SkipTest(f"aws-sam-translator is not installed: {e}") from e

        class NoManagedPolicies:
            def load(self) -> dict[str, str]:
                return {}

        template = load_template()
        for fn in functions(template).values():
            fn["Properties"]["CodeUri"] = "s3://bucket/key"
        # The translator fills in pseudo parameters (AWS::Region) from the environment.
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        _EXPANDED = transform(template, {}, NoManagedPolicies())
    return _EXPANDED


def ref_name(value: Any) -> str | None:
    """The logical id a `{"Ref": X}` or `{"Fn::GetAtt": [X, ...]}` points to."""
    if isinstance(value, dict) and len(value) == 1:
        (fn, arg), = value.items()
        if fn == "Ref" and isinstance(arg, str):
            return arg
        if fn == "Fn::GetAtt":
            return (arg.split(".")[0] if isinstance(arg, str) else arg[0])
    return None


def alarm_metrics(alarm: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(namespace, metric name, {dimension: value}) of every metric an alarm watches."""
    props = alarm["Properties"]
    if "MetricName" in props:
        found = [(props.get("Namespace"), props["MetricName"], props.get("Dimensions") or [])]
    else:
        found = [(m["MetricStat"]["Metric"].get("Namespace"), m["MetricStat"]["Metric"]["MetricName"],
                  m["MetricStat"]["Metric"].get("Dimensions") or [])
                 for m in props.get("Metrics") or [] if "MetricStat" in m]
    return [(ns, name, {d["Name"]: d["Value"] for d in dims}) for ns, name, dims in found]


def load_toml(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v.get("Type") == FUNCTION}


def binary_of(resource: dict[str, Any]) -> str | None:
    return ((resource.get("Metadata") or {}).get("BuildProperties") or {}).get("Binary")


def template_routes(template: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> binary of every HttpApi event; a route defined twice fails."""
    routes: dict[tuple[str, str], str] = {}
    for name, fn in functions(template).items():
        for event_name, event in ((fn.get("Properties") or {}).get("Events") or {}).items():
            if event.get("Type") != "HttpApi":
                continue
            props = event.get("Properties") or {}
            key = (str(props.get("Method", "ANY")).upper(), props.get("Path", "/"))
            if key in routes:
                raise AssertionError(f"{name}.{event_name}: route {key} is defined twice")
            routes[key] = binary_of(fn) or f"<{name} has no BuildProperties.Binary>"
    return routes


def router_routes(cargo: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> function of the cargo-lambda watch router. An entry is a function name
    (any method), one `{ method, function }` table or a list of them."""
    router = cargo["workspace"]["metadata"]["lambda"]["watch"]["router"]
    routes: dict[tuple[str, str], str] = {}
    for path, entry in router.items():
        targets = entry if isinstance(entry, list) else [entry]
        for target in targets:
            if isinstance(target, str):
                method, function = "ANY", target
            else:
                method, function = str(target.get("method", "ANY")).upper(), target["function"]
            if (method, path) in routes:
                raise AssertionError(f"Cargo.toml router: {(method, path)} is defined twice")
            routes[(method, path)] = function
    return routes


def function_crate_binaries() -> dict[str, str]:
    """Binary name -> Cargo.toml of the crates under functions/ (explicit `[[bin]]`, else
    cargo's automatic targets src/main.rs and src/bin/*.rs)."""
    bins: dict[str, str] = {}
    for manifest in sorted(glob.glob(os.path.join(REPO, "functions", "*", "Cargo.toml"))):
        crate = load_toml(manifest)
        crate_dir = os.path.dirname(manifest)
        names = [b["name"] for b in crate.get("bin", []) if "name" in b]
        package = crate.get("package", {})
        if package.get("autobins", True):
            if os.path.isfile(os.path.join(crate_dir, "src", "main.rs")):
                names.append(package.get("name", os.path.basename(crate_dir)))
            names += [os.path.splitext(os.path.basename(p))[0]
                      for p in glob.glob(os.path.join(crate_dir, "src", "bin", "*.rs"))]
        for name in dict.fromkeys(names):
            if name in bins and bins[name] != manifest:
                raise AssertionError(f"binary {name!r} is declared by {bins[name]} and {manifest}")
            bins[name] = os.path.relpath(manifest, REPO)
    return bins


class TemplateTest(unittest.TestCase):
    template: dict[str, Any]
    cargo: dict[str, Any]

    @classmethod
    def setUpClass(cls) -> None:
        cls.template = load_template()
        cls.cargo = load_toml(CARGO_TOML)

    def test_local_stack_default_ports_are_distinct(self) -> None:
        # `bash infra/run-local.sh` with no settings must start: two of its servers on one default
        # port fail the whole stack (the S3 gate once shared the push sink's 9004).
        import re

        with open(os.path.join(INFRA, "run-local.sh"), encoding="utf-8") as f:
            script = f.read()
        defaults = re.findall(r"\$\{(CHAT_[A-Z0-9_]*PORT):-(\d+)\}", script)
        self.assertGreaterEqual(len(defaults), 10, defaults)
        by_port: dict[str, set[str]] = {}
        for name, port in defaults:
            by_port.setdefault(port, set()).add(name)
        shared = {port: names for port, names in by_port.items() if len(names) > 1}
        self.assertEqual(shared, {}, "run-local.sh: default ports used twice")

    # (a) ------------------------------------------------------------------------------------

    def test_http_routes_match_cargo_lambda_router(self) -> None:
        deployed = {k: v for k, v in template_routes(self.template).items() if k[1] not in CATCH_ALL_PATHS}
        local = router_routes(self.cargo)
        self.assertTrue(deployed, "template.yaml has no HttpApi events")
        only_deployed = {k: v for k, v in deployed.items() if local.get(k) != v}
        only_local = {k: v for k, v in local.items() if deployed.get(k) != v}
        self.assertEqual(
            deployed, local,
            "template.yaml HttpApi events and Cargo.toml [workspace.metadata.lambda.watch.router] "
            f"differ.\n  in template.yaml only (or another binary): {sorted(only_deployed.items())}"
            f"\n  in Cargo.toml only (or another function): {sorted(only_local.items())}")

    def test_http_routes_are_on_the_one_jwt_protected_api(self) -> None:
        apis = [k for k, v in self.template["Resources"].items() if v.get("Type") == HTTP_API]
        self.assertEqual(len(apis), 1, f"expected one {HTTP_API}, found {apis}")
        api = self.template["Resources"][apis[0]]["Properties"]
        auth = api.get("Auth") or {}
        default = auth.get("DefaultAuthorizer")
        self.assertIn(default, auth.get("Authorizers") or {}, "the HTTP API needs a DefaultAuthorizer")
        self.assertIn("JwtConfiguration", auth["Authorizers"][default])
        for name, fn in functions(self.template).items():
            for event_name, event in ((fn["Properties"].get("Events")) or {}).items():
                if event.get("Type") != "HttpApi":
                    continue
                props = event.get("Properties") or {}
                self.assertEqual(props.get("ApiId"), {"Ref": apis[0]},
                                 f"{name}.{event_name} must be on {apis[0]}")
                authorizer = (props.get("Auth") or {}).get("Authorizer", default)
                self.assertEqual(authorizer, default,
                                 f"{name}.{event_name} opts out of the JWT authorizer")

    def test_no_function_runs_in_local_auth_mode(self) -> None:
        globals_env = (((self.template.get("Globals") or {}).get("Function") or {})
                       .get("Environment") or {}).get("Variables") or {}
        self.assertNotIn("CHAT_AUTH_MODE", globals_env)
        for name, fn in functions(self.template).items():
            env = ((fn["Properties"].get("Environment") or {}).get("Variables")) or {}
            self.assertNotIn("CHAT_AUTH_MODE", env,
                             f"{name}: deployed functions trust only the API Gateway authorizer")

    # (b) ------------------------------------------------------------------------------------

    def test_function_binaries_are_workspace_binaries(self) -> None:
        crate_bins = function_crate_binaries()
        self.assertTrue(crate_bins, "no crates found under functions/")
        global_code_uri = ((self.template.get("Globals") or {}).get("Function") or {}).get("CodeUri")
        deployed: dict[str, str] = {}
        for name, fn in functions(self.template).items():
            metadata = fn.get("Metadata") or {}
            self.assertEqual(metadata.get("BuildMethod"), "rust-cargolambda", name)
            binary = binary_of(fn)
            self.assertIsInstance(binary, str, f"{name}: Metadata.BuildProperties.Binary is missing")
            self.assertIn(binary, crate_bins,
                          f"{name}: Binary {binary!r} is no [[bin]] of a crate under functions/ "
                          f"(known: {sorted(crate_bins)})")
            self.assertNotIn(binary, deployed, f"{name} and {deployed.get(binary)} deploy one binary")
            deployed[binary] = name
            # Cargo Lambda builds in CodeUri: it must hold the workspace Cargo.toml.
            code_uri = fn["Properties"].get("CodeUri", global_code_uri)
            self.assertIsInstance(code_uri, str, f"{name}: CodeUri must be a local path")
            self.assertEqual(os.path.realpath(os.path.join(REPO, code_uri)), os.path.realpath(REPO),
                             f"{name}: CodeUri must be the workspace root")
        self.assertEqual(sorted(deployed), sorted(crate_bins),
                         "every binary under functions/ should be deployed by exactly one function")

    # (c) ------------------------------------------------------------------------------------

    def test_cfn_lint_passes(self) -> None:
        exe_name = "cfn-lint.exe" if os.name == "nt" else "cfn-lint"
        beside_python = os.path.join(os.path.dirname(sys.executable), exe_name)
        cfn_lint = beside_python if os.path.isfile(beside_python) else shutil.which("cfn-lint")
        if not cfn_lint:
            self.skipTest("cfn-lint is not installed (pip install -r infra/requirements.txt)")
        env = dict(os.environ)
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        # Informational checks too (e.g. I3011: a stateful resource without explicit
        # DeletionPolicy / UpdateReplacePolicy): any finding fails.
        result = subprocess.run([cfn_lint, "--include-checks", "I", "--", "template.yaml"], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual((result.returncode, result.stdout.strip()), (0, ""),
                         f"cfn-lint --include-checks I template.yaml reported (exit {result.returncode}):\n"
                         f"{result.stdout}{result.stderr}")


    def test_sam_validate_lint_passes(self) -> None:
        beside_python = os.path.join(os.path.dirname(sys.executable), "sam")
        sam = beside_python if os.path.isfile(beside_python) else shutil.which("sam")
        if not sam:
            self.skipTest("aws-sam-cli is not installed (pip install -r infra/requirements.txt)")
        # Offline: a region, dummy credentials and no telemetry are all it needs.
        env = dict(os.environ, SAM_CLI_TELEMETRY="0", AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local")
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        # --lint runs cfn-lint (which expands Fn::ForEach itself); without it SAM CLI translates the
        # template, which needs --language-extensions to expand the loops first.
        for args in (["--lint"], ["--language-extensions"]):
            result = subprocess.run([sam, "validate", *args, "--template", "template.yaml"], cwd=REPO, env=env,
                                    capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, f"sam validate {' '.join(args)} failed (exit "
                             f"{result.returncode}):\n{result.stdout}{result.stderr}")

    # (d) ------------------------------------------------------------------------------------

    def test_stateful_resources_are_retained(self) -> None:
        stateful = resources_of(self.template, *STATEFUL_TYPES)
        self.assertTrue(stateful)
        for name, res in stateful.items():
            self.assertEqual(res.get("DeletionPolicy"), "Retain", f"{name}: DeletionPolicy must be Retain")
            self.assertEqual(res.get("UpdateReplacePolicy"), "Retain",
                             f"{name}: UpdateReplacePolicy must be Retain")

    def test_tables_have_deletion_protection_and_the_chat_table_pitr(self) -> None:
        tables = resources_of(self.template, "AWS::DynamoDB::Table")
        self.assertIn("ChatTable", tables)
        for name, table in tables.items():
            self.assertIs(table["Properties"].get("DeletionProtectionEnabled"), True,
                          f"{name}: DeletionProtectionEnabled must be true")
        pitr = tables["ChatTable"]["Properties"].get("PointInTimeRecoverySpecification") or {}
        self.assertIs(pitr.get("PointInTimeRecoveryEnabled"), True, "ChatTable: PITR must stay on")

    def test_streams_and_queues_are_encrypted_at_rest(self) -> None:
        for name, stream in resources_of(self.template, "AWS::Kinesis::Stream").items():
            encryption = stream["Properties"].get("StreamEncryption") or {}
            self.assertEqual(encryption.get("EncryptionType"), "KMS", f"{name}: not encrypted at rest")
            self.assertTrue(encryption.get("KeyId"), f"{name}: StreamEncryption needs a KeyId")
        for name, queue in resources_of(self.template, "AWS::SQS::Queue").items():
            props = queue.get("Properties") or {}
            self.assertTrue(props.get("SqsManagedSseEnabled") is True or props.get("KmsMasterKeyId"),
                            f"{name}: not encrypted at rest")

    def test_buckets_are_encrypted_private_and_tls_only(self) -> None:
        buckets = resources_of(self.template, "AWS::S3::Bucket")
        self.assertTrue(buckets)
        policies = resources_of(self.template, "AWS::S3::BucketPolicy").values()
        for name, bucket in buckets.items():
            props = bucket["Properties"]
            self.assertTrue(props.get("BucketEncryption"), f"{name}: not encrypted at rest")
            block = props.get("PublicAccessBlockConfiguration") or {}
            self.assertEqual(sorted(k for k, v in block.items() if v is True),
                             ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"],
                             f"{name}: public access not fully blocked")
            denies = [st for p in policies if ref_name(p["Properties"]["Bucket"]) == name
                      for st in p["Properties"]["PolicyDocument"]["Statement"]
                      if st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}]
            self.assertTrue(denies, f"{name}: needs a policy denying requests without TLS")

    # (e) ------------------------------------------------------------------------------------

    def http_api(self) -> dict[str, Any]:
        (api,) = resources_of(self.template, HTTP_API).values()
        return api["Properties"]

    def test_cors_exposes_retry_after(self) -> None:
        cors = self.http_api().get("CorsConfiguration") or {}
        self.assertIn("retry-after", [h.lower() for h in cors.get("ExposeHeaders") or []],
                      "a 429's Retry-After is unreadable for browser scripts unless CORS exposes it")
        self.assertLessEqual({"authorization", "content-type"},
                             {h.lower() for h in cors.get("AllowHeaders") or []})

    def test_catch_all_routes_answer_every_method_but_options(self) -> None:
        routes = template_routes(self.template)
        for path in CATCH_ALL_PATHS:
            for method in CATCH_ALL_METHODS:
                self.assertEqual(routes.get((method, path)), CATCH_ALL_BINARY,
                                 f"catch-all route {method} {path} -> {CATCH_ALL_BINARY} is missing")
        for (method, path), binary in routes.items():
            self.assertNotIn(method, ("ANY", "OPTIONS"),
                             f"{method} {path} -> {binary}: would take CORS preflight requests to the authorizer")
            self.assertFalse(path.startswith("$"), f"{method} {path}: $default also takes OPTIONS")

    def test_websocket_default_route_runs_no_function(self) -> None:
        resources = self.template["Resources"]
        resolver = create_resources.Resolver(self.template, "us-east-1")
        routes = {resolver.resolve(r["Properties"]["RouteKey"]): r["Properties"]
                  for r in resources_of(self.template, "AWS::ApiGatewayV2::Route").values()}
        self.assertEqual(set(routes), {"$connect", "$disconnect", "$default", "typing", "hello"})
        self.assertIn("$default", routes)
        target = routes["$default"].get("Target") or {}
        integration = (target.get("Fn::Sub", "") if isinstance(target, dict) else target)
        name = integration.removeprefix("integrations/${").removesuffix("}")
        self.assertEqual(resources[name]["Properties"].get("IntegrationType"), "MOCK",
                         "$default (client pings) should be answered by a MOCK integration")

    def assert_access_logs(self, what: str, settings: dict[str, Any]) -> None:
        group = ref_name(settings.get("DestinationArn"))
        resources = self.template["Resources"]
        self.assertTrue(group in resources, f"{what}: AccessLogSettings.DestinationArn must be a log group of the stack")
        self.assertEqual(resources[group]["Type"], "AWS::Logs::LogGroup")
        self.assertIn("RetentionInDays", resources[group]["Properties"], f"{group} needs RetentionInDays")
        record = json.loads(settings.get("Format") or "")  # JSON lines (each value a quoted $context variable)
        self.assertIn("status", record, f"{what}: the access log should record the status")

    def assert_throttling(self, what: str, settings: dict[str, Any]) -> None:
        parameters = self.template.get("Parameters") or {}
        for key in ("ThrottlingRateLimit", "ThrottlingBurstLimit"):
            self.assertIn(ref_name(settings.get(key)), parameters, f"{what}: {key} must be a parameter")

    def test_both_apis_have_access_logs_and_throttling_parameters(self) -> None:
        api = self.http_api()
        self.assert_access_logs("HttpApi", api.get("AccessLogSettings") or {})
        self.assert_throttling("HttpApi", api.get("DefaultRouteSettings") or {})
        stages = resources_of(self.template, "AWS::ApiGatewayV2::Stage")
        self.assertEqual(len(stages), 1, "expected one WebSocket stage")
        (stage,) = stages.values()
        props = stage["Properties"]
        self.assert_access_logs("WebSocket stage", props.get("AccessLogSettings") or {})
        self.assert_throttling("WebSocket stage", props.get("DefaultRouteSettings") or {})
        self.assertIn(ref_name(props.get("StageName")), self.template.get("Parameters") or {},
                      "the WebSocket stage name must be a parameter")

    # (f) ------------------------------------------------------------------------------------

    def test_every_function_logs_json_to_its_own_log_group_with_retention(self) -> None:
        resources = expanded_template()["Resources"]
        lambdas = {k: v for k, v in resources.items() if v["Type"] == "AWS::Lambda::Function"}
        self.assertEqual(sorted(lambdas), sorted(functions(self.template)))
        owners: dict[str, str] = {}
        for name, fn in lambdas.items():
            logging = fn["Properties"].get("LoggingConfig") or {}
            self.assertEqual(logging.get("LogFormat"), "JSON", f"{name}: LoggingConfig.LogFormat must be JSON")
            self.assertIn("ApplicationLogLevel", logging, f"{name}: LoggingConfig.ApplicationLogLevel")
            group = ref_name(logging.get("LogGroup"))
            self.assertTrue(group in resources, f"{name}: LoggingConfig.LogGroup must !Ref a log group of the stack")
            self.assertEqual(resources[group]["Type"], "AWS::Logs::LogGroup", f"{name}: {group}")
            self.assertIn("RetentionInDays", resources[group].get("Properties") or {},
                          f"{group} (log group of {name}) needs RetentionInDays")
            self.assertNotIn(group, owners, f"{name} and {owners.get(group)} share the log group {group}")
            owners[group] = name

    def test_every_function_emits_metrics(self) -> None:
        for name, fn in expanded_template()["Resources"].items():
            if fn["Type"] == "AWS::Lambda::Function":
                env = ((fn["Properties"].get("Environment") or {}).get("Variables")) or {}
                self.assertEqual(env.get("CHAT_METRICS"), "emf", f"{name}: CHAT_METRICS=emf (crates/store/src/telemetry.rs)")

    def test_every_alarm_notifies_the_alarm_topic(self) -> None:
        alarms = resources_of(self.template, "AWS::CloudWatch::Alarm")
        self.assertTrue(alarms, "template.yaml has no alarms")
        topics = resources_of(self.template, "AWS::SNS::Topic")
        self.assertIn("AlarmTopic", topics)
        self.assertIn("AlarmEmail", self.template.get("Parameters") or {})
        for name, alarm in alarms.items():
            props = alarm["Properties"]
            self.assertIn({"Ref": "AlarmTopic"}, props.get("AlarmActions") or [], f"{name}: AlarmActions")
            self.assertIn({"Ref": "AlarmTopic"}, props.get("OKActions") or [], f"{name}: OKActions")
            self.assertIsNot(props.get("ActionsEnabled"), False, f"{name}: actions are disabled")
        subscriptions = resources_of(self.template, "AWS::SNS::Subscription")
        self.assertTrue(any(ref_name(s["Properties"].get("Endpoint")) == "AlarmEmail"
                            and ref_name(s["Properties"].get("TopicArn")) == "AlarmTopic"
                            for s in subscriptions.values()), "AlarmEmail must be subscribed to AlarmTopic")

    def test_everything_that_can_fail_has_its_alarms(self) -> None:
        watched = {(ns, metric, tuple(sorted((k, ref_name(v) or v) for k, v in dims.items())))
                   for alarm in resources_of(self.template, "AWS::CloudWatch::Alarm").values()
                   for ns, metric, dims in alarm_metrics(alarm)}

        def expect(ns: str, metric: str, what: str, **dims: str) -> None:
            key = (ns, metric, tuple(sorted(dims.items())))
            self.assertTrue(key in watched, f"no alarm on {ns} {metric} of {what} ({dims})")

        for name in functions(self.template):
            expect("AWS/Lambda", "Errors", name, FunctionName=name)
            expect("AWS/Lambda", "Throttles", name, FunctionName=name)
        # Stream consumers: how far behind they are.
        for mapping in resources_of(self.template, "AWS::Lambda::EventSourceMapping").values():
            fn = ref_name(mapping["Properties"]["FunctionName"])
            expect("AWS/Lambda", "IteratorAge", f"the consumer {fn}", FunctionName=fn)
            destination = (((mapping["Properties"].get("DestinationConfig") or {}).get("OnFailure") or {})
                           .get("Destination"))
            self.assertIsNotNone(ref_name(destination), f"{fn}: the mapping needs an on-failure queue")
        for name in resources_of(self.template, "AWS::SQS::Queue"):
            expect("AWS/SQS", "ApproximateNumberOfMessagesVisible", name, QueueName=name)
        for name, table in resources_of(self.template, "AWS::DynamoDB::Table").items():
            for metric in ("ReadThrottleEvents", "WriteThrottleEvents"):
                expect("AWS/DynamoDB", metric, name, TableName=name)
                for index in table["Properties"].get("GlobalSecondaryIndexes") or []:
                    expect("AWS/DynamoDB", metric, f"{name}.{index['IndexName']}", TableName=name,
                           GlobalSecondaryIndexName=index["IndexName"])
        for name in resources_of(self.template, "AWS::Kinesis::Stream"):
            expect("AWS/Kinesis", "WriteProvisionedThroughputExceeded", name, StreamName=name)
            expect("AWS/Kinesis", "ReadProvisionedThroughputExceeded", name, StreamName=name)
        for name in resources_of(self.template, HTTP_API):
            expect("AWS/ApiGateway", "5xx", name, ApiId=name)
        for name, api in resources_of(self.template, "AWS::ApiGatewayV2::Api").items():
            if api["Properties"].get("ProtocolType") == "WEBSOCKET":
                expect("AWS/ApiGateway", "ExecutionError", name, ApiId=name)

    # (g) ------------------------------------------------------------------------------------

    def test_template_stays_lean(self) -> None:
        with open(TEMPLATE, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        self.assertLessEqual(lines, MAX_TEMPLATE_LINES,
                             f"template.yaml has {lines} lines: write what repeats per function, consumer "
                             "or table once, as an Fn::ForEach loop")

    def test_language_extensions_run_before_the_sam_transform(self) -> None:
        raw = create_resources.load_template(TEMPLATE, expand=False)
        self.assertEqual(create_resources.transforms(raw),
                         [create_resources.LANGUAGE_EXTENSIONS, "AWS::Serverless-2016-10-31"])
        self.assertTrue(any(k.startswith(create_resources.FOREACH) for k in raw["Resources"]),
                        "the template has no Fn::ForEach loop")

    def test_loops_expand_as_sam_cli_expands_them(self) -> None:
        try:
            from samcli.lib.cfn_language_extensions.sam_integration import expand_language_extensions
            from samcli.yamlhelper import yaml_parse
        except ImportError as e:  # pragma: no cover - the venv always has it (aws-sam-cli)
            self.skipTest(f"aws-sam-cli is not installed: {e}")
        with open(TEMPLATE, encoding="utf-8") as f:
            theirs = expand_language_extensions(yaml_parse(f.read()), enabled=True).expanded_template
        types = lambda t: {k: v.get("Type") for k, v in t["Resources"].items()}  # noqa: E731
        self.assertEqual(types(self.template), types(theirs),
                         "create_resources.load_template and SAM CLI expand the loops differently")

    def test_every_function_has_its_log_group_and_alarms_after_expansion(self) -> None:
        resources = expanded_template()["Resources"]
        resolver = create_resources.Resolver(self.template, "us-east-1")
        stack = resolver.ref("AWS::StackName")
        functions_ = functions(self.template)
        self.assertTrue(functions_)
        for name, fn in functions_.items():
            prefix = name.removesuffix("Function")
            binary = binary_of(fn)
            self.assertEqual(resources[name]["Type"], "AWS::Lambda::Function", name)
            self.assertEqual(ref_name(resources[name]["Properties"]["LoggingConfig"]["LogGroup"]),
                             f"{prefix}LogGroup", f"{name}: LoggingConfig.LogGroup")
            self.assertEqual((resources.get(f"{prefix}LogGroup") or {}).get("Type"), "AWS::Logs::LogGroup",
                             f"{name}: no log group {prefix}LogGroup")
            for metric in ("Errors", "Throttles"):
                alarm = resources.get(f"{prefix}{metric}Alarm") or {}
                self.assertEqual(alarm.get("Type"), "AWS::CloudWatch::Alarm", f"{name}: no {prefix}{metric}Alarm")
                self.assertEqual(alarm_metrics(alarm), [("AWS/Lambda", metric, {"FunctionName": {"Ref": name}})],
                                 f"{prefix}{metric}Alarm")
                props = alarm["Properties"]
                self.assertEqual(resolver.resolve(props["AlarmName"]), f"{stack}-{binary}-{metric.lower()}",
                                 f"{prefix}{metric}Alarm: named after the binary (Mappings: Functions)")
                self.assertIn(f"the {binary} function", resolver.resolve(props["AlarmDescription"]).lower(),
                              f"{prefix}{metric}Alarm: AlarmDescription")


class LanguageExtensionsTest(unittest.TestCase):
    """create_resources.expand_language_extensions on small templates (the documented semantics)."""

    @staticmethod
    def expand(resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
        template = {"Transform": [create_resources.LANGUAGE_EXTENSIONS, "AWS::Serverless-2016-10-31"],
                    "Resources": resources, **extra}
        return create_resources.expand_language_extensions(template)

    def test_identifier_substitution(self) -> None:
        out = self.expand({
            "Fn::ForEach::Things": ["Id", ["a-b", "C"], {
                "${Id}Queue": {"Type": "AWS::SQS::Queue"},
                "&{Id}Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
                    "AlarmName": {"Fn::Sub": "${AWS::StackName}-${Id}"},
                    "Literal": {"Ref": "Id"},
                    "Queue": {"Ref": {"Fn::Sub": "&{Id}Queue"}},
                    "Arn": {"Fn::GetAtt": [{"Fn::Sub": "&{Id}Queue"}, "Arn"]},
                }}}],
            "Other": {"Type": "AWS::SNS::Topic"},
        })
        self.assertEqual(out["Transform"], "AWS::Serverless-2016-10-31")
        self.assertEqual(sorted(out["Resources"]), ["CAlarm", "CQueue", "Other", "a-bQueue", "abAlarm"])
        self.assertEqual(out["Resources"]["abAlarm"]["Properties"], {
            "AlarmName": {"Fn::Sub": "${AWS::StackName}-a-b"}, "Literal": "a-b",
            "Queue": {"Ref": "abQueue"}, "Arn": {"Fn::GetAtt": ["abQueue", "Arn"]}})

    def test_nested_loops_and_collections(self) -> None:
        out = self.expand(
            {"Fn::ForEach::Outer": ["A", {"Ref": "Names"}, {
                "Fn::ForEach::Inner": ["B", {"Fn::FindInMap": ["M", "K", "L"]}, {
                    "${A}${B}": {"Type": "AWS::SQS::Queue"}}]}]},
            Parameters={"Names": {"Type": "CommaDelimitedList", "Default": "X, Y"}},
            Mappings={"M": {"K": {"L": ["1", "2"]}}})
        self.assertEqual(sorted(out["Resources"]), ["X1", "X2", "Y1", "Y2"])

    def test_invalid_loops_fail(self) -> None:
        with self.assertRaisesRegex(ValueError, "defined twice"):
            self.expand({"Ra": {}, "Fn::ForEach::L": ["Id", ["a"], {"R${Id}": {}}]})
        with self.assertRaisesRegex(ValueError, "must contain"):
            self.expand({"Fn::ForEach::L": ["Id", ["a"], {"Fixed": {}}]})
        with self.assertRaisesRegex(ValueError, "needs the AWS::LanguageExtensions transform"):
            create_resources.expand_language_extensions(
                {"Resources": {"Fn::ForEach::L": ["Id", ["a"], {"R${Id}": {}}]}})


if __name__ == "__main__":
    unittest.main()
