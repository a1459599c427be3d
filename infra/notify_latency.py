#!/usr/bin/env python3
"""How long offline notifications take through a running local stack (docs/benchmarks.md,
"Offline notifications"; goal: within the delay + 1 s, p99 over 100 members):

    python3 infra/notify_latency.py [--api http://127.0.0.1:9000] [--sink http://127.0.0.1:9004]
                                    [--members 100] [--runs 3] [--delay 2]

A group of `--members` receivers and a sender, each receiver with one device; the set-up is left a
few seconds to be indexed (as the deployed indexer does long before the group's first message).
Per run: one message, then every receiver's notifications read from the push sink; a receiver's
latency is its notification's `sentAt` (when the notifier handed it to the sink) minus the time
the message was sent (the same machine's clock). Each run waits for the previous window to close.
`--delay` is the stack's NOTIFY_DELAY_SECONDS (run-local.sh: 2). Standard library only.
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mint_token import mint  # noqa: E402

SECRET = os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret"


def call(method, url, token=None, body=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
            return resp.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def p99(values):
    """The 99th percentile as the Rust test takes it: the value below which 99 % of them lie."""
    ordered = sorted(values)
    return ordered[max(len(ordered) * 99 // 100 - 1, 0)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--api", default=os.environ.get("CHAT_API_URL", "http://127.0.0.1:9000"))
    p.add_argument("--sink", default=f"http://127.0.0.1:{os.environ.get('CHAT_PUSH_SINK_PORT', '9004')}")
    p.add_argument("--members", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--delay", type=float, default=float(os.environ.get("NOTIFY_DELAY_SECONDS", "2")))
    args = p.parse_args()
    api, sink = args.api.rstrip("/"), args.sink.rstrip("/")
    run_id = uuid.uuid4().hex[:8]
    sender = f"nl-{run_id}-s"
    members = [f"nl-{run_id}-{i}" for i in range(args.members)]
    tokens = {m: mint(m, 3600, SECRET) for m in [sender, *members]}
    print(f"notify_latency: {args.members} receivers, {args.runs} runs, delay {args.delay} s, against {api}")

    status, group = call("POST", f"{api}/conversations", tokens[sender],
                         {"type": "group", "title": "Latency", "memberIds": members})
    assert status == 201, (status, group)
    cid = group["conversationId"]
    device_tokens = {m: f"tok-{m}" for m in members}

    def register(m):
        status, answer = call("PUT", f"{api}/devices/phone", tokens[m], {"platform": "fcm", "token": device_tokens[m]})
        assert status == 200, (status, answer)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, members))
    time.sleep(3)  # the set-up indexed, as it would be long before the first message

    def sent_at(m, seq):
        query = urllib.parse.urlencode({"token": device_tokens[m]})
        status, answer = call("GET", f"{sink}/notifications?{query}")
        assert status == 200, (status, answer)
        for n in answer["notifications"]:
            if n["data"]["seq"] == seq:
                return datetime.fromisoformat(n["sentAt"].replace("Z", "+00:00")).timestamp()
        return None

    every = []
    for run in range(args.runs):
        started = time.time()
        status, message = call("POST", f"{api}/conversations/{cid}/messages", tokens[sender],
                               {"clientMsgId": str(uuid.uuid4()), "body": f"run {run + 1}"})
        assert status == 201, (status, message)
        seq = message["seq"]
        time.sleep(args.delay + 4)  # the window's job has run by now, and the window is closed
        with ThreadPoolExecutor(8) as pool:
            arrivals = list(pool.map(lambda m: sent_at(m, seq), members))
        latencies = [a - started for a in arrivals if a is not None]
        missing = len(arrivals) - len(latencies)
        if missing:
            print(f"  run {run + 1}: {missing} of {len(arrivals)} receivers got no notification")
            return 1
        every += latencies
        latencies.sort()
        print(f"  run {run + 1}: after the send: first {latencies[0]:.2f} s, median "
              f"{latencies[len(latencies) // 2]:.2f} s, p99 {p99(latencies):.2f} s, last {latencies[-1]:.2f} s")
    goal = args.delay + 1
    worst = p99(every)
    print(f"notify_latency: p99 over {len(every)} notifications {worst:.2f} s after the send "
          f"(goal ≤ delay + 1 s = {goal:.1f} s: {'met' if worst <= goal else 'NOT met'})")
    return 0 if worst <= goal else 2


if __name__ == "__main__":
    sys.exit(main())
