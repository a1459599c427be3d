#!/usr/bin/env python3
"""The local AWS services of the stack and the tests: DynamoDB (+ DynamoDB Streams) and Kinesis.

    python infra/local_aws.py [--dynamodb local|moto] [--dynamodb-endpoint URL]
                              [--host 127.0.0.1] [--port 4566] [--dynamodb-port 8000]
                              [--template template.yaml] [--region us-east-1] [--exit-with-stdin]

Which DynamoDB (`--dynamodb`, default: env `CHAT_DYNAMODB`, else `local`):

* `local`: Amazon DynamoDB Local (installed by infra/setup-dynamodb-local.sh, which this runs; it
  needs Java 17+), in memory, on `--dynamodb-port`. It serves requests in parallel, as DynamoDB
  does. Kinesis (and SQS, for the failure queues) come from our moto launcher,
  infra/moto_server.py, on `--port`: DynamoDB Local has no Kinesis.
* `moto`: infra/moto_server.py alone serves DynamoDB, DynamoDB Streams, Kinesis and SQS on `--port`
  (the stack's emulator before DynamoDB Local; no Java needed).
* `--dynamodb-endpoint URL` (default: env `DYNAMODB_ENDPOINT`): a DynamoDB that is already running
  (another DynamoDB Local, a proxy in front of one, ...); only moto is started, for Kinesis.

The template's tables are created on the DynamoDB endpoint and its Kinesis streams and SQS queues
on moto (infra/create_resources.py; idempotent). Then it prints exactly one line to stdout,

    READY <dynamodb-url> <kinesis-url>

(the same URL twice with `moto`) and serves until SIGTERM/SIGINT, or with `--exit-with-stdin`
until its stdin closes (a test harness that dies takes it along). Its children go with it, however
it ends (Linux parent-death signal; moto also watches its stdin). A child that exits on its own
ends it with an error. `--port 0` / `--dynamodb-port 0` pick free ports.

Kinesis fault injection (`/moto-api/chat/faults`) is on the Kinesis URL. Neither DynamoDB
(DynamoDB Local, moto) has transaction conflicts or throttling: the strictness layer
(infra/dynamodb-strict) that the callers put in front of the DynamoDB URL adds them.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "infra"))
from create_resources import create_resources  # noqa: E402

BACKEND_ENV = "CHAT_DYNAMODB"
BACKENDS = ("local", "moto")
DYNAMODB_LOCAL_START_TIMEOUT_S = 90
MOTO_START_TIMEOUT_S = 60
STOP_GRACE_S = 5
TAIL_LINES = 40


def log(msg: str) -> None:
    print(f"local_aws: {msg}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when this process ends, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the normal shutdown still stops the children
        pass


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def url_of(host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Child:
    """A child process whose output is kept (the last lines) and shown if it fails."""

    def __init__(self, name: str, argv: list[str], cwd: Path | None = None, stdin: Any = None,
                 echo: bool = False):
        self.name = name
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                     text=True, errors="replace", bufsize=1)
        self.ready_line: str | None = None
        self._ready = threading.Event()
        self._echo = echo
        threading.Thread(target=self._drain, name=f"{name}-output", daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if self.ready_line is None and line.startswith("READY "):
                self.ready_line = line
                self._ready.set()
                continue
            self.tail.append(line)
            if self._echo:
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
        self._ready.set()

    def wait_ready_line(self, timeout: float) -> str:
        """moto_server.py's `READY <url>` line."""
        if not self._ready.wait(timeout) or self.ready_line is None:
            raise Failed(f"{self.name} did not get ready", self)
        return self.ready_line

    def failed(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        if self.proc.stdin is not None:  # moto_server.py --exit-with-stdin
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self.proc.terminate()

    def show_tail(self) -> None:
        for line in self.tail:
            print(f"[{self.name}] {line}", file=sys.stderr)


class Failed(Exception):
    def __init__(self, msg: str, child: Child | None = None):
        super().__init__(msg)
        self.child = child


def start_moto(args: argparse.Namespace, template: str | None) -> tuple[Child, str]:
    argv = [sys.executable, str(REPO / "infra/moto_server.py"), "--host", args.host,
            "--port", str(args.port), "--region", args.region, "--exit-with-stdin"]
    if template:
        argv += ["--template", template]
    moto = Child("moto", argv, stdin=subprocess.PIPE, echo=args.verbose)
    line = moto.wait_ready_line(MOTO_START_TIMEOUT_S)
    return moto, line.split()[1]


def dynamodb_local_dir(args: argparse.Namespace) -> Path:
    if args.dynamodb_local_dir:
        return Path(args.dynamodb_local_dir)
    # Installs it on first use (silent afterwards); checks Java every time.
    run = subprocess.run(["bash", str(REPO / "infra/setup-dynamodb-local.sh"), "--print-dir"],
                         stdout=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise Failed("DynamoDB Local is not installed (see above)")
    return Path(run.stdout.strip().splitlines()[-1])


def start_dynamodb_local(args: argparse.Namespace) -> tuple[Child, str]:
    home = dynamodb_local_dir(args)
    port = args.dynamodb_port or free_port(args.host)
    argv = [args.java, "-Djava.library.path=./DynamoDBLocal_lib", "-jar", "DynamoDBLocal.jar",
            "-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(port)]
    # It has no option for the address: it listens on every interface (and checks no signature).
    child = Child("dynamodb-local", argv, cwd=home, stdin=subprocess.DEVNULL, echo=args.verbose)
    return child, url_of(args.host, port)


def wait_dynamodb(url: str, child: Child, timeout: float, stop: threading.Event) -> None:
    """Until DynamoDB Local answers ListTables (its port opens a little before it serves)."""
    import boto3
    from botocore.config import Config

    ddb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="local", aws_secret_access_key="local",
                       config=Config(retries={"max_attempts": 0}, connect_timeout=1, read_timeout=5))
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        if child.failed():
            raise Failed(f"{child.name} exited with status {child.proc.returncode}", child)
        try:
            ddb.list_tables(Limit=1)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                raise Failed(f"{child.name} did not answer on {url} within {timeout:.0f} s", child)
            time.sleep(0.1)


def serve(args: argparse.Namespace, children: list[Child], stop: threading.Event) -> int:
    template = str(Path(args.template).resolve()) if args.template else None
    started = time.monotonic()
    endpoint = args.dynamodb_endpoint or None
    what = "the given endpoint" if endpoint else "DynamoDB Local" if args.dynamodb == "local" else "moto"
    if endpoint is None and args.dynamodb == "moto":
        moto, url = start_moto(args, template)
        children.append(moto)
        dynamodb_url = kinesis_url = url
    else:
        ddb: Child | None = None
        if endpoint is None:
            ddb, endpoint = start_dynamodb_local(args)
            children.append(ddb)
        # moto starts while the JVM does.
        moto, kinesis_url = start_moto(args, None)
        children.append(moto)
        if ddb is not None:
            wait_dynamodb(endpoint, ddb, DYNAMODB_LOCAL_START_TIMEOUT_S, stop)
        dynamodb_url = endpoint
        if template:
            create_resources(dynamodb_url, template, args.region, kinesis_endpoint=kinesis_url,
                             log=log)
    if stop.is_set():
        return 0
    log(f"ready in {time.monotonic() - started:.1f} s: DynamoDB {dynamodb_url} ({what}), "
        f"Kinesis {kinesis_url} (moto)")
    print(f"READY {dynamodb_url} {kinesis_url}", flush=True)
    while not stop.wait(0.2):
        for child in children:
            if child.failed():
                raise Failed(f"{child.name} exited with status {child.proc.returncode}", child)
    return 0


def stop_all(children: list[Child]) -> None:
    for child in children:
        child.stop()
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env_backend = os.environ.get(BACKEND_ENV, "").strip() or "local"
    parser.add_argument("--dynamodb", default=env_backend,
                        help=f"local (Amazon DynamoDB Local) or moto (default: ${BACKEND_ENV} or local)")
    parser.add_argument("--dynamodb-endpoint", default=os.environ.get("DYNAMODB_ENDPOINT", ""),
                        help="use this running DynamoDB instead of starting one (default: $DYNAMODB_ENDPOINT)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4566,
                        help="moto's port (Kinesis; all services with --dynamodb moto); 0 picks a free one")
    parser.add_argument("--dynamodb-port", type=int, default=8000,
                        help="DynamoDB Local's port; 0 picks a free one")
    parser.add_argument("--template", help="create this template's tables, streams and queues")
    parser.add_argument("--region", default="us-east-1", help="region of the created resources")
    parser.add_argument("--exit-with-stdin", action="store_true",
                        help="exit when stdin closes (a test harness dies, its services go too)")
    parser.add_argument("--java", default="java", help="the Java 17+ that runs DynamoDB Local")
    parser.add_argument("--dynamodb-local-dir",
                        help="an unpacked DynamoDB Local (DynamoDBLocal.jar, DynamoDBLocal_lib/); "
                             "default: install with infra/setup-dynamodb-local.sh")
    parser.add_argument("--verbose", action="store_true", help="show the children's output")
    args = parser.parse_args(argv)
    if args.dynamodb not in BACKENDS:
        parser.error(f"--dynamodb / ${BACKEND_ENV} must be one of {', '.join(BACKENDS)}, not {args.dynamodb!r}")

    stop = threading.Event()

    def on_signal(_sig: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.exit_with_stdin:
        def watch_stdin() -> None:
            sys.stdin.buffer.read()  # returns at EOF
            stop.set()
        threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()

    children: list[Child] = []
    status = 0
    try:
        serve(args, children, stop)
    except Failed as e:
        if not stop.is_set():
            if e.child is not None:
                e.child.show_tail()
            log(str(e))
            status = 1
    except Exception as e:  # noqa: BLE001 - e.g. creating the tables failed: say so, stop all
        if not stop.is_set():
            log(f"failed: {e!r}")
            status = 1
    finally:
        stop_all(children)
    return status


if __name__ == "__main__":
    sys.exit(main())
