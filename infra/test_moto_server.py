"""Tests of infra/moto_server.py (our moto launcher) through the AWS SDK.

    .venv/bin/python -m unittest infra/test_moto_server.py

Starts the launcher on a free loopback port with the repository's template.yaml and checks the
fixes it makes to moto: serialised requests, in-place rollback of cancelled transactions (stream
iterators keep working, no stream records, no item changes), fast transactions on a big table;
and its simulations: transaction conflicts during a transaction's window, idempotent
ClientRequestTokens, lagging global secondary indexes, their runtime switch and their reset;
its speed-ups: the same answers (status, headers, bytes) with the fast path on and off, kept-alive
connections, cached expressions; that a Query reads exactly the queried partition; and the
garbage-collection policy (survivors frozen, a reset collects them).
Simulation tests use windows and lags of 500 ms at most, and restore the defaults afterwards.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid
import zlib
from typing import Any, Callable, NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

INFRA = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(INFRA)
CHAT_TABLE = "ChatTable"
# template.yaml's tables have no global secondary index: the index tests make this table.
INDEXED_TABLE = "IndexedTable"
MEMBER_INDEX = "byMember"  # GSI of INDEXED_TABLE: memberId (hash), pk (range)
DEFAULTS = {"txWindowMs": 10, "gsiLagMs": 0, "fastPath": True}


def slow_condition(condition: str, clauses: int) -> dict[str, Any]:
    """`condition` OR-ed with clauses that are never true: same meaning, but moto takes
    milliseconds to parse it between reading the item and writing it (see test (a))."""
    names = {f"#never{i}": f"never{i}" for i in range(clauses)}
    return {"ConditionExpression": " OR ".join([f"({condition})"] + [f"attribute_exists({n})" for n in names]),
            "ExpressionAttributeNames": names}


def _code(e: ClientError) -> str:
    return e.response["Error"]["Code"]


class Raw(NamedTuple):
    """An HTTP answer as received."""
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class MotoServerTest(unittest.TestCase):
    proc: subprocess.Popen[str]
    url: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.stderr = tempfile.TemporaryFile(mode="w+")
        # The launcher's defaults, whatever the caller's environment says.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_EMULATOR_")}
        cls.proc = subprocess.Popen(
            [sys.executable, os.path.join(INFRA, "moto_server.py"), "--host", "127.0.0.1",
             "--port", "0", "--template", os.path.join(REPO, "template.yaml")],
            stdout=subprocess.PIPE, stderr=cls.stderr, text=True, env=env)
        line = cls._read_line(cls.proc, timeout=45)
        if not line.startswith("READY http://127.0.0.1:"):
            cls._stop()
            cls.stderr.seek(0)
            raise RuntimeError(f"launcher not ready: {line!r}\n{cls.stderr.read()}")
        cls.url = line.split()[1]

    @staticmethod
    def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        if not sel.select(timeout):
            return "(timeout)"
        return proc.stdout.readline().strip()  # type: ignore[union-attr]

    @classmethod
    def _stop(cls) -> None:
        cls.proc.terminate()
        try:
            cls.proc.wait(10)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            cls.proc.wait()

    @classmethod
    def tearDownClass(cls) -> None:
        cls._stop()
        assert cls.proc.returncode == 0, f"launcher exited with {cls.proc.returncode}"
        cls.proc.stdout.close()  # type: ignore[union-attr]
        cls.stderr.close()

    def tearDown(self) -> None:
        self.assertEqual(self.configure(**DEFAULTS), DEFAULTS)

    def configure(self, **settings: float) -> dict[str, float]:
        """POSTs the simulation settings (none: GETs them); returns the launcher's answer."""
        data = json.dumps(settings).encode() if settings else None
        with urllib.request.urlopen(urllib.request.Request(
                self.url + "/moto-api/chat/config", data=data, method="POST" if data else "GET")) as r:
            return json.load(r)

    def client(self, service: str) -> Any:
        return boto3.client(
            service, endpoint_url=self.url, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",
            config=Config(retries={"max_attempts": 1}, max_pool_connections=4))

    def indexed_table(self) -> str:
        """INDEXED_TABLE (keys pk, sk like ChatTable; GSI MEMBER_INDEX), created if missing."""
        ddb = self.client("dynamodb")
        if INDEXED_TABLE not in ddb.list_tables()["TableNames"]:
            ddb.create_table(
                TableName=INDEXED_TABLE, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ("pk", "sk", "memberId")],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                GlobalSecondaryIndexes=[{
                    "IndexName": MEMBER_INDEX,
                    "KeySchema": [{"AttributeName": "memberId", "KeyType": "HASH"},
                                  {"AttributeName": "pk", "KeyType": "RANGE"}],
                    "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["lastReadSeq"]}}])
        return INDEXED_TABLE

    def run_threads(self, n: int, target: Any) -> None:
        """Runs target(i, dynamodb_client, barrier) in n threads; the barrier lines them up."""
        clients = [self.client("dynamodb") for _ in range(n)]  # one connection pool each
        barrier = threading.Barrier(n, timeout=30)
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                barrier.wait()
                target(i, clients[i], barrier)
            except BaseException as e:  # reported in the main thread
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])

    # --- (a) serialised requests ----------------------------------------------------------------
    # Races in unserialised moto need a thread switch between reading the item and writing it.
    # A long condition makes moto spend milliseconds there (parsing it), so against moto without
    # serialisation these tests usually fail (increments: every run tried; puts: ~3 runs in 4).

    def test_concurrent_conditional_put_has_one_winner(self) -> None:
        prefix, rounds = f"race-{uuid.uuid4()}", 15
        wins: list[tuple[int, int]] = []  # (round, thread)

        def put(i: int, ddb: Any, barrier: threading.Barrier) -> None:
            for r in range(rounds):
                barrier.wait()
                try:
                    ddb.put_item(TableName=CHAT_TABLE,
                                 Item={"pk": {"S": f"{prefix}-{r}"}, "sk": {"S": "x"}, "by": {"N": str(i)}},
                                 **slow_condition("attribute_not_exists(pk)", 60))
                    wins.append((r, i))
                except ClientError as e:
                    if _code(e) != "ConditionalCheckFailedException":
                        raise

        self.run_threads(16, put)
        self.assertEqual(sorted(r for r, _ in wins), list(range(rounds)), "rounds with != 1 winner")
        ddb = self.client("dynamodb")
        for r, i in wins:
            item = ddb.get_item(TableName=CHAT_TABLE, Key={"pk": {"S": f"{prefix}-{r}"}, "sk": {"S": "x"}})
            self.assertEqual(item["Item"]["by"]["N"], str(i))

    def test_concurrent_conditional_increments_lose_nothing(self) -> None:
        key = {"pk": {"S": f"counter-{uuid.uuid4()}"}, "sk": {"S": "c"}}
        ddb = self.client("dynamodb")
        ddb.put_item(TableName=CHAT_TABLE, Item={**key, "n": {"N": "0"}})
        written: list[int] = []  # the value each successful update wrote

        def increment(_: int, ddb: Any, barrier: threading.Barrier) -> None:
            for _attempt in range(25):  # bounded; most attempts lose the race and retry
                old = int(ddb.get_item(TableName=CHAT_TABLE, Key=key, ConsistentRead=True)
                          ["Item"]["n"]["N"])
                try:
                    ddb.update_item(TableName=CHAT_TABLE, Key=key, UpdateExpression="SET n = :new",
                                    **slow_condition("n = :old", 30),
                                    ExpressionAttributeValues={":old": {"N": str(old)},
                                                               ":new": {"N": str(old + 1)}})
                    written.append(old + 1)
                except ClientError as e:
                    if _code(e) != "ConditionalCheckFailedException":
                        raise

        self.run_threads(16, increment)
        final = int(ddb.get_item(TableName=CHAT_TABLE, Key=key)["Item"]["n"]["N"])
        self.assertGreater(len(written), 16)
        self.assertEqual(len(set(written)), len(written), "two updates wrote the same value")
        self.assertEqual(final, len(written))
        self.assertEqual(sorted(written), list(range(1, final + 1)))

    # --- (b) cancelled transactions and DynamoDB Streams ------------------------------------------

    def stream_iterator(self, kind: str) -> str:
        ddb, streams = self.client("dynamodb"), self.client("dynamodbstreams")
        arn = ddb.describe_table(TableName=CHAT_TABLE)["Table"]["LatestStreamArn"]
        shards = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
        return streams.get_shard_iterator(StreamArn=arn, ShardId=shards[-1]["ShardId"],
                                          ShardIteratorType=kind)["ShardIterator"]

    def read_stream(self, iterator: str, pk: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(eventName, sk, NewImage) of the records of partition `pk` along an iterator chain."""
        streams, out = self.client("dynamodbstreams"), []
        for _ in range(20):
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            out += [(r["eventName"], r["dynamodb"]["Keys"]["sk"]["S"], r["dynamodb"].get("NewImage"))
                    for r in page["Records"] if r["dynamodb"]["Keys"]["pk"]["S"] == pk]
            iterator = page.get("NextShardIterator")
            if not page["Records"] or not iterator:
                break
        return out

    def test_cancelled_transaction_rolls_back_in_place(self) -> None:
        ddb = self.client("dynamodb")
        pk = f"conv-{uuid.uuid4()}"
        key = lambda sk: {"pk": {"S": pk}, "sk": {"S": sk}}  # noqa: E731
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("meta"), "seq": {"N": "1"}})
        for sk in ("old", "edit", "over"):
            ddb.put_item(TableName=CHAT_TABLE, Item={**key(sk), "x": {"S": "y"}})
        trim_horizon, latest = self.stream_iterator("TRIM_HORIZON"), self.stream_iterator("LATEST")
        before = sorted(map(str, ddb.query(TableName=CHAT_TABLE, KeyConditionExpression="pk = :p",
                                           ExpressionAttributeValues={":p": {"S": pk}})["Items"]))

        with self.assertRaises(ClientError) as caught:
            ddb.transact_write_items(TransactItems=[
                {"Put": {"TableName": CHAT_TABLE, "Item": {**key("msg#1"), "text": {"S": "hi"}}}},
                {"Update": {"TableName": CHAT_TABLE, "Key": key("new"),
                            "UpdateExpression": "SET seq = :one",
                            "ExpressionAttributeValues": {":one": {"N": "1"}}}},
                {"Update": {"TableName": CHAT_TABLE, "Key": key("edit"),
                            "UpdateExpression": "SET x = :z REMOVE y",
                            "ExpressionAttributeValues": {":z": {"S": "z"}}}},
                {"Put": {"TableName": CHAT_TABLE, "Item": {**key("over"), "x": {"S": "z"}}}},
                {"Update": {"TableName": CHAT_TABLE, "Key": key("meta"),
                            "UpdateExpression": "SET seq = seq + :one",
                            "ConditionExpression": "seq = :zero",
                            "ExpressionAttributeValues": {":one": {"N": "1"}, ":zero": {"N": "0"}},
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}},
                {"Delete": {"TableName": CHAT_TABLE, "Key": key("old")}},
            ])
        self.assertEqual(_code(caught.exception), "TransactionCanceledException")
        reasons = caught.exception.response["CancellationReasons"]
        self.assertEqual([r["Code"] for r in reasons],
                         ["None", "None", "None", "None", "ConditionalCheckFailed", "None"])
        self.assertEqual(reasons[4]["Item"], {**key("meta"), "seq": {"N": "1"}})
        self.assertNotIn("Item", reasons[0])

        after = sorted(map(str, ddb.query(TableName=CHAT_TABLE, KeyConditionExpression="pk = :p",
                                          ExpressionAttributeValues={":p": {"S": pk}})["Items"]))
        self.assertEqual(after, before, "the cancelled transaction changed items")

        ddb.put_item(TableName=CHAT_TABLE, Item={**key("msg#2"), "text": {"S": "later"}})
        self.assertEqual([r[:2] for r in self.read_stream(latest, pk)], [("INSERT", "msg#2")])
        self.assertEqual([r[:2] for r in self.read_stream(trim_horizon, pk)],
                         [("INSERT", "meta"), ("INSERT", "old"), ("INSERT", "edit"), ("INSERT", "over"),
                          ("INSERT", "msg#2")])

    def test_committed_transaction_stream_records(self) -> None:
        ddb = self.client("dynamodb")
        pk = f"conv-{uuid.uuid4()}"
        key = lambda sk: {"pk": {"S": pk}, "sk": {"S": sk}}  # noqa: E731
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("meta"), "seq": {"N": "1"}})
        latest = self.stream_iterator("LATEST")
        ddb.transact_write_items(TransactItems=[
            {"Put": {"TableName": CHAT_TABLE, "Item": {**key("msg#2"), "text": {"S": "hi"}}}},
            {"Update": {"TableName": CHAT_TABLE, "Key": key("meta"),
                        "UpdateExpression": "SET seq = seq + :one", "ConditionExpression": "seq = :s",
                        "ExpressionAttributeValues": {":one": {"N": "1"}, ":s": {"N": "1"}}}},
            {"Update": {"TableName": CHAT_TABLE, "Key": key("member#u1"),
                        "UpdateExpression": "SET lastReadSeq = :s",
                        "ExpressionAttributeValues": {":s": {"N": "2"}}}},
        ])
        # One record per written item; an Update that creates its item gives one full INSERT.
        self.assertEqual(self.read_stream(latest, pk), [
            ("INSERT", "msg#2", {**key("msg#2"), "text": {"S": "hi"}}),
            ("MODIFY", "meta", {**key("meta"), "seq": {"N": "2"}}),
            ("INSERT", "member#u1", {**key("member#u1"), "lastReadSeq": {"N": "2"}}),
        ])

    # --- (c) Kinesis ------------------------------------------------------------------------------

    def test_kinesis_round_trip(self) -> None:
        kinesis = self.client("kinesis")
        shards = kinesis.list_shards(StreamName="EventStream")["Shards"]
        self.assertEqual(len(shards), 4)  # moto's ON_DEMAND streams have 4 shards
        put = kinesis.put_record(StreamName="EventStream", Data=b'{"type":"message"}',
                                 PartitionKey="conv-1")
        iterator = kinesis.get_shard_iterator(
            StreamName="EventStream", ShardId=put["ShardId"], ShardIteratorType="AT_SEQUENCE_NUMBER",
            StartingSequenceNumber=put["SequenceNumber"])["ShardIterator"]
        records = kinesis.get_records(ShardIterator=iterator)["Records"]
        self.assertEqual((records[0]["Data"], records[0]["PartitionKey"]),
                         (b'{"type":"message"}', "conv-1"))

    def test_injected_kinesis_put_failures(self) -> None:
        kinesis = self.client("kinesis")

        def faults(body: dict | None = None) -> tuple[int, dict]:
            request = urllib.request.Request(
                self.url + "/moto-api/chat/faults", method="POST" if body is not None else "GET",
                data=json.dumps(body).encode() if body is not None else None)
            try:
                with urllib.request.urlopen(request) as r:
                    return r.status, json.load(r)
            except urllib.error.HTTPError as e:
                return e.code, json.load(e)

        self.assertEqual(faults({"kinesisPutFailures": 3}), (200, {"kinesisPutFailures": 3}))
        for bad in ({"kinesisPutFailures": -1}, {"kinesisPutFailures": "2"}, {"other": 1}):
            self.assertEqual(faults(bad)[0], 400, bad)
        key = f"faults-{uuid.uuid4()}"
        entries = [{"Data": f"r{i}".encode(), "PartitionKey": key} for i in range(5)]
        first = kinesis.put_records(StreamName="EventStream", Records=entries[:2])
        self.assertEqual(first["FailedRecordCount"], 2)
        self.assertEqual([r.get("ErrorCode") for r in first["Records"]],
                         ["ProvisionedThroughputExceededException"] * 2)
        second = kinesis.put_records(StreamName="EventStream", Records=entries[2:])
        self.assertEqual(second["FailedRecordCount"], 1)
        self.assertEqual([r.get("ErrorCode") for r in second["Records"]],
                         ["ProvisionedThroughputExceededException", None, None])
        self.assertEqual(faults(), (200, {"kinesisPutFailures": 0}))
        # Only the entries reported written were written, in order.
        shard = second["Records"][1]["ShardId"]
        iterator = kinesis.get_shard_iterator(
            StreamName="EventStream", ShardId=shard, ShardIteratorType="AT_SEQUENCE_NUMBER",
            StartingSequenceNumber=second["Records"][1]["SequenceNumber"])["ShardIterator"]
        data = [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]
                if r["PartitionKey"] == key]
        self.assertEqual(data, [b"r3", b"r4"])

    # --- (d) transactions on a big table ----------------------------------------------------------

    def test_transactions_on_big_table_are_fast(self) -> None:
        ddb = self.client("dynamodb")
        pk = f"big-{uuid.uuid4()}"
        for start in range(0, 2500, 25):
            ddb.batch_write_item(RequestItems={CHAT_TABLE: [
                {"PutRequest": {"Item": {"pk": {"S": f"{pk}-{i % 50}"}, "sk": {"S": f"msg#{i:05}"},
                                         "text": {"S": "x" * 200}}}}
                for i in range(start, start + 25)]})
        conv = {"pk": {"S": pk}, "sk": {"S": "meta"}}
        ddb.put_item(TableName=CHAT_TABLE, Item={**conv, "seq": {"N": "0"}})

        self.configure(txWindowMs=0)  # the emulator's own speed: no transaction window
        count, started = 200, time.monotonic()
        for seq in range(1, count + 1):
            ddb.transact_write_items(TransactItems=[
                {"Update": {"TableName": CHAT_TABLE, "Key": conv, "UpdateExpression": "SET seq = :s",
                            "ConditionExpression": "seq = :prev",
                            "ExpressionAttributeValues": {":s": {"N": str(seq)},
                                                          ":prev": {"N": str(seq - 1)}}}},
                {"Put": {"TableName": CHAT_TABLE, "ConditionExpression": "attribute_not_exists(pk)",
                         "Item": {"pk": {"S": pk}, "sk": {"S": f"msg#{seq:05}"}, "text": {"S": "hi"}}}},
                {"Put": {"TableName": CHAT_TABLE, "ConditionExpression": "attribute_not_exists(pk)",
                         "Item": {"pk": {"S": pk}, "sk": {"S": f"idem#{seq}"}}}},
            ])
        rate = count / (time.monotonic() - started)
        rss = _rss_mib(self.proc.pid)
        print(f"\n3-item transactions at 2,500+ items, no window: {rate:.0f} tx/s; launcher RSS {rss} MiB",
              file=sys.stderr)
        self.assertGreater(rate, 20)
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=conv)["Item"]["seq"]["N"], str(count))


    # --- (e) transaction conflicts during a transaction's window ----------------------------------

    def in_background(self, call: Callable[[Any], Any]) -> Callable[[], float]:
        """Runs call(dynamodb_client) in a thread; the returned join() gives its duration in s."""
        ddb, out = self.client("dynamodb"), {}

        def run() -> None:
            started = time.monotonic()
            try:
                call(ddb)
            except BaseException as e:  # re-raised by join()
                out["error"] = e
            out["took"] = time.monotonic() - started

        thread = threading.Thread(target=run)
        thread.start()

        def join() -> float:
            thread.join(30)
            if "error" in out:
                raise out["error"]
            return out["took"]
        return join

    def wait_for_item(self, ddb: Any, key: dict[str, Any], present: bool = True) -> None:
        """Polls GetItem until the item exists (or not): a background transaction was applied."""
        deadline = time.monotonic() + 5
        while ("Item" in ddb.get_item(TableName=CHAT_TABLE, Key=key)) != present:
            self.assertLess(time.monotonic(), deadline, f"item {key} never {'appeared' if present else 'went'}")
            time.sleep(0.005)

    def assert_error(self, code: str, call: Callable[[], Any]) -> ClientError:
        with self.assertRaises(ClientError) as caught:
            call()
        self.assertEqual(_code(caught.exception), code)
        self.assertEqual(caught.exception.response["ResponseMetadata"]["HTTPStatusCode"], 400)
        return caught.exception

    def test_transaction_conflicts_with_one_in_its_window(self) -> None:
        self.assertEqual(self.configure(txWindowMs=300), {**DEFAULTS, "txWindowMs": 300})
        ddb, pk = self.client("dynamodb"), f"conv-{uuid.uuid4()}"
        key = lambda sk: {"pk": {"S": pk}, "sk": {"S": sk}}  # noqa: E731
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("meta"), "seq": {"N": "0"}})
        bump = {"Update": {"TableName": CHAT_TABLE, "Key": key("meta"), "UpdateExpression": "ADD seq :one",
                           "ExpressionAttributeValues": {":one": {"N": "1"}}}}
        first = self.in_background(lambda c: c.transact_write_items(TransactItems=[
            {"Put": {"TableName": CHAT_TABLE, "Item": {**key("msg#1"), "text": {"S": "a"}}}}, bump]))
        self.wait_for_item(ddb, key("msg#1"))  # applied, now in its window

        second = [{"Put": {"TableName": CHAT_TABLE, "Item": {**key("msg#2"), "text": {"S": "b"}}}}, bump]
        e = self.assert_error("TransactionCanceledException",
                              lambda: ddb.transact_write_items(TransactItems=second))
        self.assertEqual([r["Code"] for r in e.response["CancellationReasons"]], ["None", "TransactionConflict"])
        self.assertNotIn("Item", ddb.get_item(TableName=CHAT_TABLE, Key=key("msg#2")))

        self.assertGreaterEqual(first(), 0.3, "a transaction answers at the end of its window")
        ddb.transact_write_items(TransactItems=second)  # the window is over
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=key("meta"))["Item"]["seq"], {"N": "2"})

    def test_other_requests_during_a_transaction_window(self) -> None:
        self.configure(txWindowMs=500)  # ten requests must fit in it, on a busy machine too
        ddb, pk = self.client("dynamodb"), f"conv-{uuid.uuid4()}"
        key = lambda sk: {"pk": {"S": pk}, "sk": {"S": sk}}  # noqa: E731
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("checked"), "x": {"N": "1"}})
        done = self.in_background(lambda c: c.transact_write_items(TransactItems=[
            {"Put": {"TableName": CHAT_TABLE, "Item": {**key("put"), "x": {"N": "1"}}}},
            {"Update": {"TableName": CHAT_TABLE, "Key": key("updated"), "UpdateExpression": "SET x = :one",
                        "ExpressionAttributeValues": {":one": {"N": "1"}}}},
            {"ConditionCheck": {"TableName": CHAT_TABLE, "Key": key("checked"),
                                "ConditionExpression": "attribute_exists(pk)"}},
        ]))
        self.wait_for_item(ddb, key("updated"))

        # Single-item writes on any of its items conflict; on other items they do not.
        for call in (lambda: ddb.put_item(TableName=CHAT_TABLE, Item={**key("put"), "x": {"N": "2"}}),
                     lambda: ddb.update_item(TableName=CHAT_TABLE, Key=key("updated"), UpdateExpression="REMOVE x"),
                     lambda: ddb.delete_item(TableName=CHAT_TABLE, Key=key("checked"))):
            e = self.assert_error("TransactionConflictException", call)
            self.assertIn("Transaction is ongoing", str(e))
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("other"), "x": {"N": "1"}})

        # Reads succeed and see the committed items.
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=key("put"))["Item"]["x"], {"N": "1"})
        items = ddb.query(TableName=CHAT_TABLE, KeyConditionExpression="pk = :p",
                          ExpressionAttributeValues={":p": {"S": pk}})["Items"]
        self.assertEqual({i["sk"]["S"]: i["x"]["N"] for i in items},
                         {"checked": "1", "other": "1", "put": "1", "updated": "1"})
        got = ddb.batch_get_item(RequestItems={CHAT_TABLE: {"Keys": [key("put"), key("other")]}})
        self.assertEqual(len(got["Responses"][CHAT_TABLE]), 2)

        # BatchWriteItem: the conflicting request comes back unprocessed, the others are applied.
        conflicting = {"PutRequest": {"Item": {**key("put"), "x": {"N": "3"}}}}
        answer = ddb.batch_write_item(RequestItems={CHAT_TABLE: [
            conflicting, {"PutRequest": {"Item": {**key("batch"), "x": {"N": "1"}}}}]})
        self.assertEqual(answer["UnprocessedItems"], {CHAT_TABLE: [conflicting]})
        self.assertIn("Item", ddb.get_item(TableName=CHAT_TABLE, Key=key("batch")))

        # TransactGetItems on one of its items is cancelled.
        e = self.assert_error("TransactionCanceledException", lambda: ddb.transact_get_items(TransactItems=[
            {"Get": {"TableName": CHAT_TABLE, "Key": key("other")}},
            {"Get": {"TableName": CHAT_TABLE, "Key": key("checked")}}]))
        self.assertEqual([r["Code"] for r in e.response["CancellationReasons"]], ["None", "TransactionConflict"])

        done()
        ddb.put_item(TableName=CHAT_TABLE, Item={**key("put"), "x": {"N": "2"}})
        ddb.delete_item(TableName=CHAT_TABLE, Key=key("checked"))

    def test_no_conflicts_without_window(self) -> None:
        self.assertEqual(self.configure(txWindowMs=0), {**DEFAULTS, "txWindowMs": 0})
        key = {"pk": {"S": f"counter-{uuid.uuid4()}"}, "sk": {"S": "c"}}

        def add(i: int, ddb: Any, _: threading.Barrier) -> None:
            for n in range(3):
                ddb.transact_write_items(TransactItems=[
                    {"Update": {"TableName": CHAT_TABLE, "Key": key, "UpdateExpression": "ADD n :one",
                                "ExpressionAttributeValues": {":one": {"N": "1"}}}},
                    {"Put": {"TableName": CHAT_TABLE, "Item": {"pk": key["pk"], "sk": {"S": f"t{i}-{n}"}}}}])
                ddb.put_item(TableName=CHAT_TABLE, Item={**key, "n": {"N": str(10_000 + n)}, "by": {"N": str(i)}})
                ddb.update_item(TableName=CHAT_TABLE, Key=key, UpdateExpression="REMOVE #by",
                                ExpressionAttributeNames={"#by": "by"})

        self.run_threads(8, add)  # any TransactionConflict would fail it

    # --- (f) ClientRequestToken -------------------------------------------------------------------

    def test_client_request_token_makes_transactions_idempotent(self) -> None:
        self.configure(txWindowMs=50)
        ddb = self.client("dynamodb")
        key = {"pk": {"S": f"counter-{uuid.uuid4()}"}, "sk": {"S": "c"}}
        n = lambda: int(ddb.get_item(TableName=CHAT_TABLE, Key=key)["Item"]["n"]["N"])  # noqa: E731

        def add(amount: int, condition: str | None = None) -> list[dict[str, Any]]:
            update = {"TableName": CHAT_TABLE, "Key": key, "UpdateExpression": "ADD n :amount",
                      "ExpressionAttributeValues": {":amount": {"N": str(amount)}}}
            if condition:
                update["ConditionExpression"] = condition
            return [{"Update": update}]

        token = str(uuid.uuid4())
        for _ in range(3):  # the first applies it, the repeats only answer success
            ddb.transact_write_items(TransactItems=add(1), ClientRequestToken=token)
        self.assertEqual(n(), 1)
        self.assert_error("IdempotentParameterMismatchException",
                          lambda: ddb.transact_write_items(TransactItems=add(2), ClientRequestToken=token))
        self.assertEqual(n(), 1)

        # A repeat while the first call is still in its window.
        self.configure(txWindowMs=300)
        token = str(uuid.uuid4())
        first = self.in_background(lambda c: c.transact_write_items(TransactItems=add(1), ClientRequestToken=token))
        deadline = time.monotonic() + 5
        while n() != 2:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.005)
        self.assert_error("TransactionInProgressException",
                          lambda: ddb.transact_write_items(TransactItems=add(1), ClientRequestToken=token))
        first()
        ddb.transact_write_items(TransactItems=add(1), ClientRequestToken=token)
        self.assertEqual(n(), 2)

        # A cancelled call does not use up its token: the same call runs again.
        self.configure(txWindowMs=0)
        token = str(uuid.uuid4())
        self.assert_error("TransactionCanceledException", lambda: ddb.transact_write_items(
            TransactItems=add(10, "n = :amount"), ClientRequestToken=token))
        ddb.update_item(TableName=CHAT_TABLE, Key=key, UpdateExpression="SET n = :ten",
                        ExpressionAttributeValues={":ten": {"N": "10"}})
        ddb.transact_write_items(TransactItems=add(10, "n = :amount"), ClientRequestToken=token)
        ddb.transact_write_items(TransactItems=add(10, "n = :amount"), ClientRequestToken=token)
        self.assertEqual(n(), 20)

    # --- (g) eventually consistent global secondary index -----------------------------------------

    def test_global_secondary_index_lags(self) -> None:
        table = self.indexed_table()
        self.assertEqual(self.configure(gsiLagMs=300, txWindowMs=0), {**DEFAULTS, "txWindowMs": 0, "gsiLagMs": 300})
        ddb, member = self.client("dynamodb"), f"user-{uuid.uuid4()}"
        conv = [f"conv-{uuid.uuid4()}" for _ in range(3)]
        key = lambda c: {"pk": {"S": c}, "sk": {"S": f"member#{member}"}}  # noqa: E731
        row = lambda c: {**key(c), "memberId": {"S": member}, "lastReadSeq": {"N": "0"}}  # noqa: E731

        def index() -> list[str]:
            items = ddb.query(TableName=table, IndexName=MEMBER_INDEX,
                              KeyConditionExpression="memberId = :m",
                              ExpressionAttributeValues={":m": {"S": member}})["Items"]
            return [i["pk"]["S"] for i in items]

        def index_scan() -> list[str]:
            items = ddb.scan(TableName=table, IndexName=MEMBER_INDEX, FilterExpression="memberId = :m",
                             ExpressionAttributeValues={":m": {"S": member}})["Items"]
            return [i["pk"]["S"] for i in items]

        def base(c: str) -> list[dict[str, Any]]:
            return ddb.query(TableName=table, KeyConditionExpression="pk = :p",
                             ExpressionAttributeValues={":p": {"S": c}})["Items"]

        written = time.monotonic()
        ddb.put_item(TableName=table, Item=row(conv[0]))
        # Failed writes never reach the index: a cancelled transaction, a failed conditional put.
        self.assert_error("TransactionCanceledException", lambda: ddb.transact_write_items(TransactItems=[
            {"Put": {"TableName": table, "Item": row(conv[1])}},
            {"ConditionCheck": {"TableName": table, "Key": key(conv[2]),
                                "ConditionExpression": "attribute_exists(pk)"}}]))
        self.assert_error("ConditionalCheckFailedException", lambda: ddb.put_item(
            TableName=table, Item=row(conv[2]), ConditionExpression="attribute_exists(pk)"))
        self.assertEqual(len(base(conv[0])), 1, "the base table sees a write at once")
        self.assertEqual((index(), index_scan()), ([], []), "the index sees it only after the lag")
        self.assertLess(time.monotonic() - written, 0.3, "too slow to test the lag")
        time.sleep(max(0.0, written + 0.35 - time.monotonic()))
        self.assertEqual((index(), index_scan()), ([conv[0]], [conv[0]]))

        removed = time.monotonic()
        ddb.delete_item(TableName=table, Key=key(conv[0]))
        self.assertEqual(base(conv[0]), [])
        self.assertEqual(index(), [conv[0]], "deletes lag too")
        self.assertLess(time.monotonic() - removed, 0.3, "too slow to test the lag")
        time.sleep(max(0.0, removed + 0.35 - time.monotonic()))
        self.assertEqual((index(), index_scan()), ([], []))

    # --- (h) settings and reset -------------------------------------------------------------------

    def test_config_endpoint(self) -> None:
        self.assertEqual(self.configure(), DEFAULTS)
        self.assertEqual(self.configure(gsiLagMs=2.5), {**DEFAULTS, "gsiLagMs": 2.5})
        for bad in ({"txWindowMs": -1}, {"gsiLagMs": "soon"}, {"other": 1}, {"fastPath": 1}):
            with self.assertRaises(urllib.error.HTTPError) as caught:
                self.configure(**bad)
            self.assertEqual(caught.exception.code, 400)
        self.assertEqual(self.configure(), {**DEFAULTS, "gsiLagMs": 2.5})
        self.assertEqual(self.configure(fastPath=False), {**DEFAULTS, "gsiLagMs": 2.5, "fastPath": False})

    def test_settings_from_flags_and_env(self) -> None:
        sys.path.insert(0, INFRA)
        try:
            import moto_server  # noqa: PLC0415 - moto is slow to import; only this test needs it
        finally:
            sys.path.remove(INFRA)
        env = {"CHAT_EMULATOR_TX_WINDOW_MS": "0", "CHAT_EMULATOR_GSI_LAG_MS": "250"}
        none = argparse.Namespace(tx_window_ms=None, gsi_lag_ms=None)
        defaults = {"tx_window_ms": 10, "gsi_lag_ms": 0, "fast_path": True}
        self.assertEqual(moto_server.settings_from(none, {}), defaults)
        self.assertEqual(moto_server.settings_from(none, env), {**defaults, "tx_window_ms": 0, "gsi_lag_ms": 250})
        flags = argparse.Namespace(tx_window_ms="5", gsi_lag_ms="1.5")
        self.assertEqual(moto_server.settings_from(flags, env), {**defaults, "tx_window_ms": 5, "gsi_lag_ms": 1.5})
        off = argparse.Namespace(tx_window_ms=None, gsi_lag_ms=None, fast_path="off")
        self.assertFalse(moto_server.settings_from(off, {})["fast_path"])
        self.assertFalse(moto_server.settings_from(none, {"CHAT_EMULATOR_FAST_PATH": "0"})["fast_path"])
        for bad in ("-1", "abc", "nan"):
            with self.assertRaises(ValueError):
                moto_server.settings_from(none, {"CHAT_EMULATOR_TX_WINDOW_MS": bad})
            with self.assertRaises(ValueError):
                moto_server.settings_from(none, {"CHAT_EMULATOR_FAST_PATH": bad})

    def test_gc_policy_freezes_survivors_and_reset_collects_them(self) -> None:
        sys.path.insert(0, INFRA)
        try:
            import moto_server  # noqa: PLC0415 - moto is slow to import; only these tests need it
        finally:
            sys.path.remove(INFRA)
        import gc  # noqa: PLC0415
        import weakref  # noqa: PLC0415

        class Node:
            pass

        def cycle() -> tuple[Node, "weakref.ref[Node]"]:
            a, b = Node(), Node()
            a.other, b.other = b, a  # type: ignore[attr-defined]
            return a, weakref.ref(a)

        try:
            moto_server.install_gc_policy()
            self.assertGreater(gc.get_freeze_count(), 0)  # what was alive at start
            kept, kept_ref = cycle()
            gc.collect()  # a full collection: its survivors are frozen, collections skip them
            self.assertNotIn(kept, gc.get_objects())
            # A frozen cycle that is dropped later stays until a reset collects everything.
            del kept
            gc.collect()
            self.assertIsNotNone(kept_ref())
            moto_server.collect_everything()
            self.assertIsNone(kept_ref())
            # Cycles dropped before the next full collection are collected as usual.
            dropped_ref = cycle()[1]
            gc.collect()
            self.assertIsNone(dropped_ref())
        finally:
            if moto_server._freeze_survivors in gc.callbacks:
                gc.callbacks.remove(moto_server._freeze_survivors)
            gc.unfreeze()

    def test_reset_clears_simulation_state(self) -> None:
        self.configure(txWindowMs=300, gsiLagMs=300)
        ddb, token = self.client("dynamodb"), str(uuid.uuid4())
        key = {"pk": {"S": f"conv-{uuid.uuid4()}"}, "sk": {"S": "meta"}}
        done = self.in_background(lambda c: c.transact_write_items(
            TransactItems=[{"Put": {"TableName": CHAT_TABLE, "Item": key}}], ClientRequestToken=token))
        self.wait_for_item(ddb, key)
        faults = self.url + "/moto-api/chat/faults"
        urllib.request.urlopen(urllib.request.Request(
            faults, data=b'{"kinesisPutFailures": 7}', method="POST")).close()

        urllib.request.urlopen(urllib.request.Request(self.url + "/moto-api/reset", method="POST")).close()
        with urllib.request.urlopen(faults) as r:
            self.assertEqual(json.load(r), {"kinesisPutFailures": 0}, "reset clears injected failures")
        sys.path.insert(0, INFRA)
        try:
            from create_resources import create_resources  # noqa: PLC0415
        finally:
            sys.path.remove(INFRA)
        create_resources(self.url, os.path.join(REPO, "template.yaml"), "us-east-1", log=lambda _: None)
        self.assertEqual(self.configure(), {**DEFAULTS, "txWindowMs": 300, "gsiLagMs": 300},
                         "reset keeps the settings")

        # The item is no longer in a transaction, and the token is new again.
        ddb.put_item(TableName=CHAT_TABLE, Item={**key, "x": {"S": "y"}})
        ddb.transact_write_items(TransactItems=[{"Delete": {"TableName": CHAT_TABLE, "Key": key}}],
                                 ClientRequestToken=token)
        self.wait_for_item(ddb, key, present=False)
        done()

    # --- (i) the fast path: the same answers as moto's own request handling -----------------------

    def raw(self, target: str, body: Any, conn: http.client.HTTPConnection | None = None,
            service: str = "dynamodb", headers: dict[str, str] | None = None) -> Raw:
        """POSTs `body` (JSON-encoded unless bytes) as the SDKs do; the answer, unparsed."""
        host, port = self.url.rsplit("/", 1)[1].split(":")
        if conn is None:
            with contextlib.closing(http.client.HTTPConnection(host, int(port), timeout=30)) as own:
                return self.raw(target, body, own, service, headers)
        json_version = "1.1" if service == "kinesis" else "1.0"
        conn.request("POST", "/", body=body if isinstance(body, bytes) else json.dumps(body).encode(), headers={
            "Content-Type": f"application/x-amz-json-{json_version}", "X-Amz-Target": target,
            "User-Agent": "test_moto_server", "X-Amz-Date": "20260101T000000Z",
            "Authorization": f"AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, "
                             "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=00",
            **(headers or {})})
        response = conn.getresponse()
        return Raw(response.status, response.reason, response.getheaders(), response.read())

    def assert_same_both_ways(self, target: str, body: Any, **kwargs: Any) -> Raw:
        """Sends the request with the fast path off, then on: the same status, headers (but Date,
        the request id and Connection) and body. Returns the fast path's answer."""
        answers = []
        for fast in (False, True):  # and on afterwards
            self.configure(fastPath=fast)
            answers.append(self.raw(target, body, **kwargs))
        moto_answer, fast_answer = answers
        varying = ("date", "x-amzn-requestid", "connection")
        self.assertEqual((fast_answer.status, fast_answer.reason), (moto_answer.status, moto_answer.reason))
        self.assertEqual([h for h in fast_answer.headers if h[0].lower() not in varying],
                         [h for h in moto_answer.headers if h[0].lower() not in varying], target)
        self.assertEqual(fast_answer.body, moto_answer.body, target)
        self.assertIn(("Connection", "close"), moto_answer.headers)
        if fast_answer.status != 500:  # moto's 500 page comes from werkzeug, without these
            self.assertEqual([len(a.header("x-amzn-requestid") or "") for a in answers], [52, 52])
            if target.startswith("DynamoDB_"):  # the SDKs check it when it is there
                self.assertEqual(int(fast_answer.header("x-amz-crc32") or -1), zlib.crc32(fast_answer.body))
        return fast_answer

    def test_fast_path_answers_like_moto(self) -> None:
        self.configure(txWindowMs=0)  # repeated transactions on the same items
        ddb, pk = self.client("dynamodb"), f"fast-{uuid.uuid4()}"
        latest = self.stream_iterator("LATEST")
        key = lambda sk: {"pk": {"S": pk}, "sk": {"S": sk}}  # noqa: E731
        rich = {**key("rich"), "s": {"S": "héllo ✓ \"quoted\" \\ /"}, "empty": {"S": ""},
                "n": {"N": "-12.50"}, "big": {"N": "123456789012345678901234567890"},
                "b": {"B": b"\x00\xff binary"}, "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2.5"]},
                "bs": {"BS": [b"x", b"\x01"]}, "null": {"NULL": True}, "t": {"BOOL": True}, "f": {"BOOL": False},
                "l": {"L": [{"S": "x"}, {"N": "1"}, {"M": {"deep": {"L": [{"NULL": True}]}}}, {"B": b"in list"}]},
                "m": {"M": {"a": {"S": "b"}, "nested": {"M": {"ss": {"SS": ["z"]}}}, "e": {"M": {}}}},
                "memberId": {"S": f"member-{pk}"}}
        ddb.put_item(TableName=CHAT_TABLE, Item=rich)
        for i in range(5):
            ddb.put_item(TableName=CHAT_TABLE, Item={**key(f"msg#{i}"), "i": {"N": str(i)}, "text": {"S": "t" * i}})
        rich_json = json.loads(json.dumps(rich, default=lambda b: base64.b64encode(b).decode()))
        ddb_target = "DynamoDB_20120810."
        same = lambda action, body, **kw: self.assert_same_both_ways(ddb_target + action, body, **kw)  # noqa: E731

        # Reads.
        got = same("GetItem", {"TableName": CHAT_TABLE, "Key": key("rich")})
        self.assertEqual(json.loads(got.body)["Item"], rich_json)
        same("GetItem", {"TableName": CHAT_TABLE, "Key": key("missing"), "ReturnConsumedCapacity": "TOTAL"})
        same("GetItem", {"TableName": CHAT_TABLE, "Key": key("rich"), "ConsistentRead": True,
                         "ProjectionExpression": "#s, m.nested, l[2]", "ExpressionAttributeNames": {"#s": "s"}})
        query = {"TableName": CHAT_TABLE, "KeyConditionExpression": "pk = :p AND begins_with(sk, :m)",
                 "ExpressionAttributeValues": {":p": {"S": pk}, ":m": {"S": "msg#"}}}
        page = json.loads(same("Query", {**query, "Limit": 2}).body)
        self.assertEqual([i["sk"]["S"] for i in page["Items"]], ["msg#0", "msg#1"])
        same("Query", {**query, "Limit": 2, "ExclusiveStartKey": page["LastEvaluatedKey"],
                       "ScanIndexForward": False})
        same("Query", {**query, "Select": "COUNT", "ReturnConsumedCapacity": "INDEXES"})
        same("Query", {**query, "FilterExpression": "i > :one", "ExpressionAttributeValues": {
            **query["ExpressionAttributeValues"], ":one": {"N": "1"}}})
        indexed = self.indexed_table()  # ChatTable has no secondary index
        ddb.put_item(TableName=indexed, Item=rich)
        same("Query", {"TableName": indexed, "IndexName": MEMBER_INDEX,
                       "KeyConditionExpression": "memberId = :m",
                       "ExpressionAttributeValues": {":m": {"S": f"member-{pk}"}}})
        same("Scan", {"TableName": CHAT_TABLE, "Limit": 3})
        same("BatchGetItem", {"RequestItems": {CHAT_TABLE: {"Keys": [key("rich"), key("msg#3"), key("missing")]}}})
        same("TransactGetItems", {"TransactItems": [{"Get": {"TableName": CHAT_TABLE, "Key": key("rich")}},
                                                    {"Get": {"TableName": CHAT_TABLE, "Key": key("missing")}}]})
        same("DescribeTable", {"TableName": CHAT_TABLE})
        same("ListTables", {})

        # Writes that change nothing the second time, and failed ones.
        update = {"TableName": CHAT_TABLE, "Key": key("msg#1"), "UpdateExpression": "SET #t = :t ADD tags :tag",
                  "ExpressionAttributeNames": {"#t": "text"},
                  "ExpressionAttributeValues": {":t": {"S": "edited"}, ":tag": {"SS": ["x"]}}}
        for return_values in ("ALL_NEW", "UPDATED_OLD", "NONE"):
            same("UpdateItem", {**update, "ReturnValues": return_values})
        same("PutItem", {"TableName": CHAT_TABLE, "Item": rich_json, "ReturnValues": "ALL_OLD"})
        same("DeleteItem", {"TableName": CHAT_TABLE, "Key": key("missing"), "ReturnValues": "ALL_OLD"})
        failed = same("PutItem", {"TableName": CHAT_TABLE, "Item": rich_json,
                                  "ConditionExpression": "attribute_not_exists(pk)",
                                  "ReturnValuesOnConditionCheckFailure": "ALL_OLD"})
        self.assertEqual((failed.status, json.loads(failed.body)["Item"]), (400, rich_json))
        same("TransactWriteItems", {"TransactItems": [
            {"Put": {"TableName": CHAT_TABLE, "Item": {**key("msg#2"), "i": {"N": "2"}, "text": {"S": "tt"}}}},
            {"Update": {"TableName": CHAT_TABLE, "Key": key("msg#3"), "UpdateExpression": "SET i = :i",
                        "ExpressionAttributeValues": {":i": {"N": "3"}}}}]})
        cancelled = same("TransactWriteItems", {"TransactItems": [
            {"Put": {"TableName": CHAT_TABLE, "Item": key("new")}},
            {"ConditionCheck": {"TableName": CHAT_TABLE, "Key": key("rich"), "ConditionExpression": "n = :zero",
                                "ExpressionAttributeValues": {":zero": {"N": "0"}},
                                "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}}]})
        reasons = json.loads(cancelled.body)["CancellationReasons"]
        self.assertEqual([r["Code"] for r in reasons], ["None", "ConditionalCheckFailed"])
        self.assertEqual(reasons[1]["Item"], rich_json)
        for bad in (
                {"TableName": CHAT_TABLE, "Key": key("msg#1"), "UpdateExpression": "SET = oops"},
                {"TableName": CHAT_TABLE, "Key": {"pk": {"S": pk}}, "UpdateExpression": "SET a = :a",
                 "ExpressionAttributeValues": {":a": {"S": "a"}}},
                {"TableName": "NoSuchTable", "Key": key("x"), "UpdateExpression": "REMOVE a"},
                {"TableName": CHAT_TABLE, "Key": key("x"), "UpdateExpression": "REMOVE a",
                 "ExpressionAttributeNames": {"#unused": "u"}}):
            self.assertEqual(same("UpdateItem", bad).status, 400)
        same("GetItem", {"TableName": "NoSuchTable", "Key": key("x")})
        same("BatchGetItem", {"RequestItems": {CHAT_TABLE: {"Keys": [key("rich"), key("rich")]}}})
        same("NoSuchAction", {})
        same("GetItem", b"{not json")
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=key("new")).get("Item"), None)

        # Requests with an Origin header (CORS: flask-cors answers those) and other services.
        same("GetItem", {"TableName": CHAT_TABLE, "Key": key("rich")}, headers={"Origin": "http://localhost:3000"})
        streams_target, kinesis_target = "DynamoDBStreams_20120810.", "Kinesis_20131202."
        arn = ddb.describe_table(TableName=CHAT_TABLE)["Table"]["LatestStreamArn"]
        self.assert_same_both_ways(streams_target + "DescribeStream", {"StreamArn": arn})
        self.assert_same_both_ways(streams_target + "ListStreams", {})
        kinesis = self.client("kinesis")
        put = kinesis.put_record(StreamName="EventStream", Data=b"\x00data", PartitionKey=pk)
        iterator = kinesis.get_shard_iterator(
            StreamName="EventStream", ShardId=put["ShardId"], ShardIteratorType="AT_SEQUENCE_NUMBER",
            StartingSequenceNumber=put["SequenceNumber"])["ShardIterator"]
        for action, body in (("GetRecords", {"ShardIterator": iterator, "Limit": 1}),
                             ("DescribeStreamSummary", {"StreamName": "EventStream"}),
                             ("ListShards", {"StreamName": "EventStream"}),
                             ("DescribeStream", {"StreamName": "NoSuchStream"})):
            self.assert_same_both_ways(kinesis_target + action, body, service="kinesis")

        # DynamoDB Streams: GetRecords uses up its iterator, so one each way; the same records.
        seq = self.client("dynamodbstreams").get_records(ShardIterator=latest, Limit=1)["Records"][0]["dynamodb"][
            "SequenceNumber"]  # the INSERT of `rich`
        records = []
        for fast in (False, True):
            self.configure(fastPath=fast)
            shard = json.loads(self.raw(streams_target + "DescribeStream", {"StreamArn": arn}).body)
            it = json.loads(self.raw(streams_target + "GetShardIterator", {
                "StreamArn": arn, "ShardId": shard["StreamDescription"]["Shards"][-1]["ShardId"],
                "ShardIteratorType": "AT_SEQUENCE_NUMBER", "SequenceNumber": seq}).body)["ShardIterator"]
            answer = self.raw(streams_target + "GetRecords", {"ShardIterator": it, "Limit": 3})
            self.assertEqual(answer.status, 200)
            records.append(json.loads(answer.body)["Records"])
        self.configure(fastPath=True)
        self.assertEqual(records[0][0]["dynamodb"]["NewImage"], rich_json)
        self.assertEqual(records[0], records[1])

    def test_set_only_updates_match_moto(self) -> None:
        """UpdateItems of the form `SET a = :x, #b = :y` (the fast path's own update) against
        moto's update, each case on a fresh partition both ways: the same answers, stream records
        and items, including every failure moto's validators raise for that form."""
        self.configure(txWindowMs=0)
        indexed = self.indexed_table()  # defines memberId (S) for its index: moto checks its type
        values = {":s": {"S": "héllo ✓"}, ":n": {"N": "-12.50"}, ":b": {"B": "AP8="}, ":empty": {"S": ""},
                  ":ss": {"SS": ["a", "b"]}, ":ns": {"NS": ["1", "2.5"]}, ":bs": {"BS": ["eA==", "AQ=="]},
                  ":null": {"NULL": True}, ":t": {"BOOL": True},
                  ":l": {"L": [{"S": "x"}, {"M": {"deep": {"L": [{"NULL": True}]}}}]},
                  ":m": {"M": {"a": {"S": "b"}, "e": {"M": {}}}}, ":seq": {"N": "7"}, ":token": {"S": "tok"}}
        every_type = ("SET s = :s, n = :n, b = :b, e = :empty, ss = :ss, ns = :ns, bs = :bs, nul = :null, "
                      "t = :t, l = :l, m = :m")
        mark = {"UpdateExpression": "SET lastReadSeq = :seq, lastReadBy = :token",
                "ConditionExpression": "attribute_exists(pk) AND lastReadSeq < :seq",
                "ExpressionAttributeValues": {":seq": {"N": "7"}, ":token": {"S": "tok"}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}

        def update(expression: str, **more: Any) -> dict[str, Any]:
            placeholders = re.findall(r":[A-Za-z0-9_]+", expression + " " + more.get("ConditionExpression", ""))
            used = {k: v for k, v in values.items() if k in placeholders}
            return {"UpdateExpression": expression, "ExpressionAttributeValues": used, **more}

        cases: list[tuple[str, list[dict[str, Any]]]] = [
            ("a new item, every type", [update(every_type, ReturnValues="ALL_NEW")]),
            ("return values", [update("SET a = :s", ReturnValues="NONE"),
                               update("SET a = :n, c = :t", ReturnValues="UPDATED_OLD"),
                               update("SET a = :ss", ReturnValues="ALL_OLD"),
                               update("SET d = :m", ReturnValues="UPDATED_NEW")]),
            ("a read receipt", [update("SET lastReadSeq = :n"), mark, mark,
                                {**mark, "ReturnValuesOnConditionCheckFailure": "NONE"}]),
            ("a condition on a missing item", [mark, {**mark, "ReturnValuesOnConditionCheckFailure": "NONE"}]),
            ("names", [update("SET #a = :s, #b = :n", ExpressionAttributeNames={"#a": "a", "#b": "count"},
                              ReturnValues="ALL_NEW"),
                       update("set   x=:s ,y = :t", ReturnValues="ALL_NEW")]),
            ("the same attribute twice", [update("SET a = :s, a = :n"), update("SET #a = :s, a = :n",
                                                                               ExpressionAttributeNames={"#a": "a"})]),
            ("key attributes", [update("SET pk = :s"), update("SET #k = :s", ExpressionAttributeNames={"#k": "sk"})]),
            ("missing placeholders", [update("SET a = :nope"), update("SET #nope = :s"),
                                      update("SET #a = :s", ExpressionAttributeNames={"#b": "b"})]),
            ("reserved words and syntax", [update("SET name = :s"), update("SET a = :s,"), update("SET a :s")]),
            ("too large", [update("SET a = :s"), {"UpdateExpression": "SET big = :big",
                                                  "ExpressionAttributeValues": {":big": {"S": "x" * 405_000}}}]),
            ("in a transaction", [{"transact": [update("SET a = :s, n = :n")]},
                                  {"transact": [update("SET a = :t", ConditionExpression="a = :s")]},
                                  {"transact": [update("SET a = :n", ConditionExpression="a = :s",
                                                       ReturnValuesOnConditionCheckFailure="ALL_OLD")]},
                                  {"transact": [update("SET pk = :s")]}]),
            ("legacy parameters", [{"AttributeUpdates": {"a": {"Action": "PUT", "Value": {"S": "v"}}}},
                                   update("SET a = :s", Expected={"a": {"Value": {"S": "v"}}})]),
        ]
        index_cases: list[tuple[str, list[dict[str, Any]]]] = [
            ("an index key of the wrong type", [update("SET memberId = :n"), update("SET memberId = :empty"),
                                                update("SET memberId = :s, x = :t", ReturnValues="ALL_NEW")]),
        ]

        def run(table: str, steps: list[dict[str, Any]], pk: str) -> list[Any]:
            key = {"pk": {"S": pk}, "sk": {"S": "item"}}
            out: list[Any] = []
            for step in steps:
                if "transact" in step:
                    action, body = "TransactWriteItems", {"TransactItems": [
                        {"Update": {"TableName": table, "Key": key, **u}} for u in step["transact"]]}
                else:
                    action, body = "UpdateItem", {"TableName": table, "Key": key, **step}
                answer = self.raw("DynamoDB_20120810." + action, body)
                out.append((answer.status, answer.body.replace(pk.encode(), b"PK")))
            item = self.raw("DynamoDB_20120810.GetItem", {"TableName": table, "Key": key})
            out.append(item.body.replace(pk.encode(), b"PK"))
            return out

        failing_only = {"a condition on a missing item", "the same attribute twice", "key attributes",
                        "missing placeholders", "reserved words and syntax"}
        streams, self.maxDiff = "DynamoDBStreams_20120810.", None
        for table, table_cases in ((CHAT_TABLE, cases), (indexed, index_cases)):
            for name, steps in table_cases:
                seen = []
                for fast in (False, True):
                    self.configure(fastPath=fast)
                    pk, iterator = f"sets-{uuid.uuid4()}", self.stream_iterator("LATEST")
                    answers = run(table, steps, pk)
                    records = []
                    if table == CHAT_TABLE:
                        page = json.loads(self.raw(streams + "GetRecords", {"ShardIterator": iterator}).body)
                        # SizeBytes: moto's size of the record's JSON, sequence number and time included.
                        varying = ("SequenceNumber", "ApproximateCreationDateTime", "SizeBytes")
                        records = [(r["eventName"], {k: v for k, v in r["dynamodb"].items() if k not in varying})
                                   for r in page["Records"] if r["dynamodb"]["Keys"]["pk"]["S"] == pk]
                        records = json.loads(json.dumps(records).replace(pk, "PK"))
                    seen.append((answers, records))
                self.configure(fastPath=True)
                self.assertEqual(seen[0], seen[1], name)
                if name not in failing_only:
                    self.assertNotEqual(seen[0][0][-1], b"{}", f"{name}: no item was written")

    def test_kinesis_shard_reads_match_moto(self) -> None:
        """GetRecords from every kind of position and with several limits, following the next
        iterators, and the sequence numbers PutRecord hands out: the same both ways."""
        kinesis, target = self.client("kinesis"), "Kinesis_20131202."
        key = f"kinesis-{uuid.uuid4()}"  # one partition key: one shard
        puts = [kinesis.put_record(StreamName="EventStream", Data=f"r{i}".encode(), PartitionKey=key)
                for i in range(4)]
        self.configure(fastPath=False)
        puts.append(kinesis.put_record(StreamName="EventStream", Data=b"r4", PartitionKey=key))
        self.configure(fastPath=True)
        puts += [kinesis.put_record(StreamName="EventStream", Data=f"r{i}".encode(), PartitionKey=key)
                 for i in range(5, 8)]
        shard, numbers = puts[0]["ShardId"], [int(p["SequenceNumber"]) for p in puts]
        self.assertEqual(numbers, list(range(numbers[0], numbers[0] + 8)), "consecutive both ways")

        def iterator(kind: str, seq: int | None = None) -> str:
            more = {"StartingSequenceNumber": str(seq)} if seq is not None else {}
            return kinesis.get_shard_iterator(StreamName="EventStream", ShardId=shard,
                                              ShardIteratorType=kind, **more)["ShardIterator"]

        starts = [iterator("TRIM_HORIZON"), iterator("LATEST"), iterator("AT_SEQUENCE_NUMBER", numbers[0]),
                  iterator("AFTER_SEQUENCE_NUMBER", numbers[2]), iterator("AT_SEQUENCE_NUMBER", numbers[-1]),
                  iterator("AFTER_SEQUENCE_NUMBER", numbers[-1])]
        for start in starts:
            for limit in (1, 3, 10_000):
                it, pages = start, 0
                while it and pages < 4:
                    answer = json.loads(self.assert_same_both_ways(
                        target + "GetRecords", {"ShardIterator": it, "Limit": limit}, service="kinesis").body)
                    it, pages = answer.get("NextShardIterator"), pages + 1
        mine = json.loads(self.raw(target + "GetRecords", {"ShardIterator": iterator(
            "AT_SEQUENCE_NUMBER", numbers[0]), "Limit": 10_000}, service="kinesis").body)["Records"]
        self.assertEqual([base64.b64decode(r["Data"]) for r in mine if r["PartitionKey"] == key],
                         [f"r{i}".encode() for i in range(8)])

    def test_fast_path_keeps_connections_open(self) -> None:
        host, port = self.url.rsplit("/", 1)[1].split(":")
        get = {"TableName": CHAT_TABLE, "Key": {"pk": {"S": "keep-alive"}, "sk": {"S": "x"}}}
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        first = self.raw("DynamoDB_20120810.GetItem", get, conn)
        sock = conn.sock
        second = self.raw("DynamoDB_20120810.GetItem", get, conn)
        self.assertIs(conn.sock, sock, "the connection was reused")
        self.assertEqual((first.status, second.status, first.header("connection")), (200, 200, None))
        # A client that asks to close.
        closing = self.raw("DynamoDB_20120810.GetItem", get, conn, headers={"Connection": "close"})
        self.assertEqual((closing.status, closing.header("connection")), (200, "close"))
        conn.close()

        # A chunked request body, and HTTP/1.0: answered, then the connection is closed.
        body = json.dumps(get).encode()
        head = (f"POST / HTTP/1.1\r\nHost: {host}\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\n"
                "Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 "
                "Credential=t/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0\r\n")
        chunked = (head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + hex(len(body))[2:].encode()
                   + b"\r\n" + body + b"\r\n0\r\n\r\n")
        http_1_0 = (head.replace("HTTP/1.1", "HTTP/1.0").encode() + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body)
        for request in (chunked, http_1_0):
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(request)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            self.assertTrue(answer.startswith((b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 OK\r\n")), answer[:100])
            self.assertIn(b"\r\nConnection: close\r\n", answer)
            self.assertTrue(answer.endswith(b"\r\n\r\n{}"), answer[-100:])

    def test_update_expression_cache_keeps_meaning(self) -> None:
        ddb, pk = self.client("dynamodb"), f"cache-{uuid.uuid4()}"
        expression = ("SET #c = if_not_exists(#c, :zero) + :inc, "
                      "tags = list_append(if_not_exists(tags, :none), :tag)")
        for i, sk in enumerate(("a", "b", "a")):
            item = ddb.update_item(TableName=CHAT_TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}},
                                   UpdateExpression=expression, ExpressionAttributeNames={"#c": "count"},
                                   ExpressionAttributeValues={":zero": {"N": "0"}, ":inc": {"N": str(i + 1)},
                                                              ":none": {"L": []}, ":tag": {"L": [{"S": f"t{i}"}]}},
                                   ReturnValues="ALL_NEW")["Attributes"]
        self.assertEqual((item["count"], item["tags"]), ({"N": "4"}, {"L": [{"S": "t0"}, {"S": "t2"}]}))
        for _ in range(2):  # an invalid expression is rejected every time
            self.assert_error("ValidationException", lambda: ddb.update_item(
                TableName=CHAT_TABLE, Key={"pk": {"S": pk}, "sk": {"S": "a"}}, UpdateExpression="SET a = ",
                ExpressionAttributeValues={":a": {"S": "a"}}))

    # --- (j) Query reads one partition --------------------------------------------------------------

    def test_query_reads_the_queried_partition(self) -> None:
        ddb, prefix = self.client("dynamodb"), f"part-{uuid.uuid4()}"
        indexed = self.indexed_table()  # keys like ChatTable's, and an index
        sks = ["m#3", "a", "m#10", "z", "m#1", "b#", "m#2"]  # stored out of order
        member = f"member-{prefix}"
        writes = [{"PutRequest": {"Item": {"pk": {"S": f"{prefix}-{p}"}, "sk": {"S": sk}, "p": {"N": str(p)},
                                           **({"memberId": {"S": member}} if sk == "a" else {})}}}
                  for p in range(30) for sk in sks]
        for start in range(0, len(writes), 25):
            ddb.batch_write_item(RequestItems={indexed: writes[start:start + 25]})

        def query(pk: str, forward: bool = True, limit: int | None = None, **extra: Any) -> list[str]:
            out, start = [], None
            while True:
                page = ddb.query(**{"TableName": indexed, "KeyConditionExpression": "pk = :p",
                                    "ExpressionAttributeValues": {":p": {"S": pk}}, "ScanIndexForward": forward,
                                    **({"Limit": limit} if limit else {}),
                                    **({"ExclusiveStartKey": start} if start else {}), **extra})
                self.assertTrue(all(i["pk"]["S"] == pk for i in page.get("Items", [])))
                out += [i["sk"]["S"] for i in page.get("Items", [])] or [page["Count"]] * ("Select" in extra)
                start = page.get("LastEvaluatedKey")
                if not start:
                    return out

        for fast in (True, False):  # the same with moto's own request handling
            self.configure(fastPath=fast)
            self.assertEqual(query(f"{prefix}-13"), sorted(sks))
            self.assertEqual(query(f"{prefix}-13", limit=3), sorted(sks))
            self.assertEqual(query(f"{prefix}-0", forward=False, limit=2), sorted(sks, reverse=True))
            self.assertEqual(query(f"{prefix}-29", Select="COUNT"), [len(sks)])
            self.assertEqual(query(f"{prefix}-nope"), [])
            between = ddb.query(TableName=indexed, KeyConditionExpression="pk = :p AND sk BETWEEN :a AND :b",
                                ExpressionAttributeValues={":p": {"S": f"{prefix}-7"}, ":a": {"S": "m#1"},
                                                           ":b": {"S": "m#3"}}, ScanIndexForward=False)["Items"]
            self.assertEqual([i["sk"]["S"] for i in between], ["m#3", "m#2", "m#10", "m#1"])
            self.assertEqual(query(f"{prefix}-4", KeyConditionExpression="pk = :p AND begins_with(sk, :m)",
                                   ExpressionAttributeValues={":p": {"S": f"{prefix}-4"}, ":m": {"S": "m#"}},
                                   limit=1), ["m#1", "m#10", "m#2", "m#3"])
            # Every sort key condition, both directions, paged: the same items as moto's own Query.
            for condition, values, expected in (
                    ("sk = :a", {":a": "m#2"}, ["m#2"]),
                    ("sk < :a", {":a": "m#2"}, ["a", "b#", "m#1", "m#10"]),
                    ("sk <= :a", {":a": "m#2"}, ["a", "b#", "m#1", "m#10", "m#2"]),
                    ("sk > :a", {":a": "m#2"}, ["m#3", "z"]),
                    ("sk >= :a", {":a": "m#2"}, ["m#2", "m#3", "z"]),
                    ("sk BETWEEN :a AND :b", {":a": "b", ":b": "m#10"}, ["b#", "m#1", "m#10"]),
                    ("begins_with(sk, :a)", {":a": "b"}, ["b#"]),
                    ("sk BETWEEN :a AND :b", {":a": "n", ":b": "y"}, [])):
                pk = f"{prefix}-21"
                for forward in (True, False):
                    got = query(pk, forward=forward, limit=2, KeyConditionExpression=f"pk = :p AND {condition}",
                                ExpressionAttributeValues={":p": {"S": pk}, **{k: {"S": v} for k, v in values.items()}})
                    self.assertEqual(got, expected if forward else expected[::-1], (condition, fast))
            index = ddb.query(TableName=indexed, IndexName=MEMBER_INDEX, KeyConditionExpression="memberId = :m",
                              ExpressionAttributeValues={":m": {"S": member}})["Items"]
            self.assertEqual([i["pk"]["S"] for i in index], sorted(f"{prefix}-{p}" for p in range(30)))
        self.configure(fastPath=True)

        # A numeric sort key sorts by number, not by its text.
        table = f"PartitionQuery-{uuid.uuid4().hex[:8]}"
        ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "n", "AttributeType": "N"}],
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                    {"AttributeName": "n", "KeyType": "RANGE"}])
        try:
            for pk in ("x", "y"):
                for n in ("10", "9", "100", "-1", "2.5"):
                    ddb.put_item(TableName=table, Item={"pk": {"S": pk}, "n": {"N": n}})
            items = ddb.query(TableName=table, KeyConditionExpression="pk = :p",
                              ExpressionAttributeValues={":p": {"S": "y"}})["Items"]
            self.assertEqual([(i["pk"]["S"], i["n"]["N"]) for i in items],
                             [("y", "-1"), ("y", "2.5"), ("y", "9"), ("y", "10"), ("y", "100")])
        finally:
            ddb.delete_table(TableName=table)

def _rss_mib(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return str(kib // 1024)
    except (OSError, StopIteration):
        return "?"


if __name__ == "__main__":
    unittest.main()
