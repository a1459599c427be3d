// The same property one level up: the real ChatClient, over the fake socket, given any mix of
// repeated, reordered, dropped and light pushes of messages and of changes to them,
// dropped connections, and failing REST calls (the catch-up's inbox walk, history and change-log
// fetches answering 500, 503, or not at all), ends up having delivered every message exactly once,
// in seq order, and every change exactly once, in changeSeq order and after its message, per
// conversation — the messages with their changes applied equal to the server's — without ever
// reconnecting because of a failed catch-up.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { applyChange, ChatClient, type ChangeType, type Message, type MessageChange } from "../../src/index.js";
import { FakeChatServer } from "../helpers/fake-server.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Step =
  | { kind: "push"; conv: number; seq: number; copies: number; light: boolean }
  | { kind: "change-push"; conv: number; pick: number; copies: number; light: boolean }
  | { kind: "drop-connection" }
  | { kind: "fault"; route: "inbox" | "history" | "changes"; conv: number; respond: 500 | 503 | "network"; times: number }
  | { kind: "pause" };

const CHANGE_TYPES: ChangeType[] = ["message.edited", "message.deleted", "reaction.added", "reaction.removed"];

const scenario = fc.record({
  sizes: fc.tuple(fc.integer({ min: 1, max: 25 }), fc.integer({ min: 0, max: 25 })),
  /** Changes made after the messages: type, conversation, message (0: the newest), who, which reaction. */
  edits: fc.array(fc.record({ type: fc.nat(3), conv: fc.nat(1), target: fc.oneof(fc.nat(2), fc.nat(25)), user: fc.nat(2), reaction: fc.nat(1) }), { maxLength: 30 }),
  steps: fc.array(
    fc.oneof(
      { weight: 10, arbitrary: fc.record({ kind: fc.constant("push" as const), conv: fc.nat(1), seq: fc.integer({ min: 1, max: 25 }), copies: fc.integer({ min: 0, max: 2 }), light: fc.boolean() }) },
      { weight: 6, arbitrary: fc.record({ kind: fc.constant("change-push" as const), conv: fc.nat(1), pick: fc.nat(30), copies: fc.integer({ min: 0, max: 2 }), light: fc.boolean() }) },
      { weight: 1, arbitrary: fc.record({ kind: fc.constant("drop-connection" as const) }) },
      {
        weight: 2,
        arbitrary: fc.record({
          kind: fc.constant("fault" as const),
          route: fc.constantFrom("inbox" as const, "history" as const, "changes" as const),
          conv: fc.nat(1),
          respond: fc.constantFrom(500 as const, 503 as const, "network" as const),
          times: fc.integer({ min: 1, max: 4 }),
        }),
      },
      { weight: 1, arbitrary: fc.record({ kind: fc.constant("pause" as const) }) },
    ),
    { maxLength: 60 },
  ),
  gapFillDelayMs: fc.integer({ min: 0, max: 20 }),
});

describe("property: the client delivers each message and each change once, in order, whatever the socket does", () => {
  it("holds for random pushes and connection drops", async () => {
    await fc.assert(
      fc.asyncProperty(scenario, async ({ sizes, edits, steps, gapFillDelayMs }) => {
        const server = new FakeChatServer();
        const ids = sizes.map(() => server.createConversation(["alice", "bob"]));
        const client = new ChatClient({
          apiUrl: "http://api.test",
          wsUrl: "ws://ws.test",
          token: "alice",
          fetch: server.fetch,
          WebSocket: server.WebSocket,
          gapFillDelayMs,
          reconnect: { baseDelayMs: 1, maxDelayMs: 5 },
        });
        const got = new Map<string, Message[]>(ids.map((id) => [id, []]));
        const gotChanges = new Map<string, MessageChange[]>(ids.map((id) => [id, []]));
        let drops = 0;
        client.on("message", (m) => got.get(m.conversationId)!.push(m));
        let early = 0; // changes that came before their message (asserted below, not in the listener)
        client.on("change", (c) => {
          if (!got.get(c.conversationId)!.some((m) => m.seq === c.seq)) early += 1;
          gotChanges.get(c.conversationId)!.push(c);
        });
        try {
          await client.inbox();
          await client.connect();
          const all = ids.map((id, i) => Array.from({ length: sizes[i]! }, () => server.addMessage(id, "bob")));
          for (const e of edits) {
            const n = sizes[e.conv]!;
            if (n > 0) server.change(ids[e.conv]!, n - (e.target % n), CHANGE_TYPES[e.type]!, ["alice", "bob", "carol"][e.user]!, e.type === 0 ? `edit ${e.target}` : ["👍", "❤️"][e.reaction]!);
          }
          const log = ids.map((id) => server.conversations.get(id)!.changes);
          for (const s of steps) {
            if (s.kind === "drop-connection") {
              server.openSockets()[0]?.drop();
              drops += 1;
            } else if (s.kind === "fault") {
              const path = s.route === "inbox" ? "/inbox" : `/conversations/${ids[s.conv % ids.length]}/${s.route === "history" ? "messages" : "changes"}`;
              const respond = s.respond === "network" ? ("network" as const) : { status: s.respond };
              server.failNext(...Array.from({ length: s.times }, () => ({ match: (r: { method: string; path: string }) => r.method === "GET" && r.path === path, respond })));
            } else if (s.kind === "change-push") {
              const list = log[s.conv]!;
              if (list.length === 0) continue;
              const c = list[s.pick % list.length]!;
              server.lightChanges = s.light;
              for (let k = 0; k < s.copies; k++) server.push("alice", server.changeEvent(ids[s.conv]!, c));
            } else if (s.kind === "pause") {
              await sleep(3);
            } else {
              const list = all[s.conv]!;
              if (list.length === 0) continue;
              const m = list[(s.seq - 1) % list.length]!;
              const event = s.light ? { type: "message.new", conversationId: m.conversationId, seq: m.seq } : { type: "message.new", ...m };
              for (let c = 0; c < s.copies; c++) server.push("alice", event);
            }
          }
          // Whatever was lost at the end, a reconnect catches up.
          server.openSockets()[0]?.drop();
          drops += 1;
          const deadline = Date.now() + 5000;
          while (ids.some((id, i) => got.get(id)!.length < sizes[i]! || gotChanges.get(id)!.length < log[i]!.length) || client.connectionState !== "open") {
            if (Date.now() > deadline) break;
            await sleep(2);
          }
          await sleep(10); // anything still in flight would show up as a duplicate
          assert.equal(early, 0, "a change comes after its message");
          ids.forEach((id, i) => {
            assert.deepEqual(got.get(id)!.map((m) => m.seq), all[i]!.map((m) => m.seq));
            assert.deepEqual(gotChanges.get(id)!.map((c) => c.changeSeq), log[i]!.map((c) => c.changeSeq));
            // The app's copies, each change applied in order: the server's messages as they are now.
            const view = new Map(got.get(id)!.map((m) => [m.seq, m]));
            for (const c of gotChanges.get(id)!) view.set(c.seq, applyChange(view.get(c.seq)!, c));
            assert.deepEqual([...view.values()], server.conversations.get(id)!.messages);
          });
          // One connection, plus at most one per drop: a failed catch-up never closes the socket itself.
          assert.ok(server.sockets.length <= drops + 1, `${server.sockets.length} sockets for ${drops} drops`);
        } finally {
          client.close();
        }
      }),
      { numRuns: 60 },
    );
  });
});
