"""Tests of infra/moto_server.py (our moto launcher) through the AWS SDK.

    .venv/bin/python -m unittest infra/test_moto_server.py

Starts the launcher on a free loopback port with the repository's template.yaml and checks what
it changes in moto: serialised requests; in-place rollback of cancelled transactions (stream
iterators keep working, no stream records, no item changes); fast transactions and Queries on a
big table, and Queries that answer as moto's own; Kinesis fault injection and its reset; Kinesis
shard reads that answer as moto's own; SQS long polls that block nobody and answer when a message
is due.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
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


def import_moto_server() -> Any:
    sys.path.insert(0, INFRA)
    try:
        import moto_server  # noqa: PLC0415 - moto is slow to import; only these tests need it
    finally:
        sys.path.remove(INFRA)
    return moto_server


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

    def faults(self, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url + "/moto-api/chat/faults", method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(request) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

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

        self.assertEqual(self.faults({"kinesisPutFailures": 3}), (200, {"kinesisPutFailures": 3}))
        for bad in ({"kinesisPutFailures": -1}, {"kinesisPutFailures": "2"}, {"other": 1}):
            self.assertEqual(self.faults(bad)[0], 400, bad)
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
        self.assertEqual(self.faults(), (200, {"kinesisPutFailures": 0}))
        # Only the entries reported written were written, in order.
        shard = second["Records"][1]["ShardId"]
        iterator = kinesis.get_shard_iterator(
            StreamName="EventStream", ShardId=shard, ShardIteratorType="AT_SEQUENCE_NUMBER",
            StartingSequenceNumber=second["Records"][1]["SequenceNumber"])["ShardIterator"]
        data = [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]
                if r["PartitionKey"] == key]
        self.assertEqual(data, [b"r3", b"r4"])

    def test_reset_clears_injected_failures(self) -> None:
        self.assertEqual(self.faults({"kinesisPutFailures": 7}), (200, {"kinesisPutFailures": 7}))
        urllib.request.urlopen(urllib.request.Request(self.url + "/moto-api/reset", method="POST")).close()
        self.assertEqual(self.faults(), (200, {"kinesisPutFailures": 0}))
        sys.path.insert(0, INFRA)
        try:
            from create_resources import create_resources  # noqa: PLC0415
        finally:
            sys.path.remove(INFRA)
        create_resources(self.url, os.path.join(REPO, "template.yaml"), "us-east-1", log=lambda _: None)

    def test_kinesis_shard_reads_match_moto(self) -> None:
        """In-process: GetRecords from every position with several limits, and the first and
        last sequence numbers, as moto's own code answers them."""
        moto_server = import_moto_server()
        from moto.kinesis.models import Shard  # noqa: PLC0415 - unpatched: patch_moto is not run

        shard = Shard(0, 0, 2**128)
        self.assertEqual((moto_server._shard_min(shard), moto_server._shard_max(shard)), (0, 0))
        self.assertEqual(moto_server._shard_get_records(shard, "0", None), shard.get_records("0", None))
        for i in range(12):
            shard.put_record(f"key-{i % 3}", f"r{i}", str(i))
        self.assertEqual((moto_server._shard_min(shard), moto_server._shard_max(shard)),
                         (shard.get_min_sequence_number(), shard.get_max_sequence_number()))
        for last in ("-1", "0", "1", "5", "11", "12", "20"):
            for limit in (None, 1, 3, 10_000, 0, -1):
                self.assertEqual(moto_server._shard_get_records(shard, last, limit),
                                 shard.get_records(last, limit), (last, limit))
        del shard.records[3]  # not 1..n any more: moto's own walk
        self.assertEqual(moto_server._shard_get_records(shard, "1", 4), shard.get_records("1", 4))
        moto_server.patch_moto()  # what the launcher runs (here: only this process's moto)
        self.assertIs(Shard.get_records, moto_server._shard_get_records)
        self.assertEqual(shard.put_record("key", "r", "1"), "13")

    # --- (d) transactions and Queries on a big table ------------------------------------------------

    def test_transactions_and_queries_on_big_table_are_fast(self) -> None:
        ddb = self.client("dynamodb")
        pk = f"big-{uuid.uuid4()}"
        for start in range(0, 5000, 25):
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
        self.assertEqual(ddb.get_item(TableName=CHAT_TABLE, Key=conv)["Item"]["seq"]["N"], str(count))
        queries, started = 100, time.monotonic()
        for i in range(queries):
            page = ddb.query(TableName=CHAT_TABLE, KeyConditionExpression="pk = :p AND begins_with(sk, :m)",
                             ExpressionAttributeValues={":p": {"S": f"{pk}-{i % 50}"}, ":m": {"S": "msg#"}},
                             Limit=20, ScanIndexForward=False)
            self.assertEqual(len(page["Items"]), 20)
        query_rate = queries / (time.monotonic() - started)
        print(f"\nat 5,000+ items: 3-item transactions {rate:.0f}/s, Queries {query_rate:.0f}/s; "
              f"launcher RSS {_rss_mib(self.proc.pid)} MiB", file=sys.stderr)
        self.assertGreater(rate, 20)  # moto's own: a copy of the whole table per transaction
        self.assertGreater(query_rate, 40)  # moto's own: a sort of the whole table per Query

    # --- (e) a Query reads the queried partition ---------------------------------------------------

    def test_query_reads_the_queried_partition(self) -> None:
        ddb, prefix = self.client("dynamodb"), f"part-{uuid.uuid4()}"
        sks = ["m#3", "a", "m#10", "z", "m#1", "b#", "m#2"]  # stored out of order
        writes = [{"PutRequest": {"Item": {"pk": {"S": f"{prefix}-{p}"}, "sk": {"S": sk}}}}
                  for p in range(30) for sk in sks]
        for start in range(0, len(writes), 25):
            ddb.batch_write_item(RequestItems={CHAT_TABLE: writes[start:start + 25]})

        def query(pk: str, forward: bool = True, limit: int | None = None, table: str = CHAT_TABLE,
                  key: str = "sk", **extra: Any) -> list[str]:
            out, start = [], None
            while True:
                page = ddb.query(**{"TableName": table, "KeyConditionExpression": "pk = :p",
                                    "ExpressionAttributeValues": {":p": {"S": pk}}, "ScanIndexForward": forward,
                                    **({"Limit": limit} if limit else {}),
                                    **({"ExclusiveStartKey": start} if start else {}), **extra})
                self.assertTrue(all(i["pk"]["S"] == pk for i in page["Items"]))
                out += [next(iter(i[key].values())) for i in page["Items"]]
                start = page.get("LastEvaluatedKey")
                if not start:
                    return out

        self.assertEqual(query(f"{prefix}-13"), sorted(sks))
        self.assertEqual(query(f"{prefix}-13", limit=3), sorted(sks))
        self.assertEqual(query(f"{prefix}-0", forward=False, limit=2), sorted(sks, reverse=True))
        self.assertEqual(query(f"{prefix}-nope"), [])
        pk = f"{prefix}-21"
        for condition, values, expected in (
                ("sk = :a", {":a": "m#2"}, ["m#2"]),
                ("sk < :a", {":a": "m#2"}, ["a", "b#", "m#1", "m#10"]),
                ("sk >= :a", {":a": "m#2"}, ["m#2", "m#3", "z"]),
                ("sk BETWEEN :a AND :b", {":a": "b", ":b": "m#10"}, ["b#", "m#1", "m#10"]),
                ("begins_with(sk, :a)", {":a": "m#"}, ["m#1", "m#10", "m#2", "m#3"])):
            for forward in (True, False):
                got = query(pk, forward=forward, limit=2, KeyConditionExpression=f"pk = :p AND {condition}",
                            ExpressionAttributeValues={":p": {"S": pk}, **{k: {"S": v} for k, v in values.items()}})
                self.assertEqual(got, expected if forward else expected[::-1], condition)

        # A numeric sort key sorts by number; a table without a sort key has one item per partition.
        numeric, plain = f"Numeric-{uuid.uuid4().hex[:8]}", f"Plain-{uuid.uuid4().hex[:8]}"
        ddb.create_table(TableName=numeric, BillingMode="PAY_PER_REQUEST",
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "n", "AttributeType": "N"}],
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                    {"AttributeName": "n", "KeyType": "RANGE"}])
        ddb.create_table(TableName=plain, BillingMode="PAY_PER_REQUEST",
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        try:
            for pk in ("x", "y"):
                ddb.put_item(TableName=plain, Item={"pk": {"S": pk}, "v": {"S": pk * 2}})
                for n in ("10", "9", "100", "-1", "2.5"):
                    ddb.put_item(TableName=numeric, Item={"pk": {"S": pk}, "n": {"N": n}})
            self.assertEqual(query("y", table=numeric, key="n"), ["-1", "2.5", "9", "10", "100"])
            self.assertEqual(query("y", table=plain, key="v"), ["yy"])
            self.assertEqual(query("z", table=plain, key="v"), [])
        finally:
            ddb.delete_table(TableName=numeric)
            ddb.delete_table(TableName=plain)

    # --- (f) SQS long polls ------------------------------------------------------------------------

    def test_a_long_poll_blocks_nobody_and_answers_when_a_delayed_message_is_due(self) -> None:
        sqs, kinesis = self.client("sqs"), self.client("kinesis")
        name = f"poll-{uuid.uuid4().hex[:8]}"
        queue = sqs.create_queue(QueueName=name)["QueueUrl"]
        self.assertEqual(sqs.meta.service_model.protocol, "json")  # what the launcher handles
        got: dict[str, Any] = {}

        def receive(key: str, wait: int) -> None:
            started = time.monotonic()
            answer = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=wait, MaxNumberOfMessages=10)
            got[key] = (time.monotonic() - started, [m["Body"] for m in answer.get("Messages", [])])

        # While a long poll waits on an empty queue, other requests are answered at once.
        waiting = threading.Thread(target=receive, args=("empty", 2))
        waiting.start()
        time.sleep(0.2)
        started = time.monotonic()
        kinesis.put_record(StreamName="EventStream", Data=b"x", PartitionKey="poll")
        sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])
        others = time.monotonic() - started
        waiting.join(10)
        self.assertLess(others, 0.5, "requests answered while a long poll waits")
        elapsed, bodies = got["empty"]
        self.assertEqual(bodies, [])
        self.assertGreaterEqual(elapsed, 1.9, "an empty long poll waits its WaitTimeSeconds")
        # A delayed message is received when it is due, not when a one-second wait of moto's ends.
        sent = time.monotonic()
        sqs.send_message(QueueUrl=queue, MessageBody="due", DelaySeconds=1)
        time.sleep(0.5)
        receive("due", 5)
        due_after = time.monotonic() - sent
        self.assertEqual(got["due"][1], ["due"])
        self.assertGreaterEqual(due_after, 1.0)
        self.assertLess(due_after, 1.3, "received within 0.3 s of its delay")
        # A message sent while a long poll waits is received at once.
        poller = threading.Thread(target=receive, args=("sent", 5))
        poller.start()
        time.sleep(0.3)
        sent = time.monotonic()
        sqs.send_message(QueueUrl=queue, MessageBody="now")
        poller.join(10)
        self.assertEqual(got["sent"][1], ["now"])
        self.assertLess(time.monotonic() - sent, 0.3)
        sqs.delete_queue(QueueUrl=queue)


def _rss_mib(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return str(kib // 1024)
    except (OSError, StopIteration):
        return "?"


if __name__ == "__main__":
    unittest.main()
