// ChatClient against an in-memory server (fake fetch, fake WebSocket): the REST calls, send retries,
// read-mark debouncing, and live delivery (dedupe, gap fill, light payloads, reconnect catch-up).

import assert from "node:assert/strict";
import { afterEach, describe, it } from "node:test";
import {
  applyChange,
  ChangeError,
  ChatApiError,
  ChatClient,
  SendError,
  SyncError,
  type ChatClientOptions,
  type ConnectionState,
  type Message,
  type MessageChange,
  type ReadUpdatedEvent,
} from "../../src/index.js";
import * as presence from "../../src/presence.js";
import * as safety from "../../src/safety.js";
import { FakeChatServer } from "../helpers/fake-server.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const clients: ChatClient[] = [];

function setup(options: Partial<ChatClientOptions> = {}, server = new FakeChatServer()) {
  const client = new ChatClient({
    apiUrl: "http://api.test/",
    wsUrl: "ws://ws.test",
    token: "alice",
    fetch: server.fetch,
    WebSocket: server.WebSocket,
    readDebounceMs: 60,
    gapFillDelayMs: 10,
    reconnect: { baseDelayMs: 10, maxDelayMs: 40 },
    sendRetry: { baseDelayMs: 5 },
    ...options,
  });
  clients.push(client);
  const messages: Message[] = [];
  const reads: ReadUpdatedEvent[] = [];
  const states: ConnectionState[] = [];
  const errors: Error[] = [];
  const changes: MessageChange[] = [];
  client.on("message", (m) => messages.push(m));
  client.on("change", (c) => changes.push(c));
  client.on("read", (r) => reads.push(r));
  client.on("connection", (s) => states.push(s));
  client.on("error", (e) => errors.push(e));
  return { server, client, messages, reads, states, errors, changes };
}

afterEach(() => {
  for (const c of clients.splice(0)) c.close();
});

async function until(what: string, cond: () => boolean, timeoutMs = 3000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) assert.fail(`timed out waiting for: ${what}`);
    await sleep(5);
  }
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const seqs = (ms: Message[]) => ms.map((m) => m.seq);

describe("REST", () => {
  it("calls the safety and moderation routes (docs/api.md §27–§30)", async () => {
    const { server, client } = setup();
    const last = () => `${server.requests.at(-1)!.method} ${server.requests.at(-1)!.path}${server.requests.at(-1)!.query.toString() ? "?" + server.requests.at(-1)!.query.toString() : ""}`;
    await safety.block(client, "b|x");
    assert.equal(last(), "PUT /me/blocks/b%7Cx");
    await safety.unblock(client, "bob");
    assert.equal(last(), "DELETE /me/blocks/bob");
    assert.deepEqual((await safety.blocks(client, { limit: 5 })).blocks, []);
    assert.equal(last(), "GET /me/blocks?limit=5");
    await safety.ban(client, "g-1", "bob");
    assert.equal(last(), "POST /conversations/g-1/bans/bob");
    await safety.unban(client, "g-1", "bob");
    assert.equal(last(), "DELETE /conversations/g-1/bans/bob");
    assert.equal((await safety.report(client, "g-1", 3, "spam", "why")).reportId, "r1");
    assert.equal(last(), "POST /conversations/g-1/messages/3/reports");
    assert.deepEqual(server.requests.at(-1)!.body, { reason: "spam", note: "why" });
    assert.deepEqual((await safety.moderationReports(client, { cursor: "c1" })).reports, []);
    assert.equal(last(), "GET /moderation/reports?cursor=c1");
    await safety.suspend(client, "bob");
    assert.equal(last(), "PUT /moderation/suspensions/bob");
    await safety.unsuspend(client, "bob");
    assert.equal(last(), "DELETE /moderation/suspensions/bob");
  });

  it("calls every route with the API's paths, bodies and a Bearer token", async () => {
    const { server, client } = setup();
    const direct = await client.openDirect("bob");
    assert.equal(direct.type, "direct");
    assert.deepEqual(direct.memberIds.sort(), ["alice", "bob"]);
    assert.equal((await client.openDirect("bob")).conversationId, direct.conversationId);

    const group = await client.createGroup({ title: "Team", memberIds: ["bob", "carol"], clientRequestId: "6f1c2a8e-1111-4222-8333-944455556666" });
    assert.equal(group.title, "Team");
    assert.deepEqual(server.requests.at(-1)!.body, { type: "group", title: "Team", memberIds: ["bob", "carol"], clientRequestId: "6f1c2a8e-1111-4222-8333-944455556666" });

    assert.equal((await client.getConversation(group.conversationId)).memberCount, 3);
    assert.equal((await client.addMembers(group.conversationId, ["dave"])).memberCount, 4);
    assert.equal(await client.removeMember(group.conversationId, "dave"), undefined);
    assert.equal(server.requests.at(-1)!.method, "DELETE");
    assert.equal(server.requests.at(-1)!.path, `/conversations/${group.conversationId}/members/dave`);

    const sent = await client.send(group.conversationId, "hello <b>'\"👋\n");
    assert.equal(sent.seq, 1);
    assert.equal(sent.body, "hello <b>'\"👋\n");
    const page = await client.history(group.conversationId, { afterSeq: 0, limit: 10 });
    assert.deepEqual(page, { messages: [sent], lastSeq: 1, hasMore: false });
    assert.equal(server.requests.at(-1)!.query.toString(), "afterSeq=0&limit=10");
    await client.history(group.conversationId, { beforeSeq: 5 });
    assert.equal(server.requests.at(-1)!.query.toString(), "beforeSeq=5");

    const reads = await client.readStates(group.conversationId);
    assert.equal(server.requests.at(-1)!.path, `/conversations/${group.conversationId}/reads`);
    assert.deepEqual(reads.members.find((m) => m.userId === "alice"), { userId: "alice", lastReadSeq: 1 });
    assert.equal((client as unknown as Record<string, unknown>).reads, undefined, "the old name is gone: readStates, as in docs/api.md §13");
    const inbox = await client.inbox({ limit: 1 });
    assert.equal(inbox.conversations.length, 1);
    assert.equal(inbox.conversations[0]!.conversationId, group.conversationId);
    assert.ok(inbox.nextCursor);
    const rest = await client.inbox({ cursor: inbox.nextCursor });
    assert.equal(rest.conversations[0]!.conversationId, direct.conversationId);

    for (const r of server.requests) {
      assert.equal(r.headers.Authorization, "Bearer alice");
      assert.equal(r.path.startsWith("//"), false, "trailing slash of apiUrl is dropped");
      if (r.body !== undefined) assert.equal(r.headers["Content-Type"], "application/json");
    }
  });

  it("throws ChatApiError with the API's status, code and message", async () => {
    const { client, server } = setup();
    const err = await client.getConversation("nope").catch((e: unknown) => e);
    assert.ok(err instanceof ChatApiError);
    assert.deepEqual([err.status, err.code, err.message], [404, "not_found", "conversation not found"]);

    // Answers from in front of the functions (API Gateway's authorizer) carry no error object.
    server.failNext({ respond: { status: 401, body: { message: "Unauthorized" } } });
    const e401 = (await client.inbox().catch((e: unknown) => e)) as ChatApiError;
    assert.deepEqual([e401.status, e401.code, e401.message], [401, "unauthorized", "Unauthorized"]);

    server.failNext({ respond: "network" });
    const eNet = (await client.inbox().catch((e: unknown) => e)) as ChatApiError;
    assert.deepEqual([eNet.status, eNet.code], [0, "network_error"]);
  });

  it("maps API Gateway's own answers (not in the API's error shape) to a code from the status", async () => {
    const { client, server } = setup();
    const cases: [number, unknown, string, string, boolean][] = [
      [401, { message: "Unauthorized" }, "unauthorized", "Unauthorized", false],
      [403, { message: "Forbidden" }, "forbidden", "Forbidden", false],
      [413, { message: "Request Entity Too Large" }, "payload_too_large", "Request Entity Too Large", false],
      [429, { message: "Too Many Requests" }, "throttled", "Too Many Requests", true],
      [500, { message: "Internal Server Error" }, "internal", "Internal Server Error", true],
      [502, "Bad Gateway", "internal", "Bad Gateway", true],
      [503, { message: "Service Unavailable" }, "unavailable", "Service Unavailable", true],
      [504, { message: "Endpoint request timed out" }, "unavailable", "Endpoint request timed out", true],
      [503, { error: { code: "unavailable", message: "the outcome is unknown" } }, "unavailable", "the outcome is unknown", true],
      [429, { error: { code: "throttled", message: "busy" } }, "throttled", "busy", true],
    ];
    for (const [status, body, code, message, retryable] of cases) {
      server.failNext({ respond: { status, body } });
      const e = (await client.inbox().catch((x: unknown) => x)) as ChatApiError;
      assert.ok(e instanceof ChatApiError);
      assert.deepEqual([e.status, e.code, e.message, e.retryable], [status, code, message, retryable], `${status} ${JSON.stringify(body)}`);
    }
  });

  it("calls a token function (sync or async) for every request and every connect", async () => {
    let n = 0;
    const { server, client } = setup({ token: async () => (++n, "alice") });
    await client.inbox();
    await client.inbox();
    assert.equal(n, 2);
    await client.connect();
    assert.equal(n, 3);
    assert.equal(new URL(server.sockets[0]!.url).searchParams.get("token"), "alice");

    let m = 0;
    const sync = setup({ token: () => (++m, "bob") });
    await sync.client.inbox();
    await sync.client.inbox();
    assert.equal(m, 2);
    assert.equal(sync.server.requests.at(-1)!.headers.Authorization, "Bearer bob");
  });
});

describe("send", () => {
  it("makes a v4 UUID clientMsgId, or uses the one given", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    const a = await client.send(id, "one");
    assert.match(a.clientMsgId, UUID);
    assert.equal((server.requests.at(-1)!.body as { clientMsgId: string }).clientMsgId, a.clientMsgId);
    const given = "0b9d3c1e-7a6f-4e2d-9c8b-1a2b3c4d5e6f";
    const b = await client.send(id, "two", { clientMsgId: given });
    assert.equal(b.clientMsgId, given);
    // A replay returns the original message and creates nothing.
    const again = await client.send(id, "two", { clientMsgId: given });
    assert.deepEqual(again, b);
    assert.equal(server.conversations.get(id)!.messages.length, 2);
  });

  it("retries network errors and 5xx with the same clientMsgId", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.failNext({ respond: "network" }, { respond: { status: 503, body: { error: { code: "internal", message: "x" } } } }, { respond: { status: 500 } });
    const m = await client.send(id, "hi");
    const sends = server.requests.filter((r) => r.method === "POST");
    assert.equal(sends.length, 4);
    assert.equal(new Set(sends.map((r) => (r.body as { clientMsgId: string }).clientMsgId)).size, 1);
    assert.equal(m.seq, 1);
    assert.equal(server.conversations.get(id)!.messages.length, 1);
  });

  it("retries API Gateway's own 429 (throttled: nothing happened) and gives up at once on its 413", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.failNext({ respond: { status: 429, body: { message: "Too Many Requests" } } });
    const m = await client.send(id, "hi");
    assert.equal(m.seq, 1);
    assert.equal(server.requests.filter((r) => r.method === "POST").length, 2);
    server.failNext({ respond: { status: 413, body: { message: "Request Entity Too Large" } } });
    const e = (await client.send(id, "x").catch((x: unknown) => x)) as SendError;
    assert.deepEqual([e.status, e.code], [413, "payload_too_large"]);
    assert.equal(server.requests.filter((r) => r.method === "POST").length, 3, "a 413 is not retried");
  });

  it("retries a 503 unavailable (outcome unknown) with the same clientMsgId after Retry-After: the write that landed is returned, not repeated", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    // The first attempt is stored, but its answer is a 503: the server could not tell in time.
    server.failNext({
      match: (r) => {
        if (r.method !== "POST") return false;
        const b = r.body as { clientMsgId: string; body: string };
        server.addMessage(id, "alice", b.body, b.clientMsgId);
        return true;
      },
      respond: { status: 503, body: { error: { code: "unavailable", message: "outcome unknown" } }, headers: { "Retry-After": "0.1" } },
    });
    const t0 = Date.now();
    const m = await client.send(id, "hi");
    assert.ok(Date.now() - t0 >= 95, "waited for Retry-After");
    const sends = server.requests.filter((r) => r.method === "POST");
    assert.equal(sends.length, 2);
    assert.equal(new Set(sends.map((r) => (r.body as { clientMsgId: string }).clientMsgId)).size, 1);
    assert.equal(m.seq, 1);
    assert.equal(m.clientMsgId, (sends[0]!.body as { clientMsgId: string }).clientMsgId);
    assert.equal(server.conversations.get(id)!.messages.length, 1);
  });

  it("waits for Retry-After before retrying a 429", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.failNext({ respond: { status: 429, body: { error: { code: "throttled", message: "slow down" } }, headers: { "Retry-After": "1" } } });
    const t0 = Date.now();
    await client.send(id, "hi");
    const waited = Date.now() - t0;
    assert.ok(waited >= 990, `waited ${waited} ms for Retry-After: 1`);
    assert.ok(waited < 2500, `waited ${waited} ms`);
  });

  it("waits out rate_limited and slow_mode refusals and retries with the same clientMsgId", async () => {
    const { server, client } = setup({ sendRetry: { maxElapsedMs: 100 } });
    const id = server.createConversation(["alice", "bob"]);
    const refuse = (code: string) => ({
      match: (r: { method: string }) => r.method === "POST",
      respond: { status: 429, body: { error: { code, message: "wait" } }, headers: { "Retry-After": "1" } },
    });
    server.failNext(refuse("rate_limited"));
    const t0 = Date.now();
    const m = await client.send(id, "hi");
    assert.ok(Date.now() - t0 >= 990, "waited Retry-After even past maxElapsedMs");
    server.failNext(refuse("slow_mode"));
    await client.send(id, "again");
    const sends = server.requests.filter((r) => r.method === "POST");
    assert.equal(sends.length, 4);
    const ids = sends.map((r) => (r.body as { clientMsgId: string }).clientMsgId);
    assert.equal(ids[0], ids[1]);
    assert.equal(ids[2], ids[3]);
    assert.equal(ids[0], m.clientMsgId);
    // The error carries retryAfter (seconds) and says it was a limit.
    const e = new ChatApiError(429, "slow_mode", "wait", 2500);
    assert.equal(e.retryAfter, 3);
    assert.ok(e.limited && e.retryable);
    assert.ok(!new ChatApiError(429, "throttled", "busy", 1000).limited);
  });

  it("waits out rate_limited refusals past maxAttempts (found by probing: a burst of 200 sends gave up after 6)", async () => {
    const { server, client } = setup({ sendRetry: { maxAttempts: 2, maxElapsedMs: 100 } });
    const id = server.createConversation(["alice", "bob"]);
    const refuse = {
      match: (r: { method: string }) => r.method === "POST",
      respond: { status: 429, body: { error: { code: "rate_limited", message: "wait" } }, headers: { "Retry-After": "1" } },
    };
    for (let i = 0; i < 3; i++) server.failNext(refuse);
    const m = await client.send(id, "hi");
    assert.equal(m.seq, 1);
    assert.equal(server.requests.filter((r) => r.method === "POST").length, 4);
    // Not a limit: the attempts cap it.
    for (let i = 0; i < 2; i++) server.failNext({ ...refuse, respond: { ...refuse.respond, body: { error: { code: "throttled", message: "busy" } } } });
    await assert.rejects(client.send(id, "busy"), (e: unknown) => e instanceof SendError && e.code === "throttled");
  });

  it("calls updateConversation, addAdmin and removeAdmin", async () => {
    const { server, client } = setup();
    const group = { conversationId: "g-1", type: "group", title: "T", memberIds: ["alice", "bob"], memberCount: 2, lastSeq: 0, createdAt: "2026-01-01T00:00:00.000Z", lastMessageAt: null, lastChange: 0 };
    const answer = (body: unknown) => ({ respond: { status: 200, body } });
    server.failNext(
      answer({ ...group, slowModeSeconds: 30 }),
      answer({ ...group, slowModeSeconds: 30, admins: ["bob"] }),
      answer({ ...group, slowModeSeconds: 30 }),
    );
    assert.equal((await safety.updateConversation(client, "g-1", { slowModeSeconds: 30 })).slowModeSeconds, 30);
    assert.deepEqual((await safety.addAdmin(client, "g-1", "bob|x")).admins, ["bob"]);
    assert.equal((await safety.removeAdmin(client, "g-1", "bob|x")).admins, undefined);
    const calls = server.requests.slice(-3).map((r) => `${r.method} ${r.path}`);
    assert.deepEqual(calls, [
      "PATCH /conversations/g-1",
      "PUT /conversations/g-1/admins/bob%7Cx",
      "DELETE /conversations/g-1/admins/bob%7Cx",
    ]);
    assert.deepEqual(server.requests.at(-3)!.body, { slowModeSeconds: 30 });
  });

  it("adds a random jitter to Retry-After, so clients throttled together do not retry together", async (t) => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    const throttled = { respond: { status: 429, body: { error: { code: "throttled", message: "busy" } }, headers: { "Retry-After": "0.2" } } };
    const gap = async () => {
      server.requests.length = 0;
      server.failNext(throttled);
      await client.send(id, "hi");
      const [first, retry] = server.requests.filter((r) => r.method === "POST");
      return retry!.at - first!.at;
    };
    const random = t.mock.method(Math, "random", () => 0);
    const least = await gap();
    assert.ok(least >= 195 && least < 500, `Retry-After 0.2 s, no jitter drawn: retried after ${least} ms`);
    random.mock.mockImplementation(() => 0.5);
    const half = await gap();
    // 200 ms + 0.5 × max(100 ms, 1 s) of jitter.
    assert.ok(half >= 690 && half < 1200, `Retry-After 0.2 s, jitter drawn at 0.5: retried after ${half} ms`);
  });

  it("a send that gives up throws a SendError with its clientMsgId; sending again with it is safe", async () => {
    const { server, client } = setup({ sendRetry: { maxAttempts: 2, baseDelayMs: 1 } });
    const id = server.createConversation(["alice", "bob"]);
    const unavailable = { respond: { status: 503, body: { error: { code: "unavailable", message: "outcome unknown" } } } };
    server.failNext(unavailable, unavailable);
    const e = await client.send(id, "hi").catch((x: unknown) => x);
    assert.ok(e instanceof SendError);
    assert.ok(e instanceof ChatApiError, "still a ChatApiError: status, code, message, retryable");
    assert.deepEqual([e.status, e.code, e.retryable, e.conversationId], [503, "unavailable", true, id]);
    assert.match(e.clientMsgId, UUID);
    const sent = server.requests.filter((r) => r.method === "POST").map((r) => (r.body as { clientMsgId: string }).clientMsgId);
    assert.deepEqual(sent, [e.clientMsgId, e.clientMsgId]);
    assert.ok(e.cause instanceof ChatApiError);

    // Later, the app sends it again with the same id.
    const m = await client.send(id, "hi", { clientMsgId: e.clientMsgId });
    assert.equal(m.clientMsgId, e.clientMsgId);
    assert.deepEqual(await client.send(id, "hi", { clientMsgId: e.clientMsgId }), m, "and once more: a replay");
    assert.equal(server.conversations.get(id)!.messages.length, 1);

    // An explicit id is the one reported; so is it when the failure is not an API answer at all.
    const given = "0b9d3c1e-7a6f-4e2d-9c8b-1a2b3c4d5e6f";
    server.failNext({ respond: { status: 409, body: { error: { code: "conflict", message: "reused" } } } });
    const c = (await client.send(id, "x", { clientMsgId: given }).catch((x: unknown) => x)) as SendError;
    assert.deepEqual([c.status, c.code, c.clientMsgId], [409, "conflict", given]);
    const broken = setup({ token: () => Promise.reject(new Error("no token")) }, server).client;
    const n = (await broken.send(id, "x", { clientMsgId: given }).catch((x: unknown) => x)) as SendError;
    assert.ok(n instanceof SendError);
    assert.deepEqual([n.status, n.code, n.message, n.clientMsgId], [0, "client_error", "no token", given]);
  });

  it("gives up after the bound and does not retry client errors", async () => {
    const { server, client } = setup({ sendRetry: { maxAttempts: 3, baseDelayMs: 1 } });
    const id = server.createConversation(["alice", "bob"]);
    server.failNext(...Array.from({ length: 3 }, () => ({ respond: { status: 500 } })));
    const e = (await client.send(id, "hi").catch((x: unknown) => x)) as ChatApiError;
    assert.equal(e.status, 500);
    assert.equal(server.requests.filter((r) => r.method === "POST").length, 3);

    server.requests.length = 0;
    server.failNext({ respond: { status: 409, body: { error: { code: "conflict", message: "clientMsgId reused" } } } });
    const c = (await client.send(id, "hi").catch((x: unknown) => x)) as ChatApiError;
    assert.equal(c.code, "conflict");
    assert.equal(server.requests.length, 1);

    // A Retry-After beyond the time budget fails now instead of sleeping past it.
    const budget = setup({ sendRetry: { maxElapsedMs: 500 } }, server);
    server.failNext({ respond: { status: 429, headers: { "Retry-After": "60" } } });
    const t0 = Date.now();
    const t = (await budget.client.send(id, "hi").catch((x: unknown) => x)) as ChatApiError;
    assert.equal(t.status, 429);
    assert.equal(t.retryAfterMs, 60_000);
    assert.ok(Date.now() - t0 < 400);
  });
});

describe("message changes", () => {
  it("edit, delete, react, unreact, reactions and changes call their routes", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    const m = await client.send(id, "helo");
    const e = await client.edit(id, m.seq, "hello");
    const patch = server.requests.at(-1)!;
    assert.deepEqual([patch.method, patch.path], ["PATCH", `/conversations/${id}/messages/1`]);
    const { clientChangeId } = patch.body as { clientChangeId: string };
    assert.match(clientChangeId, UUID);
    assert.deepEqual(patch.body, { clientChangeId, body: "hello" });
    assert.deepEqual([e.body, e.version, typeof e.editedAt], ["hello", 2, "string"]);

    const r = await client.react(id, m.seq, "👍");
    const put = server.requests.at(-1)!;
    assert.deepEqual([put.method, put.path, put.body], ["PUT", `/conversations/${id}/messages/1/reactions/${encodeURIComponent("👍")}`, undefined]);
    assert.deepEqual(r, { conversationId: id, seq: 1, reactions: [{ reaction: "👍", count: 1 }] });
    assert.deepEqual(await client.reactions(id, m.seq, { reaction: "👍", limit: 10 }), { reactions: [{ userId: "alice", reaction: "👍" }], nextCursor: null });
    assert.equal(server.requests.at(-1)!.query.toString(), `reaction=${encodeURIComponent("👍")}&limit=10`);
    assert.deepEqual((await client.unreact(id, m.seq, "👍")).reactions, []);
    assert.equal(server.requests.at(-1)!.method, "DELETE");

    const t = await client.delete(id, m.seq);
    const del = server.requests.at(-1)!;
    assert.deepEqual([del.method, del.path], ["DELETE", `/conversations/${id}/messages/1`]);
    assert.match(del.query.get("clientChangeId")!, UUID);
    assert.notEqual(del.query.get("clientChangeId"), clientChangeId, "a fresh id per action");
    assert.deepEqual([t.deleted, t.body, t.reactions], [true, "", undefined]);

    const page = await client.changes(id, { afterChange: 1, limit: 2 });
    assert.equal(server.requests.at(-1)!.query.toString(), "afterChange=1&limit=2");
    assert.deepEqual(page.changes.map((c) => [c.changeSeq, c.type]), [[2, "reaction.added"], [3, "reaction.removed"]]);
    assert.deepEqual([page.lastChange, page.hasMore], [4, true]);
  });

  it("retries an edit or delete with the same clientChangeId; gives up with a ChangeError carrying it", async () => {
    const { server, client } = setup({ sendRetry: { maxAttempts: 3, baseDelayMs: 1 } });
    const id = server.createConversation(["alice", "bob"]);
    await client.send(id, "one");
    // The first attempt lands, but its answer is a 503: the retry is answered with its result.
    server.failNext({
      match: (r) => {
        if (r.method !== "PATCH") return false;
        server.change(id, 1, "message.edited", "alice", "two");
        server.conversations.get(id)!.byClientChangeId.set((r.body as { clientChangeId: string }).clientChangeId, { body: "two", message: server.conversations.get(id)!.messages[0]! });
        return true;
      },
      respond: { status: 503, body: { error: { code: "unavailable", message: "outcome unknown" } }, headers: { "Retry-After": "0.05" } },
    });
    const e = await client.edit(id, 1, "two");
    const patches = server.requests.filter((r) => r.method === "PATCH");
    assert.equal(patches.length, 2);
    assert.equal(new Set(patches.map((r) => (r.body as { clientChangeId: string }).clientChangeId)).size, 1);
    assert.deepEqual([e.version, server.conversations.get(id)!.changes.length], [2, 1], "edited once");

    server.failNext({ respond: "network" }, { respond: { status: 429 } }, { respond: { status: 500 } });
    const err = await client.delete(id, 1).catch((x: unknown) => x);
    assert.ok(err instanceof ChangeError && err instanceof ChatApiError);
    assert.deepEqual([err.status, err.conversationId, err.seq], [500, id, 1]);
    const ids = server.requests.filter((r) => r.method === "DELETE").map((r) => r.query.get("clientChangeId"));
    assert.deepEqual(ids, [err.clientChangeId, err.clientChangeId, err.clientChangeId]);
    const t = await client.delete(id, 1, { clientChangeId: err.clientChangeId });
    assert.equal(t.deleted, true);

    server.failNext({ respond: { status: 403, body: { error: { code: "forbidden", message: "not yours" } } } });
    const f = (await client.edit(id, 1, "x").catch((x: unknown) => x)) as ChangeError;
    assert.deepEqual([f.status, f.code], [403, "forbidden"]);
    assert.equal(server.requests.filter((r) => r.method === "PATCH").length, 3, "a 403 is not retried");
  });

  it("react and unreact of one reaction run in call order, retries included", async () => {
    const { server, client } = setup({ sendRetry: { baseDelayMs: 20 } });
    const id = server.createConversation(["alice", "bob"]);
    await client.send(id, "one");
    server.failNext({ match: (r) => r.method === "PUT", respond: { status: 503 } });
    const [a, b] = await Promise.all([client.react(id, 1, "👍"), client.unreact(id, 1, "👍")]);
    assert.deepEqual([a.reactions, b.reactions], [[{ reaction: "👍", count: 1 }], []]);
    assert.deepEqual(server.requests.filter((r) => r.path.includes("/reactions/")).map((r) => r.method), ["PUT", "PUT", "DELETE"]);
    assert.equal(server.conversations.get(id)!.messages[0]!.reactions, undefined, "the later unreact wins");
  });

  it("delivers each change once, in changeSeq order, after its message; fills a gap with afterChange", async () => {
    const { server, client, messages, changes } = setup();
    const id = server.createConversation(["alice", "bob"]);
    const m1 = server.addMessage(id, "bob");
    await client.getConversation(id); // lastSeq 1, lastChange 0
    await client.connect();
    const c1 = server.change(id, 1, "reaction.added", "bob", "👍")!;
    const c2 = server.change(id, 1, "message.edited", "bob", "edited")!;
    const c3 = server.change(id, 1, "reaction.added", "carol", "👍")!;
    for (const c of [c1, c1, c3]) server.push("alice", server.changeEvent(id, c)); // c2 lost
    await until("three changes", () => changes.length === 3);
    assert.deepEqual(changes.map((c) => c.changeSeq), [1, 2, 3]);
    assert.deepEqual(server.changeRequests(id).map((r) => r.query.get("afterChange")), ["1"]);
    assert.deepEqual(changes[1]!.message, c2.message);
    assert.equal(changes[1]!.conversationId, id);
    // Applied in order to the message the app holds, the result is the server's message.
    assert.deepEqual(changes.reduce(applyChange, m1), server.conversations.get(id)!.messages[0]);
    server.push("alice", server.changeEvent(id, c2));
    await sleep(30);
    assert.equal(changes.length, 3, "a late repeat is dropped");

    // A change of a message not delivered yet waits for it; the light form is fetched.
    server.lightChanges = true;
    const m2 = server.addMessage(id, "bob");
    const c4 = server.change(id, 2, "message.deleted", "bob")!;
    server.push("alice", server.changeEvent(id, c4));
    await until("message 2 and change 4", () => changes.length === 4);
    assert.deepEqual(messages.map((m) => [m.seq, m.deleted]), [[2, true]], "message 2 comes as it is now: deleted");
    assert.equal(m2.deleted, undefined);
    assert.deepEqual(changes[3]!.message, messages[0]);
  });

  it("catches up changes after a reconnect, from the last delivered changeSeq", async () => {
    const { server, client, changes } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.addMessage(id, "bob");
    server.change(id, 1, "reaction.added", "bob", "👍");
    await client.inbox(); // lastChange 1: changes after it are news
    await client.connect();
    server.autoPush = true;
    server.change(id, 1, "reaction.added", "carol", "👍");
    await until("change 2", () => changes.length === 1);
    server.autoPush = false;
    server.openSockets("alice")[0]!.drop();
    server.change(id, 1, "message.edited", "bob", "while away");
    server.change(id, 1, "reaction.removed", "bob", "👍");
    await until("open again, caught up", () => client.connectionState === "open" && changes.length === 3);
    assert.deepEqual(changes.map((c) => c.changeSeq), [2, 3, 4]);
    assert.deepEqual(server.changeRequests(id).map((r) => r.query.get("afterChange")), ["2"]);
    assert.equal(server.historyRequests(id).length, 0, "no message was missing");
    assert.deepEqual(changes.at(-1)!.message, server.conversations.get(id)!.messages[0]);
  });
});

describe("markRead", () => {
  it("sends one request per conversation per window, with the highest seq", async () => {
    const { server, client } = setup({ readDebounceMs: 250 });
    const a = server.createConversation(["alice", "bob"]);
    const b = server.createConversation(["alice", "bob"]);
    for (let i = 1; i <= 9; i++) server.addMessage(a, "bob");
    server.addMessage(b, "bob");
    client.markRead(a, 3);
    client.markRead(a, 7);
    client.markRead(a, 5);
    client.markRead(b, 1);
    const reads = () => server.requests.filter((r) => r.path.endsWith("/read"));
    await sleep(50);
    assert.equal(reads().length, 0, "nothing before the window ends");
    await until("two read requests", () => reads().length === 2);
    await sleep(300);
    assert.deepEqual(reads().map((r) => [r.path.split("/")[2], r.body]).sort(), [[a, { seq: 7 }], [b, { seq: 1 }]]);

    // At or below what the server confirmed: no request at all.
    client.markRead(a, 6);
    client.markRead(a, 7);
    await sleep(300);
    assert.equal(reads().length, 2);

    client.markRead(a, 9);
    await client.flushReads();
    assert.equal(reads().length, 3);
    assert.deepEqual(reads()[2]!.body, { seq: 9 });
    await sleep(300);
    assert.equal(reads().length, 3, "flushed marks are not sent again");
  });

  it("retries a failed mark in a later window and reports the failure", async () => {
    const { server, client, errors } = setup();
    const a = server.createConversation(["alice", "bob"]);
    server.addMessage(a, "bob");
    server.failNext({ match: (r) => r.path.endsWith("/read"), respond: { status: 503 } });
    client.markRead(a, 1);
    await until("the retry", () => server.requests.filter((r) => r.path.endsWith("/read")).length === 2);
    await until("the error event", () => errors.length === 1);
    assert.equal((errors[0] as ChatApiError).status, 503);
    assert.equal(server.conversations.get(a)!.reads.get("alice"), 1);
  });
});

describe("no echo to the sending socket", () => {
  it("names its socket on sends and reads once its hello frame came, and a new socket only once it said which", async () => {
    const { server, client } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.addMessage(id, "bob");
    await client.connect();
    const socket = server.sockets.at(-1)!;
    assert.deepEqual(JSON.parse(socket.sent[0]!), { action: "hello" });
    await client.send(id, "before its answer");
    socket.deliver(JSON.stringify({ type: "hello", connectionId: "c1=", userId: "alice" }));
    await client.send(id, "after");
    client.markRead(id, 3);
    await client.flushReads();
    const named = (suffix: string) =>
      server.requests.filter((r) => r.method === "POST" && r.path.endsWith(suffix)).map((r) => r.headers["X-Connection-Id"]);
    assert.deepEqual(named("/messages"), [undefined, "c1="]);
    assert.deepEqual(named("/read"), ["c1="]);

    // A new socket is named only once it said which it is.
    socket.drop();
    await until("a new socket", () => server.sockets.length === 2 && server.sockets[1]!.readyState === 1);
    assert.deepEqual(JSON.parse(server.sockets[1]!.sent[0]!), { action: "hello" });
    await client.send(id, "on the new socket");
    assert.equal(named("/messages").at(-1), undefined);
    server.sockets[1]!.deliver(JSON.stringify({ type: "hello", connectionId: "c2=", userId: "alice" }));
    await client.send(id, "named again");
    assert.equal(named("/messages").at(-1), "c2=");
  });
});

describe("live delivery", () => {
  it("reports the connection's states and resolves connect() once open", async () => {
    const { client, states } = setup();
    const p = client.connect();
    assert.equal(client.connectionState, "connecting");
    await p;
    assert.deepEqual(states, ["connecting", "open"]);
    client.close();
    assert.deepEqual(states, ["connecting", "open", "closed"]);
    const other = setup().client;
    const pending = other.connect();
    other.close();
    await assert.rejects(pending, /closed before the connection opened/);
  });

  it("delivers each message once, in order, without fetching when a reorder heals itself", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 50 });
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    const [m1, m2, m3] = [1, 2, 3].map(() => server.addMessage(id, "bob"));
    for (const m of [m1, m1, m3, m2, m3, m1]) server.push("alice", { type: "message.new", ...m });
    await until("three messages", () => messages.length === 3);
    await sleep(80);
    assert.deepEqual(seqs(messages), [1, 2, 3]);
    assert.deepEqual(messages[1], m2);
    assert.equal(server.historyRequests().length, 0);
  });

  it("fills a gap with afterSeq", async () => {
    const { server, client, messages } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    const ms = [1, 2, 3, 4].map(() => server.addMessage(id, "bob"));
    server.push("alice", { type: "message.new", ...ms[0]! });
    server.push("alice", { type: "message.new", ...ms[2]! }); // 2 lost
    // Seq 3 while holding 1: one fetch afterSeq=1 brings 2, 3 and (already stored) 4.
    await until("four messages", () => messages.length === 4);
    assert.deepEqual(messages, ms);
    assert.deepEqual(server.historyRequests().map((r) => r.query.get("afterSeq")), ["1"]);
    server.push("alice", { type: "message.new", ...ms[3]! });
    await sleep(30);
    assert.deepEqual(seqs(messages), [1, 2, 3, 4], "the late push of 4 is a repeat");
  });

  it("fetches the content of light payloads, one request for a burst", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 30 });
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    const ms = [1, 2, 3].map(() => server.addMessage(id, "bob"));
    for (const m of ms) server.push("alice", { type: "message.new", conversationId: id, seq: m.seq });
    await until("three messages", () => messages.length === 3);
    assert.deepEqual(messages, ms, "full objects, with body");
    assert.equal(server.historyRequests().length, 1);
    assert.equal(server.historyRequests()[0]!.query.get("afterSeq"), "0");
  });

  it("starts a conversation first seen through a light push at the user's lastReadSeq: a coalesced burst all comes", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 30 });
    const id = server.createConversation(["alice", "bob"]);
    await client.connect();
    // Sent in quick succession, pushed as one light message.new carrying the highest seq.
    const ms = [1, 2, 3].map(() => server.addMessage(id, "bob"));
    server.push("alice", { type: "message.new", conversationId: id, seq: 3 });
    await until("three messages", () => messages.length === 3);
    assert.deepEqual(messages, ms, "from the first unread, not from the push");
    assert.equal(server.historyRequests()[0]!.query.get("afterSeq"), "0");
    // Once started, the conversation goes on as any other.
    const next = server.addMessage(id, "bob");
    server.push("alice", { type: "message.new", conversationId: id, seq: next.seq });
    await until("the fourth", () => messages.length === 4);
    assert.deepEqual(messages.at(-1), next);
  });

  it("starts a conversation first seen through a full push at the user's lastReadSeq: a first push lost or overtaken still comes", async () => {
    for (const order of [[2, 3, 1], [3, 2]]) {
      const { server, client, messages } = setup({ gapFillDelayMs: 30 });
      const id = server.createConversation(["alice", "bob"]);
      await client.connect();
      const ms = [1, 2, 3].map(() => server.addMessage(id, "bob"));
      for (const seq of order) server.push("alice", { type: "message.new", ...ms[seq - 1]! });
      await until("three messages", () => messages.length === 3);
      await sleep(50);
      assert.deepEqual(messages, ms, `pushed ${order}: from the first unread, each once`);
      client.close();
    }
  });

  it("a conversation first seen through a push of the user's own message (another device) delivers that message", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 30 });
    const id = server.createConversation(["alice", "bob"]);
    await client.connect();
    server.addMessage(id, "bob");
    const own = server.addMessage(id, "alice"); // sending marks it read: lastReadSeq 2
    server.push("alice", { type: "message.new", ...own });
    await until("the own message", () => messages.length === 1);
    await sleep(50);
    assert.deepEqual(messages, [own], "not the read one before it");
  });

  it("while the inbox trails, a first sight through a push starts at the watermark of the read states", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 30 });
    const id = server.createConversation(["alice", "bob"]);
    await client.connect();
    server.push("alice", { type: "hello", connectionId: "c-1", userId: "alice" });
    const ms = [1, 2].map(() => server.addMessage(id, "bob"));
    const empty = { conversations: [], nextCursor: null };
    server.failNext({ match: (r) => r.path === "/inbox", respond: { status: 200, body: empty } });
    server.push("alice", { type: "message.new", ...ms[1]! });
    await until("two messages", () => messages.length === 2);
    assert.deepEqual(messages, ms);
    assert.ok(server.requests.some((r) => r.path === `/conversations/${id}/reads`));
  });

  it("passes a server error frame on as an error event", async () => {
    const { server, client, errors } = setup();
    await client.connect();
    const refusal = { code: "invalid_request", message: "field `state` must be start or stop" };
    server.push("alice", { type: "error", error: refusal });
    await until("the error", () => errors.length === 1);
    assert.ok(errors[0] instanceof ChatApiError);
    assert.deepEqual([errors[0].status, errors[0].code, errors[0].message], [400, refusal.code, refusal.message]);
  });

  it("with lightFetch watched, fetches light payloads only for a watched conversation, a burst in one request", async () => {
    const { server, client, messages } = setup({ gapFillDelayMs: 30, lightFetch: "watched" });
    const id = server.createConversation(["alice", "bob"]);
    const other = server.createConversation(["alice", "carol"]);
    await client.getConversation(id);
    await client.getConversation(other);
    await client.connect();
    const light = (c: string, seq: number) => server.push("alice", { type: "message.new", conversationId: c, seq });
    const ms = [1, 2].map(() => server.addMessage(id, "bob"));
    for (const m of ms) light(id, m.seq);
    await sleep(80);
    assert.equal(server.historyRequests().length, 0, "not on screen: nothing fetched");
    assert.deepEqual(messages, []);

    client.watch(id);
    await until("the two messages", () => messages.length === 2);
    assert.deepEqual(messages, ms, "fetched once watched, in order");
    assert.equal(server.historyRequests().length, 1);

    // On screen: a burst of light payloads is one request.
    const burst = [3, 4, 5].map(() => server.addMessage(id, "bob"));
    for (const m of burst) light(id, m.seq);
    await until("the burst", () => messages.length === 5);
    assert.equal(server.historyRequests().length, 2);

    // Another conversation with full pushes is delivered as before; a light one elsewhere waits.
    const full = server.addMessage(other, "carol");
    server.push("alice", { type: "message.new", ...full });
    await until("the full push", () => messages.length === 6);
    client.unwatch(id);
    light(id, server.addMessage(id, "bob").seq);
    await sleep(80);
    assert.equal(server.historyRequests().length, 2, "unwatched again: no fetch");
  });

  it("delivers the sender's own message once, whether the answer or the push comes first", async () => {
    const { server, client, messages } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    const m = await client.send(id, "mine");
    server.push("alice", { type: "message.new", ...m });
    await sleep(30);
    assert.deepEqual(messages, [m]);
  });

  it("passes read receipts on once per watermark move, and membership events as they come", async () => {
    const { server, client, reads } = setup();
    const id = server.createConversation(["alice", "bob"]);
    server.addMessage(id, "alice");
    server.addMessage(id, "alice");
    await client.readStates(id); // bob: 0
    await client.connect();
    const members: unknown[] = [];
    client.on("members", (e) => members.push(e));
    const r = (n: number) => ({ type: "read.updated", conversationId: id, userId: "bob", lastReadSeq: n });
    for (const e of [r(1), r(1), r(0), r(2), r(1)]) server.push("alice", e);
    server.push("alice", { type: "member.added", conversationId: id, userIds: ["carol"] });
    server.push("alice", "not json at all");
    await until("receipts", () => reads.length === 2 && members.length === 1);
    assert.deepEqual(reads.map((e) => e.lastReadSeq), [1, 2]);
    assert.deepEqual(members, [{ type: "member.added", conversationId: id, userIds: ["carol"] }]);
  });

  it("after a reconnect, fetches the read states of watched conversations again: receipts missed while down come out", async () => {
    const { server, client, reads } = setup();
    const id = server.createConversation(["alice", "bob"]);
    const elsewhere = server.createConversation(["alice", "carol"]);
    for (const c of [id, elsewhere]) {
      server.addMessage(c, "alice");
      server.addMessage(c, "alice");
      await client.readStates(c); // the peer: 0
    }
    const notLoaded = server.createConversation(["alice", "dave"]);
    client.watch(id);
    client.watch(notLoaded);
    await client.connect();
    const readsFetched = (c: string) =>
      server.requests.filter((r) => r.method === "GET" && r.path.endsWith(`/${c}/reads`)).length;
    assert.equal(readsFetched(id), 2, "loaded by the app, then again as the socket opened (after the load)");

    server.openSockets("alice")[0]!.drop();
    server.refuseConnections = true;
    await until("a failed reconnect", () => server.sockets.length >= 2);
    // Both peers read while alice's socket is down: no push reaches her.
    server.conversations.get(id)!.reads.set("bob", 2);
    server.conversations.get(elsewhere)!.reads.set("carol", 2);
    server.refuseConnections = false;

    await until("bob's receipt", () => reads.length === 1);
    await sleep(50);
    assert.deepEqual(reads, [{ type: "read.updated", conversationId: id, userId: "bob", lastReadSeq: 2 }]);
    assert.equal(readsFetched(id), 3, "and once after the reconnect");
    assert.equal(readsFetched(elsewhere), 1, "not on screen: not fetched again");
    assert.equal(readsFetched(notLoaded), 0, "on screen but never loaded: nothing to refresh");

    // A receipt pushed live afterwards that says nothing new is dropped as before.
    server.push("alice", { type: "read.updated", conversationId: id, userId: "bob", lastReadSeq: 2 });
    await sleep(30);
    assert.equal(reads.length, 1);
  });

  it("reconnects with backoff and catches up: missed messages once, in order, before newer live ones", async () => {
    const { server, client, messages, states } = setup();
    const id = server.createConversation(["alice", "bob"]);
    // Enough other conversations that the catch-up has to walk to the inbox's second page.
    for (let i = 0; i < 120; i++) server.createConversation(["alice", `u${i}`]);
    const other = server.createConversation(["alice", "carol"]);
    await client.inbox({ limit: 100 });
    await client.getConversation(id);
    await client.connect();
    server.autoPush = true;
    server.addMessage(id, "bob");
    await until("first message", () => messages.length === 1);

    server.autoPush = false;
    server.openSockets("alice")[0]!.drop();
    server.refuseConnections = true;
    await until("a few failed reconnects", () => server.sockets.length >= 4);
    for (let i = 0; i < 5; i++) server.addMessage(id, "bob"); // 2..6, pushed to no one
    server.addMessage(other, "carol");
    // The next connection's first frame (seq 7) comes while the catch-up is still fetching.
    const live = server.addMessage(id, "bob");
    let pushedEarly = false;
    const origFetch = server.fetch;
    (client as unknown as { fetch: typeof fetch }).fetch = async (input, init) => {
      if (!pushedEarly && String(input).includes("/messages")) {
        pushedEarly = true;
        server.push("alice", { type: "message.new", ...live });
      }
      return origFetch(input, init);
    };
    server.refuseConnections = false;
    await until("all seven plus the other conversation's", () => messages.length === 8);
    await sleep(50);
    assert.ok(pushedEarly);
    const inConv = messages.filter((m) => m.conversationId === id);
    assert.deepEqual(seqs(inConv), [1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(messages.filter((m) => m.conversationId === other).map((m) => m.body), ["message from carol"]);
    assert.equal(states.at(-1), "open");
    assert.deepEqual(states.slice(0, 4), ["connecting", "open", "closed", "connecting"]);
    const inboxWalk = server.requests.filter((r) => r.path === "/inbox").slice(1);
    assert.ok(inboxWalk.some((r) => r.query.get("cursor") === "100"), "walked to the inbox's second page");
    // Only the catch-up fetched the conversation's history: the held live event caused no fetch of its own.
    assert.deepEqual(server.historyRequests(id).map((r) => r.query.get("afterSeq")), ["1"]);
  });

  it("a second look at the inbox catches what a trailing inbox index missed", async () => {
    const { server, client, messages } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    server.openSockets()[0]!.drop();
    server.addMessage(id, "bob"); // committed, but the inbox's index has not caught up yet
    const stale = { conversations: [{ conversationId: id, type: "group", memberCount: 2, lastSeq: 0, lastReadSeq: 0, unreadCount: 0, lastMessageAt: null, lastMessage: null }], nextCursor: null };
    server.failNext({ match: (r) => r.path === "/inbox", respond: { status: 200, body: stale } });
    await until("open again", () => client.connectionState === "open");
    assert.equal(messages.length, 0, "the catch-up saw the stale inbox");
    await until("the message, after the re-check", () => messages.length === 1, 4000);
    assert.equal(messages[0]!.seq, 1);
  });

  it("catches up on a conversation that is new to it and ranks above one it holds: every unread message comes", async () => {
    const { server, client, messages } = setup();
    const old = server.createConversation(["alice", "dave"]);
    server.addMessage(old, "dave"); // unread, never listed by the app: below every held one
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    server.addMessage(id, "bob");
    await client.connect();
    await until("the held conversation's message", () => messages.length === 1);
    server.openSockets()[0]!.drop();
    server.refuseConnections = true;
    await until("a failed reconnect", () => server.sockets.length >= 2);
    const group = server.createConversation(["carol", "alice"]); // added while away
    const news = [1, 2].map(() => server.addMessage(group, "carol"));
    server.refuseConnections = false;
    await until("the new group's messages", () => messages.length === 3);
    await sleep(50);
    assert.deepEqual(messages.slice(1), news);
    assert.equal(server.historyRequests(old).length, 0, "an old conversation below the held ones waits for the app");
  });

  it("forgets a conversation it was removed from instead of failing the catch-up", async () => {
    const { server, client, states, errors } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    server.openSockets()[0]!.drop();
    server.addMessage(id, "bob");
    // The inbox still lists it (its index trails), but the conversation answers 404.
    server.failNext({ match: (r) => r.path.endsWith("/messages"), respond: { status: 404, body: { error: { code: "not_found", message: "conversation not found" } } } });
    await until("open again", () => states.filter((s) => s === "open").length === 2);
    assert.deepEqual(errors, [], "no failed catch-up, no reconnect loop");
    assert.equal(states.length, 5);
  });

  it("spreads reconnects: jittered delays that double up to the cap", async () => {
    const { server, client } = setup({ reconnect: { baseDelayMs: 20, maxDelayMs: 80 } });
    await client.connect();
    server.refuseConnections = true;
    const t0 = Date.now();
    server.openSockets()[0]!.drop();
    await until("six attempts", () => server.sockets.length >= 7, 5000);
    const elapsed = Date.now() - t0;
    // Ceilings 20, 40, 80, 80, 80, 80 ms, each waited between half and all of it: 190..380 ms.
    assert.ok(elapsed >= 180 && elapsed < 2000, `six reconnects took ${elapsed} ms`);
  });

  it("a failed inbox walk does not keep the connection from opening: it is reported and retried, and the catch-up completes", async () => {
    const { server, client, messages, states, errors } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    server.addMessage(id, "bob");
    server.failNext(...[1, 2].map(() => ({ match: (r: { path: string }) => r.path === "/inbox", respond: { status: 500 } })));
    server.openSockets()[0]!.drop();
    await until("open again", () => states.filter((s) => s === "open").length === 2);
    await until("caught up by the retried walk", () => messages.length === 1);
    assert.deepEqual(states, ["connecting", "open", "closed", "connecting", "open"], "no close and reopen in between");
    assert.equal(server.sockets.length, 2);
    assert.equal(errors.length, 2);
    for (const [i, e] of errors.entries()) {
      assert.ok(e instanceof SyncError);
      assert.deepEqual([e.conversationId, e.attempt, (e.cause as ChatApiError).status], [null, i + 1, 500]);
    }
  });

  it("one conversation whose catch-up keeps failing holds up neither the connection nor the others; its messages come once, in order, when it heals", async () => {
    const { server, client, messages, states, errors } = setup();
    const bad = server.createConversation(["alice", "bob"]);
    const good = server.createConversation(["alice", "carol"]);
    await client.getConversation(bad);
    await client.getConversation(good);
    await client.connect();
    server.openSockets()[0]!.drop();
    for (const c of [bad, good]) for (let i = 0; i < 2; i++) server.addMessage(c, "bob");
    const badHistory = (r: { method: string; path: string }) => r.method === "GET" && r.path === `/conversations/${bad}/messages`;
    let failing = true;
    server.failNext(...Array.from({ length: 1000 }, () => ({ match: (r: { method: string; path: string }) => failing && badHistory(r), respond: { status: 500 } })));
    await until("open again", () => states.at(-1) === "open");
    const of = (c: string) => seqs(messages.filter((m) => m.conversationId === c));
    assert.deepEqual(of(good), [1, 2], "the other conversation caught up");

    // Live pushes: the good conversation's are delivered at once; the bad one's wait for its gap.
    const [b3, g3] = [server.addMessage(bad, "bob"), server.addMessage(good, "carol")];
    for (const e of [b3, g3, b3]) server.push("alice", { type: "message.new", ...e });
    await until("the good conversation's live message", () => of(good).length === 3);
    await until("a few retries", () => errors.length >= 4);
    assert.deepEqual(of(bad), [], "nothing of the failing conversation before its gap is filled");
    assert.equal(client.connectionState, "open");
    assert.equal(server.sockets.length, 2, "no reconnect");

    failing = false;
    await until("healed", () => of(bad).length === 3);
    await sleep(50);
    assert.deepEqual(of(bad), [1, 2, 3]);
    assert.deepEqual(of(good), [1, 2, 3]);
    assert.deepEqual(messages.filter((m) => m.conversationId === bad), server.conversations.get(bad)!.messages);
    assert.deepEqual(states, ["connecting", "open", "closed", "connecting", "open"]);
    // Reported, per conversation, with backoff between the attempts (ceilings 10, 20, 40, 40 … ms).
    for (const [i, e] of errors.entries()) {
      assert.ok(e instanceof SyncError);
      assert.deepEqual([e.conversationId, e.attempt], [bad, i + 1]);
    }
    const times = server.historyRequests(bad).map((r) => r.at);
    const waits = times.slice(1).map((t, i) => t - times[i]!);
    assert.ok(waits.length >= 4 && waits.length < 60, `${waits.length} retries`);
    assert.ok(waits.slice(2).every((w) => w >= 18), `waits ${waits.join(", ")} ms`);
  });

  it("a gap fill that keeps failing while connected is retried until it heals, not given up", async () => {
    const { server, client, messages, errors } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    const ms = [1, 2, 3].map(() => server.addMessage(id, "bob"));
    server.failNext(...Array.from({ length: 6 }, () => ({ match: (r: { method: string; path: string }) => r.method === "GET" && r.path.endsWith("/messages"), respond: "network" as const })));
    server.push("alice", { type: "message.new", ...ms[0]! });
    server.push("alice", { type: "message.new", ...ms[2]! }); // 2 lost
    await until("all three", () => messages.length === 3, 5000);
    assert.deepEqual(messages, ms);
    assert.equal(errors.length, 6);
    assert.ok(errors.every((e) => e instanceof SyncError && e.conversationId === id));
    assert.equal(server.sockets.length, 1);
  });

  it("the catch-up's retries wait for Retry-After plus jitter", async (t) => {
    t.mock.method(Math, "random", () => 0.5);
    const { server, client, messages, errors } = setup();
    const id = server.createConversation(["alice", "bob"]);
    await client.getConversation(id);
    await client.connect();
    server.addMessage(id, "bob");
    server.failNext({ match: (r) => r.path === "/inbox", respond: { status: 429, body: { error: { code: "throttled", message: "busy" } }, headers: { "Retry-After": "0.3" } } });
    server.openSockets()[0]!.drop();
    await until("caught up", () => messages.length === 1, 4000);
    const walks = server.requests.filter((r) => r.path === "/inbox");
    const waited = walks.at(-1)!.at - walks.at(-2)!.at;
    // 300 ms + 0.5 × max(150 ms, 1 s).
    assert.ok(waited >= 790 && waited < 1500, `retried the walk after ${waited} ms`);
    assert.equal((errors[0] as SyncError).retryInMs, 800);
  });

  it("a connection that drops right after opening backs off; the backoff starts over only after resetAfterMs open", async () => {
    const { server, client } = setup({ reconnect: { baseDelayMs: 10, maxDelayMs: 160, resetAfterMs: 300 } });
    // The first five connections drop as soon as they are open (and caught up); the sixth stays.
    client.on("connection", (s) => {
      if (s === "open" && server.sockets.length <= 5) setTimeout(() => server.openSockets()[0]?.drop(), 0);
    });
    await client.connect();
    await until("the sixth connection open", () => server.sockets.length === 6 && client.connectionState === "open", 5000);
    const made = server.sockets.map((s) => s.createdAt);
    const waits = made.slice(1).map((t, i) => t - made[i]!);
    // Ceilings 10, 20, 40, 80, 160 ms, each waited between half and all of it.
    assert.ok(waits[3]! >= 40 && waits[4]! >= 80, `waits between connections: ${waits.join(", ")} ms`);

    await sleep(350); // open longer than resetAfterMs: healthy
    assert.equal(server.sockets.length, 6);
    const dropped = Date.now();
    server.openSockets()[0]!.drop();
    await until("reconnected", () => server.sockets.length === 7);
    const again = server.sockets.at(-1)!.createdAt - dropped;
    assert.ok(again < 60, `after a healthy connection, the first reconnect waits at most the base delay (took ${again} ms)`);
  });
});

describe("typing and presence", () => {
  it("sends one start per 2.5 s however often typing() is called, and stop at once", async () => {
    const { server, client } = setup();
    await client.connect();
    const socket = server.openSockets("alice")[0]!;
    for (let i = 0; i < 5; i++) client.typing("g-1");
    client.stopTyping("g-1");
    client.stopTyping("g-1");
    assert.deepEqual(
      socket.sent.filter((f) => f.includes("typing")).map((f) => JSON.parse(f)),
      [
        { action: "typing", conversationId: "g-1", state: "start" },
        { action: "typing", conversationId: "g-1", state: "stop" },
      ],
    );
  });

  it("holds a start that follows a stop until the server's 2 s throttle lets it through", async () => {
    const { server, client } = setup();
    await client.connect();
    const socket = server.openSockets("alice")[0]!;
    const frames = () => socket.sent.filter((f) => f.includes("typing")).map((f) => JSON.parse(f).state);
    client.typing("g-1");
    client.stopTyping("g-1");
    client.typing("g-1");
    assert.deepEqual(frames(), ["start", "stop"], "the server would ignore a start now");
    await until("the held start", () => frames().length === 3, 4000);
    assert.deepEqual(frames(), ["start", "stop", "start"]);
    client.stopTyping("g-1");
    client.typing("g-1");
    client.stopTyping("g-1");
    await new Promise((r) => setTimeout(r, 2700));
    assert.deepEqual(frames(), ["start", "stop", "start", "stop"], "a stop drops the held start");
  });

  it("holds who types per conversation and clears it by itself 6 s after the last frame", async () => {
    const { server, client } = setup();
    const seen: unknown[] = [];
    client.on("typing", (t) => seen.push(t));
    await client.connect();
    server.push("alice", { type: "typing", conversationId: "g-1", typing: ["bob"], count: 1 });
    await until("a typing event", () => seen.length === 1);
    assert.deepEqual(seen[0], { type: "typing", conversationId: "g-1", typing: ["bob"], count: 1 });
    // The server's empty set, had it been lost, is stood in for by the SDK's own expiry.
    await until("cleared", () => seen.length === 2, 7000);
    assert.deepEqual(seen[1], { type: "typing", conversationId: "g-1", typing: [], count: 0 });
  });

  it("hands presence pushes to the app", async () => {
    const { server, client } = setup();
    const seen: unknown[] = [];
    client.on("presence", (p) => seen.push(p));
    await client.connect();
    const event = { type: "presence", userId: "bob", online: false, lastActiveAt: "2026-12-03T10:00:00Z" };
    server.push("alice", event);
    await until("a presence event", () => seen.length === 1);
    assert.deepEqual(seen[0], event);
  });

  it("asks for presence and sets its visibility", async () => {
    const requests: { method: string; url: string; body: unknown }[] = [];
    const fetch = (async (url: string, init: RequestInit) => {
      requests.push({ method: init.method ?? "GET", url, body: JSON.parse(String(init.body)) });
      const body = url.endsWith("/presence") && init.method === "POST"
        ? { presence: [{ userId: "bob", online: true, lastActiveAt: null }] }
        : { visible: false };
      return new Response(JSON.stringify(body), { status: 200, headers: { "content-type": "application/json" } });
    }) as typeof globalThis.fetch;
    const { client } = setup({ fetch });
    assert.deepEqual(await presence.presence(client, ["bob"]), [{ userId: "bob", online: true, lastActiveAt: null }]);
    await presence.setPresenceVisible(client, false);
    assert.deepEqual(
      requests.map((r) => [r.method, r.url, r.body]),
      [
        ["POST", "http://api.test/presence", { userIds: ["bob"] }],
        ["PUT", "http://api.test/me/presence", { visible: false }],
      ],
    );
  });
});
