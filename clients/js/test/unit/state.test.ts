// The pure state module: examples, then the property (issue 10): a stale state plus any interleaving
// of duplicated, reordered and dropped events, followed by the SDK's gap fill against a server,
// delivers exactly what a fresh fetch holds, once each, in order.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  applyPage,
  initialState,
  missingAfter,
  observe,
  observeReads,
  reduce,
  type ChatState,
  type Message,
  type ReadUpdatedEvent,
  type ServerEvent,
  type Step,
} from "../../src/index.js";

function msg(conversationId: string, seq: number): Message {
  return {
    conversationId,
    seq,
    clientMsgId: `00000000-0000-4000-8000-${String(seq).padStart(12, "0")}`,
    senderId: seq % 2 ? "alice" : "bob",
    body: `${conversationId} #${seq}`,
    createdAt: new Date(Date.UTC(2026, 0, 1, 0, 0, seq)).toISOString(),
  };
}
const full = (m: Message): ServerEvent => ({ type: "message.new", ...m });
const light = (conversationId: string, seq: number): ServerEvent => ({ type: "message.new", conversationId, seq });

/** Applies events in order; returns the final state and everything delivered. */
function run(state: ChatState, events: ServerEvent[]): { state: ChatState; messages: Message[]; reads: ReadUpdatedEvent[] } {
  const messages: Message[] = [];
  const reads: ReadUpdatedEvent[] = [];
  for (const e of events) {
    const step = reduce(state, e);
    state = step.state;
    messages.push(...step.messages);
    reads.push(...step.reads);
  }
  return { state, messages, reads };
}
const seqs = (ms: Message[]) => ms.map((m) => m.seq);

describe("reduce", () => {
  it("delivers in order, drops duplicates", () => {
    const s0 = observe(initialState(), "c", 0).state;
    const { state, messages } = run(s0, [full(msg("c", 1)), full(msg("c", 1)), full(msg("c", 2)), full(msg("c", 1))]);
    assert.deepEqual(seqs(messages), [1, 2]);
    assert.equal(state.conversations.get("c")!.delivered, 2);
    assert.equal(missingAfter(state, "c"), null);
  });

  it("holds a message above a gap until the gap is filled, then delivers the run in order", () => {
    const s0 = observe(initialState(), "c", 1).state;
    const a = run(s0, [full(msg("c", 3)), full(msg("c", 4))]);
    assert.deepEqual(a.messages, []);
    assert.equal(missingAfter(a.state, "c"), 1, "seq 3 while holding 1: fetch afterSeq=1");
    const b = applyPage(a.state, { conversationId: "c", messages: [msg("c", 2), msg("c", 3)], lastSeq: 4 });
    assert.deepEqual(seqs(b.messages), [2, 3, 4]);
    assert.equal(missingAfter(b.state, "c"), null);
    assert.equal(b.state.conversations.get("c")!.ahead.size, 0);
  });

  it("a light payload marks the message as missing; its page delivers it", () => {
    const s0 = observe(initialState(), "c", 4).state;
    const a = reduce(s0, light("c", 5));
    assert.deepEqual(a.messages, []);
    assert.equal(missingAfter(a.state, "c"), 4);
    const b = applyPage(a.state, { conversationId: "c", messages: [msg("c", 5)], lastSeq: 5 });
    assert.deepEqual(b.messages, [msg("c", 5)]);
  });

  it("starts an unknown conversation at its first live message", () => {
    const a = reduce(initialState(), full(msg("new", 7)));
    assert.deepEqual(seqs(a.messages), [7]);
    const b = reduce(initialState(), light("new", 7));
    assert.equal(missingAfter(b.state, "new"), 6);
  });

  it("emits a read receipt only when it moves a watermark, and a receipt beyond lastSeq reveals a gap", () => {
    const s0 = observe(initialState(), "c", 3).state;
    const r = (userId: string, lastReadSeq: number): ServerEvent => ({ type: "read.updated", conversationId: "c", userId, lastReadSeq });
    const out = run(s0, [r("bob", 2), r("bob", 2), r("bob", 1), r("carol", 1), r("bob", 3)]);
    assert.deepEqual(out.reads.map((e) => [e.userId, e.lastReadSeq]), [["bob", 2], ["carol", 1], ["bob", 3]]);
    assert.equal(missingAfter(out.state, "c"), null);
    assert.equal(missingAfter(reduce(out.state, r("bob", 5)).state, "c"), 3);
    const after = observeReads(out.state, { conversationId: "c", lastSeq: 3, members: [{ userId: "bob", lastReadSeq: 1 }, { userId: "dave", lastReadSeq: 3 }] });
    assert.equal(after.conversations.get("c")!.reads.get("bob"), 3, "watermarks never go back");
    assert.equal(after.conversations.get("c")!.reads.get("dave"), 3);
  });

  it("ignores membership events and malformed ones", () => {
    const s0 = observe(initialState(), "c", 3).state;
    assert.equal(reduce(s0, { type: "member.added", conversationId: "c", userIds: ["x"] }).state, s0);
    assert.equal(reduce(s0, { type: "message.new", conversationId: "c", seq: -1 } as ServerEvent).state, s0);
    assert.equal(reduce(s0, { type: "message.new", conversationId: "c", seq: 1.5 } as ServerEvent).state, s0);
  });

  it("does not change the state it is given", () => {
    const s0 = observe(initialState(), "c", 1).state;
    const before = JSON.stringify([...s0.conversations.get("c")!.ahead]);
    reduce(s0, full(msg("c", 3)));
    assert.equal(JSON.stringify([...s0.conversations.get("c")!.ahead]), before);
    assert.equal(s0.conversations.get("c")!.lastSeq, 1);
  });
});

describe("observe", () => {
  it("starts a new conversation at the summary's lastSeq, or at the newest message of a page the app fetched", () => {
    assert.equal(observe(initialState(), "c", 9).state.conversations.get("c")!.delivered, 9);
    assert.equal(observe(initialState(), "c", 9, 5).state.conversations.get("c")!.delivered, 5);
  });

  it("a higher lastSeq for a known conversation is a gap; a page the app fetched moves the watermark", () => {
    const s = observe(observe(initialState(), "c", 2).state, "c", 6).state;
    assert.equal(missingAfter(s, "c"), 2);
    const held = reduce(s, full(msg("c", 6))).state;
    const t = observe(held, "c", 6, 5);
    assert.deepEqual(seqs(t.messages), [6], "the held message right above the app's page is delivered");
    assert.equal(missingAfter(t.state, "c"), null);
  });
});

// ---------------------------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------------------------

/** The server: each conversation's messages 1..N and members' watermarks. */
interface World {
  messages: Map<string, Message[]>;
}

/** What the SDK does to close gaps: fetch `afterSeq = delivered` pages until nothing is missing. */
function fill(state: ChatState, world: World, id: string, limit: number, out: Message[]): ChatState {
  for (let after = missingAfter(state, id), guard = 0; after !== null; after = missingAfter(state, id), guard++) {
    assert.ok(guard < 1000, "gap fill must terminate");
    const all = world.messages.get(id)!;
    const page = { conversationId: id, messages: all.filter((m) => m.seq > after).slice(0, limit), lastSeq: all.length };
    const step: Step = applyPage(state, page);
    out.push(...step.messages);
    state = step.state;
  }
  return state;
}

const CONVERSATIONS = ["a", "b", "c"];
const USERS = ["alice", "bob", "carol"];

type Action =
  | { kind: "message"; conv: number; seq: number; light: boolean }
  | { kind: "read"; conv: number; user: number; seq: number }
  | { kind: "fill"; conv: number };

const scenario = fc
  .record({
    sizes: fc.tuple(fc.nat(40), fc.nat(40), fc.nat(40)),
    staleFractions: fc.tuple(fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })),
    pageLimit: fc.integer({ min: 1, max: 100 }),
    actions: fc.array(
      fc.oneof(
        { weight: 8, arbitrary: fc.record({ kind: fc.constant("message" as const), conv: fc.nat(2), seq: fc.integer({ min: 1, max: 40 }), light: fc.boolean() }) },
        { weight: 2, arbitrary: fc.record({ kind: fc.constant("read" as const), conv: fc.nat(2), user: fc.nat(2), seq: fc.nat(40) }) },
        { weight: 1, arbitrary: fc.record({ kind: fc.constant("fill" as const), conv: fc.nat(2) }) },
      ),
      { maxLength: 200 },
    ),
  })
  .map(({ sizes, staleFractions, pageLimit, actions }) => ({
    sizes,
    stale: sizes.map((n, i) => Math.floor(n * staleFractions[i]!)),
    pageLimit,
    // Events can only be about messages that exist: clamp to each conversation's size (drop if empty).
    actions: actions.flatMap((a): Action[] => {
      const n = sizes[a.conv]!;
      if (a.kind === "message") return n === 0 ? [] : [{ ...a, seq: ((a.seq - 1) % n) + 1 }];
      if (a.kind === "read") return [{ ...a, seq: Math.min(a.seq, n) }];
      return [a];
    }),
  }));

describe("property: stale state + duplicated/reordered/dropped events + gap fill = fresh fetch", () => {
  it("holds for any interleaving", () => {
    fc.assert(
      fc.property(scenario, ({ sizes, stale, pageLimit, actions }) => {
        const world: World = { messages: new Map(CONVERSATIONS.map((id, i) => [id, Array.from({ length: sizes[i]! }, (_, k) => msg(id, k + 1))])) };

        // The app's view: a fresh fetch up to its stale point, after which it only hears from the SDK.
        let state = initialState();
        const app = new Map<string, Message[]>();
        CONVERSATIONS.forEach((id, i) => {
          state = observe(state, id, stale[i]!).state;
          app.set(id, world.messages.get(id)!.slice(0, stale[i]));
        });
        const receipts: ReadUpdatedEvent[] = [];
        const take = (step: Step) => {
          state = step.state;
          for (const m of step.messages) app.get(m.conversationId)!.push(m);
          receipts.push(...step.reads);
        };

        for (const a of actions) {
          const id = CONVERSATIONS[a.conv]!;
          if (a.kind === "message") {
            const m = world.messages.get(id)![a.seq - 1]!;
            take(reduce(state, a.light ? light(id, a.seq) : full(m)));
          } else if (a.kind === "read") {
            take(reduce(state, { type: "read.updated", conversationId: id, userId: USERS[a.user]!, lastReadSeq: a.seq }));
          } else {
            const out: Message[] = [];
            state = fill(state, world, id, pageLimit, out);
            for (const m of out) app.get(id)!.push(m);
          }
        }

        // The reconnect's catch-up: the inbox tells each conversation's lastSeq, then gap fill.
        for (const id of CONVERSATIONS) {
          take(observe(state, id, world.messages.get(id)!.length));
          const out: Message[] = [];
          state = fill(state, world, id, pageLimit, out);
          for (const m of out) app.get(id)!.push(m);
        }

        // Same contents as a fresh fetch: every message once, in seq order, byte for byte.
        let fresh = initialState();
        for (const id of CONVERSATIONS) {
          fresh = observe(fresh, id, 0).state;
          fresh = applyPage(fresh, { conversationId: id, messages: world.messages.get(id)!, lastSeq: world.messages.get(id)!.length }).state;
          assert.deepEqual(app.get(id), world.messages.get(id));
          const got = state.conversations.get(id)!;
          const want = fresh.conversations.get(id)!;
          assert.equal(got.delivered, want.delivered);
          assert.equal(got.lastSeq, want.lastSeq);
          assert.equal(got.ahead.size, 0);
        }

        // Read receipts: each emitted one moved a watermark up; the last known is the highest seen.
        const high = new Map<string, number>();
        for (const r of receipts) {
          const k = `${r.conversationId}/${r.userId}`;
          assert.ok(r.lastReadSeq > (high.get(k) ?? -1), "a receipt is emitted only when it advances");
          high.set(k, r.lastReadSeq);
        }
        for (const a of actions) {
          if (a.kind !== "read") continue;
          const id = CONVERSATIONS[a.conv]!;
          assert.ok(state.conversations.get(id)!.reads.get(USERS[a.user]!)! >= a.seq);
        }
      }),
      { numRuns: 500 },
    );
  });
});
