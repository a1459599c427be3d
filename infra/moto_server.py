#!/usr/bin/env python3
"""Our moto launcher: moto's server app (all services on one port) with what the stack needs.

    python infra/moto_server.py [--host 127.0.0.1] [--port 4566] [--template template.yaml]
                                [--region us-east-1] [--log-requests] [--exit-with-stdin]

It serves Kinesis and SQS to the local stack and the tests (DynamoDB Local has no Kinesis), SNS
mobile push to the tests (platform applications and endpoints; `GET /moto-api/data.json` shows
what each endpoint was sent), and DynamoDB with DynamoDB Streams on the fallback path
(`CHAT_DYNAMODB=moto`, machines without Java). `POST /moto-api/reset` clears all state. Changes
to moto 5.2.5 (pinned: they rely on its internals):

* Requests are processed one at a time. moto has no locking: its Kinesis numbers a shard's next
  record from the last one ("not safe for concurrency": two concurrent puts get the same number
  and one record is lost), and concurrent conditional DynamoDB writes race (two "successful"
  attribute_not_exists puts, lost updates). The HTTP server stays threaded, and request bodies
  are read before taking the lock, so a slow client cannot stall the others.
* An SQS long poll (ReceiveMessage with WaitTimeSeconds, AWS JSON protocol) does not hold that
  lock while it waits: it is tried every 50 ms without waiting, and answered as soon as a message
  is visible, as SQS does. moto's own long poll held the lock for the whole wait (the local
  stack's notification poller blocked every Kinesis and SQS call for up to a second at a time)
  and noticed a delayed message only when one of its one-second waits ended (up to a second
  late).
* Kinesis fault injection for tests: `POST /moto-api/chat/faults` with JSON
  `{"kinesisPutFailures": N}` makes the next N entries of PutRecords calls (counted across
  calls, in order) fail the way Kinesis throttling does: not written, reported with `ErrorCode`
  `ProvisionedThroughputExceededException` and counted in `FailedRecordCount`, while the call's
  other entries are written. It answers the failures still to come, as does `GET`; a reset
  clears them.
* A Kinesis shard finds its last sequence number at the end of its records, and GetRecords reads
  the records after the iterator's position directly: moto lists every record of the shard for
  each PutRecord and walks the shard from its first record for each GetRecords, so both grew
  with all the stream ever carried (a long-running stack or a bench slowed down by the hour).
* A cancelled TransactWriteItems rolls back in place (DynamoDB path). moto deep-copies every
  table a transaction names before it writes, and on cancellation swaps the copies in: every
  transaction costs a copy of whole tables, and the copy has a new stream shard object, so the
  stream iterators the relay holds keep reading the old shard and never see a new record. Here
  only the items it names and the length of the streams are saved and put back.
* A Query of a table reads only the queried partition (DynamoDB path): moto sorts every item of
  the table for every Query, most of the fallback test suite's time.
* moto keeps every DynamoDB Streams shard iterator forever (~2 KB per poll); a used one is
  dropped (each GetRecords answer carries the next one).
* moto's listing of its own package directory and of a handler class's methods, done for every
  request, are cached (a quarter of its time per request). The listen backlog is 1024, not 128:
  a burst of new connections otherwise overflows it and the dropped attempts retry after 1 s.

What DynamoDB on AWS has and neither moto nor DynamoDB Local does (transaction conflicts,
per-partition throttling, latency, injected DynamoDB faults) comes from the strictness layer in
front of either (infra/dynamodb-strict). Left as moto has them, since nothing here depends on
them: ClientRequestToken is ignored (a repeated transaction is applied again); an UpdateItem that
creates its item emits two INSERT records (the bare key, then the item) and, if it then fails,
leaves the bare key behind; a PutItem that changes nothing emits MODIFY; TTL never expires items.

Once listening, and after the template's resources exist (--template, see create_resources.py),
prints exactly one line `READY http://HOST:PORT` to stdout. Serves until SIGTERM/SIGINT (or,
with --exit-with-stdin, until stdin closes). `--port 0` picks a free port.
"""
from __future__ import annotations

import argparse
import copy
import functools
import io
import json
import logging
import os
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Iterable

import moto
import moto.backends
import moto.core.responses
import moto.dynamodb.models as ddb_models
import werkzeug.serving
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.dynamodbstreams.models import DynamoDBStreamsBackend
from moto.kinesis.models import KinesisBackend, Shard
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server
from werkzeug.wsgi import get_input_stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from create_resources import create_resources  # noqa: E402

MOTO_VERSION = "5.2.5"  # the patches below rely on its internals: re-check them before a bump
FAULTS_PATH = "/moto-api/chat/faults"
LISTEN_BACKLOG = 1024
LONG_POLL_STEP = 0.05  # seconds between an SQS long poll's attempts (Serialized.long_poll)


# --- one request at a time, and the fault injection endpoint -----------------------------------

class Faults:
    """Injected failures: PutRecords entries still to refuse."""

    def __init__(self) -> None:
        self.kinesis_put_failures = 0


FAULTS = Faults()


class Serialized:
    """WSGI middleware running the wrapped app for one request at a time; also serves
    FAULTS_PATH and clears the faults on `POST /moto-api/reset`."""

    def __init__(self, app: Callable[..., Iterable[bytes]]):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        # Read the whole body first (Content-Length or chunked), outside the lock.
        body = get_input_stream(environ).read()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input_terminated"] = False
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        wait = sqs_long_poll(environ, body)
        if wait:
            return self.long_poll(environ, body, wait, start_response)
        with self.lock:
            if path == FAULTS_PATH:
                return faults_response(method, body, start_response)
            if path == "/moto-api/reset" and method == "POST":
                FAULTS.kinesis_put_failures = 0
            return self.run(environ, start_response)

    def run(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """The wrapped app's whole response (the caller holds the lock)."""
        result = self.app(environ, start_response)
        try:  # the whole response under the lock: moto may produce it lazily
            return list(result)
        finally:
            if hasattr(result, "close"):
                result.close()

    def long_poll(self, environ: dict[str, Any], body: bytes, wait: float,
                  start_response: Callable[..., Any]) -> list[bytes]:
        """An SQS ReceiveMessage with WaitTimeSeconds, as SQS answers it: at once when a message
        is (or becomes) visible, else empty after the wait. moto's own long poll holds the lock
        for the whole wait (every other request waits behind it) and notices a delayed message
        only when its one-second waits end; here each attempt is a receive without waiting, and
        the lock is free between attempts."""
        request = json.loads(body)
        request["WaitTimeSeconds"] = 0
        short = json.dumps(request).encode()
        deadline = time.monotonic() + wait
        while True:
            environ["wsgi.input"] = io.BytesIO(short)
            environ["CONTENT_LENGTH"] = str(len(short))
            answer: list[Any] = []

            def keep(status: str, headers: list[Any], exc_info: Any = None) -> Callable[[bytes], None]:
                answer[:] = [status, headers]
                return lambda _data: None  # moto returns its body; it never writes

            with self.lock:
                chunks = self.run(environ, keep)
            status, headers = answer
            if not status.startswith("200") or time.monotonic() >= deadline or _has_messages(chunks):
                start_response(status, headers)
                return chunks
            time.sleep(min(LONG_POLL_STEP, max(deadline - time.monotonic(), 0)))


def sqs_long_poll(environ: dict[str, Any], body: bytes) -> float:
    """The WaitTimeSeconds of an SQS ReceiveMessage (AWS JSON protocol) that asks for one, else 0."""
    if environ.get("HTTP_X_AMZ_TARGET") != "AmazonSQS.ReceiveMessage":
        return 0
    try:
        wait = json.loads(body).get("WaitTimeSeconds")
    except (ValueError, AttributeError):
        return 0  # moto answers what it makes of it
    return float(wait) if isinstance(wait, int) and not isinstance(wait, bool) and 0 < wait <= 20 else 0


def _has_messages(chunks: list[bytes]) -> bool:
    try:
        return bool(json.loads(b"".join(chunks)).get("Messages"))
    except (ValueError, AttributeError):
        return True  # not an answer this loop understands: hand it over


def faults_response(method: str, body: bytes, start_response: Callable[..., Any]) -> list[bytes]:
    status, answer = "200 OK", None
    if method == "POST":
        try:
            doc = json.loads(body or b"{}")
            n = doc["kinesisPutFailures"] if isinstance(doc, dict) and set(doc) == {"kinesisPutFailures"} else None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError
            FAULTS.kinesis_put_failures = n
        except ValueError:
            status, answer = "400 Bad Request", {"message": 'expected {"kinesisPutFailures": <count >= 0>}'}
    elif method != "GET":
        status, answer = "405 Method Not Allowed", {"message": "use GET or POST"}
    data = json.dumps(answer or {"kinesisPutFailures": FAULTS.kinesis_put_failures}).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def put_records_with_faults(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """KinesisBackend.put_records refusing the injected number of entries (FAULTS), like a
    throttled PutRecords: those entries are not written, the others are."""

    def put_records(self: Any, stream_arn: str, stream_name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        failing = min(FAULTS.kinesis_put_failures, len(records))
        if not failing:
            return original(self, stream_arn, stream_name, records)
        FAULTS.kinesis_put_failures -= failing
        written = original(self, stream_arn, stream_name, records[failing:]) if records[failing:] else {"Records": []}
        refused = {"ErrorCode": "ProvisionedThroughputExceededException",
                   "ErrorMessage": "Rate exceeded for shard (injected by moto_server.py)"}
        return {"FailedRecordCount": failing + written.get("FailedRecordCount", 0),
                "Records": [dict(refused) for _ in range(failing)] + written["Records"]}

    return put_records


# --- Kinesis shards ----------------------------------------------------------------------------
# A shard keeps its records in an OrderedDict keyed 1, 2, 3 ... (put_record numbers each record
# the last key + 1; nothing else adds or removes one). The last (first) key is read from the
# dict's end (start), and GetRecords reads the records after the iterator's sequence number
# directly when the keys are 1..n; anything else is moto's walk.

_moto_shard_get_records = Shard.get_records


def _shard_max(self: Shard) -> int:
    return next(reversed(self.records)) if self.records else 0


def _shard_min(self: Shard) -> int:
    return next(iter(self.records)) if self.records else 0


def _shard_get_records(self: Shard, last_sequence_id: str, limit: int | None) -> tuple[list[Any], int, int]:
    records, n = self.records, len(self.records)
    if (not (limit is None or (type(limit) is int and limit > 0)) or not n
            or next(iter(records)) != 1 or next(reversed(records)) != n):
        return _moto_shard_get_records(self, last_sequence_id, limit)
    last = int(last_sequence_id)
    first = max(last, 0) + 1
    stop = n if limit is None else min(n, first + limit - 1)
    results = [records[seq] for seq in range(first, stop + 1)]
    if not results:
        return [], last, 0
    behind = records[n].created_at - results[-1].created_at  # as moto: newest minus last returned
    return results, results[-1].sequence_number, int(behind * 1000)


# --- DynamoDB: cancelled transactions roll back in place ---------------------------------------

_moto_transact_write_items = DynamoDBBackend.transact_write_items


def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    """moto's, but a cancelled one puts back the items it names and the streams' lengths."""
    items: dict[tuple[int, DynamoType, DynamoType | None], tuple[Table, Any]] = {}
    shards: dict[int, tuple[Any, int]] = {}
    for entry in transact_items if isinstance(transact_items, list) else []:
        for op_type, op in entry.items() if isinstance(entry, dict) else []:
            try:
                table = self.get_table(op["TableName"])  # a name or an ARN
                attrs = op["Item" if op_type == "Put" else "Key"]
                hash_key = DynamoType(attrs[table.hash_key_attr])
                range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
            except Exception:  # noqa: BLE001 - malformed or unknown: moto rejects it, writing nothing
                continue
            if (id(table), hash_key, range_key) not in items:
                bucket = table.items.get(hash_key)  # .get: table.items is a defaultdict
                item = bucket if range_key is None else (bucket or {}).get(range_key)
                # A deep copy: UpdateItem changes the stored Item in place.
                items[(id(table), hash_key, range_key)] = (table, copy.deepcopy(item))
            if table.stream_shard is not None:
                shards.setdefault(id(table), (table.stream_shard, len(table.stream_shard.items)))
    try:
        return _moto_transact_write_items(self, transact_items)
    except BaseException:
        for (_, hash_key, range_key), (table, item) in items.items():
            if range_key is None:
                bucket, key = table.items, hash_key
            else:
                bucket, key = table.items.setdefault(hash_key, {}), range_key
            if item is not None:
                bucket[key] = item
            else:
                bucket.pop(key, None)
                if range_key is not None and not bucket:
                    table.items.pop(hash_key, None)
        for shard, length in shards.values():
            del shard.items[length:]
        raise


def _deepcopy_except_tables(x: Any, memo: dict[int, Any] | None = None) -> Any:
    # In moto.dynamodb.models only transact_write_items deep-copies Table objects: its backup of
    # each table. With the table itself as the "backup", its rollback (`self.tables[name] =
    # backup`) changes nothing, and transact_write_items above restores the items instead.
    return x if isinstance(x, Table) else copy.deepcopy(x, memo)


# --- DynamoDB: a Query reads its partition -----------------------------------------------------
# moto's Table.query picks the queried partition's items out of `all_items()`: every item of the
# table, sorted, for every Query (most of the fallback test suite's time; seconds per Query once
# a run has written some ten thousand items). While a base-table Query runs (requests are
# serialised), all_items answers with that partition only, in the same order.

_moto_query, _moto_all_items = Table.query, Table.all_items
_queried: list[Any] = [None]  # (table, hash key) of the base-table Query running


def _query(self: Table, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
    index_name = kwargs["index_name"] if "index_name" in kwargs else args[6] if len(args) > 6 else None
    _queried[0] = (self, hash_key) if hash_key is not None and not index_name else None
    try:
        return _moto_query(self, hash_key, *args, **kwargs)
    finally:
        _queried[0] = None


def _all_items(self: Table) -> list[Any]:
    if _queried[0] is None or _queried[0][0] is not self:
        return _moto_all_items(self)
    partition = self.items.get(_queried[0][1])  # .get: table.items is a defaultdict
    if partition is None:
        return []
    return sorted(partition.values(), key=lambda item: item.range_key) if self.range_key_attr else [partition]


def patch_moto() -> None:
    if moto.__version__ != MOTO_VERSION:
        sys.exit(f"moto_server.py: needs moto {MOTO_VERSION}, found {moto.__version__} "
                 "(run infra/setup.sh and use <repo>/.venv/bin/python)")
    KinesisBackend.put_records = put_records_with_faults(KinesisBackend.put_records)  # type: ignore[method-assign]
    Shard.get_records = _shard_get_records  # type: ignore[method-assign]
    Shard.get_max_sequence_number = _shard_max  # type: ignore[method-assign]
    Shard.get_min_sequence_number = _shard_min  # type: ignore[method-assign]
    copy_shim = types.ModuleType("copy")
    copy_shim.__dict__.update(copy.__dict__)
    copy_shim.deepcopy = _deepcopy_except_tables  # type: ignore[attr-defined]
    ddb_models.copy = copy_shim  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    Table.query, Table.all_items = _query, _all_items  # type: ignore[method-assign]

    def get_records(self: DynamoDBStreamsBackend, iterator_arn: str, limit: int) -> Any:
        return self.shard_iterators.pop(iterator_arn).get(limit)

    DynamoDBStreamsBackend.get_records = get_records  # type: ignore[method-assign]
    moto.core.responses.method_names_from_class = functools.lru_cache(maxsize=None)(
        moto.core.responses.method_names_from_class)
    list_modules = moto.backends.list_of_moto_modules
    moto.backends.list_of_moto_modules = functools.lru_cache(maxsize=None)(lambda: tuple(list_modules()))


# --- main --------------------------------------------------------------------------------------

def make_app() -> Serialized:
    """The WSGI app (after patch_moto)."""
    return Serialized(DomainDispatcherApplication(create_backend_app))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4566, help="0 picks a free port")
    parser.add_argument("--template", help="create this template's tables, streams and queues at start")
    parser.add_argument("--region", default="us-east-1", help="region of the created resources")
    parser.add_argument("--log-requests", action="store_true", help="log every request to stderr")
    parser.add_argument("--exit-with-stdin", action="store_true",
                        help="exit when stdin closes (a test harness dies, its emulator goes too)")
    args = parser.parse_args(argv)

    patch_moto()
    if not args.log_requests:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    werkzeug.serving.BaseWSGIServer.request_queue_size = LISTEN_BACKLOG
    server = make_server(args.host, args.port, make_app(), threaded=True)
    port = server.server_port
    os.environ["MOTO_PORT"] = str(port)  # moto builds some URLs with it
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    # SIGTERM, like SIGINT, raises KeyboardInterrupt in the main thread (no locks in the handler).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()
    if args.exit_with_stdin:
        def watch_stdin() -> None:
            sys.stdin.buffer.read()  # returns at EOF
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
    try:
        if args.template:
            create_resources(url, args.template, args.region,
                             log=lambda msg: print(msg, file=sys.stderr, flush=True))
        print(f"READY {url}", flush=True)
        while True:  # a signal interrupts the sleep; timed, in case another thread took the signal
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
