#!/usr/bin/env python3
"""Replay what reached the relay's failure queue: each message there names a batch of the chat
table's stream (shard, first and last sequence number) that the relay did not get into Kinesis
before the records' time ran out. This reads those records from the stream again and invokes the
relay with them, the same event Lambda would send; a message is deleted only once the relay
reported every record done.

Deployed (names from the stack's outputs):

    python infra/replay_failures.py --queue-url "$RELAY_FAILURE_QUEUE_URL" --function "$RELAY_FUNCTION"

Locally (with infra/run-local.sh running: SQS on its moto launcher, the stream on DynamoDB Local;
the local gateway serves the Invoke API for `relay`):

    python infra/replay_failures.py --queue-url http://127.0.0.1:4566/123456789012/RelayFailureQueue \\
        --function relay --sqs-endpoint http://127.0.0.1:4566 --streams-endpoint http://127.0.0.1:8000 \\
        --lambda-endpoint http://127.0.0.1:9002

Replay only works while the stream still holds the records (24 hours): the relay's IteratorAge
alarm should fire long before anything reaches the queue. Replayed events may reach clients after
newer ones of the same conversation; clients deduplicate by (conversationId, seq) and have
already fetched the gap with afterSeq. Messages of the fanout's queue (Kinesis batches) are not
replayed: pushes are for clients online then, who have caught up since. Exit status: 0 when every
message was replayed (or none was waiting), 1 when some stay in the queue (each is reported).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

INVOKE_ATTEMPTS = 5
RANGE_TIMEOUT = 60.0  # seconds to read one named range whole


def clients(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    local = {}
    if (args.endpoint or args.sqs_endpoint or args.streams_endpoint) and not os.environ.get("AWS_ACCESS_KEY_ID"):
        local = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
    config = Config(retries={"mode": "standard"}, read_timeout=120)

    def client(service: str, endpoint: str | None) -> Any:
        return boto3.client(service, region_name=args.region, endpoint_url=endpoint, config=config,
                            **(local if endpoint else {}))

    return (client("sqs", args.sqs_endpoint or args.endpoint),
            client("dynamodbstreams", args.streams_endpoint or args.endpoint),
            client("lambda", args.lambda_endpoint or None))


def attribute(value: Any) -> Any:
    """DynamoDB JSON as the Lambda event carries it: binary values base64, the rest as is."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: attribute(v) for k, v in value.items()}
    if isinstance(value, list):
        return [attribute(v) for v in value]
    return value


def lambda_record(r: dict[str, Any], stream_arn: str, region: str) -> dict[str, Any]:
    """A GetRecords record in the shape of a Lambda DynamoDB event record."""
    change = dict(r["dynamodb"])
    when = change.get("ApproximateCreationDateTime")
    if when is not None:
        change["ApproximateCreationDateTime"] = int(when.timestamp()) if hasattr(when, "timestamp") else when
    event = {
        "eventID": r.get("eventID"), "eventName": r.get("eventName"),
        "eventVersion": r.get("eventVersion", "1.1"), "eventSource": "aws:dynamodb",
        "awsRegion": r.get("awsRegion", region), "eventSourceARN": stream_arn,
        "dynamodb": attribute(change),
    }
    if r.get("userIdentity"):
        event["userIdentity"] = {"type": r["userIdentity"].get("Type"),
                                 "principalId": r["userIdentity"].get("PrincipalId")}
    return event


class IncompleteRange(Exception):
    """The stream did not give every record up to the range's end within the time allowed."""


def read_range(streams: Any, info: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """The stream records from startSequenceNumber to endSequenceNumber, in order, all of them.

    DynamoDB Streams may answer empty pages before later records of an open shard (an iterator
    moves through time, not records), so empty pages do not end a range: only its end sequence
    number does, or the shard's end. A range not read whole within `timeout` seconds raises
    IncompleteRange, and its message stays in the queue: a partial replay would be deleted as done.
    """
    end = int(info["endSequenceNumber"])
    iterator = streams.get_shard_iterator(
        StreamArn=info["streamArn"], ShardId=info["shardId"], ShardIteratorType="AT_SEQUENCE_NUMBER",
        SequenceNumber=info["startSequenceNumber"])["ShardIterator"]
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while iterator:
        page = streams.get_records(ShardIterator=iterator, Limit=1000)
        for r in page.get("Records", []):
            if int(r["dynamodb"]["SequenceNumber"]) > end:
                return records
            records.append(r)
        if records and int(records[-1]["dynamodb"]["SequenceNumber"]) == end:
            return records
        iterator = page.get("NextShardIterator")
        if iterator and time.monotonic() > deadline:
            raise IncompleteRange(f"{len(records)} records read in {timeout:g} s, none yet at or past "
                                  f"the range's end {end}")
        if iterator and not page.get("Records"):
            time.sleep(0.2)  # an empty page of an open shard: newer records may not be visible yet
    return records  # the shard ended (closed) before the range's end: that is all there is


def invoke(lam: Any, function: str, records: list[dict[str, Any]]) -> str | None:
    """Invokes the relay until it reports no failed record, like Lambda resuming from the first
    one it reports; None when done, else why not."""
    for attempt in range(1, INVOKE_ATTEMPTS + 1):
        response = lam.invoke(FunctionName=function, InvocationType="RequestResponse",
                              Payload=json.dumps({"Records": records}).encode())
        payload = json.loads(response["Payload"].read() or b"{}")
        if response.get("FunctionError"):
            why = f"the function failed: {payload}"
        else:
            failed = [f.get("itemIdentifier") for f in payload.get("batchItemFailures") or []]
            if not failed:
                return None
            ids = [r["dynamodb"]["SequenceNumber"] for r in records]
            first = min((ids.index(f) for f in failed if f in ids), default=0)
            records = records[first:]
            why = f"the relay reported {records[0]['dynamodb']['SequenceNumber']} failed"
        if attempt < INVOKE_ATTEMPTS:
            time.sleep(min(2 ** attempt, 20))
    return why + f" ({INVOKE_ATTEMPTS} attempts)"


def replay(message: dict[str, Any], streams: Any, lam: Any, function: str, region: str,
           dry_run: bool, range_timeout: float = RANGE_TIMEOUT) -> str | None:
    """Replays one queue message; None when done, else why it stays in the queue."""
    try:
        body = json.loads(message["Body"])
    except ValueError:
        return "not JSON"
    info = body.get("DDBStreamBatchInfo") if isinstance(body, dict) else None
    if not info:
        kind = "a Kinesis batch (pushes are not replayed)" if "KinesisBatchInfo" in (body or {}) else "unknown"
        return f"not a DynamoDB stream batch: {kind}"
    try:
        records = read_range(streams, info, range_timeout)
    except IncompleteRange as e:
        return f"the stream did not give the whole range: {e}"
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("TrimmedDataAccessException", "ResourceNotFoundException", "ExpiredIteratorException"):
            return f"the records are no longer in the stream ({code}); they cannot be replayed"
        raise
    if not records:
        return "no records in the named range"
    events = [lambda_record(r, info["streamArn"], region) for r in records]
    print(f"  {len(events)} stream records {info['startSequenceNumber']}..{info['endSequenceNumber']} "
          f"of shard {info['shardId']}")
    if dry_run:
        return "dry run"
    return invoke(lam, function, events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue-url", required=True, help="the relay's failure queue (RelayFailureQueueUrl)")
    parser.add_argument("--function", required=True, help="the relay function's name (RelayFunctionName)")
    parser.add_argument("--region", default=os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    parser.add_argument("--endpoint", help="SQS and DynamoDB Streams endpoint (local emulator)")
    parser.add_argument("--sqs-endpoint", help="SQS endpoint, when not --endpoint (local: moto)")
    parser.add_argument("--streams-endpoint",
                        help="DynamoDB Streams endpoint, when not --endpoint (local: DynamoDB Local)")
    parser.add_argument("--lambda-endpoint", help="Lambda Invoke API endpoint (local gateway)")
    parser.add_argument("--dry-run", action="store_true", help="read and show, invoke nothing, delete nothing")
    parser.add_argument("--range-timeout", type=float, default=RANGE_TIMEOUT,
                        help="seconds to read one named range whole before keeping its message")
    args = parser.parse_args(argv)
    sqs, streams, lam = clients(args)

    replayed, kept = 0, []
    while True:
        batch = sqs.receive_message(QueueUrl=args.queue_url, MaxNumberOfMessages=10,
                                    VisibilityTimeout=600, WaitTimeSeconds=0).get("Messages", [])
        if not batch:
            break
        for m in batch:
            print(f"message {m['MessageId']}:")
            why = replay(m, streams, lam, args.function, args.region, args.dry_run, args.range_timeout)
            if why is None:
                sqs.delete_message(QueueUrl=args.queue_url, ReceiptHandle=m["ReceiptHandle"])
                replayed += 1
                print("  replayed, deleted from the queue")
            else:
                kept.append(m)
                print(f"  kept in the queue: {why}")
    for m in kept:  # visible again for the next run
        sqs.change_message_visibility(QueueUrl=args.queue_url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=0)
    print(f"replayed {replayed}, kept {len(kept)}")
    return 1 if kept else 0


if __name__ == "__main__":
    sys.exit(main())
