#!/usr/bin/env python3
"""Smoke test of a deployed chat stack (or of the local one), step by step, PASS/FAIL each.

    infra/smoke.sh STACK_NAME [--region R] [--push-timeout S]
    infra/smoke.sh --local [REST_URL WS_URL] [--push-timeout S]

Deployed (after `sam deploy`; needs the AWS CLI v2 and credentials):
  1. reads the stack's outputs (RestApiUrl, WebSocketUrl) with `aws cloudformation describe-stacks`;
  2. gets two users' tokens, either
       - from CHAT_SMOKE_TOKEN_A and CHAT_SMOKE_TOKEN_B (the issuer's JWTs, accepted by the stack's
         JwtIssuer/JwtAudience); the user ids are the tokens' `sub`, or CHAT_SMOKE_USER_ID_A /
         CHAT_SMOKE_USER_ID_B if set; or
       - with CHAT_SMOKE_USER_POOL_ID and CHAT_SMOKE_CLIENT_ID (an app client allowing
         USER_PASSWORD_AUTH, whose id is in JwtAudience; CHAT_SMOKE_CLIENT_SECRET if it has a
         secret): creates two temporary Cognito users (admin-create-user, admin-set-user-password),
         signs them in (USER_PASSWORD_AUTH, ID tokens) and deletes them at the end;
  3. walks the REST API: a direct conversation (201, then 200 for the same pair), a send (201), its
     replay (200, identical), B's inbox (1 unread), B's read (advanced) and a late older read (not
     advanced), B's reply, every member's watermark, history (newest, beforeSeq, afterSeq), a bad
     request (400 naming the field), an unknown path (404) and no token (401);
  4. keeps user A connected to the WebSocket API (?token=) meanwhile: `read.updated` when B reads
     and `message.new` for B's reply must arrive within --push-timeout seconds (default 5),
     deduplicated by (conversationId, seq);
  5. prints the relay's and the fanout's IteratorAge (CloudWatch AWS/Lambda, Maximum, last 15
     minutes; the functions of logical ids RelayFunction and FanoutFunction), warning above 60 s;
  6. deletes what it created (the Cognito users). The conversation stays: there is no delete API.

--local: the local stack (infra/run-local.sh; default http://127.0.0.1:9000 and ws://127.0.0.1:9001):
  two fresh user ids with HS256 tokens minted like infra/mint_token.py (CHAT_LOCAL_JWT_SECRET,
  default `local-dev-secret`); steps 1, 5 and the Cognito part of 2 and 6 are skipped.

Exit status: 0 when every step passed (warnings allowed), 1 when any failed, 2 on bad usage.
Standard library only (plus the `aws` command when deployed).
"""
import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mint_token import mint  # noqa: E402
from ws_listen import read_exact, send_frame  # noqa: E402

ITERATOR_AGE_WARN_S = 60
HTTP_TIMEOUT_S = 30


class Fail(Exception):
    pass


class Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Steps and their report

class Report:
    def __init__(self):
        self.passed = self.failed = self.warned = self.skipped = 0

    def line(self, status: str, name: str, detail: str = "") -> None:
        print(f"{status:<5} {name}" + (f": {detail}" if detail else ""), flush=True)

    def step(self, name: str, fn, *args):
        """Runs one step; returns its value, or None when it failed or was skipped."""
        try:
            value = fn(*args)
        except Skip as e:
            self.skipped += 1
            self.line("SKIP", name, str(e))
            return None
        except Fail as e:
            self.failed += 1
            self.line("FAIL", name, str(e))
            return None
        except Exception as e:  # a bug or an unexpected answer: still a failed step, not a crash
            self.failed += 1
            self.line("FAIL", name, f"{type(e).__name__}: {e}")
            return None
        detail, warning = (value.get("detail", ""), value.get("warning")) if isinstance(value, dict) else ("", None)
        if warning:
            self.warned += 1
            self.line("WARN", name, f"{detail}; {warning}" if detail else warning)
        else:
            self.passed += 1
            self.line("PASS", name, detail)
        return value

    def skip(self, name: str, why: str) -> None:
        self.skipped += 1
        self.line("SKIP", name, why)


def need(*values):
    if any(v is None for v in values):
        raise Skip("an earlier step it depends on failed")


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


# ---------------------------------------------------------------------------------------------
# HTTP

def http(method: str, url: str, token=None, body=None, raw: bytes = None, headers=None):
    """Returns (status, parsed JSON or None, raw text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            status, text = resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise Fail(f"{method} {url}: {e}")
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    return status, parsed, text


def expect(status, parsed, text, want: int, what: str):
    if status != want:
        raise Fail(f"{what}: expected {want}, got {status} {short(text)}")
    return parsed


def short(text: str, n: int = 300) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[:n] + "…"


def error_code(parsed):
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        e = parsed["error"]
        if isinstance(e.get("code"), str) and isinstance(e.get("message"), str):
            return e["code"], e["message"]
    return None


# ---------------------------------------------------------------------------------------------
# WebSocket: a minimal client (RFC 6455, the frame helpers of infra/ws_listen.py) that collects
# the events in a background thread.

def event_like(**fields):
    """Matches an event that has each of `fields` at its value."""
    return lambda event: all(event.get(k) == v for k, v in fields.items())


class Listener:
    def __init__(self, base: str, token: str):
        url = urllib.parse.urlparse(base)
        secure = url.scheme == "wss"
        sock = socket.create_connection((url.hostname, url.port or (443 if secure else 80)), timeout=HTTP_TIMEOUT_S)
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
        key = base64.b64encode(os.urandom(16)).decode()
        path = (url.path or "/") + "?token=" + urllib.parse.quote(token, safe="")
        sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        self.f = sock.makefile("rb")
        status = self.f.readline().decode(errors="replace").strip()
        while self.f.readline() not in (b"\r\n", b""):
            pass
        if " 101 " not in status + " ":
            sock.close()
            raise Fail(f"connection refused: {status or 'no answer'}")
        sock.settimeout(None)
        self.sock = sock
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.events = []        # (monotonic time received, event), every frame including repeats
        self.seen = set()       # dedup keys
        self.duplicates = 0
        self.closed = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        message = b""
        try:
            while True:
                b0, b1 = read_exact(self.f, 2)
                n = b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(read_exact(self.f, 2), "big")
                elif n == 127:
                    n = int.from_bytes(read_exact(self.f, 8), "big")
                payload = read_exact(self.f, n)
                opcode = b0 & 0x0F
                if opcode == 0x9:
                    with self.lock:
                        send_frame(self.sock, 0xA, payload)
                elif opcode == 0x8:
                    raise EOFError("closed by the server")
                elif opcode in (0x0, 0x1):
                    message += payload
                    if b0 & 0x80:
                        self._add(message.decode("utf-8", "replace"))
                        message = b""
        except Exception as e:  # EOF, reset, or our own close
            with self.cond:
                self.closed = str(e) or type(e).__name__
                self.cond.notify_all()

    def _add(self, text: str):
        try:
            event = json.loads(text)
        except ValueError:
            event = {"type": "(not JSON)", "text": text}
        kind = event.get("type")
        # Delivery is at-least-once: clients dedupe messages by (conversationId, seq); a read
        # receipt is the same event when its member and watermark are.
        if kind == "message.new":
            key = (kind, event.get("conversationId"), event.get("seq"))
        elif kind == "read.updated":
            key = (kind, event.get("conversationId"), event.get("userId"), event.get("lastReadSeq"))
        else:
            key = None
        with self.cond:
            if key is not None and key in self.seen:
                self.duplicates += 1
                return
            if key is not None:
                self.seen.add(key)
            self.events.append((time.monotonic(), event))
            self.cond.notify_all()

    def wait_for(self, match, since: float, timeout: float):
        """The first (deduplicated) event matching `match`, and seconds from `since`; Fail after timeout."""
        deadline = since + timeout
        with self.cond:
            while True:
                for at, event in self.events:
                    if match(event):
                        return event, max(0.0, at - since)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    break
                self.cond.wait(remaining)
            got = ", ".join(json.dumps(e, ensure_ascii=False)[:120] for _, e in self.events[-5:]) or "nothing"
            why = f"the connection closed ({self.closed})" if self.closed else f"not within {timeout:g} s"
            raise Fail(f"{why}; received: {got}")

    def close(self):
        try:
            with self.lock:
                send_frame(self.sock, 0x8, b"\x03\xe8")
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# AWS (the AWS CLI v2)

class Aws:
    def __init__(self, region):
        self.region = region
        if not shutil.which("aws"):
            raise Fail("the AWS CLI (`aws`, v2) is not on PATH")

    def __call__(self, *args, input_json=None):
        cmd = ["aws", *args, "--output", "json"]
        if self.region:
            cmd += ["--region", self.region]
        path = None
        try:
            if input_json is not None:
                # Passwords go in a private file, not on the command line (visible in `ps`).
                fd, path = tempfile.mkstemp(prefix="chat-smoke-", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump(input_json, f)
                cmd += ["--cli-input-json", f"file://{path}"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        finally:
            if path:
                os.unlink(path)
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            raise Fail(f"`aws {' '.join(args[:2])}` failed: {err[-1] if err else f'exit {proc.returncode}'}")
        return json.loads(proc.stdout) if proc.stdout.strip() else {}


def jwt_sub(token: str):
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"]
    except Exception:
        raise Fail("cannot read `sub` from the token (not a JWT?)")


# ---------------------------------------------------------------------------------------------
# The run

def main() -> int:
    ap = argparse.ArgumentParser(
        prog="infra/smoke.sh", usage="\n  ".join(l.strip() for l in __doc__.split("\n\n")[1].strip().splitlines()),
        description=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stack", nargs="?", help="the CloudFormation stack name (sam deploy's Stack Name)")
    ap.add_argument("--local", nargs="*", metavar="URL",
                    help="test the local stack: [REST_URL WS_URL] (default http://127.0.0.1:9000 ws://127.0.0.1:9001)")
    ap.add_argument("--region", help="AWS region (default: the AWS CLI's, e.g. AWS_REGION)")
    ap.add_argument("--push-timeout", type=float, default=5.0, metavar="S",
                    help="seconds a push may take to arrive (default 5)")
    args = ap.parse_args()
    local = args.local is not None
    if local == bool(args.stack) or (local and len(args.local) not in (0, 2)):
        ap.print_usage(sys.stderr)
        print("give either STACK_NAME or --local [REST_URL WS_URL]", file=sys.stderr)
        return 2

    r = Report()
    created_users = []   # Cognito usernames to delete
    aws = None
    pool = None
    listener = None
    conv = None
    started = time.monotonic()
    print(f"chat smoke test: {'the local stack' if local else 'stack ' + args.stack}"
          f" (push timeout {args.push_timeout:g} s)", flush=True)
    try:
        # 1. Where the stack is.
        if local:
            rest, ws = (args.local or ["http://127.0.0.1:9000", "ws://127.0.0.1:9001"])
            rest = rest.rstrip("/")
            r.skip("stack outputs", f"--local: REST {rest}, WebSocket {ws}")
        else:
            def outputs():
                nonlocal aws
                aws = Aws(args.region)
                stack = aws("cloudformation", "describe-stacks", "--stack-name", args.stack)["Stacks"][0]
                out = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
                missing = [k for k in ("RestApiUrl", "WebSocketUrl") if k not in out]
                check(not missing, f"stack {stack['StackStatus']} has no output {', '.join(missing)}")
                status = stack["StackStatus"]
                warning = None if status in ("CREATE_COMPLETE", "UPDATE_COMPLETE") else f"stack status {status}"
                return {"detail": f"{status}; RestApiUrl {out['RestApiUrl']}, WebSocketUrl {out['WebSocketUrl']}",
                        "warning": warning, "rest": out["RestApiUrl"].rstrip("/"), "ws": out["WebSocketUrl"]}
            o = r.step("stack outputs", outputs)
            rest, ws = (o["rest"], o["ws"]) if o else (None, None)

        # 2. Two users.
        def tokens():
            nonlocal pool
            if local:
                secret = os.environ.get("CHAT_LOCAL_JWT_SECRET") or "local-dev-secret"
                tag = secrets.token_hex(4)
                a, b = f"smoke-{tag}-a", f"smoke-{tag}-b"
                return {"detail": f"local HS256 tokens for fresh users {a}, {b}", "fresh": True,
                        "a": (a, mint(a, 3600, secret)), "b": (b, mint(b, 3600, secret))}
            ta, tb = os.environ.get("CHAT_SMOKE_TOKEN_A"), os.environ.get("CHAT_SMOKE_TOKEN_B")
            if ta and tb:
                a = os.environ.get("CHAT_SMOKE_USER_ID_A") or jwt_sub(ta)
                b = os.environ.get("CHAT_SMOKE_USER_ID_B") or jwt_sub(tb)
                check(a != b, f"both tokens are for the same user {a}")
                return {"detail": f"from CHAT_SMOKE_TOKEN_A/B: users {a}, {b}", "fresh": False,
                        "a": (a, ta), "b": (b, tb)}
            pool, client = os.environ.get("CHAT_SMOKE_USER_POOL_ID"), os.environ.get("CHAT_SMOKE_CLIENT_ID")
            if not (pool and client):
                raise Fail("set CHAT_SMOKE_TOKEN_A and CHAT_SMOKE_TOKEN_B, or CHAT_SMOKE_USER_POOL_ID and "
                           "CHAT_SMOKE_CLIENT_ID (see --help)")
            need(aws)
            client_secret = os.environ.get("CHAT_SMOKE_CLIENT_SECRET")
            email_names = False
            try:
                desc = aws("cognito-idp", "describe-user-pool", "--user-pool-id", pool)["UserPool"]
                email_names = "email" in (desc.get("UsernameAttributes") or [])
            except Fail:
                pass  # no DescribeUserPool permission: plain usernames
            tag = secrets.token_hex(4)
            users = {}
            for who in ("a", "b"):
                name = f"chat-smoke-{tag}-{who}" + ("@example.invalid" if email_names else "")
                attrs = ["Name=email,Value=" + name, "Name=email_verified,Value=true"] if email_names else []
                aws("cognito-idp", "admin-create-user", "--user-pool-id", pool, "--username", name,
                    "--message-action", "SUPPRESS", *(["--user-attributes", *attrs] if attrs else []))
                created_users.append(name)
                password = f"Sm0ke-{secrets.token_urlsafe(18)}!aZ9"
                aws("cognito-idp", "admin-set-user-password", input_json={
                    "UserPoolId": pool, "Username": name, "Password": password, "Permanent": True})
                params = {"USERNAME": name, "PASSWORD": password}
                if client_secret:
                    params["SECRET_HASH"] = base64.b64encode(hmac.new(
                        client_secret.encode(), (name + client).encode(), hashlib.sha256).digest()).decode()
                auth = aws("cognito-idp", "initiate-auth", input_json={
                    "ClientId": client, "AuthFlow": "USER_PASSWORD_AUTH", "AuthParameters": params})
                token = (auth.get("AuthenticationResult") or {}).get("IdToken")
                check(token, f"no ID token for {name} (challenge {auth.get('ChallengeName')})")
                users[who] = (jwt_sub(token), token)
            return {"detail": f"temporary Cognito users chat-smoke-{tag}-a (sub {users['a'][0]}), "
                              f"chat-smoke-{tag}-b (sub {users['b'][0]})", "fresh": True, **users}
        t = r.step("tokens", tokens)
        (a, ta), (b, tb) = (t["a"], t["b"]) if t else ((None, None), (None, None))
        fresh = bool(t and t["fresh"])

        # 3 and 4. The walk-through, with A listening.
        def create():
            status, c, text = http("POST", f"{rest}/conversations", ta, {"type": "direct", "peerId": b})
            check(status == 201 or (status == 200 and not fresh),
                  f"expected 201, got {status} {short(text)}")
            check(c.get("type") == "direct" and sorted(c.get("memberIds", [])) == sorted([a, b])
                  and c.get("memberCount") == 2, f"unexpected conversation {short(text)}")
            note = "" if status == 201 else " (200: it exists from an earlier run with these users)"
            return {"detail": f"{status} {c['conversationId']}{note}", "conv": c}
        c = r.step("create direct conversation (A with B)", lambda: (need(rest, ta, tb), create())[1])
        conv = c and c["conv"]
        cid = conv and conv["conversationId"]

        def create_again():
            need(cid)
            expect(*http("POST", f"{rest}/conversations", ta, {"type": "direct", "peerId": b}), 200, "A again")
            status, c2, text = http("POST", f"{rest}/conversations", tb, {"type": "direct", "peerId": a})
            expect(status, c2, text, 200, "B with A")
            check(c2["conversationId"] == cid, f"B got another conversation {c2['conversationId']}")
            return {"detail": "200 with the same conversation for A again and for B with A"}
        r.step("same pair again", create_again)

        base_seq = None

        def baseline():
            need(cid)
            nonlocal base_seq
            status, c2, text = http("GET", f"{rest}/conversations/{cid}", tb)
            base_seq = expect(status, c2, text, 200, "GET conversation")["lastSeq"]
            if base_seq:  # an earlier run's messages: B catches up so the unread count starts at 0
                expect(*http("POST", f"{rest}/conversations/{cid}/read", tb, {"seq": base_seq}), 200, "B reads")
            return {"detail": f"lastSeq {base_seq}" + (" (B marked it read)" if base_seq else "")}
        r.step("conversation as B", baseline)

        def connect():
            nonlocal listener
            need(ws, ta)
            listener = Listener(ws, ta)
            return {"detail": f"A connected to {ws}?token=…"}
        r.step("WebSocket connect (A)", connect)

        body1 = f'smoke {uuid.uuid4().hex[:8]} 👋 "quotes" <b>日本語</b>\nline 2'
        msg_id = str(uuid.uuid4())
        m1 = None

        def send():
            nonlocal m1
            need(cid, base_seq)
            status, m, text = http("POST", f"{rest}/conversations/{cid}/messages", ta,
                                   {"clientMsgId": msg_id, "body": body1})
            expect(status, m, text, 201, "send")
            check(m.get("seq") == base_seq + 1, f"seq {m.get('seq')}, expected {base_seq + 1}")
            check(m.get("body") == body1 and m.get("senderId") == a and m.get("clientMsgId") == msg_id,
                  f"unexpected message {short(text)}")
            m1 = m
            return {"detail": f"201 seq {m['seq']}"}
        r.step("A sends a message", send)

        def replay():
            need(m1)
            status, m, text = http("POST", f"{rest}/conversations/{cid}/messages", ta,
                                   {"clientMsgId": msg_id, "body": body1})
            expect(status, m, text, 200, "replay")
            check(m == m1, f"not identical: {short(text)}")
            return {"detail": "200, identical message"}
        r.step("replay the same clientMsgId", replay)

        def inbox():
            need(m1)
            status, page, text = http("GET", f"{rest}/inbox", tb)
            expect(status, page, text, 200, "inbox")
            entry = next((e for e in page["conversations"] if e["conversationId"] == cid), None)
            check(entry is not None, f"conversation not in B's first inbox page {short(text)}")
            check(entry.get("unreadCount") == 1 and entry.get("lastSeq") == m1["seq"]
                  and entry.get("peerId") == a and (entry.get("lastMessage") or {}).get("seq") == m1["seq"],
                  f"unexpected entry {short(json.dumps(entry, ensure_ascii=False))}")
            return {"detail": f"unreadCount 1, lastSeq {entry['lastSeq']}, peerId {a}"}
        r.step("B's inbox shows 1 unread", inbox)

        read_at = None

        def mark_read():
            nonlocal read_at
            need(m1)
            read_at = time.monotonic()
            status, rd, text = http("POST", f"{rest}/conversations/{cid}/read", tb, {"seq": m1["seq"]})
            expect(status, rd, text, 200, "read")
            check(rd.get("advanced") is True and rd.get("lastReadSeq") == m1["seq"], f"unexpected {short(text)}")
            return {"detail": f"lastReadSeq {rd['lastReadSeq']}, advanced true"}
        read_ok = r.step("B marks it read", mark_read)

        def late_read():
            need(m1)
            status, rd, text = http("POST", f"{rest}/conversations/{cid}/read", tb, {"seq": m1["seq"] - 1})
            expect(status, rd, text, 200, "late read")
            check(rd.get("advanced") is False and rd.get("lastReadSeq") == m1["seq"], f"unexpected {short(text)}")
            return {"detail": f"seq {m1['seq'] - 1}: lastReadSeq stays {rd['lastReadSeq']}, advanced false"}
        r.step("a late, older read", late_read)

        def push_read():
            need(listener, read_ok)
            e, took = listener.wait_for(
                event_like(type="read.updated", conversationId=cid, userId=b, lastReadSeq=m1["seq"]),
                read_at, args.push_timeout)
            return {"detail": f"A got read.updated (B, lastReadSeq {e['lastReadSeq']}) {took:.2f} s after the read"}
        r.step("push: read.updated to A", push_read)

        body2 = f"reply {uuid.uuid4().hex[:8]} ✅"
        m2 = None
        sent_at = None

        def reply():
            nonlocal m2, sent_at
            need(m1)
            sent_at = time.monotonic()
            status, m, text = http("POST", f"{rest}/conversations/{cid}/messages", tb,
                                   {"clientMsgId": str(uuid.uuid4()), "body": body2})
            expect(status, m, text, 201, "send")
            check(m.get("seq") == m1["seq"] + 1 and m.get("senderId") == b, f"unexpected {short(text)}")
            m2 = m
            return {"detail": f"201 seq {m['seq']}"}
        r.step("B replies", reply)

        def push_message():
            need(listener, m2)
            e, took = listener.wait_for(
                event_like(type="message.new", conversationId=cid, seq=m2["seq"]), sent_at, args.push_timeout)
            check(e.get("senderId") == b and e.get("body") == body2 and e.get("clientMsgId") == m2["clientMsgId"],
                  f"unexpected event {short(json.dumps(e, ensure_ascii=False))}")
            return {"detail": f"A got message.new seq {e['seq']} from B {took:.2f} s after the send"}
        r.step("push: message.new to A", push_message)

        def reads():
            need(m2)
            status, rs, text = http("GET", f"{rest}/conversations/{cid}/reads", ta)
            expect(status, rs, text, 200, "reads")
            marks = {m["userId"]: m["lastReadSeq"] for m in rs["members"]}
            check(rs["lastSeq"] == m2["seq"] and marks == {a: m1["seq"], b: m2["seq"]}, f"unexpected {short(text)}")
            return {"detail": f"lastSeq {rs['lastSeq']}; A read {marks[a]}, B read {marks[b]} (sending marks read)"}
        r.step("every member's watermark", reads)

        def history():
            need(m2)
            s1, s2 = m1["seq"], m2["seq"]
            url = f"{rest}/conversations/{cid}/messages"

            def page(query, want_seqs, want_more):
                status, p, text = http("GET", f"{url}?{query}", ta)
                expect(status, p, text, 200, query)
                seqs = [m["seq"] for m in p["messages"]]
                check(seqs == want_seqs and p["hasMore"] is want_more and p["lastSeq"] == s2,
                      f"{query}: seqs {seqs} hasMore {p['hasMore']} lastSeq {p['lastSeq']}, expected "
                      f"{want_seqs} hasMore {want_more} lastSeq {s2}")
                return p
            p = page("limit=2", [s1, s2], s1 > 1)
            check([m["body"] for m in p["messages"]] == [body1, body2], "bodies not returned byte-for-byte")
            check(p["messages"][0] == m1, f"history's message differs from the send's: {short(json.dumps(p['messages'][0]))}")
            page(f"beforeSeq={s2}&limit=1", [s1], s1 > 1)
            page(f"afterSeq={s1 - 1}&limit=1", [s1], True)
            page(f"afterSeq={s1}", [s2], False)
            return {"detail": f"newest [{s1}, {s2}], beforeSeq={s2} [{s1}], afterSeq={s1 - 1} [{s1}] hasMore, "
                              f"afterSeq={s1} [{s2}] no more; bodies byte-for-byte"}
        r.step("history newest / beforeSeq / afterSeq", history)

        def bad_request():
            need(cid)
            status, e, text = http("POST", f"{rest}/conversations/{cid}/messages", ta, {"body": "x"})
            ec = error_code(e)
            check(status == 400 and ec and ec[0] == "invalid_request" and "clientMsgId" in ec[1],
                  f"missing clientMsgId: expected 400 invalid_request naming clientMsgId, got {status} {short(text)}")
            status, e, text = http("GET", f"{rest}/conversations/{cid}/messages?limit=0", ta)
            ec2 = error_code(e)
            check(status == 400 and ec2 and ec2[0] == "invalid_request" and "limit" in ec2[1],
                  f"limit=0: expected 400 invalid_request naming limit, got {status} {short(text)}")
            if local:
                # A header value that is not ASCII text (sent as Latin-1): bad input, not a 5xx.
                status, e, text = http("GET", f"{rest}/inbox", ta, headers={"X-Foo": "caf\u00e9"})
                ec3 = error_code(e)
                check(status == 400 and ec3 and ec3[0] == "invalid_request" and "x-foo" in ec3[1],
                      f"non-ASCII header: expected 400 invalid_request naming it, got {status} {short(text)}")
            return {"detail": f"400 invalid_request: \"{ec[1]}\"; \"{ec2[1]}\""}
        r.step("bad requests get 400", bad_request)

        def unknown_path():
            need(rest, ta)
            status, e, text = http("GET", f"{rest}/nowhere", ta)
            ec = error_code(e)
            check(status == 404 and ec and ec[0] == "not_found",
                  f"expected 404 not_found in the error shape, got {status} {short(text)}")
            if local:
                # A request target that is not a path (`OPTIONS *`) names no route either.
                u = urllib.parse.urlsplit(rest)
                with socket.create_connection((u.hostname, u.port or 80), timeout=10) as sock:
                    sock.sendall(f"OPTIONS * HTTP/1.1\r\nHost: {u.netloc}\r\n"
                                 "Connection: close\r\n\r\n".encode())
                    answer = b""
                    while chunk := sock.recv(65536):
                        answer += chunk
                head, _, star_body = answer.partition(b"\r\n\r\n")
                check(head.startswith(b"HTTP/1.1 404") and b'"not_found"' in star_body,
                      f"OPTIONS *: expected 404 not_found, got {short(answer.decode(errors='replace'))}")
            return {"detail": f"404 {short(text, 120)}"}
        r.step("unknown path gets 404", unknown_path)

        def no_token():
            need(rest)
            status, e, text = http("GET", f"{rest}/inbox")
            check(status == 401, f"expected 401, got {status} {short(text)}")
            ec = error_code(e)
            if local:
                check(ec and ec[0] == "unauthorized", f"not the error shape: {short(text)}")
                # A token that is not ASCII text (sent as Latin-1) is a malformed one.
                status, e, text = http("GET", f"{rest}/inbox", headers={"Authorization": "Bearer caf\u00e9"})
                check(status == 401 and (error_code(e) or [""])[0] == "unauthorized",
                      f"non-ASCII token: expected 401 unauthorized, got {status} {short(text)}")
            # Deployed, API Gateway's JWT authorizer answers first, in its own shape
            # ({"message":"Unauthorized"}), not ours.
            return {"detail": f"401 {short(text, 120)}"}
        r.step("no token gets 401", no_token)

        if listener:
            n = sum(1 for _, e in listener.events if e.get("conversationId") == cid)
            print(f"      (A's socket: {n} distinct events of this conversation, "
                  f"{listener.duplicates} repeats deduplicated)", flush=True)

        # 5. The pipeline's lag.
        for logical in ("RelayFunction", "FanoutFunction"):
            if local:
                r.skip(f"IteratorAge {logical}", "--local: no CloudWatch")
                continue

            def iterator_age(logical=logical):
                need(aws)
                res = aws("cloudformation", "describe-stack-resource", "--stack-name", args.stack,
                          "--logical-resource-id", logical)["StackResourceDetail"]
                fn = res["PhysicalResourceId"]
                end = datetime.now(timezone.utc)
                stats = aws("cloudwatch", "get-metric-statistics", "--namespace", "AWS/Lambda",
                            "--metric-name", "IteratorAge", "--dimensions", f"Name=FunctionName,Value={fn}",
                            "--start-time", (end - timedelta(minutes=15)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "--end-time", end.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "--period", "60", "--statistics", "Maximum")
                points = stats.get("Datapoints", [])
                if not points:
                    return {"detail": f"{fn}: no datapoints in the last 15 minutes (Lambda publishes them "
                                      f"a minute or two late; this run's records may not be there yet)"}
                worst = max(p["Maximum"] for p in points) / 1000.0
                latest = max(points, key=lambda p: p["Timestamp"])
                detail = (f"{fn}: max {worst:.1f} s over the last 15 minutes "
                          f"({len(points)} one-minute periods with data, the latest {latest['Maximum'] / 1000.0:.1f} s)")
                warning = (f"above {ITERATOR_AGE_WARN_S} s: the pipeline is behind (README \"Operating it\")"
                           if worst > ITERATOR_AGE_WARN_S else None)
                return {"detail": detail, "warning": warning}
            r.step(f"IteratorAge {logical}", iterator_age)
    finally:
        # 6. Cleanup.
        if listener:
            listener.close()
        if created_users:
            def delete_users():
                gone = []
                errors = []
                for name in created_users:
                    try:
                        aws("cognito-idp", "admin-delete-user", "--user-pool-id", pool, "--username", name)
                        gone.append(name)
                    except Fail as e:
                        errors.append(f"{name}: {e}")
                check(not errors, "could not delete " + "; ".join(errors) + " (delete them by hand)")
                return {"detail": "deleted " + ", ".join(gone)}
            r.step("cleanup: temporary Cognito users", delete_users)
        elif local:
            r.skip("cleanup: temporary Cognito users", "--local: none created")
        if conv:
            print(f"NOTE  the conversation {conv['conversationId']} and its messages stay: "
                  f"the API has no way to delete them", flush=True)

    print(f"---- {r.passed} passed, {r.failed} failed, {r.warned} warnings, {r.skipped} skipped "
          f"in {time.monotonic() - started:.1f} s", flush=True)
    print("FAIL" if r.failed else "PASS", flush=True)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
