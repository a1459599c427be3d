#!/usr/bin/env python3
"""Mints an HS256 token for the local stack: `python3 infra/mint_token.py <userId> [ttl seconds]`.

Uses CHAT_LOCAL_JWT_SECRET (default `local-dev-secret`, the local stack's default). Standard
library only, so it works before anything is installed.
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import time


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(sub: str, ttl: int, secret: str) -> str:
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = b64(json.dumps({"sub": sub, "exp": int(time.time()) + ttl}, separators=(",", ":")).encode())
    signature = hmac.new(secret.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ttl = int(sys.argv[2]) if len(sys.argv) > 2 else 24 * 3600
    print(mint(sys.argv[1], ttl, os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret"))
