#!/usr/bin/env python3
"""Local DynamoDB / DynamoDB Streams / Kinesis emulator: moto's server app with fixes.

    python infra/moto_server.py [--host 127.0.0.1] [--port 4566] [--template template.yaml]
                                [--region us-east-1] [--log-requests] [--exit-with-stdin]
                                [--tx-window-ms 10] [--gsi-lag-ms 0]

Runs moto's server app in-process (all services on one port; `POST /moto-api/reset` clears all
state) with these fixes for moto 5.2.5's server mode (always on):

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
* TransactWriteItems honours ClientRequestToken (moto ignores it): a repeat with the same token
  within 10 minutes of a successful call returns success without applying it again; with other
  parameters it fails with IdempotentParameterMismatchException; while the first call is still
  in its transaction window (below) with TransactionInProgressException. A cancelled call does
  not use up its token.
* moto's per-request listing of its own package directory is cached (a quarter of its time).

and these simulations of DynamoDB behaviour that moto lacks (switchable):

* Transaction conflicts, on by default: `--tx-window-ms N` / env `CHAT_EMULATOR_TX_WINDOW_MS`
  (default 10, about DynamoDB's transactional write latency; 0 turns it off). The items of a
  successful TransactWriteItems (Put, Update, Delete and ConditionCheck; key = table, hash and
  range key) stay "in a transaction" for N ms after it is applied, and its response is sent at
  the end of that window; the window does not hold the request lock. Meanwhile, as the DynamoDB
  developer guide describes ("Transaction conflict handling"): another TransactWriteItems or a
  TransactGetItems touching one of them is cancelled (TransactionCanceledException, reason code
  `TransactionConflict` for those items and `None` for the others); PutItem, UpdateItem and
  DeleteItem on one of them fail with TransactionConflictException; a BatchWriteItem applies its
  other requests and returns the conflicting ones in UnprocessedItems (its individual writes are
  serializable with transactions, and TransactionConflictException is not among its errors);
  GetItem, BatchGetItem, Query and Scan succeed and see the committed items. Cancelled
  transactions mark nothing. PartiQL statements are not checked.
* Eventually consistent global secondary indexes, off by default: `--gsi-lag-ms M` / env
  `CHAT_EMULATOR_GSI_LAG_MS` (default 0 = off). A Query or Scan with the IndexName of a GSI sees
  the table as it was M ms ago (puts, updates and deletes alike); base tables and local indexes
  are unaffected. Only committed writes reach the index: cancelled transactions and failed
  conditional writes never show. Writes made while the lag was 0 are visible at once.

Both can also be changed while running: `POST /moto-api/chat/config` with JSON
`{"txWindowMs": N, "gsiLagMs": M}` (either key optional) answers the current settings as JSON, and
so does `GET /moto-api/chat/config`. `POST /moto-api/reset` also clears the items in a
transaction window, the request tokens and the index copies; it keeps these settings.

Once listening, and after the template's tables and streams exist (--template, see
create_resources.py), prints exactly one line `READY http://HOST:PORT` to stdout. Serves until
SIGTERM/SIGINT. `--port 0` picks a free port.
"""
from __future__ import annotations

import argparse
import collections
import copy
import functools
import hashlib
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
from moto.dynamodbstreams.models import DynamoDBStreamsBackend
import moto.backends
import moto.dynamodb.models as ddb_models
from moto.core.responses import ActionResult
from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException, TransactionCanceledException
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoHandler
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

TX_WINDOW_ENV, GSI_LAG_ENV = "CHAT_EMULATOR_TX_WINDOW_MS", "CHAT_EMULATOR_GSI_LAG_MS"
DEFAULT_TX_WINDOW_MS, DEFAULT_GSI_LAG_MS = 10, 0
CONFIG_PATH = "/moto-api/chat/config"
TOKEN_TTL_S = 600  # DynamoDB: a ClientRequestToken is valid for 10 minutes after the call ends


# --- simulation state -------------------------------------------------------------------------
# Everything below is read and written only by request threads holding Serialized.lock.

ItemKey = tuple[str, DynamoType, "DynamoType | None"]  # (table ARN, hash key, range key)


def item_key(table: Table, attrs: Any) -> ItemKey | None:
    """The key of the item that `attrs` (a Key or a whole Item, in DynamoDB JSON) names."""
    try:
        hash_key = DynamoType(attrs[table.hash_key_attr])
        range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
    except (KeyError, TypeError, AttributeError):
        return None  # malformed: moto rejects it without writing
    return (table.table_arn, hash_key, range_key)


def stored_item(table: Table, hash_key: DynamoType, range_key: DynamoType | None) -> Any:
    # .get, not []: table.items is a defaultdict, and a lookup must not add empty buckets.
    return table.items.get(hash_key) if range_key is None else table.items.get(hash_key, {}).get(range_key)


class InFlight:
    """Items of committed transactions still inside their transaction window."""

    def __init__(self) -> None:
        self.until: dict[ItemKey, float] = {}  # key -> end of its window (time.monotonic())
        self.expiry: collections.deque[tuple[float, ItemKey]] = collections.deque()

    def mark(self, keys: Iterable[ItemKey], until: float) -> None:
        for key in keys:
            self.until[key] = max(until, self.until.get(key, 0.0))
            self.expiry.append((until, key))

    def busy(self, key: ItemKey | None) -> bool:
        now = time.monotonic()
        # Windows end in about the order they start, so expired entries are at the front.
        while self.expiry and self.expiry[0][0] <= now:
            _, old = self.expiry.popleft()
            if self.until.get(old, now) <= now:
                self.until.pop(old, None)
        return key is not None and self.until.get(key, 0.0) > now


class Tokens:
    """ClientRequestTokens of successful TransactWriteItems calls, oldest first."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, float]] = {}  # token -> (request digest, end of the call)

    def get(self, token: str) -> tuple[str, float] | None:
        now = time.monotonic()
        while self.calls:
            oldest = next(iter(self.calls))
            if self.calls[oldest][1] + TOKEN_TTL_S > now:
                break
            del self.calls[oldest]
        return self.calls.get(token)

    def add(self, token: str, digest: str, ends: float) -> None:
        self.calls.pop(token, None)  # re-inserted at the end, keeping the dict in time order
        self.calls[token] = (digest, ends)


class Shadow:
    """The items a table's global secondary indexes see: the table as it was `lag` ms ago.

    Made as a copy of the table's items before the first write that happens while a lag is set;
    then each committed write appends (time, key, copy of the new item or None) to `pending`,
    which index reads apply up to `now - lag` before running against `items`."""

    def __init__(self, table: Table):
        self.table = table
        self.items = copy.deepcopy(table.items)
        self.pending: collections.deque[tuple[float, DynamoType, DynamoType | None, Any]] = collections.deque()

    def record(self, hash_key: DynamoType, range_key: DynamoType | None) -> None:
        item = stored_item(self.table, hash_key, range_key)
        # A copy: UpdateItem changes the stored Item object in place.
        self.pending.append((time.monotonic(), hash_key, range_key, copy.deepcopy(item)))

    def catch_up(self, lag_s: float) -> None:
        cutoff = time.monotonic() - lag_s
        while self.pending and self.pending[0][0] <= cutoff:
            _, hash_key, range_key, item = self.pending.popleft()
            if range_key is None:
                bucket, key = self.items, hash_key
            else:
                bucket, key = self.items[hash_key], range_key
            if item is None:
                bucket.pop(key, None)
            else:
                bucket[key] = item


class Simulation:
    """Settings and state of the transaction-window and index-lag simulations."""

    def __init__(self, tx_window_ms: float, gsi_lag_ms: float):
        self.tx_window_ms = tx_window_ms
        self.gsi_lag_ms = gsi_lag_ms
        self.reset()

    def reset(self) -> None:
        self.in_flight = InFlight()
        self.tokens = Tokens()
        self.shadows: dict[int, Shadow] = {}  # id(table) -> its shadow

    def settings(self) -> dict[str, float]:
        return {"txWindowMs": self.tx_window_ms, "gsiLagMs": self.gsi_lag_ms}

    def configure(self, tx_window_ms: float | None = None, gsi_lag_ms: float | None = None) -> None:
        if tx_window_ms is not None:
            self.tx_window_ms = tx_window_ms
            if not tx_window_ms:
                self.in_flight = InFlight()
        if gsi_lag_ms is not None:
            self.gsi_lag_ms = gsi_lag_ms
            if not gsi_lag_ms:
                self.shadows.clear()  # the indexes are up to date again

    # Writes call before_write for each table they may change, then after_write with the keys of
    # a committed write; failed writes never call after_write.

    def before_write(self, table: Table | None) -> None:
        if self.gsi_lag_ms and table is not None and table.global_indexes:
            self.shadow(table)

    def after_write(self, table: Table | None, keys: Iterable[ItemKey | None]) -> None:
        shadow = self.shadows.get(id(table)) if self.gsi_lag_ms and table is not None else None
        if shadow is not None and shadow.table is table:
            for key in keys:
                if key is not None:
                    shadow.record(key[1], key[2])

    def shadow(self, table: Table) -> Shadow:
        shadow = self.shadows.get(id(table))
        if shadow is None or shadow.table is not table:  # none yet, or a deleted table's
            shadow = self.shadows[id(table)] = Shadow(table)
        return shadow


SIM = Simulation(DEFAULT_TX_WINDOW_MS, DEFAULT_GSI_LAG_MS)

# When the current request's response may be sent (the end of its transaction window).
_request = threading.local()


class TransactionConflictException(DynamodbException):
    def __init__(self) -> None:
        super().__init__(ERROR_TYPE_PREFIX + "TransactionConflictException", "Transaction is ongoing for the item")


class IdempotentParameterMismatchException(DynamodbException):
    def __init__(self) -> None:
        super().__init__(ERROR_TYPE_PREFIX + "IdempotentParameterMismatchException",
                         "The request uses the same client token as a previous, but non-identical request.")


class TransactionInProgressException(DynamodbException):
    def __init__(self) -> None:
        super().__init__(ERROR_TYPE_PREFIX + "TransactionInProgressException",
                         "The transaction with the given request token is already in progress.")


def conflict_cancellation(busy: list[bool]) -> TransactionCanceledException:
    return TransactionCanceledException(
        [("TransactionConflict", "Transaction is ongoing for the item", None) if b else (None, None, None)
         for b in busy])


# --- one request at a time --------------------------------------------------------------------

class Serialized:
    """WSGI middleware running the wrapped app for one request at a time. Also serves
    CONFIG_PATH and clears the simulation state on `POST /moto-api/reset`."""

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
        with self.lock:
            _request.send_at = None
            if path == CONFIG_PATH:
                return config_response(method, body, start_response)
            if path == "/moto-api/reset" and method == "POST":
                SIM.reset()
            result = self.app(environ, start_response)
            try:
                # Produce the whole response under the lock; it is sent after releasing it.
                response = list(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        # A committed transaction answers at the end of its window; other requests run meanwhile.
        if _request.send_at is not None:
            time.sleep(max(0.0, _request.send_at - time.monotonic()))
        return response


def config_response(method: str, body: bytes, start_response: Callable[..., Any]) -> list[bytes]:
    status = "200 OK"
    if method == "POST":
        try:
            SIM.configure(**parse_config(body))
        except ValueError as e:
            status, answer = "400 Bad Request", {"message": str(e)}
    elif method != "GET":
        status, answer = "405 Method Not Allowed", {"message": "use GET or POST"}
    if status == "200 OK":
        answer = SIM.settings()
    data = json.dumps(answer).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def parse_config(body: bytes) -> dict[str, float]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        raise ValueError("body is not JSON") from None
    names = {"txWindowMs": "tx_window_ms", "gsiLagMs": "gsi_lag_ms"}
    if not isinstance(doc, dict) or set(doc) - set(names):
        raise ValueError(f"expected a JSON object with keys among {sorted(names)}")
    return {names[k]: milliseconds(v, k) for k, v in doc.items()}


def milliseconds(value: Any, what: str) -> float:
    """A duration in ms: a non-negative finite number (int when whole), or a string of one."""
    try:
        if isinstance(value, bool):
            raise ValueError
        ms = float(value)
        if not 0 <= ms < float("inf"):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a number of milliseconds >= 0, got {value!r}") from None
    return int(ms) if ms.is_integer() else ms


# --- in-place undo of writes ------------------------------------------------------------------

class Undo:
    """Saves items of DynamoDB tables and the length of their stream shards, so that writes to
    those items can be undone in place, leaving no stream records behind."""

    def __init__(self) -> None:
        self.items: dict[tuple[int, DynamoType, DynamoType | None], tuple[Table, Any]] = {}
        self.shards: dict[int, tuple[Any, int]] = {}

    def save(self, table: Table, attrs: Any) -> None:
        """Saves the item with the key in `attrs` (a Key or a whole Item, in DynamoDB JSON)."""
        key = item_key(table, attrs)
        if key is None:
            return  # malformed: moto rejects it without writing
        _, hash_key, range_key = key
        if (id(table), hash_key, range_key) not in self.items:
            # Deep copy: UpdateItem changes the stored Item object in place.
            self.items[(id(table), hash_key, range_key)] = (table, copy.deepcopy(stored_item(table, hash_key, range_key)))
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


# --- backend patches --------------------------------------------------------------------------

_moto_transact_write_items = DynamoDBBackend.transact_write_items
_moto_update_item = DynamoDBBackend.update_item


def transact_items_keys(backend: DynamoDBBackend, transact_items: Any) -> list[tuple[str, Table | None, Any]]:
    """(operation, table, key attrs) of each entry of TransactItems; table None if unknown."""
    out = []
    for entry in transact_items if isinstance(transact_items, list) else []:
        for op_type, op in (entry.items() if isinstance(entry, dict) else []):
            table = _table(backend, op.get("TableName")) if isinstance(op, dict) else None
            out.append((op_type, table, op.get("Item" if op_type == "Put" else "Key") if table else None))
    return out


def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    ops = transact_items_keys(self, transact_items)
    keys = [item_key(table, attrs) if table else None for _, table, attrs in ops]
    if SIM.tx_window_ms:
        busy = [SIM.in_flight.busy(key) for key in keys]
        if any(busy):
            raise conflict_cancellation(busy)
    undo = Undo()
    for _, table, attrs in ops:
        if table is not None:
            undo.save(table, attrs)
            SIM.before_write(table)
    try:
        # moto's code writes as it goes; its whole-table backup is disabled (see below).
        result = _moto_transact_write_items(self, transact_items)
    except BaseException:
        undo.restore()
        raise
    for (op_type, table, _), key in zip(ops, keys):
        if op_type != "ConditionCheck":
            SIM.after_write(table, [key])
    if SIM.tx_window_ms:
        send_at = time.monotonic() + SIM.tx_window_ms / 1000
        SIM.in_flight.mark((k for k in keys if k is not None), send_at)
        _request.send_at = send_at
    return result


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


# --- request handler patches (one call per API request; moto's transactions do not call them) ---

_moto_handler = {name: getattr(DynamoHandler, name) for name in (
    "put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items",
    "transact_get_items", "query", "scan")}


def _single_write(name: str, attrs_field: str) -> Callable[[DynamoHandler], Any]:
    """PutItem / UpdateItem / DeleteItem: TransactionConflictException on an item in a window."""
    moto_method = _moto_handler[name]

    def handler(self: DynamoHandler) -> Any:
        table = _table(self.dynamodb_backend, self.body.get("TableName"))
        key = item_key(table, self.body.get(attrs_field)) if table else None
        if SIM.tx_window_ms and SIM.in_flight.busy(key):
            raise TransactionConflictException()
        SIM.before_write(table)
        result = moto_method(self)
        SIM.after_write(table, [key])
        return result

    handler.__name__ = name
    return handler


def batch_write_item(self: DynamoHandler) -> Any:
    requests = self.body.get("RequestItems")
    if not isinstance(requests, dict):
        return _moto_handler["batch_write_item"](self)
    backend = self.dynamodb_backend
    kept: dict[str, list[Any]] = {}
    unprocessed: dict[str, list[Any]] = {}
    written: list[tuple[Table, ItemKey | None]] = []
    for table_name, table_requests in requests.items():
        table = _table(backend, table_name)
        for request in table_requests if isinstance(table_requests, list) else []:
            key = None
            if table is not None and isinstance(request, dict):
                put, delete = request.get("PutRequest"), request.get("DeleteRequest")
                attrs = put.get("Item") if isinstance(put, dict) else delete.get("Key") if isinstance(delete, dict) else None
                key = item_key(table, attrs)
            if SIM.tx_window_ms and SIM.in_flight.busy(key):
                unprocessed.setdefault(table_name, []).append(request)
            else:
                kept.setdefault(table_name, []).append(request)
                if table is not None:
                    written.append((table, key))
                    SIM.before_write(table)
    if unprocessed:
        self.body = {**self.body, "RequestItems": kept}
    try:
        result = _moto_handler["batch_write_item"](self)
    finally:
        # moto writes request by request and may fail half-way: record whatever the items now are
        # (for an unchanged item that is a no-op in the index copy).
        for table, key in written:
            SIM.after_write(table, [key])
    if unprocessed:
        result.result["UnprocessedItems"] = unprocessed
    return result


def request_digest(body: dict[str, Any]) -> str:
    params = {k: v for k, v in body.items() if k != "ClientRequestToken"}
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


def transact_write_items_handler(self: DynamoHandler) -> Any:
    token = self.body.get("ClientRequestToken")
    if isinstance(token, str):
        digest = request_digest(self.body)
        previous = SIM.tokens.get(token)
        if previous is not None:
            previous_digest, ends = previous
            if previous_digest != digest:
                raise IdempotentParameterMismatchException()
            if ends > time.monotonic():
                raise TransactionInProgressException()
            return ActionResult({"ConsumedCapacity": [], "ItemCollectionMetrics": {}})
    result = _moto_handler["transact_write_items"](self)
    if isinstance(token, str):
        SIM.tokens.add(token, digest, getattr(_request, "send_at", None) or time.monotonic())
    return result


def transact_get_items(self: DynamoHandler) -> Any:
    if SIM.tx_window_ms:
        backend, busy = self.dynamodb_backend, []
        for entry in self.body.get("TransactItems") or []:
            get = entry.get("Get") if isinstance(entry, dict) else None
            table = _table(backend, get.get("TableName")) if isinstance(get, dict) else None
            busy.append(SIM.in_flight.busy(item_key(table, get.get("Key")) if table else None))
        if any(busy):
            raise conflict_cancellation(busy)
    return _moto_handler["transact_get_items"](self)


def _index_read(name: str) -> Callable[[DynamoHandler], Any]:
    """Query / Scan: on a global secondary index, run against the table's lagging copy."""
    moto_method = _moto_handler[name]

    def handler(self: DynamoHandler) -> Any:
        index_name = self.body.get("IndexName")
        table = _table(self.dynamodb_backend, self.body.get("TableName")) if index_name and SIM.gsi_lag_ms else None
        if table is None or index_name not in {i.name for i in table.global_indexes or []}:
            return moto_method(self)
        shadow = SIM.shadow(table)
        shadow.catch_up(SIM.gsi_lag_ms / 1000)
        items, table.items = table.items, shadow.items
        try:
            return moto_method(self)
        finally:
            table.items = items

    handler.__name__ = name
    return handler


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
    # moto dispatches a request to the DynamoHandler method named after its action.
    DynamoHandler.put_item = _single_write("put_item", "Item")  # type: ignore[method-assign]
    DynamoHandler.update_item = _single_write("update_item", "Key")  # type: ignore[method-assign]
    DynamoHandler.delete_item = _single_write("delete_item", "Key")  # type: ignore[method-assign]
    DynamoHandler.batch_write_item = batch_write_item  # type: ignore[method-assign]
    DynamoHandler.transact_write_items = transact_write_items_handler  # type: ignore[method-assign]
    DynamoHandler.transact_get_items = transact_get_items  # type: ignore[method-assign]
    DynamoHandler.query = _index_read("query")  # type: ignore[method-assign]
    DynamoHandler.scan = _index_read("scan")  # type: ignore[method-assign]
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

def settings_from(args: argparse.Namespace, env: dict[str, str]) -> dict[str, float]:
    """The simulation settings: a flag wins over its env var, which wins over the default."""
    out = {}
    for name, flag, var, default in (("tx_window_ms", "--tx-window-ms", TX_WINDOW_ENV, DEFAULT_TX_WINDOW_MS),
                                     ("gsi_lag_ms", "--gsi-lag-ms", GSI_LAG_ENV, DEFAULT_GSI_LAG_MS)):
        value, what = getattr(args, name), flag
        if value is None and env.get(var, "").strip():
            value, what = env[var], var
        out[name] = default if value is None else milliseconds(value, what)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4566, help="0 picks a free port")
    parser.add_argument("--template", help="create this template's tables and streams at start")
    parser.add_argument("--region", default="us-east-1", help="region of the created resources")
    parser.add_argument("--log-requests", action="store_true", help="log every request to stderr")
    parser.add_argument("--exit-with-stdin", action="store_true",
                        help="exit when stdin closes (a test harness dies, its emulator goes too)")
    parser.add_argument("--tx-window-ms", metavar="MS", help=f"transaction window in ms; 0 = no conflicts "
                        f"(default: ${TX_WINDOW_ENV} or {DEFAULT_TX_WINDOW_MS})")
    parser.add_argument("--gsi-lag-ms", metavar="MS", help=f"global secondary index lag in ms; 0 = none "
                        f"(default: ${GSI_LAG_ENV} or {DEFAULT_GSI_LAG_MS})")
    args = parser.parse_args(argv)
    try:
        SIM.configure(**settings_from(args, dict(os.environ)))
    except ValueError as e:
        parser.error(str(e))

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
