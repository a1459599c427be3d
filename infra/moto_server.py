#!/usr/bin/env python3
"""Local DynamoDB / DynamoDB Streams / Kinesis emulator: moto's server app with fixes.

    python infra/moto_server.py [--host 127.0.0.1] [--port 4566] [--template template.yaml]
                                [--region us-east-1] [--log-requests] [--exit-with-stdin]
                                [--tx-window-ms 10] [--gsi-lag-ms 0] [--fast-path on]

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
* moto's per-request listing of its own package directory is cached (a quarter of its time), and
  so is its per-request listing of a handler class's methods (inspect.getmembers).
* A Query of the table reads only the queried partition. moto sorts every item of the table for
  every Query, so a Query's cost grew with the whole table (seconds per call once a benchmark or
  a long test run had written a few ten thousand items); DynamoDB reads one item collection.

these speed-ups, which give the same answers as moto's own code (the tests send requests both
ways and compare status, headers and bytes). On the chat backend's mix of requests moto alone
spent ~7 ms of CPU per request (100-140 requests/s from 8 clients), with them ~2.5 ms (~350/s;
infra/emulator_load.py):

* DynamoDB, DynamoDB Streams and Kinesis requests (POST / with X-Amz-Target, signed for dynamodb
  or kinesis, no Origin header) go straight to the handler moto's dispatcher would pick for them
  (it is asked once per credential scope and target prefix), skipping the dispatcher and Flask;
  the response is built as moto's Flask view and flask-cors build it. Everything else takes
  moto's way (moto-api, other services, CORS requests).
* Their responses are serialized by a copy of moto's JSON serializer compiled per output shape.
  moto asks six alias providers for every member of every structure, ten per AttributeValue:
  80 % of a 20-item Query. Same bytes; results it does not expect go to moto's serializer.
* HTTP/1.1 keep-alive: werkzeug's server closes every connection after one response (a new TCP
  connection and thread per request, and a 10 ms drain wait). Here a connection stays open when
  the request had a Content-Length body, which the serialising middleware always reads whole;
  chunked requests and HTTP/1.0 close as before. A response goes out in one write (TCP_NODELAY).
* Update expressions are parsed once per text (moto parses each one twice per update, and never
  changes the parsed tree), condition expressions lexed once per text; a tree is copied for
  validation by a copier for plain syntax trees instead of copy.deepcopy, and moto's tree
  traversers keep their constant node-class dispatch map instead of rebuilding it per node.
* An update that only sets top-level attributes to values (`SET a = :x, #b = :y`: a read
  receipt, a commit's conversation item) is applied without moto's expression tree: moto copies
  the tree and runs ten validating traversers over it, a third of an UpdateItem's time. Only
  when none of those validators could object (no key, defined or index attribute, no reserved
  word, no repeated name, every placeholder given); anything else is moto's update.
* A Kinesis PutRecord finds a shard's last sequence number at the end of its records, and
  GetRecords reads the records after the iterator's position directly: moto listed every record
  of the shard for each (both grew with all the stream ever carried).
* The access-log line is formatted only when it is logged (`--log-requests`), the Date header
  once a second.
* A Query sorts the partition by the sort key's string when all are strings: the order of
  moto's DynamoType comparison, without its cost per comparison; and it hands moto only the items
  its sort key condition selects (tested with moto's own comparison function). moto tests every
  item of the partition through DynamoType, so reading the few pending sends of a conversation
  cost as much as its whole history, and grew with it; DynamoDB reads only the selected items.
* Results are turned into plain JSON values by a converter that knows moto's item types (moto's
  generic one asks each value for five types and a `to_json` method: an eighth of a hot
  conversation's emulator time); other values go to moto's.

* Full garbage collections skip what survived the previous one (gc.freeze after each): CPython
  scanned every stored item and stream record each time, pausing the server 150-360 ms at a time
  on a benchmark's table (2.4 s in a hot-conversation run); now 10-20 ms. Not switchable: it
  changes no answer. A reset unfreezes and collects everything.

`--fast-path off` / env `CHAT_EMULATOR_FAST_PATH=0` / `{"fastPath": false}` on the config
endpoint (below) switches them off, leaving moto's own request handling with the fixes above.
* The listen backlog is 1024 instead of werkzeug's 128: a burst of new client connections (hundreds
  of clients reconnecting at once, each SDK pool opening connections) otherwise overflows it, and
  the dropped connection attempts only come back after a second, past a client's connect timeout.

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
`{"txWindowMs": N, "gsiLagMs": M, "fastPath": true}` (any key optional) answers the current
settings as JSON, and so does `GET /moto-api/chat/config`. `POST /moto-api/reset` also clears the
items in a transaction window, the request tokens and the index copies; it keeps the settings.

and one failure injection for tests: `POST /moto-api/chat/faults` with JSON
`{"kinesisPutFailures": N}` makes the next N entries of PutRecords calls (counted across calls, in
order) fail the way Kinesis throttling does: not written, reported in the response with
`ErrorCode` `ProvisionedThroughputExceededException` and counted in `FailedRecordCount`, while the
call's other entries are written. It answers the failures still to come, as does `GET`;
`POST /moto-api/reset` clears them.

Once listening, and after the template's tables and streams exist (--template, see
create_resources.py), prints exactly one line `READY http://HOST:PORT` to stdout. Serves until
SIGTERM/SIGINT. `--port 0` picks a free port.
"""
from __future__ import annotations

import argparse
import base64
import collections
import copy
import copyreg
import enum
import functools
import gc
import inspect
import hashlib
import io
import json
import logging
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
import types
from typing import Any, Callable, Iterable

import moto
import moto.backends
import moto.core.responses
import moto.dynamodb.models as ddb_models
import moto.dynamodb.responses as ddb_responses
import moto.settings
from botocore import xform_name
from botocore.exceptions import ClientError
from flask import Response as FlaskResponse
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.responses import ActionResult
from moto.core.serialize import (
    AttributePickerContext,
    ClassPrefixAlias,
    ExplicitAlias,
    JSONSerializer,
    ModelAlias,
    NoAlias,
    ShapeNameAlias,
    ShapePrefixAlias,
    TimestampSerializer,
    XFormedAttributePicker,
)
from moto.dynamodb.comparisons import (
    COMPARISON_FUNCS,
    ConditionExpressionParser,
    create_condition_expression_parser,
    get_expected,
)
from moto.dynamodb.exceptions import (
    ERROR_TYPE_PREFIX,
    ConditionalCheckFailed,
    DynamodbException,
    ItemSizeTooLarge,
    ItemSizeToUpdateTooLarge,
    TransactionCanceledException,
)
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict
from moto.dynamodb.models.table import Table
from moto.dynamodb.parsing import validators
from moto.dynamodb.parsing.ast_nodes import DepthFirstTraverser, Node as AstNode
from moto.dynamodb.parsing.expressions import UpdateExpressionParser
from moto.dynamodb.parsing.reserved_keywords import ReservedKeywords
from moto.dynamodb.responses import DynamoHandler
from moto.dynamodbstreams.models import DynamoDBStreamsBackend
from moto.kinesis.models import KinesisBackend, Shard
from moto.moto_api import recorder
from moto.moto_server.werkzeug_app import (
    BackendRequest,
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
import werkzeug.serving
from werkzeug.exceptions import BadRequestKeyError, HTTPException, InternalServerError
from werkzeug.serving import connection_dropped_errors, make_server
from werkzeug.wsgi import get_input_stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from create_resources import create_resources  # noqa: E402

# The patches below rely on moto internals (see the docstring); re-check them before changing this.
MOTO_VERSION = "5.2.5"

TX_WINDOW_ENV, GSI_LAG_ENV = "CHAT_EMULATOR_TX_WINDOW_MS", "CHAT_EMULATOR_GSI_LAG_MS"
FAST_PATH_ENV = "CHAT_EMULATOR_FAST_PATH"
DEFAULT_TX_WINDOW_MS, DEFAULT_GSI_LAG_MS = 10, 0
CONFIG_PATH = "/moto-api/chat/config"
FAULTS_PATH = "/moto-api/chat/faults"
LISTEN_BACKLOG = 1024
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
    """Settings and state of the transaction-window and index-lag simulations; also the switch
    of the speed-ups (fast_path)."""

    def __init__(self, tx_window_ms: float, gsi_lag_ms: float, fast_path: bool = True):
        self.tx_window_ms = tx_window_ms
        self.gsi_lag_ms = gsi_lag_ms
        self.fast_path = fast_path
        self.reset()

    def reset(self) -> None:
        self.in_flight = InFlight()
        self.tokens = Tokens()
        self.shadows: dict[int, Shadow] = {}  # id(table) -> its shadow

    def settings(self) -> dict[str, Any]:
        return {"txWindowMs": self.tx_window_ms, "gsiLagMs": self.gsi_lag_ms, "fastPath": self.fast_path}

    def configure(self, tx_window_ms: float | None = None, gsi_lag_ms: float | None = None,
                  fast_path: bool | None = None) -> None:
        if fast_path is not None:
            self.fast_path = fast_path
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


class Faults:
    """Injected failures (tests): PutRecords entries still to refuse."""

    def __init__(self) -> None:
        self.kinesis_put_failures = 0

    def answer(self) -> dict[str, int]:
        return {"kinesisPutFailures": self.kinesis_put_failures}


FAULTS = Faults()

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
            if path == FAULTS_PATH:
                return faults_response(method, body, start_response)
            reset = path == "/moto-api/reset" and method == "POST"
            if reset:
                SIM.reset()
                FAULTS.kinesis_put_failures = 0
            result = self.app(environ, start_response)
            try:
                # Produce the whole response under the lock; it is sent after releasing it.
                response = list(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
            if reset:
                collect_everything()
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
    data = json.dumps(answer or FAULTS.answer()).encode()
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


def parse_config(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        raise ValueError("body is not JSON") from None
    names = {"txWindowMs": "tx_window_ms", "gsiLagMs": "gsi_lag_ms", "fastPath": "fast_path"}
    if not isinstance(doc, dict) or set(doc) - set(names):
        raise ValueError(f"expected a JSON object with keys among {sorted(names)}")
    if not isinstance(doc.get("fastPath", True), bool):
        raise ValueError(f"fastPath: expected true or false, got {doc['fastPath']!r}")
    return {names[k]: v if k == "fastPath" else milliseconds(v, k) for k, v in doc.items()}


def on_off(value: str, what: str) -> bool:
    words = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}
    flag = words.get(value.strip().lower())
    if flag is None:
        raise ValueError(f"{what}: expected on or off, got {value!r}")
    return flag


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
        item = _update_with_sets(self, table, table_name, key, *args, **kwargs)
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


# moto's Table.query looks for a partition's items among `all_items()` (every item of the table,
# sorted). While a base-table Query runs (requests are serialised, see Serialized), all_items
# answers with the queried partition only; everything else sees the whole table as before.
_moto_query = Table.query
_moto_all_items = Table.all_items
_queried_partition: tuple[Table, Any] | None = None


_QUERY_SIGNATURE = inspect.signature(_moto_query)


def _partition_query(self: Table, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
    global _queried_partition
    arguments = _QUERY_SIGNATURE.bind(self, hash_key, *args, **kwargs).arguments
    if arguments.get("index_name") or hash_key is None or not self.range_key_attr:
        return _moto_query(self, hash_key, *args, **kwargs)
    _queried_partition = (self, hash_key, arguments.get("range_comparison"), arguments.get("range_objs"))
    try:
        return _moto_query(self, hash_key, *args, **kwargs)
    finally:
        _queried_partition = None


def _key_range(comparison: str | None, objs: Any) -> Callable[[str], bool] | None:
    """The sort key condition of a Query on string keys, as a test of a key's string (moto's own
    comparison function on the same values); None when there is none or it is not on strings."""
    func = COMPARISON_FUNCS.get(comparison) if comparison else None
    if func is None or not objs or any(getattr(o, "type", None) != "S" for o in objs):
        return None
    values = [o.value for o in objs]
    return lambda key: bool(func(key, *values))


def _all_items(self: Table) -> list[Any]:
    if _queried_partition is not None and _queried_partition[0] is self:
        _, hash_key, comparison, objs = _queried_partition
        items = list(self.items.get(hash_key, {}).values())
        if SIM.fast_path and all(item.range_key.type == "S" for item in items):
            # Only the items the sort key condition selects (moto tests each item again, slowly:
            # through DynamoType, for every item of the partition, so a Query of a few pending
            # sends cost as much as the conversation's whole history). DynamoDB reads only them.
            in_range = _key_range(comparison, objs)
            if in_range is not None:
                items = [item for item in items if in_range(item.range_key.value)]
            # The same order: DynamoType compares strings by value (cast_value), but slowly.
            items.sort(key=lambda item: item.range_key.value)
            return items
        return sorted(items, key=lambda item: item.range_key)
    return _moto_all_items(self)


# --- speed: expression parsing -----------------------------------------------------------------
# An UpdateItem (and each Update of a transaction) parses its UpdateExpression twice (handler and
# backend), and every condition is lexed once or twice; a chat backend sends the same few
# expressions over and over. The parsed update expression depends on its text only, and moto
# never changes it (UpdateExpressionValidator works on a deep copy); the lexed condition tokens
# depend on the text only, and moto copies the token deque before consuming it (below).

_moto_update_make = UpdateExpressionParser.make
_moto_lex_condition = ConditionExpressionParser._lex_condition_expression


@functools.lru_cache(maxsize=4096)
def _parsed_update_expression(expression: str) -> Any:
    return _moto_update_make(expression)  # an invalid one raises, and is not cached


def _update_make(cls: type, expression: Any) -> Any:
    if SIM.fast_path and cls is UpdateExpressionParser and isinstance(expression, str):
        return _parsed_update_expression(expression)
    return _moto_update_make.__func__(cls, expression)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=4096)
def _lexed_condition(expression: str) -> tuple[Any, ...]:
    parser = ConditionExpressionParser(expression, None, None)
    return tuple(_moto_lex_condition(parser))  # namedtuples; their children lists stay empty


def _lex_condition(self: ConditionExpressionParser) -> collections.deque[Any]:
    if SIM.fast_path and isinstance(self.condition_expression, str):
        return collections.deque(_lexed_condition(self.condition_expression))
    return _moto_lex_condition(self)


# Validating an update expression deep-copies its syntax tree (copy.deepcopy: a quarter of an
# UpdateItem's validation) and then runs ten traversers over it, each of which rebuilds its
# constant {node class: method} map for every node it visits. _deepcopy_ast copies trees of plain
# AST nodes (no copy hooks of their own) as copy.deepcopy does, and hands anything else to it.

_plain_ast_classes: dict[type, bool] = {}


def _plain_ast_class(cls: type) -> bool:
    plain = _plain_ast_classes.get(cls)
    if plain is None:
        plain = _plain_ast_classes[cls] = (
            issubclass(cls, AstNode) and cls not in copyreg.dispatch_table
            and not any("__slots__" in vars(c) for c in cls.__mro__)
            and getattr(cls, "__deepcopy__", None) is None and not hasattr(cls, "__setstate__")
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is object.__getstate__)  # type: ignore[attr-defined]
    return plain


def _deepcopy_ast(x: Any, memo: dict[int, Any] | None = None) -> Any:
    if not SIM.fast_path:
        return copy.deepcopy(x, memo)
    return _copy_ast(x, {} if memo is None else memo)


def _copy_ast(x: Any, memo: dict[int, Any]) -> Any:
    cls = type(x)
    if x is None or cls is str or cls is int or cls is bool or cls is float:
        return x
    done = memo.get(id(x), memo)
    if done is not memo:
        return done  # shared within the tree (a node's parent), as deepcopy's memo keeps it
    if cls is list:
        copied: list[Any] = []
        memo[id(x)] = copied
        copied.extend(_copy_ast(item, memo) for item in x)
        return copied
    if _plain_ast_class(cls):
        node = cls.__new__(cls)  # as copy._reconstruct: new object, memo, then a copy of __dict__
        memo[id(x)] = node
        node.__dict__.update({name: _copy_ast(value, memo) for name, value in x.__dict__.items()})
        return node
    return copy.deepcopy(x, memo)


_moto_nodes_to_be_processed = DepthFirstTraverser.nodes_to_be_processed
_moto_process = DepthFirstTraverser.process


def _processing(traverser: DepthFirstTraverser) -> tuple[Any, ...]:
    cached = traverser.__dict__.get("_chat_processing")
    if cached is None:  # _processing_map returns the same classes and methods on every call
        cached = traverser.__dict__["_chat_processing"] = tuple(traverser._processing_map().items())
    return cached


def _nodes_to_be_processed(self: DepthFirstTraverser) -> tuple[type, ...]:
    if not SIM.fast_path:
        return _moto_nodes_to_be_processed(self)
    return tuple(cls for cls, _ in _processing(self))


def _process(self: DepthFirstTraverser, node: Any) -> Any:
    if not SIM.fast_path:
        return _moto_process(self, node)
    for cls, processor in _processing(self):
        if isinstance(node, cls):
            return processor(node)
    return None


# --- speed: updates that only set attributes ----------------------------------------------------
# Most updates of the chat backend are `SET a = :x, b = :y` (a read receipt, a commit's
# conversation item). For each, moto validates the expression by copying its tree and running ten
# traversers over it (a third of an UpdateItem's time), then executes the tree. For an expression
# of that form alone, whose names are not key attributes, defined attributes or reserved words
# (what moto's validators check) and whose placeholders are all given, the outcome of validating
# and executing is known: each attribute is set to its value, in order. _update_with_sets does
# what moto's update_item does in that case (same reads, condition, item creation, size check,
# stream record) without the tree; anything else is moto's own update_item.

_SET_ACTION = r"(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)"
_SETS_ONLY = re.compile(rf"\s*SET\s+{_SET_ACTION}(?:\s*,\s*{_SET_ACTION})*\s*", re.IGNORECASE)
_UPDATE_SIGNATURE = inspect.signature(_moto_update_item)


@functools.lru_cache(maxsize=4096)
def _simple_sets(expression: str) -> tuple[tuple[str, str], ...] | None:
    """((path token, value placeholder), ...) of `SET a = :x, #b = :y`; None for anything else."""
    if not _SETS_ONLY.fullmatch(expression):
        return None
    body = re.split(r"\s+", expression.strip(), maxsplit=1)[1]
    return tuple((path, value) for path, value in re.findall(_SET_ACTION, body))


@functools.lru_cache(maxsize=1)
def _reserved_words() -> frozenset[str]:
    return frozenset(ReservedKeywords.get_reserved_keywords())


def _set_plan(table: Table, arguments: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """[(attribute name, AttributeValue), ...] when the update is a plain SET moto would accept."""
    expression = arguments.get("update_expression")
    if not isinstance(expression, str) or arguments.get("attribute_updates") or arguments.get("expected"):
        return None
    sets = _simple_sets(expression)
    if sets is None:
        return None
    names = arguments.get("expression_attribute_names") or {}
    values = arguments.get("expression_attribute_values") or {}
    if not isinstance(names, dict) or not isinstance(values, dict):
        return None
    guarded = set(table.table_key_attrs) | set(table.attribute_keys)
    guarded |= {d.get("AttributeName") for d in table.attr or [] if isinstance(d, dict)}
    plan, seen = [], set()
    for token, placeholder in sets:
        placeholder_name = token.startswith("#")
        name = names.get(token) if placeholder_name else token
        if (not isinstance(name, str) or name in seen or token in guarded or name in guarded
                or placeholder not in values or (not placeholder_name and token.upper() in _reserved_words())):
            return None
        seen.add(name)
        plan.append((name, values[placeholder]))
    return plan


def _update_with_sets(self: DynamoDBBackend, table: Table | None, table_name: str, key: Any,
                      *args: Any, **kwargs: Any) -> Any:
    arguments = _UPDATE_SIGNATURE.bind(self, table_name, key, *args, **kwargs).arguments
    plan = _set_plan(table, arguments) if SIM.fast_path and table is not None else None
    if plan is None or table is None:
        return _moto_update_item(self, table_name, key, *args, **kwargs)
    UpdateExpressionParser.make(arguments["update_expression"])  # its syntax errors, as moto
    names = arguments.get("expression_attribute_names")
    values = arguments.get("expression_attribute_values")
    if table.hash_key_attr in key and table.range_key_attr in key:
        hash_value, range_value = DynamoType(key[table.hash_key_attr]), DynamoType(key[table.range_key_attr])
    elif table.hash_key_attr in key:
        hash_value, range_value = DynamoType(key[table.hash_key_attr]), None
    else:
        hash_value, range_value = DynamoType(key), None
    item = table.get_item(hash_value, range_value)
    orig_item = copy.deepcopy(item)
    if not get_expected({}).expr(item):
        raise ConditionalCheckFailed
    condition = create_condition_expression_parser(arguments.get("condition_expression"), names, values).parse()
    if not condition.expr(item):
        if arguments.get("return_values_on_condition_check_failure") == "ALL_OLD" and item is not None:
            raise ConditionalCheckFailed(item=item.to_json()["Attributes"])
        raise ConditionalCheckFailed
    typed = [(name, DynamoType(value)) for name, value in plan]  # moto's validator makes these
    if item is None:
        data: dict[str, Any] = {table.hash_key_attr: {hash_value.type: hash_value.value}}
        if range_value:
            data[table.range_key_attr] = {range_value.type: range_value.value}
        table.put_item(data)
        item = table.get_item(hash_value, range_value)
    try:
        for name, value in typed:
            item.attrs[name] = value
    except ItemSizeTooLarge:
        raise ItemSizeToUpdateTooLarge()
    if table.stream_shard is not None:
        table.stream_shard.add(orig_item, item)
    return item


# --- speed: Kinesis shards -----------------------------------------------------------------------
# A moto Kinesis shard keeps its records in an OrderedDict keyed 1, 2, 3 ... (put_record numbers
# each record the last key + 1; nothing else adds or removes one). Yet it finds the last key by
# listing every key (each PutRecord), and GetRecords walks the shard from its first record to
# the iterator's position: both grew with everything the stream ever carried, so a local stack
# left running slowed down hour by hour. Here the last (first) key is read from the dict's end
# (start), and GetRecords reads the records after the iterator's sequence number directly when
# the keys are 1..n; anything else (or the fast path off) is moto's walk.

_moto_shard_get_records = Shard.get_records
_moto_shard_max = Shard.get_max_sequence_number
_moto_shard_min = Shard.get_min_sequence_number


def _shard_max(self: Shard) -> int:
    if not SIM.fast_path:
        return _moto_shard_max(self)
    return next(reversed(self.records)) if self.records else 0


def _shard_min(self: Shard) -> int:
    if not SIM.fast_path:
        return _moto_shard_min(self)
    return next(iter(self.records)) if self.records else 0


def _shard_get_records(self: Shard, last_sequence_id: str, limit: int | None) -> tuple[list[Any], int, int]:
    records, n = self.records, len(self.records)
    if (not SIM.fast_path or not (limit is None or (type(limit) is int and limit > 0)) or not n
            or next(iter(records)) != 1 or next(reversed(records)) != n):
        return _moto_shard_get_records(self, last_sequence_id, limit)
    last = int(last_sequence_id)
    first = max(last, 0) + 1
    stop = n if limit is None else min(n, first + limit - 1)
    try:
        results = [records[seq] for seq in range(first, stop + 1)]
    except KeyError:  # not numbered 1..n after all
        return _moto_shard_get_records(self, last_sequence_id, limit)
    if not results:
        return [], last, 0
    behind = records[n].created_at - results[-1].created_at  # as moto: newest minus last returned
    return results, results[-1].sequence_number, int(behind * 1000)


# --- speed: response serialization -------------------------------------------------------------
# moto's JSONSerializer walks the output shape and, for every member of every structure (ten per
# AttributeValue), asks six alias providers for candidate keys: 80 % of a 20-item Query's time.
# _FastJSON does the same walk with everything that depends only on the shapes worked out once
# per shape, and gives byte-for-byte the same body. It reads plain dicts itself; for any other
# object (a model object, a dict subclass: the alias providers look at its class) it asks moto's
# own attribute picker, and on anything unexpected it lets moto serialize the whole result.

class _Fallback(Exception):
    """Raised while compiling or serializing: serialize this result with moto's code instead."""


_NOTHING = object()  # a member moto's serializer would leave out
_PICKER = XFormedAttributePicker()  # moto's picker without response transformers


def _candidate_keys(parent: Any, key: str, shape: Any) -> list[str]:
    """The keys AttributePicker tries, in order, to find member `key` of structure `parent` in a
    plain dict (see moto.core.serialize.DEFAULT_ALIAS_PROVIDERS; ExplicitAlias never applies to a
    dict, ClassPrefixAlias uses the class name "dict")."""
    aliases = []
    if shape.type_name in ("list", "structure") and shape.name not in parent.members and key != shape.name:
        aliases.append(shape.name)  # ShapeNameAlias
    aliases.append(key)  # NoAlias
    if key.lower().startswith(parent.name.lower()) and key[len(parent.name):] not in parent.members:
        aliases.append(key[len(parent.name):])  # ShapePrefixAlias
    if key.lower().startswith("dict"):
        aliases.append(key[len("dict"):])  # ClassPrefixAlias
    if shape.serialization.get("name", key) != key:
        aliases.append(shape.serialization["name"])  # ModelAlias
    out: list[str] = []
    for alias in aliases:
        for candidate in (alias, xform_name(alias)):  # XFormedAttributePicker
            if "." in candidate:
                raise _Fallback  # get_value would read it as a path
            if candidate not in out:
                out.append(candidate)
    return out


class _FastJSON:
    """Compiled serializers for JSONSerializer._serialize_result, one per Shape object (moto's
    shapes are cached: the service model, its operation models and their members)."""

    def __init__(self) -> None:
        self.converters: dict[int, tuple[Any, Callable[[Any], Any]]] = {}
        self.timestamps = TimestampSerializer(JSONSerializer.DEFAULT_TIMESTAMP_FORMAT)

    def converter(self, shape: Any) -> Callable[[Any], Any]:
        """fn(value) -> what moto's JSONSerializer._serialize(d, value, shape, key) stores in
        d[key], or _NOTHING when it stores nothing."""
        entry = self.converters.get(id(shape))
        if entry is None or entry[0] is not shape:
            entry = self.converters[id(shape)] = (shape, self._compile(shape))  # keeps the shape alive
        return entry[1]

    def _compile(self, shape: Any) -> Callable[[Any], Any]:
        kind = shape.type_name
        if kind == "structure":
            if shape.is_document_type:
                return _fail
            return self._structure(shape)
        if kind == "list":
            member = shape.member
            if member.serialization.get("name", member.name) != member.name:
                return _fail
            return self._list(member)
        if kind == "map":
            if "name" in shape.value.serialization:
                return _fail
            return self._map(shape.value)
        if kind == "string":
            return _string
        if kind in ("integer", "long"):
            return int
        if kind in ("float", "double"):
            return float
        if kind == "blob":
            return _blob
        if kind == "timestamp":
            def timestamp(value: Any) -> Any:
                out: dict[str, Any] = {}
                self.timestamps.serialize(out, value, shape, "timestamp")
                return out["timestamp"]
            return timestamp
        if hasattr(JSONSerializer, f"_serialize_type_{kind}"):
            return _fail  # a type this does not mirror
        return _identity  # boolean and the others: ResponseSerializer._default_serialize

    def _structure(self, shape: Any) -> Callable[[Any], Any]:
        members = []
        for key, member in shape.members.items():
            if "name" in member.serialization:
                return _fail
            try:
                candidates = _candidate_keys(shape, key, member)
            except _Fallback:
                return _fail
            members.append((key, member, candidates))
        # For plain dicts: candidate key -> [(position of the member, rank among its candidates)].
        by_candidate: dict[str, list[tuple[int, int]]] = {}
        for position, (_, _, candidates) in enumerate(members):
            for rank, candidate in enumerate(candidates):
                by_candidate.setdefault(candidate, []).append((position, rank))
        compiled: list[tuple[str, Any, Callable[[Any], Any]]] | None = None

        def structure(value: Any) -> Any:
            nonlocal compiled
            if value is None:
                return _NOTHING
            if compiled is None:  # lazily: AttributeValue contains itself
                compiled = [(k, m, self.converter(m)) for k, m, _ in members]
            out: dict[str, Any] = {}
            if type(value) is dict:
                # Each member takes the first of its candidate keys that the dict has; looked up
                # from the dict's side (an AttributeValue has one key, its shape ten members).
                picked: dict[int, tuple[int, Any]] = {}
                for name in value:
                    for position, rank in by_candidate.get(name, ()):
                        if position not in picked or rank < picked[position][0]:
                            picked[position] = (rank, name)
                for position in sorted(picked) if len(picked) > 1 else picked:
                    member_value = value[picked[position][1]]
                    if member_value is not None:
                        key, _, convert = compiled[position]
                        converted = convert(member_value)
                        if converted is not _NOTHING:
                            out[key] = converted
            else:
                for key, member, convert in compiled:
                    member.parent = shape  # as moto's serializer sets it; its alias providers read it
                    member_value = _PICKER(AttributePickerContext(obj=value, key=key, shape=member))
                    if member_value is not None:
                        converted = convert(member_value)
                        if converted is not _NOTHING:
                            out[key] = converted
            return out
        return structure

    def _list(self, member: Any) -> Callable[[Any], Any]:
        convert: Callable[[Any], Any] | None = None

        def list_(value: Any) -> Any:
            nonlocal convert
            if convert is None:
                convert = self.converter(member)
            out = []
            for item in value:
                converted = convert(item)
                out.append(item if converted is _NOTHING else converted)
            return out
        return list_

    def _map(self, value_shape: Any) -> Callable[[Any], Any]:
        convert: Callable[[Any], Any] | None = None

        def map_(value: Any) -> Any:
            nonlocal convert
            if convert is None:
                convert = self.converter(value_shape)
            out: dict[str, Any] = {}
            for key, item in value.items():
                converted = convert(item)
                if converted is not _NOTHING:
                    out[key] = converted
            return out
        return map_


def _fail(_: Any) -> Any:
    raise _Fallback


def _identity(value: Any) -> Any:
    return value


def _string(value: Any) -> Any:
    if type(value) is str:
        return value
    if isinstance(value, enum.Enum):
        value = value.value
    return str(value) if value not in [None, {}, []] else value


def _blob(value: Any) -> str:
    if isinstance(value, str):
        value = value.encode("utf-8")
    return base64.b64encode(value).strip().decode("utf-8")


_moto_dynamo_to_dict = ddb_responses.dynamo_to_dict


def _dynamo_to_dict(obj: Any) -> Any:
    """moto's `dynamo_to_dict` (results → plain JSON values), for the shapes DynamoDB results have."""
    return _to_plain(obj) if SIM.fast_path else _moto_dynamo_to_dict(obj)


def _to_plain(obj: Any) -> Any:
    cls = obj.__class__
    if cls is DynamoType:
        kind = obj.type
        if kind in ("S", "N", "BOOL", "NULL"):
            return {kind: obj.value}
        if kind == "M":
            return {"M": {k: _to_plain(v) for k, v in obj.value.items()}}
        if kind == "L":
            return {"L": [_to_plain(v) for v in obj.value]}
    elif cls is dict or cls is LimitedSizeDict:
        return {k: _to_plain(v) for k, v in obj.items()}
    elif cls is list:
        return [_to_plain(v) for v in obj]
    elif cls is str or cls is int or cls is bool or obj is None:
        return obj
    return _moto_dynamo_to_dict(obj)  # binary values and sets, items, datetimes


_ALIAS_PROVIDERS = [ExplicitAlias, ShapeNameAlias, NoAlias, ShapePrefixAlias, ClassPrefixAlias, ModelAlias]
_FAST_JSON = _FastJSON()
_FAST_JSON_SERVICES = {"dynamodb", "dynamodbstreams", "kinesis"}
_moto_serialize_result = JSONSerializer._serialize_result


def _serialize_result(self: Any, resp: Any, result: Any) -> Any:
    picker = self._value_picker
    if (not SIM.fast_path or type(self) is not JSONSerializer or type(picker) is not XFormedAttributePicker
            or picker.alias_providers != _ALIAS_PROVIDERS or picker.response_transformers
            or self.service_model.service_name not in _FAST_JSON_SERVICES):
        return _moto_serialize_result(self, resp, result)
    shape = self.operation_model.output_shape
    serialized: Any = {}
    if shape is not None:
        try:
            serialized = _FAST_JSON.converter(shape)(result)
        except Exception:  # moto's code fails the same way, or copes differently: let it decide
            return _moto_serialize_result(self, resp, result)
        if serialized is _NOTHING:
            serialized = {}
    return self._serialized_result_to_response(resp, result, shape, serialized)


# --- speed: request dispatch -------------------------------------------------------------------
# moto routes every request through DomainDispatcherApplication (which works out the service from
# the signature's credential scope and X-Amz-Target) and a Flask app per service (request
# context, URL map, CORS after-request hook) to the service's BaseResponse.dispatch. For the JSON
# APIs used here, FastDispatch makes the same routing decision (asking the dispatcher itself,
# once per scope and target prefix) and then does what moto's Flask view does, without Flask.

_FAST_BACKENDS = {"dynamodb", "dynamodbstreams", "kinesis"}


class FastDispatch:
    """WSGI app: POST / of DynamoDB, DynamoDB Streams and Kinesis straight to moto's handler;
    everything else (moto-api, other services, CORS requests) to moto's dispatcher."""

    def __init__(self, dispatcher: DomainDispatcherApplication):
        self.dispatcher = dispatcher
        self.routes: dict[tuple[str, str, str], Callable[..., Any] | None] = {}

    def route(self, environ: dict[str, Any]) -> Callable[..., Any] | None:
        """moto's view for this request if it is one for the fast path, else None."""
        if (environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != "/"
                or "HTTP_ORIGIN" in environ or "HTTP_ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK" in environ):
            return None  # CORS headers then depend on the request: leave them to flask-cors
        auth, target = environ.get("HTTP_AUTHORIZATION"), environ.get("HTTP_X_AMZ_TARGET")
        if not auth or not target or "." not in target:
            return None
        key = (auth.split(",")[0], target.split(".")[0], environ.get("HTTP_HOST", ""))
        if key not in self.routes:
            view = None
            # Signed for DynamoDB (and its Streams) or Kinesis: then moto's dispatcher decides by
            # the credential scope and the target prefix only (no body, path or host).
            if "/dynamodb/aws4_request" in key[0] or "/kinesis/aws4_request" in key[0]:
                try:
                    backend = self.dispatcher.get_backend_for_host(
                        self.dispatcher.infer_service_region_host(environ, "/"))
                except Exception:  # moto's path fails the same way
                    backend = None
                if backend in _FAST_BACKENDS:
                    view = _backend_view(backend)
            if len(self.routes) > 1000:
                self.routes.clear()
            self.routes[key] = view
        return self.routes[key]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        view = self.route(environ) if SIM.fast_path else None
        if view is None:
            return self.dispatcher(environ, start_response)
        # From here on, what moto's Flask view (moto.core.utils.convert_to_flask_response) and
        # Flask do for it; an exception propagates as it does from moto's app (debug mode).
        request = BackendRequest(environ)
        try:
            try:
                recorder._record_request(request)
                result = view(request, request.raw_url, dict(request.headers))
            except ClientError as exc:
                result = 400, {}, exc.response["Error"]["Message"]
        except HTTPException as e:
            if isinstance(e, BadRequestKeyError):
                raise  # Flask in debug mode (moto's apps) lets these through
            response = FlaskResponse.force_type(e, environ)  # Flask: the exception as the response
        else:
            if len(result) == 3:
                status, headers, content = result
            else:
                status, headers, content = 200, {}, result
            response = FlaskResponse(response=content, status=status, headers=headers)
        if not moto.settings.DISABLE_GLOBAL_CORS and not response.headers.get("Access-Control-Allow-Origin"):
            response.headers.add("Access-Control-Allow-Origin", "*")  # flask-cors, no Origin header
        return response(environ, start_response)


@functools.lru_cache(maxsize=None)
def _backend_view(backend: str) -> Callable[..., Any]:
    """The view moto's Flask app for `backend` serves POST / with (create_backend_app)."""
    backend_dict = moto.backends.get_backend(backend)
    return backend_dict[DEFAULT_ACCOUNT_ID]["us-east-1"].flask_paths["/"]


# --- speed: HTTP connections -------------------------------------------------------------------
# werkzeug's server closes every connection after one response (so each request is a new TCP
# connection and a new thread), writes headers and body separately, and then waits up to 10 ms
# per request to drain the socket. Serialized always reads the whole request body, so the
# connection can stay open for the next request: HTTP/1.1 keep-alive, as the SDKs expect.

LOG_REQUESTS = [False]  # --log-requests
_DATE: list[Any] = [0, ""]


class KeepAliveHandler(MotoRequestHandler):
    """moto's request handler, but answers with one write and keeps the connection open when the
    request body was read to its end (a Content-Length body; chunked ones close as before)."""

    def setup(self) -> None:
        super().setup()
        # One write per response; the 100-continue interim answer must not hold it back (Nagle).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def run_wsgi(self) -> None:
        if not SIM.fast_path:
            return super().run_wsgi()
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.environ = environ = self.make_environ()
        length = environ.get("CONTENT_LENGTH", "")
        keep_alive = (self.request_version == "HTTP/1.1" and not self.close_connection
                      and "HTTP_TRANSFER_ENCODING" not in environ and (length == "" or length.isdigit()))
        started: list[Any] = []
        written: list[bytes] = []  # by the legacy write() callable, before the app's iterable

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info:
                try:
                    if started:
                        raise exc_info[1].with_traceback(exc_info[2])
                finally:
                    exc_info = None
            elif started:
                raise AssertionError("Headers already set")
            started[:] = [status, headers]
            return written.append

        sent = False
        try:
            app_iter = self.server.app(environ, start_response)
            try:
                body = b"".join(written + list(app_iter))
            finally:
                if hasattr(app_iter, "close"):
                    app_iter.close()
            sent = True
            self.send_whole(started[0], started[1], body, keep_alive)
        except connection_dropped_errors as e:
            self.close_connection = True
            self.connection_dropped(e, environ)
        except Exception as e:
            self.close_connection = True
            if self.server.passthrough_errors:
                raise
            if not sent:  # as werkzeug's run_wsgi: an error page, and the traceback in the log
                try:
                    started.clear()
                    body = b"".join(InternalServerError()(environ, start_response))
                    self.send_whole(started[0], started[1], body, keep_alive=False)
                except Exception:
                    pass
            from werkzeug.debug.tbtools import DebugTraceback  # noqa: PLC0415 - as werkzeug does
            self.server.log("error", f"Error on request:\n{DebugTraceback(e).render_traceback_text()}")
        if self.close_connection:
            self.drain()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # werkzeug formats the access-log line before its logger drops it (4 % of a request).
        if LOG_REQUESTS[0]:
            super().log_request(code, size)

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header, formatted once a second instead of once a response.
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        if _DATE[0] != now:
            _DATE[:] = [now, super().date_time_string(now)]
        return _DATE[1]

    def send_whole(self, status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> None:
        """Writes what werkzeug's run_wsgi writes for this response (the same status line and
        headers, but Connection: close only when not keeping the connection), in one write."""
        try:
            code_str, msg = status.split(None, 1)
        except ValueError:
            code_str, msg = status, ""
        code = int(code_str)
        self.send_response(code, msg)  # status line, Server, Date (buffered); the access log
        names = set()
        for key, value in headers:
            self.send_header(key, value)
            names.add(key.lower())
        chunked = (not ("content-length" in names or self.command == "HEAD" or 100 <= code < 200
                        or code in {204, 304}) and self.protocol_version >= "HTTP/1.1")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            body = (hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        if chunked or not keep_alive:
            self.send_header("Connection", "close")  # sets self.close_connection
        self._headers_buffer.append(b"\r\n")
        data = b"".join(self._headers_buffer) + body
        self._headers_buffer = []
        self.wfile.write(data)

    def drain(self) -> None:
        """As werkzeug before closing: read what the client may still send (an unread body), so
        that closing the socket does not reset the connection before the client reads the answer."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.connection, selectors.EVENT_READ)
            total_size = total_reads = 0
            while selector.select(timeout=0.01):
                data = self.rfile.read(10_000_000)
                total_size += len(data)
                total_reads += 1
                if not data or total_size >= 10_000_000_000 or total_reads > 1000:
                    break


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
    Table.query = _partition_query  # type: ignore[method-assign]
    Table.all_items = _all_items  # type: ignore[method-assign]
    JSONSerializer._serialize_result = _serialize_result  # type: ignore[method-assign]
    ddb_responses.dynamo_to_dict = _dynamo_to_dict  # type: ignore[attr-defined]
    UpdateExpressionParser.make = classmethod(_update_make)  # type: ignore[method-assign, assignment]
    ConditionExpressionParser._lex_condition_expression = _lex_condition  # type: ignore[method-assign]
    validators.deepcopy = _deepcopy_ast  # type: ignore[attr-defined]
    DepthFirstTraverser.nodes_to_be_processed = _nodes_to_be_processed  # type: ignore[method-assign]
    DepthFirstTraverser.process = _process  # type: ignore[method-assign]
    # moto lists a handler class's methods (inspect.getmembers) on every request, to check that the
    # action is one; the classes do not change once patched (above).
    moto.core.responses.method_names_from_class = functools.lru_cache(maxsize=None)(
        moto.core.responses.method_names_from_class)
    KinesisBackend.put_records = put_records_with_faults(KinesisBackend.put_records)  # type: ignore[method-assign]
    Shard.get_records = _shard_get_records  # type: ignore[method-assign]
    Shard.get_max_sequence_number = _shard_max  # type: ignore[method-assign]
    Shard.get_min_sequence_number = _shard_min  # type: ignore[method-assign]
    # moto lists its package directory to route every request: a quarter of its time per request.
    list_modules = moto.backends.list_of_moto_modules
    moto.backends.list_of_moto_modules = functools.lru_cache(maxsize=None)(lambda: tuple(list_modules()))


# --- speed: garbage collection -----------------------------------------------------------------
# CPython's full (generation 2) collection scans every object that can be in a cycle, and the
# emulator holds hundreds of thousands of them (moto's modules, then every stored item and stream
# record), so it paused the whole server for 150-360 ms at a time, several times a minute under
# load, and longer as the tables grew: the slowest requests of every benchmark row. After each
# full collection the objects that survived it (reachable then: the tables, the stream records,
# the modules) are moved to the permanent generation (gc.freeze), which collections skip; the
# next full one scans only what was allocated since. Frozen objects are still freed when their
# last reference goes; only a frozen cycle dropped later stays (the objects of the request
# running at that moment), until a reset, which unfreezes everything and collects it.

def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def install_gc_policy() -> None:
    """Freeze what survives each full collection (above), starting with what is alive now."""
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
    gc.collect()


def collect_everything() -> None:
    """On reset: unfreeze, so that the dropped tables and records (cycles) are collected."""
    gc.unfreeze()
    gc.collect()


# --- main -------------------------------------------------------------------------------------

def settings_from(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The settings: a flag wins over its env var, which wins over the default."""
    out: dict[str, Any] = {}
    for name, flag, var, default in (("tx_window_ms", "--tx-window-ms", TX_WINDOW_ENV, DEFAULT_TX_WINDOW_MS),
                                     ("gsi_lag_ms", "--gsi-lag-ms", GSI_LAG_ENV, DEFAULT_GSI_LAG_MS),
                                     ("fast_path", "--fast-path", FAST_PATH_ENV, True)):
        value, what = getattr(args, name, None), flag
        if value is None and env.get(var, "").strip():
            value, what = env[var], var
        if value is None:
            out[name] = default
        else:
            out[name] = on_off(value, what) if name == "fast_path" else milliseconds(value, what)
    return out


def make_app() -> Serialized:
    """The WSGI app (after patch_moto)."""
    return Serialized(FastDispatch(DomainDispatcherApplication(create_backend_app)))


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
    parser.add_argument("--fast-path", metavar="on|off", help=f"the speed-ups; off = moto's own request "
                        f"handling (default: ${FAST_PATH_ENV} or on)")
    args = parser.parse_args(argv)
    try:
        SIM.configure(**settings_from(args, dict(os.environ)))
    except ValueError as e:
        parser.error(str(e))

    patch_moto()
    LOG_REQUESTS[0] = args.log_requests
    if not args.log_requests:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    werkzeug.serving.BaseWSGIServer.request_queue_size = LISTEN_BACKLOG
    server = make_server(args.host, args.port, make_app(), threaded=True, request_handler=KeepAliveHandler)
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
        install_gc_policy()
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
