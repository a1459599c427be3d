#!/usr/bin/env python3
"""Prints the push events a user receives, one JSON per line:

    python3 infra/ws_listen.py <userId> [ws://127.0.0.1:9001]
    CHAT_TOKEN=<JWT> python3 infra/ws_listen.py <userId> wss://{api}.execute-api.{region}.amazonaws.com/prod

Mints a local token (like infra/mint_token.py), or takes the token in CHAT_TOKEN (a deployed
stack's issuer's, README "Deploy"), and connects as a browser would (`?token=`).
Standard library only: a minimal WebSocket client (RFC 6455), enough for text frames.
"""
import base64
import os
import socket
import ssl
import struct
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mint_token import mint  # noqa: E402


def send_frame(sock: socket.socket, opcode: int, payload: bytes) -> None:
    # Client frames are masked (RFC 6455 §5.3).
    mask = os.urandom(4)
    header = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        header += bytes([0x80 | n])
    elif n < 65536:
        header += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        header += bytes([0x80 | 127]) + struct.pack("!Q", n)
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def read_exact(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    user = sys.argv[1]
    base = sys.argv[2] if len(sys.argv) > 2 else "ws://127.0.0.1:9001"
    url = urllib.parse.urlparse(base)
    token = os.environ.get("CHAT_TOKEN") or mint(
        user, 24 * 3600, os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret")
    secure = url.scheme == "wss"
    sock = socket.create_connection((url.hostname, url.port or (443 if secure else 80)))
    if secure:
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
    key = base64.b64encode(os.urandom(16)).decode()
    path = (url.path or "/") + "?token=" + urllib.parse.quote(token)
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    f = sock.makefile("rb")
    status = f.readline().decode().strip()
    while f.readline() not in (b"\r\n", b""):
        pass
    if " 101 " not in status + " ":
        print(f"refused: {status}", file=sys.stderr)
        return 1
    print(f"connected as {user}; waiting for events (Ctrl-C to stop)", file=sys.stderr, flush=True)
    message = b""
    try:
        while True:
            b0, b1 = read_exact(f, 2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", read_exact(f, 2))[0]
            elif n == 127:
                n = struct.unpack("!Q", read_exact(f, 8))[0]
            payload = read_exact(f, n)
            opcode = b0 & 0x0F
            if opcode == 0x9:
                send_frame(sock, 0xA, payload)
            elif opcode == 0x8:
                return 0
            elif opcode in (0x0, 0x1):
                message += payload
                if b0 & 0x80:
                    print(message.decode(), flush=True)
                    message = b""
    except (EOFError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    sys.exit(main())
