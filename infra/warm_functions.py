#!/usr/bin/env python3
"""Starts the REST functions' instances before the first client does (infra/run-local.sh).

    python3 infra/warm_functions.py [http://127.0.0.1:9000] [--concurrency N]

`cargo lambda watch` (1.9.2) starts an instance (a `cargo run` of the function, ~0.4 s of CPU)
whenever a request waits and no instance is idle, and an instance still starting does not count
as idle: the first request to a function starts 10-30 instances while the first one comes up,
and the first concurrent burst starts the rest. Measured through the local stack, the hot
conversation bench's 8-sender row right after start had p99 1.6 s while its instances came up,
0.3 s once they were. With `--concurrency` at the watch's own limit (run-local.sh: 32), this
starts them all up front, with unauthenticated requests each function answers with 401 at once
(192 instances of the six functions in ~45 s on 2 cores; the whole stack then used 1.4 GB).
Standard library only.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
import urllib.error
import urllib.request

# One route per function (the router in Cargo.toml); no token, so each answers 401.
ROUTES = [
    ("POST", "/conversations"),
    ("POST", "/conversations/warm-up/messages"),
    ("GET", "/conversations/warm-up/messages"),
    ("POST", "/conversations/warm-up/read"),
    ("GET", "/conversations/warm-up/reads"),
    ("GET", "/inbox"),
]


def call(api: str, method: str, path: str) -> int:
    request = urllib.request.Request(api + path, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def instances_starting() -> int | None:
    """Function instances still starting: `cargo run --bin <function>` processes (cargo execs the
    function once it is built). From Linux's /proc; None elsewhere."""
    if not os.path.isdir("/proc/self/task"):
        return None
    starting = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        starting += os.path.basename(args[0]) == b"cargo" and b"run" in args and b"--bin" in args
    return starting


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("api", nargs="?", default="http://127.0.0.1:9000")
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once per function")
    args = parser.parse_args()
    started = time.monotonic()
    jobs = [route for route in ROUTES for _ in range(args.concurrency)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        statuses = list(pool.map(lambda route: call(args.api, *route), jobs))
    # The instances started by those requests keep coming up for a while after: wait for them,
    # so that their cargo runs do not compete with the first client for the CPU.
    deadline = time.monotonic() + 60
    while (instances_starting() or 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    # 503: an instance took longer to start than the REST API waits for an answer (22 s,
    # infra/local-gateway/src/rest_edge.rs); it still starts, and the wait above covers it.
    unexpected = sorted({s for s in statuses if s not in (401, 503)})
    print(f"warm_functions: {len(jobs)} requests in {time.monotonic() - started:.1f} s"
          + (f", unexpected statuses {unexpected}" if unexpected else ""), file=sys.stderr)
    # Not one answer from a function: the stack is not serving; say so rather than announce it.
    return 0 if 401 in statuses else 1


if __name__ == "__main__":
    sys.exit(main())
