#!/usr/bin/env python3
"""Mints an HS256 token for the local stack: `python3 infra/mint_token.py [--moderator] <userId> [ttl seconds]`.

`--moderator` adds the scope `chat:moderator` (docs/api.md §30): the token may list reports,
delete any message and suspend users.

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


def mint(sub: str, ttl: int, secret: str, moderator: bool = False) -> str:
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"sub": sub, "exp": int(time.time()) + ttl}
    if moderator:
        claims["scope"] = "chat:moderator"
    payload = b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(secret.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


if __name__ == "__main__":
    args = sys.argv[1:]
    moderator = "--moderator" in args
    args = [a for a in args if a != "--moderator"]
    if not args:
        sys.exit(__doc__)
    ttl = int(args[1]) if len(args) > 1 else 24 * 3600
    secret = os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret"
    print(mint(args[0], ttl, secret, moderator))
