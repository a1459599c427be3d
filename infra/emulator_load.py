#!/usr/bin/env python3
"""Load generator for the local DynamoDB and Kinesis emulators: requests/s and latency.

    .venv/bin/python infra/emulator_load.py --url http://127.0.0.1:4566 [--clients 1,8] [--seconds 15]
                                            [--items 5000] [--client raw|boto3] [--pid PID]
                                            [--only GetItem|ReadReceipt|...]
    .venv/bin/python infra/emulator_load.py --url http://127.0.0.1:4566 --kinesis [--records 20000] ...

Fills ChatTable with --items items (100 partitions; once per emulator run: skipped when they are
there), then runs, for each client count, that many threads for --seconds each, doing a mix like
the chat backend's: GetItem 30 %, Query of one partition (Limit 20, newest first) 20 %, UpdateItem
15 %, 4-item TransactWriteItems 10 %, PutItem 10 %, BatchGetItem of 10 keys 10 %, DeleteItem 5 %.
`--only OP` runs one operation instead of the mix: any of the mix's, or ReadReceipt (the chat
backend's mark-read UpdateItem: `SET lastReadSeq = :seq, lastReadBy = :token` if
`attribute_exists(pk) AND lastReadSeq < :seq`, on 50 member items of one partition, each call
with a higher seq than all before it: it advances its member, but for the few that several
clients send out of order, which fail their condition as late receipts do). Prints requests/s, latency percentiles per operation, the error types of 400 answers (a few are
expected: transaction conflicts, updates of items another thread deleted), and with --pid the
emulator's CPU time per request (user + system, from /proc; less sensitive than requests/s to
other load on the machine). Puts and transactions add items to the queried partitions, so
compare emulators on fresh starts with the same runs.

`--kinesis` loads the template's Kinesis stream (EventStream, on our moto launcher) instead, as
the relay and the local gateway's poller do: it first puts --records records (every run adds
them: a stream that has carried that much), then each thread does PutRecords of 5 records with a
random conversation as partition key (50 %) and GetRecords following its own iterator of each
shard in turn, from LATEST (50 %). Raw client only.

`--client raw` (default) sends the JSON requests over http.client connections (kept alive when
the emulator allows) with SDK-like headers, so that little client CPU competes with the
emulator; `--client boto3` uses boto3 (one client per thread), as the tests do.
"""
from __future__ import annotations

import argparse
import base64
import collections
import http.client
import itertools
import json
import os
import random
import threading
import time
import urllib.parse
import uuid
from typing import Any

TABLE = "ChatTable"
PARTITIONS = 100
MIX = (("GetItem", 30), ("Query", 20), ("UpdateItem", 15), ("TransactWriteItems", 10),
       ("PutItem", 10), ("BatchGetItem", 10), ("DeleteItem", 5))


MEMBERS = 50  # ReadReceipt's member items, in one partition
RECEIPT_SEQ = itertools.count(1)  # shared by the threads (next() on it is atomic)
ACTION = {"ReadReceipt": "UpdateItem"}  # operations that are a shape of another API action
STREAM = "EventStream"
KINESIS_MIX = (("PutRecords", 1), ("GetRecords", 1))


def member(m: int) -> dict[str, Any]:
    return {"pk": {"S": "load-receipts"}, "sk": {"S": f"M#user-{m}"}}


def key(p: int, s: int) -> dict[str, Any]:
    return {"pk": {"S": f"load-conv-{p}"}, "sk": {"S": f"msg#{s:06}"}}


class Ops:
    """Request parameters for each operation of the mix (one instance per thread)."""

    def __init__(self, per_partition: int, seed: int):
        self.rnd = random.Random(seed)
        self.per_partition = per_partition
        self.thread = uuid.uuid4().hex[:8]
        self.created: list[dict[str, Any]] = []
        self.n = 0

    def existing(self) -> dict[str, Any]:
        return key(self.rnd.randrange(PARTITIONS), self.rnd.randrange(self.per_partition))

    def new_item(self, p: int) -> dict[str, Any]:
        self.n += 1
        return {"pk": {"S": f"load-conv-{p}"}, "sk": {"S": f"new#{self.thread}#{self.n:08}"},
                "text": {"S": "x" * self.rnd.randrange(20, 200)}, "by": {"S": f"user-{self.rnd.randrange(50)}"}}

    def make(self, op: str) -> dict[str, Any]:
        rnd = self.rnd
        if op == "GetItem":
            return {"TableName": TABLE, "Key": self.existing()}
        if op == "Query":
            return {"TableName": TABLE, "KeyConditionExpression": "pk = :p AND begins_with(sk, :m)",
                    "ExpressionAttributeValues": {":p": {"S": f"load-conv-{rnd.randrange(PARTITIONS)}"},
                                                  ":m": {"S": "msg#"}},
                    "Limit": 20, "ScanIndexForward": False}
        if op == "UpdateItem":
            return {"TableName": TABLE, "Key": self.existing(),
                    "UpdateExpression": "SET #t = :t, edits = if_not_exists(edits, :zero) + :one",
                    "ConditionExpression": "attribute_exists(pk)",
                    "ExpressionAttributeNames": {"#t": "text"},
                    "ExpressionAttributeValues": {":t": {"S": f"edited {rnd.random()}"},
                                                  ":zero": {"N": "0"}, ":one": {"N": "1"}},
                    "ReturnValues": "ALL_NEW"}
        if op == "ReadReceipt":  # a seq above every one drawn before (concurrent ones may land late)
            return {"TableName": TABLE, "Key": member(rnd.randrange(MEMBERS)),
                    "UpdateExpression": "SET lastReadSeq = :seq, lastReadBy = :token",
                    "ConditionExpression": "attribute_exists(pk) AND lastReadSeq < :seq",
                    "ExpressionAttributeValues": {":seq": {"N": str(next(RECEIPT_SEQ))},
                                                  ":token": {"S": uuid.uuid4().hex}},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        if op == "TransactWriteItems":
            p = rnd.randrange(PARTITIONS)
            meta = {"pk": {"S": f"load-conv-{p}"}, "sk": {"S": "meta"}}
            msg, idem = self.new_item(p), self.new_item(p)
            self.created.append({"pk": msg["pk"], "sk": msg["sk"]})
            self.created.append({"pk": idem["pk"], "sk": idem["sk"]})
            return {"TransactItems": [
                {"Update": {"TableName": TABLE, "Key": meta, "UpdateExpression": "ADD seq :one",
                            "ExpressionAttributeValues": {":one": {"N": "1"}}}},
                {"Put": {"TableName": TABLE, "Item": msg, "ConditionExpression": "attribute_not_exists(pk)"}},
                {"Put": {"TableName": TABLE, "Item": idem, "ConditionExpression": "attribute_not_exists(pk)"}},
                {"Update": {"TableName": TABLE, "Key": self.existing(),
                            "UpdateExpression": "SET lastReadSeq = :s",
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": {":s": {"N": str(rnd.randrange(10**6))}}}},
            ]}
        if op == "PutItem":
            item = self.new_item(rnd.randrange(PARTITIONS))
            self.created.append({"pk": item["pk"], "sk": item["sk"]})
            return {"TableName": TABLE, "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}
        if op == "BatchGetItem":
            keys = {json.dumps(k, sort_keys=True): k for k in (self.existing() for _ in range(10))}
            return {"RequestItems": {TABLE: {"Keys": list(keys.values())}}}  # duplicates: ValidationException
        if op == "DeleteItem":
            target = self.created.pop(rnd.randrange(len(self.created))) if self.created else self.existing()
            return {"TableName": TABLE, "Key": target, "ReturnValues": "ALL_OLD"}
        raise ValueError(op)


class RawClient:
    """One connection, kept alive when the server allows."""

    def __init__(self, url: str, service: str = "dynamodb"):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port, self.service = parsed.hostname, parsed.port, service
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        self.errors: collections.Counter[str] = collections.Counter()

    def call(self, op: str, params: dict[str, Any]) -> int:
        status, data = self.send(op, params)
        if status != 200:
            self.errors[json.loads(data).get("__type", "?").split("#")[-1]] += 1
        return status

    def send(self, op: str, params: dict[str, Any]) -> tuple[int, bytes]:
        body = json.dumps(params).encode()
        kinesis = self.service == "kinesis"
        headers = {
            "Content-Type": f"application/x-amz-json-{'1.1' if kinesis else '1.0'}",
            "X-Amz-Target": f"Kinesis_20131202.{op}" if kinesis else f"DynamoDB_20120810.{ACTION.get(op, op)}",
            "User-Agent": "emulator-load/1 (raw http.client)",
            "X-Amz-Date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
            "Authorization": f"AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/{self.service}/aws4_request, "
                             "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=" + "0" * 64,
        }
        for attempt in (0, 1):
            try:
                self.conn.request("POST", "/", body=body, headers=headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except ConnectionError:  # the server closed the connection: a new one (as SDKs do)
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError


class Boto3Client:
    def __init__(self, url: str):
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError
        self.error = ClientError
        self.ddb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1",
                                aws_access_key_id="test", aws_secret_access_key="test",
                                config=Config(retries={"max_attempts": 1}))
        self.errors: collections.Counter[str] = collections.Counter()
        snake = lambda action: "".join("_" + c.lower() if c.isupper() else c for c in action)[1:]  # noqa: E731
        self.methods = {op: getattr(self.ddb, snake(ACTION.get(op, op)))
                        for op in [op for op, _ in MIX] + list(ACTION)}

    def call(self, op: str, params: dict[str, Any]) -> int:
        try:
            self.methods[op](**params)
            return 200
        except self.error as e:
            self.errors[e.response["Error"]["Code"]] += 1
            return e.response["ResponseMetadata"]["HTTPStatusCode"]


class KinesisOps:
    """PutRecords and GetRecords on STREAM (one instance per thread, with its own iterators)."""

    def __init__(self, client: RawClient, seed: int):
        self.client, self.rnd = client, random.Random(seed)
        shards = json.loads(client.send("ListShards", {"StreamName": STREAM})[1])["Shards"]
        self.iterators = [self.latest(s["ShardId"]) for s in shards]
        self.turn = 0

    def latest(self, shard: str) -> str:
        params = {"StreamName": STREAM, "ShardId": shard, "ShardIteratorType": "LATEST"}
        return json.loads(self.client.send("GetShardIterator", params)[1])["ShardIterator"]

    def call(self, op: str) -> int:
        if op == "PutRecords":
            data = base64.b64encode(b'{"events":[{"type":"read.updated"}]}').decode()
            records = [{"Data": data, "PartitionKey": f"conv-{self.rnd.randrange(10**6)}"} for _ in range(5)]
            return self.client.call(op, {"StreamName": STREAM, "Records": records})
        self.turn = (self.turn + 1) % len(self.iterators)
        status, data = self.client.send(op, {"ShardIterator": self.iterators[self.turn], "Limit": 100})
        if status == 200:
            self.iterators[self.turn] = json.loads(data)["NextShardIterator"]
        return status


def fill_kinesis(url: str, records: int) -> None:
    client, data = RawClient(url, "kinesis"), base64.b64encode(b"x" * 200).decode()
    for i in range(0, records, 500):
        entries = [{"Data": data, "PartitionKey": f"fill-{i + j}"} for j in range(min(500, records - i))]
        assert client.call("PutRecords", {"StreamName": STREAM, "Records": entries}) == 200


def fill(url: str, items: int) -> int:
    """Puts `items` items in PARTITIONS partitions (and a meta item each); returns items per partition."""
    per = max(1, items // PARTITIONS)
    client = RawClient(url)
    writes = [{"PutRequest": {"Item": {**key(p, s), "text": {"S": f"message {s} of {p}"},
                                       "by": {"S": f"user-{s % 7}"}}}}
              for p in range(PARTITIONS) for s in range(per)]
    writes += [{"PutRequest": {"Item": {"pk": {"S": f"load-conv-{p}"}, "sk": {"S": "meta"}, "seq": {"N": "0"}}}}
               for p in range(PARTITIONS)]
    members = [{"PutRequest": {"Item": {**member(m), "lastReadSeq": {"N": "0"}}}} for m in range(MEMBERS)]
    for i in range(0, MEMBERS, 25):  # every run: RECEIPT_SEQ starts again at 1
        assert client.call("BatchWriteItem", {"RequestItems": {TABLE: members[i:i + 25]}}) == 200
    if "Item" in json.loads(client.send("GetItem", {"TableName": TABLE, "Key": key(PARTITIONS - 1, per - 1)})[1]):
        return per  # filled by an earlier run
    for i in range(0, len(writes), 25):
        assert client.call("BatchWriteItem", {"RequestItems": {TABLE: writes[i:i + 25]}}) == 200
    return per


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(url: str, clients: int, seconds: float, per: int, kind: str, pid: int | None,
        only: str | None = None, kinesis: bool = False) -> None:
    mix = ((only, 1),) if only else KINESIS_MIX if kinesis else MIX
    ops = [op for op, weight in mix for _ in range(weight)]
    latencies: dict[str, list[float]] = {op: [] for op, _ in mix}
    statuses: dict[int, int] = {}
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    stop = [0.0]

    def worker(i: int) -> None:
        client = RawClient(url, "kinesis" if kinesis else "dynamodb") if kind == "raw" else Boto3Client(url)
        gen = Ops(per, seed=i * 7919 + int(time.time()))
        streams = KinesisOps(client, seed=i) if kinesis else None
        mine: dict[str, list[float]] = {op: [] for op, _ in mix}
        codes: dict[int, int] = {}
        barrier.wait()
        while time.monotonic() < stop[0]:
            op = gen.rnd.choice(ops)
            params = gen.make(op) if streams is None else None
            started = time.monotonic()
            status = client.call(op, params) if streams is None else streams.call(op)
            mine[op].append(time.monotonic() - started)
            codes[status] = codes.get(status, 0) + 1
        with lock:
            for op, values in mine.items():
                latencies[op] += values
            for status, n in codes.items():
                statuses[status] = statuses.get(status, 0) + n
            errors.update(client.errors)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # clients built
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    stop[0] = t0 + seconds
    barrier.wait()
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    total = sum(len(v) for v in latencies.values())
    line = f"{clients} client(s), {kind}: {total / elapsed:.0f} req/s ({total} in {elapsed:.1f} s)"
    if pid is not None:
        line += f"; emulator CPU {1000 * cpu / max(total, 1):.2f} ms/req ({cpu / elapsed:.0%} of a core)"
    print(line + f"; statuses {dict(sorted(statuses.items()))}" + (f" {dict(errors)}" if errors else ""))
    for op, values in latencies.items():
        if values:
            values.sort()
            pick = lambda q: 1000 * values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
            print(f"    {op:<20} n={len(values):<6} p50 {pick(0.5):6.1f} ms  p95 {pick(0.95):6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", default="1,8", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--client", choices=("raw", "boto3"), default="raw")
    parser.add_argument("--pid", type=int, help="the emulator's process id, to report its CPU time")
    parser.add_argument("--only", choices=[op for op, _ in MIX + KINESIS_MIX] + list(ACTION),
                        help="one operation instead of the mix")
    parser.add_argument("--kinesis", action="store_true", help="load Kinesis instead of DynamoDB")
    parser.add_argument("--records", type=int, default=20000, help="with --kinesis: records put first")
    args = parser.parse_args()
    if args.kinesis != (args.only in dict(KINESIS_MIX)) and args.only:
        parser.error(f"--only {args.only}: " + ("a DynamoDB operation" if args.kinesis else "needs --kinesis"))
    if args.kinesis:
        if args.client != "raw":
            parser.error("--kinesis needs --client raw")
        fill_kinesis(args.url, args.records)
        per = 0
    else:
        per = fill(args.url, args.items)
    for n in (int(c) for c in args.clients.split(",")):
        run(args.url, n, args.seconds, per, args.client, args.pid, args.only, args.kinesis)


if __name__ == "__main__":
    main()
