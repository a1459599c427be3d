#!/usr/bin/env python3
"""How long a thumbnail takes through a running local stack (docs/benchmarks.md, "Thumbnails"):

    python3 infra/thumbnail_latency.py [--api http://127.0.0.1:9000] [--runs 5]

Per run: a 12-megapixel (4000 × 3000) PNG made here, `createAttachment`, the presigned PUT to the
S3 stand-in, a send with it, then the sender's history polled every 50 ms until the message's
attachment has `thumbnailUrl`; prints the time from the PUT's answer to that, and the thumbnail's
own bytes. The upload event goes from the S3 gate to the thumbnails function as on AWS (the
bucket's notification). Standard library only.
"""
import argparse
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.request
import uuid
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mint_token import mint  # noqa: E402

SECRET = os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret"


def png(width: int, height: int) -> bytes:
    """An RGB PNG with a gradient and some texture (so it is not one flat colour)."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")
        g = (y * 255) // height
        for x in range(0, width):
            row += bytes(((x * 255) // width, g, (x ^ y) & 0xFF))
        rows.append(bytes(row))
    raw = zlib.compress(b"".join(rows), 6)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def call(method, url, token=None, body=None, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
            return resp.status, (json.loads(text) if text[:1] in (b"{", b"[") else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--api", default=os.environ.get("CHAT_API_URL", "http://127.0.0.1:9000"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    api = args.api.rstrip("/")
    image = png(4000, 3000)
    print(f"thumbnail_latency: a 4000x3000 PNG of {len(image):,} bytes, {args.runs} runs against {api}")
    a, b = f"thumb-{uuid.uuid4().hex[:8]}", f"peer-{uuid.uuid4().hex[:8]}"
    ta = mint(a, 3600, SECRET)
    status, c = call("POST", f"{api}/conversations", ta, {"type": "direct", "peerId": b})
    assert status in (200, 201), (status, c)
    cid = c["conversationId"]
    took = []
    for run in range(args.runs):
        status, created = call("POST", f"{api}/conversations/{cid}/attachments", ta,
                               {"fileName": "photo.png", "contentType": "image/png", "size": len(image)})
        assert status == 201, (status, created)
        up = created["upload"]
        headers = {k: v for k, v in up["headers"].items() if k.lower() != "content-length"}
        status, _ = call(up["method"], up["url"], raw=image, headers=headers)
        assert status == 200, ("upload", status)
        uploaded = time.monotonic()
        body = {"clientMsgId": str(uuid.uuid4()), "body": "", "attachments": [created["attachmentId"]]}
        status, sent = call("POST", f"{api}/conversations/{cid}/messages", ta, body)
        assert status == 201, (status, sent)
        seq = sent["seq"]
        while True:
            status, page = call("GET", f"{api}/conversations/{cid}/messages?afterSeq={seq - 1}", ta)
            att = (page or {}).get("messages", [{}])[0].get("attachments", [{}])[0]
            if att.get("thumbnailUrl"):
                seconds = time.monotonic() - uploaded
                took.append(seconds)
                print(f"  run {run + 1}: thumbnail {att.get('width')}x{att.get('height')} "
                      f"ready {seconds:.2f} s after the upload")
                break
            if time.monotonic() - uploaded > args.timeout:
                print(f"  run {run + 1}: no thumbnail within {args.timeout} s")
                return 1
            time.sleep(0.05)
    took.sort()
    print(f"thumbnail_latency: median {took[len(took) // 2]:.2f} s, max {took[-1]:.2f} s (goal ≤ 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
