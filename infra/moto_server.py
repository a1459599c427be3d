#!/usr/bin/env python3
"""Local DynamoDB / DynamoDB Streams / Kinesis emulator: moto's server app with fixes.

    python infra/moto_server.py [--host 127.0.0.1] [--port 4566] [--template template.yaml]
                                [--region us-east-1] [--log-requests]

Runs moto's server app in-process (all services on one port; `POST /moto-api/reset` clears all
state) with these fixes for moto 5.2.5's server mode:

* Requests are processed one at a time. moto has no locking, so concurrent conditional writes
  race (two "successful" attribute_not_exists puts, lost updates). The HTTP server stays threaded,
  and request bodies are read before taking the lock, so a slow client cannot stall the others.
* TransactWriteItems rolls back in place. moto applies the writes one by one, and on a cancelled
  transaction swaps in a deep copy of each table taken beforehand; that copy has a new stream shard
  object, so shard iterators taken earlier keep reading the old shard (which holds the cancelled
  writes' records) and never see new records, and every transaction deep-copies whole tables.
  Here only the items a transaction touches are saved and restored, its stream records are removed,
  and the Table and shard objects stay the same.
* UpdateItem that creates an item emits one INSERT stream record (moto emits a key-only INSERT,
  then a second INSERT with the full item), and a failed UpdateItem leaves nothing behind.
* moto's per-request listing of its own package directory is cached (a quarter of its time).

Once listening, and after the template's tables and streams exist (--template, see
create_resources.py), prints exactly one line `READY http://HOST:PORT` to stdout. Serves until
SIGTERM/SIGINT. `--port 0` picks a free port.
"""
from __future__ import annotations

import argparse
import copy
import functools
import io
import logging
import os
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Iterable

import moto
from moto.dynamodbstreams.models import DynamoDBStreamsBackend
import moto.backends
import moto.dynamodb.models as ddb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server
from werkzeug.wsgi import get_input_stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from create_resources import create_resources  # noqa: E402

# The patches below rely on moto internals (see the docstring); re-check them before changing this.
MOTO_VERSION = "5.2.5"


# --- one request at a time --------------------------------------------------------------------

class Serialized:
    """WSGI middleware running the wrapped app for one request at a time."""

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
        with self.lock:
            result = self.app(environ, start_response)
            try:
                # Produce the whole response under the lock; it is sent after releasing it.
                return list(result)
            finally:
                if hasattr(result, "close"):
                    result.close()


# --- in-place undo of writes ------------------------------------------------------------------

class Undo:
    """Saves items of DynamoDB tables and the length of their stream shards, so that writes to
    those items can be undone in place, leaving no stream records behind."""

    def __init__(self) -> None:
        self.items: dict[tuple[int, DynamoType, DynamoType | None], tuple[Table, Any]] = {}
        self.shards: dict[int, tuple[Any, int]] = {}

    def save(self, table: Table, attrs: Any) -> None:
        """Saves the item with the key in `attrs` (a Key or a whole Item, in DynamoDB JSON)."""
        try:
            hash_key = DynamoType(attrs[table.hash_key_attr])
            range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
        except (KeyError, TypeError, AttributeError):
            return  # malformed: moto rejects it without writing
        key = (id(table), hash_key, range_key)
        if key not in self.items:
            if range_key is None:
                item = table.items.get(hash_key)
            else:
                item = table.items.get(hash_key, {}).get(range_key)
            # Deep copy: UpdateItem changes the stored Item object in place.
            self.items[key] = (table, copy.deepcopy(item))
        if table.stream_shard is not None and id(table) not in self.shards:
            self.shards[id(table)] = (table.stream_shard, len(table.stream_shard.items))

    def restore(self) -> None:
        for (_, hash_key, range_key), (table, item) in self.items.items():
            if range_key is None:
                bucket, key = table.items, hash_key
            else:
                bucket, key = table.items.setdefault(hash_key, {}), range_key
            if item is None:
                bucket.pop(key, None)
                if range_key is not None and not bucket:
                    table.items.pop(hash_key, None)
            else:
                bucket[key] = item
        for shard, length in self.shards.values():
            del shard.items[length:]


def _table(backend: DynamoDBBackend, name: Any) -> Table | None:
    try:
        return backend.get_table(name)
    except Exception:  # unknown table: moto reports it, nothing gets written
        return None


_moto_transact_write_items = DynamoDBBackend.transact_write_items
_moto_update_item = DynamoDBBackend.update_item


def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    undo = Undo()
    for entry in transact_items if isinstance(transact_items, list) else []:
        for op_type, op in entry.items():
            table = _table(self, op.get("TableName")) if isinstance(op, dict) else None
            if table is not None:
                undo.save(table, op.get("Item" if op_type == "Put" else "Key"))
    try:
        # moto's code writes as it goes; its whole-table backup is disabled (see below).
        return _moto_transact_write_items(self, transact_items)
    except BaseException:
        undo.restore()
        raise


def update_item(self: DynamoDBBackend, table_name: str, key: Any, *args: Any, **kwargs: Any) -> Any:
    table = _table(self, table_name)
    undo = Undo()
    if table is not None:
        undo.save(table, key)
    try:
        item = _moto_update_item(self, table_name, key, *args, **kwargs)
    except BaseException:
        undo.restore()
        raise
    # Creating an item, moto first puts the bare key (an INSERT record), then records the update
    # as another INSERT: keep only the second record, under the first one's sequence number.
    for shard, length in undo.shards.values():
        added = shard.items[length:]
        if len(added) == 2 and all(r.record["eventName"] == "INSERT" for r in added):
            added[1].record["dynamodb"]["SequenceNumber"] = added[0].record["dynamodb"]["SequenceNumber"]
            del shard.items[length]
    return item


def _deepcopy_except_tables(x: Any, memo: dict[int, Any] | None = None) -> Any:
    # In moto.dynamodb.models only transact_write_items deep-copies Table objects: its backup of
    # each table. With the table itself as "backup", moto's rollback (`self.tables[name] = backup`)
    # is a no-op, and our wrapper restores the touched items instead.
    return x if isinstance(x, Table) else copy.deepcopy(x, memo)


def patch_moto() -> None:
    if moto.__version__ != MOTO_VERSION:
        sys.exit(f"moto_server.py: needs moto {MOTO_VERSION}, found {moto.__version__} "
                 "(run infra/setup.sh and use <repo>/.venv/bin/python)")
    copy_shim = types.ModuleType("copy")
    copy_shim.__dict__.update(copy.__dict__)
    copy_shim.deepcopy = _deepcopy_except_tables  # type: ignore[attr-defined]
    ddb_models.copy = copy_shim  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    DynamoDBBackend.update_item = update_item  # type: ignore[method-assign]
    # moto keeps every DynamoDB Streams iterator forever (~2 KB per poll, ~70 MB/h at 10 polls/s).
    # Each GetRecords answer carries the next iterator, so a used one is dropped; AWS would keep it
    # 15 minutes, which only matters to a client that re-reads from an old iterator.
    def get_records(self, iterator_arn: str, limit: int) -> dict:
        return self.shard_iterators.pop(iterator_arn).get(limit)

    DynamoDBStreamsBackend.get_records = get_records  # type: ignore[method-assign]
    # moto lists its package directory to route every request: a quarter of its time per request.
    list_modules = moto.backends.list_of_moto_modules
    moto.backends.list_of_moto_modules = functools.lru_cache(maxsize=None)(lambda: tuple(list_modules()))


# --- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4566, help="0 picks a free port")
    parser.add_argument("--template", help="create this template's tables and streams at start")
    parser.add_argument("--region", default="us-east-1", help="region of the created resources")
    parser.add_argument("--log-requests", action="store_true", help="log every request to stderr")
    parser.add_argument("--exit-with-stdin", action="store_true",
                        help="exit when stdin closes (a test harness dies, its emulator goes too)")
    args = parser.parse_args(argv)

    patch_moto()
    if not args.log_requests:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    app = Serialized(DomainDispatcherApplication(create_backend_app))
    server = make_server(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)
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
