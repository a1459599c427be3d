// The SDK against the running local stack (infra/run-local.sh; CHAT_API_URL / CHAT_WS_URL to point
// elsewhere): every method, and the live guarantees of issue 10 end to end: a burst of 100 concurrent
// sends reaches a connected client as exactly 1..100 in order; a client offline during 50 messages has
// all 50, once each, after reconnecting.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import WebSocket from "ws";
import {
  applyChange,
  ChatApiError,
  ChatClient,
  type ChatEvents,
  type Message,
  type MessageChange,
  type WebSocketConstructor,
} from "../../src/index.js";
import { getAttachment, uploadAttachment } from "../../src/attachments.js";
import { clientFor, eventually, mintToken, newUser, requireStack, sleep, waitFor, WS_URL } from "../helpers/stack.js";

const open: ChatClient[] = [];
function client(user: string, options: Parameters<typeof clientFor>[1] = {}): ChatClient {
  const c = clientFor(user, options);
  open.push(c);
  return c;
}

/** Collects the "message" (or "change") events of a client, per conversation. */
function collect<K extends "message" | "change" = "message">(c: ChatClient, event: K = "message" as K): Map<string, ChatEvents[K][]> {
  const got = new Map<string, ChatEvents[K][]>();
  c.on(event, (e) => {
    if (!got.has(e.conversationId)) got.set(e.conversationId, []);
    got.get(e.conversationId)!.push(e);
  });
  return got;
}

/**
 * A WebSocket class whose current socket the test can cut; while `offline`, new ones fail to
 * connect, as with no network.
 */
function unpluggable(): { WebSocket: WebSocketConstructor; cut(): void; plug(): void } {
  let offline = false;
  let current: WebSocket | undefined;
  class Unpluggable extends WebSocket {
    constructor(url: string) {
      super(offline ? "ws://127.0.0.1:9/" : url);
      current = this;
    }
  }
  return {
    WebSocket: Unpluggable as unknown as WebSocketConstructor,
    cut: () => {
      offline = true;
      current!.terminate();
    },
    plug: () => {
      offline = false;
    },
  };
}

/** The messages a client was handed, with the changes it was handed applied (applyChange). */
function held(messages: Message[] | undefined, changes: MessageChange[] | undefined): Message[] {
  return (messages ?? []).map((m) => (changes ?? []).filter((c) => c.seq === m.seq).reduce(applyChange, m));
}

const changeSeqs = (cs: { changeSeq: number }[] | undefined) => (cs ?? []).map((c) => c.changeSeq);
const seqs = (ms: Message[] | undefined) => (ms ?? []).map((m) => m.seq);
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

async function apiError(p: Promise<unknown>): Promise<ChatApiError> {
  const e = await p.then(
    () => assert.fail("expected a ChatApiError"),
    (x: unknown) => x,
  );
  assert.ok(e instanceof ChatApiError, `expected a ChatApiError, got ${String(e)}`);
  return e;
}

before(requireStack);
after(() => {
  for (const c of open) c.close();
});

describe("REST methods", () => {
  it("conversations: openDirect, createGroup, getConversation, addMembers, removeMember", async () => {
    const [alice, bob, carol, dave] = ["alice", "bob", "carol", "dave"].map(newUser) as [string, string, string, string];
    const a = client(alice);
    const b = client(bob);

    const direct = await a.openDirect(bob);
    assert.equal(direct.type, "direct");
    assert.deepEqual([...direct.memberIds].sort(), [alice, bob].sort());
    assert.equal(direct.memberCount, 2);
    assert.equal(direct.lastSeq, 0);
    assert.equal(direct.lastMessageAt, null);
    assert.equal((await b.openDirect(alice)).conversationId, direct.conversationId, "one direct conversation per pair");
    const self = await apiError(a.openDirect(alice));
    assert.deepEqual([self.status, self.code], [400, "invalid_request"]);

    const requestId = crypto.randomUUID();
    const group = await a.createGroup({ title: "Team 🚀", memberIds: [bob, carol], clientRequestId: requestId });
    assert.equal(group.type, "group");
    assert.equal(group.title, "Team 🚀");
    assert.deepEqual([...group.memberIds].sort(), [alice, bob, carol].sort());
    const again = await a.createGroup({ title: "Team 🚀", memberIds: [bob, carol], clientRequestId: requestId });
    assert.equal(again.conversationId, group.conversationId, "same clientRequestId, same group");

    assert.deepEqual(await b.getConversation(group.conversationId), group);
    const added = await b.addMembers(group.conversationId, [dave]);
    assert.equal(added.memberCount, 4);
    assert.ok(added.memberIds.includes(dave));

    const notOwner = await apiError(b.removeMember(group.conversationId, carol));
    assert.deepEqual([notOwner.status, notOwner.code], [403, "forbidden"]);
    await a.removeMember(group.conversationId, carol); // the owner removes anyone
    await client(dave).removeMember(group.conversationId, dave); // anyone removes itself
    const now = await a.getConversation(group.conversationId);
    assert.deepEqual([...now.memberIds].sort(), [alice, bob].sort());
    const gone = await apiError(client(carol).getConversation(group.conversationId));
    assert.deepEqual([gone.status, gone.code], [404, "not_found"], "a non-member learns nothing");

    const onDirect = await apiError(a.addMembers(direct.conversationId, [carol]));
    assert.deepEqual([onDirect.status, onDirect.code], [409, "conflict"]);
  });

  it("attachments: uploadAttachment, send, getAttachment's bytes; a stranger's 404", async () => {
    const [alice, bob, eve] = [newUser("alice"), newUser("bob"), newUser("eve")];
    const a = client(alice);
    const { conversationId: id } = await a.openDirect(bob);
    const bytes = new TextEncoder().encode("a file's bytes, é");
    const attachmentId = await uploadAttachment(a, id, bytes, { fileName: "notes.txt", contentType: "text/plain" });
    const sent = await a.send(id, "", { attachments: [attachmentId] });
    assert.equal(sent.attachments?.[0]?.attachmentId, attachmentId);
    const file = await getAttachment(client(bob), id, attachmentId);
    assert.deepEqual(new Uint8Array(await file.arrayBuffer()), bytes);
    const stranger = await apiError(getAttachment(client(eve), id, attachmentId));
    assert.deepEqual([stranger.status, stranger.code], [404, "not_found"]);
  });

  it("send (idempotent, byte for byte) and history (newest, beforeSeq, afterSeq)", async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const a = client(alice);
    const { conversationId: id } = await a.openDirect(bob);

    const text = `"quotes" 'and' <script>alert(1)</script>\nline two — 日本語 👋🏽 ${"x".repeat(3)}`;
    const first = await a.send(id, text);
    assert.equal(first.seq, 1);
    assert.equal(first.body, text);
    assert.equal(first.senderId, alice);
    assert.match(first.clientMsgId, /^[0-9a-f-]{36}$/);
    const replay = await a.send(id, text, { clientMsgId: first.clientMsgId });
    assert.deepEqual(replay, first, "a replay returns the original message");
    const reused = await apiError(a.send(id, "another body", { clientMsgId: first.clientMsgId }));
    assert.deepEqual([reused.status, reused.code], [409, "conflict"]);
    const tooLong = await apiError(a.send(id, "y".repeat(4001)));
    assert.deepEqual([tooLong.status, tooLong.code], [413, "payload_too_large"]);
    const empty = await apiError(a.send(id, ""));
    assert.equal(empty.status, 400);

    for (let i = 2; i <= 7; i++) await a.send(id, `m${i}`);
    const newest = await a.history(id, { limit: 3 });
    assert.deepEqual(seqs(newest.messages), [5, 6, 7]);
    assert.equal(newest.lastSeq, 7);
    assert.equal(newest.hasMore, true);
    const back = await a.history(id, { beforeSeq: 5, limit: 3 });
    assert.deepEqual(seqs(back.messages), [2, 3, 4]);
    assert.equal(back.hasMore, true);
    const start = await a.history(id, { beforeSeq: 2 });
    assert.deepEqual(start.messages, [first]);
    assert.equal(start.hasMore, false);
    const forward = await a.history(id, { afterSeq: 5 });
    assert.deepEqual(seqs(forward.messages), [6, 7]);
    assert.equal(forward.hasMore, false);
    const both = await apiError(a.history(id, { beforeSeq: 5, afterSeq: 1 }));
    assert.deepEqual([both.status, both.code], [400, "invalid_request"]);
    const badLimit = await apiError(a.history(id, { limit: 101 }));
    assert.equal(badLimit.status, 400);
  });

  it("reads, markRead (debounced), flushReads and inbox", async () => {
    const [alice, bob, carol] = [newUser("alice"), newUser("bob"), newUser("carol")];
    const a = client(alice);
    const b = client(bob, { readDebounceMs: 300 });
    const direct = await a.openDirect(bob);
    const group = await a.createGroup({ title: "Reads", memberIds: [bob, carol] });
    for (let i = 1; i <= 4; i++) await a.send(direct.conversationId, `d${i}`);
    await sleep(10);
    for (let i = 1; i <= 2; i++) await a.send(group.conversationId, `g${i}`);

    const inbox = await eventually(async () => {
      const page = await b.inbox();
      assert.deepEqual(
        page.conversations.map((c) => [c.conversationId, c.lastSeq]),
        [[group.conversationId, 2], [direct.conversationId, 4]],
        "newest activity first",
      );
      return page;
    });
    const d = inbox.conversations[1]!;
    assert.equal(d.type, "direct");
    assert.equal(d.peerId, alice);
    assert.deepEqual([d.lastSeq, d.lastReadSeq, d.unreadCount], [4, 0, 4]);
    assert.equal(d.lastMessage!.body, "d4");
    assert.equal(inbox.conversations[0]!.title, "Reads");
    // Pages of one walk the inbox index, whose order trails the newest messages by a moment
    // (docs/api.md §14): each conversation once, the newest first once the index has caught up.
    await eventually(async () => {
      const page1 = await b.inbox({ limit: 1 });
      assert.equal(page1.conversations.length, 1);
      assert.ok(page1.nextCursor);
      const page2 = await b.inbox({ limit: 1, cursor: page1.nextCursor });
      assert.deepEqual(
        [page1.conversations[0]!.conversationId, page2.conversations[0]!.conversationId],
        [group.conversationId, direct.conversationId],
      );
      assert.equal(page2.nextCursor, null);
    });

    // Marks within one window: one request, the highest seq.
    b.markRead(direct.conversationId, 1);
    b.markRead(direct.conversationId, 3);
    b.markRead(direct.conversationId, 2);
    b.markRead(group.conversationId, 99); // beyond lastSeq: the server clamps it
    await b.flushReads();
    const reads = await a.readStates(direct.conversationId);
    assert.equal(reads.lastSeq, 4);
    assert.deepEqual(
      [...reads.members].sort((x, y) => x.userId.localeCompare(y.userId)),
      [{ userId: alice, lastReadSeq: 4 }, { userId: bob, lastReadSeq: 3 }].sort((x, y) => x.userId.localeCompare(y.userId)),
    );
    const g = await a.readStates(group.conversationId);
    assert.equal(g.members.find((m) => m.userId === bob)!.lastReadSeq, 2);
    assert.equal(g.members.find((m) => m.userId === carol)!.lastReadSeq, 0);

    b.markRead(direct.conversationId, 4); // goes out by itself when its window (300 ms) ends
    await sleep(300);
    await eventually(async () => {
      const after = await b.inbox();
      assert.equal(after.conversations.find((c) => c.conversationId === direct.conversationId)!.unreadCount, 0);
    });
  });

  it("errors: 401 for a bad token, 404 for a stranger, 400 for bad input", async () => {
    const [alice, bob, eve] = [newUser("alice"), newUser("bob"), newUser("eve")];
    const { conversationId: id } = await client(alice).openDirect(bob);
    const forged = client(alice, { token: mintToken(alice).replace(/.$/, (c) => (c === "A" ? "B" : "A")) });
    assert.deepEqual(await apiError(forged.inbox()).then((e) => [e.status, e.code]), [401, "unauthorized"]);
    const expired = client(alice, { token: mintToken(alice, -60) });
    assert.equal((await apiError(expired.inbox())).status, 401);
    const stranger = client(eve);
    for (const call of [() => stranger.getConversation(id), () => stranger.history(id), () => stranger.readStates(id), () => stranger.send(id, "hi")]) {
      assert.deepEqual(await apiError(call()).then((e) => [e.status, e.code]), [404, "not_found"]);
    }
    assert.equal((await apiError(stranger.inbox({ limit: 0 }))).code, "invalid_request");
  });
});

describe("live delivery", () => {
  it("a burst of 100 concurrent sends reaches a connected client as exactly 1..100, in order", { timeout: 240_000 }, async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const a = client(alice, { sendRetry: { maxAttempts: 30, maxElapsedMs: 180_000 } });
    const b = client(bob);
    const got = collect(b);
    const { conversationId: id } = await a.openDirect(bob);
    await b.getConversation(id);
    await b.connect();

    const sent = await Promise.all(range(1, 100).map((i) => a.send(id, `burst ${i}`)));
    assert.deepEqual(sent.map((m) => m.seq).sort((x, y) => x - y), range(1, 100), "the server numbered them 1..100");
    await waitFor("100 messages at bob", () => (got.get(id)?.length ?? 0) >= 100, 120_000);
    await sleep(2000); // late repeats would show up now
    assert.deepEqual(seqs(got.get(id)), range(1, 100));
    assert.deepEqual(
      got.get(id)!.map((m) => m.body).sort(),
      sent.map((m) => m.body).sort(),
    );
  });

  it("a client offline during 50 messages has all 50 after reconnecting, each once", { timeout: 180_000 }, async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const socket = unpluggable();
    const a = client(alice);
    const b = client(bob, { WebSocket: socket.WebSocket, reconnect: { baseDelayMs: 200, maxDelayMs: 1000 } });
    const got = collect(b);
    const states: string[] = [];
    b.on("connection", (s) => states.push(s));
    const { conversationId: id } = await a.openDirect(bob);
    await b.getConversation(id);
    await b.connect();
    await a.send(id, "before");
    await waitFor("the first message", () => got.get(id)?.length === 1);

    socket.cut();
    await waitFor("closed", () => states.at(-1) !== "open");
    for (let i = 1; i <= 50; i++) await a.send(id, `while offline ${i}`);
    assert.equal(got.get(id)!.length, 1, "nothing arrives while offline");
    socket.plug();

    await waitFor("51 messages at bob", () => (got.get(id)?.length ?? 0) >= 51, 60_000);
    await waitFor("open again", () => states.at(-1) === "open");
    await sleep(2000);
    assert.deepEqual(seqs(got.get(id)), range(1, 51));
    assert.deepEqual(got.get(id)!.slice(1).map((m) => m.body), range(1, 50).map((i) => `while offline ${i}`));
    assert.ok(states.filter((s) => s === "open").length >= 2);

    // And after an explicit close() and connect(), the same.
    b.close();
    for (let i = 1; i <= 5; i++) await a.send(id, `after close ${i}`);
    await b.connect();
    await waitFor("56 messages", () => got.get(id)!.length >= 56);
    await sleep(1000);
    assert.deepEqual(seqs(got.get(id)), range(1, 56));
  });

  it("read receipts and membership changes reach the other members", { timeout: 60_000 }, async () => {
    const [alice, bob, carol] = [newUser("alice"), newUser("bob"), newUser("carol")];
    const a = client(alice);
    const b = client(bob, { readDebounceMs: 100 });
    const group = await a.createGroup({ title: "Live", memberIds: [bob] });
    await a.send(group.conversationId, "hello");
    await a.send(group.conversationId, "world");
    const reads: { userId: string; lastReadSeq: number }[] = [];
    const members: { type: string; userIds: string[] }[] = [];
    a.on("read", (r) => reads.push(r));
    a.on("members", (m) => members.push(m));
    await a.connect();

    b.markRead(group.conversationId, 1);
    b.markRead(group.conversationId, 2);
    await waitFor("bob's receipt at alice", () => reads.some((r) => r.userId === bob && r.lastReadSeq === 2));
    assert.deepEqual(reads.filter((r) => r.userId === bob).map((r) => r.lastReadSeq), [2], "one mark, one receipt");

    await b.addMembers(group.conversationId, [carol]);
    await waitFor("member.added at alice", () => members.some((m) => m.type === "member.added"));
    assert.deepEqual(members[0], { type: "member.added", conversationId: group.conversationId, userIds: [carol] });
    await client(carol).removeMember(group.conversationId, carol);
    await waitFor("member.removed at alice", () => members.some((m) => m.type === "member.removed"));
  });

  it("in a group of more than 200 members, light pushes become full messages", { timeout: 180_000 }, async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const others = range(1, 199).map((i) => newUser(`m${i}`));
    const a = client(alice);
    const b = client(bob);
    const got = collect(b);
    const group = await a.createGroup({ title: "Big", memberIds: [bob, ...others] });
    assert.equal(group.memberCount, 201);
    await b.getConversation(group.conversationId);
    await b.connect();

    // What the server pushes to bob, seen on a second, raw connection.
    const frames: Record<string, unknown>[] = [];
    const raw = new WebSocket(`${WS_URL.replace(/\/?$/, "/")}?token=${encodeURIComponent(mintToken(bob))}`);
    raw.on("message", (d) => frames.push(JSON.parse(String(d))));
    await new Promise((resolve, reject) => raw.once("open", resolve).once("error", reject));

    const sent: Message[] = [];
    for (let i = 1; i <= 5; i++) sent.push(await a.send(group.conversationId, `big ${i}`));
    await waitFor("5 messages at bob", () => (got.get(group.conversationId)?.length ?? 0) >= 5, 60_000);
    // Quick successive light messages may come as one carrying the highest seq (docs/api.md §15.3).
    const pushed = () => frames.filter((f) => f.type === "message.new");
    await waitFor("seq 5 on the raw socket", () => pushed().some((f) => f.seq === 5), 30_000);
    raw.close();
    assert.deepEqual(got.get(group.conversationId), sent, "full messages, fetched by the SDK");
    for (const f of pushed()) {
      assert.deepEqual(Object.keys(f).sort(), ["conversationId", "seq", "type"], "the light form above 200 members");
    }
  });
  it("edits, deletions and reactions reach the other member as \"change\" events, once each, in changeSeq order", { timeout: 60_000 }, async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const a = client(alice);
    const b = client(bob);
    const got = collect(b);
    const changes = collect(b, "change");
    const { conversationId: id } = await a.openDirect(bob);
    await b.getConversation(id);
    await b.connect();
    await a.send(id, "first");
    await a.send(id, "second");
    await waitFor("both messages at bob", () => got.get(id)?.length === 2);

    const edited = await a.edit(id, 1, "first, edited");
    assert.deepEqual([edited.seq, edited.body, edited.version, typeof edited.editedAt], [1, "first, edited", 2, "string"]);
    assert.deepEqual(await a.react(id, 1, "👍"), { conversationId: id, seq: 1, reactions: [{ reaction: "👍", count: 1 }] });
    assert.deepEqual((await a.react(id, 1, "👍")).reactions, [{ reaction: "👍", count: 1 }], "a repeat changes nothing");
    assert.deepEqual(await b.reactions(id, 1), { reactions: [{ userId: alice, reaction: "👍" }], nextCursor: null });
    const tombstone = await a.delete(id, 2);
    assert.deepEqual([tombstone.deleted, tombstone.body, tombstone.version], [true, "", 2]);
    assert.deepEqual((await a.unreact(id, 1, "👍")).reactions, []);

    await waitFor("4 changes at bob", () => (changes.get(id)?.length ?? 0) >= 4);
    await sleep(2000); // late repeats would show up now
    const at = changes.get(id)!;
    assert.deepEqual(changeSeqs(at), [1, 2, 3, 4]);
    assert.deepEqual(
      at.map((c) => [c.type, c.seq, c.userId, c.reaction]),
      [
        ["message.edited", 1, alice, undefined],
        ["reaction.added", 1, alice, "👍"],
        ["message.deleted", 2, alice, undefined],
        ["reaction.removed", 1, alice, "👍"],
      ],
    );
    assert.deepEqual(held(got.get(id), at), (await b.history(id)).messages, "applied, they give what a fetch gives");
    const page = await b.changes(id, { afterChange: 1, limit: 2 });
    assert.deepEqual([changeSeqs(page.changes), page.lastChange, page.hasMore], [[2, 3], 4, true]);
    assert.deepEqual((await a.getConversation(id)).lastChange, 4);
  });

  it("a client offline during changes has them after reconnecting, fetched with afterChange, each once", { timeout: 120_000 }, async () => {
    const [alice, bob] = [newUser("alice"), newUser("bob")];
    const socket = unpluggable();
    const asked: string[] = [];
    const recording = ((input: string | URL | Request, init?: RequestInit) => {
      asked.push(String(input));
      return fetch(input, init);
    }) as typeof fetch;
    const a = client(alice);
    const b = client(bob, { WebSocket: socket.WebSocket, fetch: recording, reconnect: { baseDelayMs: 200, maxDelayMs: 1000 } });
    const got = collect(b);
    const changes = collect(b, "change");
    const states: string[] = [];
    b.on("connection", (s) => states.push(s));
    const { conversationId: id } = await a.openDirect(bob);
    for (const body of ["one", "two", "three"]) await a.send(id, body);
    await b.getConversation(id);
    await b.connect();
    const before = (await b.history(id)).messages;
    await a.edit(id, 1, "one, edited");
    await waitFor("the first change", () => changes.get(id)?.length === 1);

    socket.cut();
    await waitFor("closed", () => states.at(-1) !== "open");
    await a.react(id, 2, "🎉");
    await a.edit(id, 3, "three, edited");
    await a.delete(id, 1);
    await a.react(id, 3, "🎉");
    assert.equal(changes.get(id)!.length, 1, "nothing arrives while offline");
    socket.plug();

    await waitFor("5 changes at bob", () => (changes.get(id)?.length ?? 0) >= 5, 60_000);
    await waitFor("open again", () => states.at(-1) === "open");
    await sleep(2000);
    assert.deepEqual(changeSeqs(changes.get(id)), [1, 2, 3, 4, 5]);
    assert.deepEqual(
      changes.get(id)!.map((c) => c.type),
      ["message.edited", "reaction.added", "message.edited", "message.deleted", "reaction.added"],
    );
    assert.ok(
      asked.some((u) => u.includes(`/conversations/${id}/changes?afterChange=1`)),
      `the catch-up asked for afterChange=1: ${asked.filter((u) => u.includes("/changes")).join(", ")}`,
    );
    const history = await b.history(id);
    assert.deepEqual(held(before, changes.get(id)), history.messages, "applied, they give what a fetch gives");
    assert.deepEqual(history.messages.map((m) => [m.body, m.version, m.deleted, m.reactions]), [
      ["", 3, true, undefined],
      ["two", 1, undefined, [{ reaction: "🎉", count: 1 }]],
      ["three, edited", 2, undefined, [{ reaction: "🎉", count: 1 }]],
    ]);
  });
});
