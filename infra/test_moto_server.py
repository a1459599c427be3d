"""Tests of infra/moto_server.py (our moto launcher) through the AWS SDK.

    .venv/bin/python -m unittest infra/test_moto_server.py

Starts the launcher on a free loopback port with the repository's template.yaml and checks the
fixes it makes to moto: serialised requests, in-place rollback of cancelled transactions (stream
iterators keep working, no stream records, no item changes), fast transactions on a big table.
"""
from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

INFRA = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(INFRA)
CHAT_TABLE = "ChatTable"


def slow_condition(condition: str, clauses: int) -> dict[str, Any]:
    """`condition` OR-ed with clauses that are never true: same meaning, but moto takes
    milliseconds to parse it between reading the item and writing it (see test (a))."""
    names = {f"#never{i}": f"never{i}" for i in range(clauses)}
    return {"ConditionExpression": " OR ".join([f"({condition})"] + [f"attribute_exists({n})" for n in names]),
            "ExpressionAttributeNames": names}


def _code(e: ClientError) -> str:
    return e.response["Error"]["Code"]


class MotoServerTest(unittest.TestCase):
    proc: subprocess.Popen[str]
    url: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.stderr = tempfile.TemporaryFile(mode="w+")
        cls.proc = subprocess.Popen(
            [sys.executable, os.path.join(INFRA, "moto_server.py"), "--host", "127.0.0.1",
             "--port", "0", "--template", os.path.join(REPO, "template.yaml")],
            stdout=subprocess.PIPE, stderr=cls.stderr, text=True)
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

    def client(self, service: str) -> Any:
        return boto3.client(
            service, endpoint_url=self.url, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",
            config=Config(retries={"max_attempts": 1}, max_pool_connections=4))

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
        print(f"\n3-item transactions at 2,500+ items: {rate:.0f} tx/s; launcher RSS {rss} MiB",
              file=sys.stderr)
        self.assertGreater(rate, 20)
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=conv)["Item"]["seq"]["N"], str(count))


def _rss_mib(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return str(kib // 1024)
    except (OSError, StopIteration):
        return "?"


if __name__ == "__main__":
    unittest.main()
