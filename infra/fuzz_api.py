#!/usr/bin/env python3
"""OpenAPI fuzz test of the REST API against a running local stack (docs/api.md §2: a 5xx is never
the answer to bad input).

    infra/run-local.sh                       # in another terminal (or CHAT_REST_PORT=... for other ports)
    .venv/bin/python infra/fuzz_api.py [--url http://127.0.0.1:9000] [--report-dir DIR] [-- <schemathesis args>]

Runs schemathesis (pinned in infra/requirements.txt) over every operation of docs/openapi.yaml
with valid and invalid requests (its examples, coverage, fuzzing and stateful phases: the
stateful one follows the document's links, so conversations it creates are then read, written
to and marked read), with infra/schemathesis.toml: a fixed seed and example count (about 3,000
requests, reproducible), and the expected statuses the document cannot express. Every check is
on, among them: no 5xx (not_a_server_error), status codes, content types, headers and bodies
as documented (response_schema_conformance), invalid requests refused with a 4xx, a request
without the token refused (ignored_auth).

Requests carry `Authorization: Bearer <token>` for the user `--user`, an HS256 token minted like
infra/mint_token.py with CHAT_LOCAL_JWT_SECRET (default `local-dev-secret`, the local stack's).
The exchange is recorded as a HAR file in the report directory (default `.local/fuzz`), from
which this script counts the requests and their statuses, and lists every 5xx.

Exit status: 0 when schemathesis found nothing and no response was a 5xx; 1 otherwise; 2 when
the stack does not answer.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mint_token import mint  # noqa: E402

INFRA = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(INFRA)
SCHEMA = os.path.join(REPO, "docs", "openapi.yaml")
CONFIG = os.path.join(INFRA, "schemathesis.toml")


def wait_for(url: str, seconds: float) -> bool:
    parsed = urllib.parse.urlparse(url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((parsed.hostname, parsed.port or 80), timeout=2):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def summarize(har_path: str) -> tuple[int, list[str]]:
    """Prints the requests by status; returns (request count, the 5xx as 'METHOD url -> status')."""
    with open(har_path, encoding="utf-8") as f:
        entries = json.load(f)["log"]["entries"]
    statuses = collections.Counter(e["response"]["status"] for e in entries)
    by_operation = collections.Counter(
        f"{e['request']['method']} {urllib.parse.urlparse(e['request']['url']).path.split('/')[1] or '/'}"
        for e in entries)
    server_errors = [f"{e['request']['method']} {e['request']['url']} -> {e['response']['status']}"
                     for e in entries if e["response"]["status"] >= 500]
    print(f"\nfuzz_api: {len(entries)} requests; by status: "
          + ", ".join(f"{s} × {n}" for s, n in sorted(statuses.items())))
    print("fuzz_api: by method and first path segment: "
          + ", ".join(f"{k} × {n}" for k, n in sorted(by_operation.items())))
    return len(entries), server_errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CHAT_REST_URL")
                        or f"http://127.0.0.1:{os.environ.get('CHAT_REST_PORT', '9000')}")
    parser.add_argument("--user", default="fuzz-alice", help="the token's sub")
    parser.add_argument("--report-dir", default=os.path.join(REPO, ".local", "fuzz"))
    parser.add_argument("--wait", type=float, default=30, help="seconds to wait for the stack")
    parser.add_argument("schemathesis_args", nargs="*", help="passed on to `schemathesis run` (after --)")
    args = parser.parse_args(argv)

    if not wait_for(args.url, args.wait):
        print(f"fuzz_api: nothing answers at {args.url}: start the local stack (infra/run-local.sh)",
              file=sys.stderr)
        return 2
    os.makedirs(args.report_dir, exist_ok=True)
    har = os.path.join(args.report_dir, "requests.har")
    junit = os.path.join(args.report_dir, "junit.xml")
    for old in (har, junit):
        if os.path.exists(old):
            os.remove(old)
    token = mint(args.user, 24 * 3600, os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret")
    schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    command = [schemathesis if os.path.isfile(schemathesis) else "schemathesis",
               "--config-file", CONFIG, "--no-color",
               "run", SCHEMA, "--url", args.url,
               "--header", f"Authorization: Bearer {token}",
               # Above the functions' local request budget (20 s, chat_store::retry::Timeouts::LOCAL), so a
               # slow answer is judged by what it says, not cut off: every request ends in a
               # response of its own before then.
               "--request-timeout", "30",
               "--report", "har,junit", "--report-har-path", har, "--report-junit-path", junit,
               *args.schemathesis_args]
    shown = [("Authorization: Bearer <token>" if c.startswith("Authorization:") else c) for c in command]
    print("fuzz_api: " + " ".join(shown), flush=True)
    start = time.monotonic()
    result = subprocess.run(command, cwd=REPO)
    print(f"fuzz_api: schemathesis exited {result.returncode} after {time.monotonic() - start:.0f} s")

    if not os.path.isfile(har):
        print(f"fuzz_api: no HAR report at {har}", file=sys.stderr)
        return 1
    count, server_errors = summarize(har)
    for line in server_errors[:50]:
        print(f"fuzz_api: 5xx: {line}", file=sys.stderr)
    if server_errors:
        print(f"fuzz_api: {len(server_errors)} of {count} responses were a 5xx", file=sys.stderr)
    print(f"fuzz_api: reports in {os.path.relpath(args.report_dir, REPO)} (requests.har, junit.xml)")
    return 0 if result.returncode == 0 and not server_errors and count > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
