// The pure state module: examples, then the property (messages, and the changes to them):
// a stale state plus any interleaving of duplicated, reordered and dropped message and change events,
// followed by the SDK's gap fill against a server, delivers exactly what a fresh fetch holds, once
// each, in order: every message in its current version, every change once, in changeSeq order.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  applyChange,
  applyChanges,
  applyPage,
  initialState,
  missingAfter,
  missingChangesAfter,
  observe,
  observeChanges,
  observeReads,
  reduce,
  type Change,
  type ChangeType,
  type ChatState,
  type Message,
  type MessageChange,
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
    version: 1,
  };
}
const full = (m: Message): ServerEvent => ({ type: "message.new", ...m });
const light = (conversationId: string, seq: number): ServerEvent => ({ type: "message.new", conversationId, seq });

/** Applies events in order; returns the final state and everything delivered. */
function run(state: ChatState, events: ServerEvent[]) {
  const messages: Message[] = [];
  const reads: ReadUpdatedEvent[] = [];
  const changes: MessageChange[] = [];
  for (const e of events) {
    const step = reduce(state, e);
    state = step.state;
    messages.push(...step.messages);
    reads.push(...step.reads);
    changes.push(...step.changes);
  }
  return { state, messages, reads, changes };
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
    const observed = observeReads(out.state, { conversationId: "c", lastSeq: 3, members: [{ userId: "bob", lastReadSeq: 1 }, { userId: "dave", lastReadSeq: 3 }] });
    const after = observed.state;
    assert.equal(after.conversations.get("c")!.reads.get("bob"), 3, "watermarks never go back");
    assert.equal(after.conversations.get("c")!.reads.get("dave"), 3);
    assert.deepEqual(observed.reads, [{ type: "read.updated", conversationId: "c", userId: "dave", lastReadSeq: 3 }], "only the watermark it moved");
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

const edited = (m: Message, body: string, version = m.version + 1): Message => ({ ...m, body, version, editedAt: "2026-01-02T00:00:00.000Z" });
const tomb = (m: Message): Message => ({ ...m, body: "", deleted: true });
const change = (conversationId: string, changeSeq: number, message: Message, type: ChangeType = "message.edited"): ServerEvent => ({
  type,
  conversationId,
  changeSeq,
  seq: message.seq,
  message,
});
const changeSeqs = (cs: MessageChange[]) => cs.map((c) => c.changeSeq);

describe("changes", () => {
  const start = () => observeChanges(observe(initialState(), "c", 3).state, "c", 2).state;

  it("delivers each change once, in changeSeq order; a gap is filled with afterChange", () => {
    const m2 = msg("c", 2);
    const out = run(start(), [change("c", 3, edited(m2, "a")), change("c", 5, edited(m2, "c", 4)), change("c", 3, edited(m2, "a"))]);
    assert.deepEqual(changeSeqs(out.changes), [3]);
    assert.equal(missingChangesAfter(out.state, "c"), 3, "holding 3, seeing 5: fetch afterChange=3");
    const page: Change[] = [4, 5].map((k) => ({ changeSeq: k, type: "message.edited", seq: 2, userId: "bob", at: "x", message: edited(m2, String(k), k - 1) }));
    const filled = applyChanges(out.state, { conversationId: "c", changes: page, lastChange: 5 });
    assert.deepEqual(changeSeqs(filled.changes), [4, 5]);
    assert.equal(filled.changes[0]!.conversationId, "c", "a fetched change gets its conversation id");
    assert.equal(missingChangesAfter(filled.state, "c"), null);
    assert.equal(filled.state.conversations.get("c")!.changesAhead.size, 0);
  });

  it("a light change is fetched; a summary's higher lastChange is a gap", () => {
    const s = reduce(start(), { type: "reaction.added", conversationId: "c", changeSeq: 3, seq: 1 }).state;
    assert.equal(missingChangesAfter(s, "c"), 2);
    assert.equal(missingChangesAfter(observeChanges(start(), "c", 9).state, "c"), 2);
    assert.equal(observeChanges(start(), "c", 9, 9).state.conversations.get("c")!.changed, 9, "changes the app fetched count as held");
  });

  it("first sight through a change starts the messages at the changed one: a summary does not skip them", () => {
    // Found by probing: the summary's lastSeq counted messages 1-3 as delivered, never sent.
    const m1 = msg("c", 1);
    const a = run(initialState(), [change("c", 1, edited(m1, "e"))]);
    assert.deepEqual(a.changes, [], "its message is not delivered yet");
    assert.equal(missingAfter(a.state, "c"), 0, "message 1 is fetched");
    const summary = observe(a.state, "c", 3).state;
    assert.equal(missingAfter(summary, "c"), 0, "still fetched after the summary");
    const page = applyPage(summary, { conversationId: "c", messages: [edited(m1, "e"), msg("c", 2), msg("c", 3)], lastSeq: 3 });
    assert.deepEqual(seqs(page.messages), [1, 2, 3]);
    assert.deepEqual(changeSeqs(page.changes), [1]);
  });

  it("first sight through a message starts its changes at the first: a summary does not skip them", () => {
    // Found by probing: an edit made while the socket was down was never delivered (the summary's
    // lastChange counted it as delivered).
    const m1 = msg("c", 1);
    const a = run(initialState(), [full(m1)]);
    assert.deepEqual(seqs(a.messages), [1]);
    const summary = observeChanges(a.state, "c", 1).state;
    assert.equal(missingChangesAfter(summary, "c"), 0, "change 1 is fetched");
    const page: Change[] = [{ changeSeq: 1, type: "message.edited", seq: 1, userId: "alice", at: "x", message: edited(m1, "e") }];
    const filled = applyChanges(summary, { conversationId: "c", changes: page, lastChange: 1 });
    assert.deepEqual(changeSeqs(filled.changes), [1]);
    assert.equal(missingChangesAfter(filled.state, "c"), null);
  });

  it("first sight through a history page starts its changes at the first: a later summary does not skip them", () => {
    // Found by a property probe: history() before any summary, an edit, then the summary's
    // lastChange counted the edit as delivered; the app kept version 1 for good.
    const m1 = msg("c", 1);
    // What history() takes in: its page's lastSeq and the newest seq it holds.
    const seen = observe(initialState(), "c", 1, 1).state;
    assert.equal(missingAfter(seen, "c"), null, "the page's messages are held");
    const summary = observeChanges(seen, "c", 1).state;
    assert.equal(missingChangesAfter(summary, "c"), 0, "change 1 is fetched");
    const page: Change[] = [{ changeSeq: 1, type: "message.edited", seq: 1, userId: "alice", at: "x", message: edited(m1, "e") }];
    const filled = applyChanges(summary, { conversationId: "c", changes: page, lastChange: 1 });
    assert.deepEqual(changeSeqs(filled.changes), [1]);
    assert.equal(filled.changes[0]!.message!.body, "e");
  });

  it("first sight through a change still takes an earlier change pushed late (a deletion of a message pushed as sent)", () => {
    // Found by a property probe: change 2 seen first counted change 1 (deleting message 2) as held,
    // so message 2's push as sent stayed the app's copy, deleted text shown for good.
    const [m1, m2] = [msg("c", 1), msg("c", 2)];
    const r = run(initialState(), [change("c", 2, edited(m1, "e")), full(m1), full(m2), change("c", 1, tomb(m2), "message.deleted")]);
    assert.deepEqual(seqs(r.messages), [1, 2]);
    assert.deepEqual(changeSeqs(r.changes), [1, 2], "both changes, in order");
    assert.equal(r.changes[0]!.message!.deleted, true);
  });

  it("holds a change until its message is delivered, and delivers the message with it applied", () => {
    const m5 = msg("c", 5);
    const a = run(start(), [change("c", 3, tomb(m5), "message.deleted")]);
    assert.deepEqual(a.changes, [], "message 5 is not delivered yet");
    assert.equal(missingAfter(a.state, "c"), 3, "a change of seq 5 says message 5 exists");
    assert.equal(missingChangesAfter(a.state, "c"), null, "the held change is not fetched again");
    // The late push of message 5 (as it was sent) comes out as the tombstone, then its change.
    const b = run(a.state, [full(msg("c", 4)), full(m5)]);
    assert.deepEqual(b.messages, [msg("c", 4), tomb(m5)]);
    assert.deepEqual(changeSeqs(b.changes), [3]);
  });

  it("applyChange: the newer state wins, a tombstone is final, repeats change nothing", () => {
    const m = msg("c", 1);
    const v2 = edited(m, "two");
    assert.equal(applyChange(m, { message: v2 }), v2);
    assert.equal(applyChange(v2, { message: m }), v2, "an older version loses");
    assert.equal(applyChange(applyChange(v2, { message: v2 }), { message: v2 }), v2);
    const liked = { ...v2, reactions: [{ reaction: "👍", count: 1 }] };
    assert.equal(applyChange(v2, { message: liked }), liked, "same version: the change's reactions");
    const t = tomb(v2);
    assert.equal(applyChange(t, { message: liked }), t, "a tombstone is final");
    assert.equal(applyChange(t, { message: edited(v2, "later") }), t);
    assert.equal(applyChange(m, { message: msg("c", 2) }), m, "another message's change is ignored");
    assert.equal(applyChange(m, { message: msg("d", 1) }), m);
  });

  it("ignores malformed change events", () => {
    const s0 = start();
    for (const bad of [{ changeSeq: 0 }, { changeSeq: -1 }, { changeSeq: 1.5 }, { seq: 0 }, { seq: "1" }]) {
      const e = { type: "message.edited", conversationId: "c", changeSeq: 3, seq: 1, message: msg("c", 1), ...bad } as unknown as ServerEvent;
      assert.equal(reduce(s0, e).state, s0, JSON.stringify(bad));
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------------------------

const CONVERSATIONS = ["a", "b", "c"];
const USERS = ["alice", "bob", "carol"];
const REACTIONS = ["👍", "❤️"];

/** What happens on the server, in order: a send, or a change of the message `target` picks (0: the newest). */
type Op =
  | { kind: "send" }
  | { kind: "edit" | "delete"; target: number }
  | { kind: "react" | "unreact"; target: number; user: number; reaction: number };

/**
 * The server of one conversation, advancing one op at a time: its messages as they are now, its
 * change log, and what each push carried (a message as sent; a change's message right after it).
 * Its change log answers with the message right after each change, or (`current`) as it is now;
 * either way a deleted message's content is gone from it.
 */
class Server {
  readonly messages: Message[] = [];
  readonly changes: Change[] = [];
  readonly sent: Message[] = [];
  private readonly reactors = new Map<number, Map<string, Set<string>>>();
  private done = 0;
  constructor(
    readonly id: string,
    private readonly ops: Op[],
    private readonly current: boolean,
  ) {}

  get finished(): boolean {
    return this.done >= this.ops.length;
  }

  advance(): void {
    const op = this.ops[this.done++];
    if (!op) return;
    const n = this.messages.length;
    if (op.kind === "send" || n === 0) {
      const m = msg(this.id, n + 1);
      this.messages.push(m);
      this.sent.push(m);
      return;
    }
    const seq = n - (op.target % n); // target 0 is the newest message

    const old = this.messages[seq - 1]!;
    if (old.deleted) return; // edit: 409; delete again, reactions: nothing changes
    let type: ChangeType;
    let next: Message;
    let user = USERS[0]!;
    let reaction: string | undefined;
    if (op.kind === "edit") {
      type = "message.edited";
      next = { ...old, body: `${old.body} v${old.version + 1}`, version: old.version + 1, editedAt: new Date(Date.UTC(2026, 1, 1, 0, 0, this.done)).toISOString() };
    } else if (op.kind === "delete") {
      type = "message.deleted";
      const { reactions: _, ...rest } = old;
      next = { ...rest, body: "", deleted: true };
      this.reactors.delete(seq);
    } else if (op.kind === "react" || op.kind === "unreact") {
      user = USERS[op.user]!;
      reaction = REACTIONS[op.reaction]!;
      const by = this.reactors.get(seq) ?? new Map<string, Set<string>>();
      this.reactors.set(seq, by);
      const users = by.get(reaction) ?? new Set<string>();
      by.set(reaction, users);
      if ((op.kind === "react") === users.has(user)) return; // nothing changes, no change
      type = op.kind === "react" ? "reaction.added" : "reaction.removed";
      if (op.kind === "react") users.add(user);
      else users.delete(user);
      const reactions = REACTIONS.flatMap((r) => (by.get(r)?.size ? [{ reaction: r, count: by.get(r)!.size }] : []));
      const { reactions: _, ...rest } = old;
      next = reactions.length > 0 ? { ...rest, reactions } : rest;
    } else {
      return;
    }
    this.messages[seq - 1] = next;
    this.changes.push({ changeSeq: this.changes.length + 1, type, seq, userId: user, ...(reaction ? { reaction } : {}), at: "t", message: next });
  }

  /** `GET …/changes?afterChange=`: the log, with each message after its change or as it is now, never a deleted one's content. */
  changesAfter(after: number, limit: number): Change[] {
    return this.changes.slice(after, after + limit).map((c) => {
      const now = this.messages[c.seq - 1]!;
      return this.current || now.deleted ? { ...c, message: now } : c;
    });
  }
}

/**
 * What the SDK does to close gaps: fetch `afterSeq = delivered` pages, then `afterChange = changed`
 * pages, until nothing is missing (or, to let events in between, after `pages` pages).
 */
function fill(state: ChatState, server: Server, limit: number, take: (step: Step) => void, pages = Infinity): ChatState {
  const id = server.id;
  for (let guard = 0; guard < pages; guard++) {
    assert.ok(guard < 1000, "gap fill must terminate");
    const after = missingAfter(state, id);
    const afterChange = missingChangesAfter(state, id);
    let step: Step;
    if (after !== null) {
      step = applyPage(state, { conversationId: id, messages: server.messages.filter((m) => m.seq > after).slice(0, limit), lastSeq: server.messages.length });
    } else if (afterChange !== null) {
      step = applyChanges(state, { conversationId: id, changes: server.changesAfter(afterChange, limit), lastChange: server.changes.length });
    } else {
      return state;
    }
    take(step);
    state = step.state;
  }
  return state;
}

type Action =
  | { kind: "advance"; conv: number }
  | { kind: "message"; conv: number; pick: number; light: boolean }
  | { kind: "change"; conv: number; pick: number; light: boolean }
  | { kind: "read"; conv: number; user: number; seq: number }
  | { kind: "fill"; conv: number; pages: number };

// Changes go mostly to recent messages, as in a chat: what was just sent is edited, deleted, liked.
const target = fc.oneof(fc.nat(2), fc.nat(40));
const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: fc.constant({ kind: "send" as const }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("edit" as const), target }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("delete" as const), target }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constantFrom("react" as const, "unreact" as const), target, user: fc.nat(2), reaction: fc.nat(1) }) },
);

const scenario = fc.record({
  ops: fc.tuple(fc.array(op, { maxLength: 60, size: "max" }), fc.array(op, { maxLength: 60, size: "max" }), fc.array(op, { maxLength: 60, size: "max" })),
  staleFractions: fc.tuple(fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })),
  current: fc.boolean(),
  pageLimit: fc.integer({ min: 1, max: 100 }),
  actions: fc.array(
    fc.oneof(
      { weight: 3, arbitrary: fc.record({ kind: fc.constant("advance" as const), conv: fc.nat(2) }) },
      { weight: 6, arbitrary: fc.record({ kind: fc.constant("message" as const), conv: fc.nat(2), pick: fc.nat(1000), light: fc.boolean() }) },
      { weight: 6, arbitrary: fc.record({ kind: fc.constant("change" as const), conv: fc.nat(2), pick: fc.nat(1000), light: fc.boolean() }) },
      { weight: 2, arbitrary: fc.record({ kind: fc.constant("read" as const), conv: fc.nat(2), user: fc.nat(2), seq: fc.nat(60) }) },
      { weight: 2, arbitrary: fc.record({ kind: fc.constant("fill" as const), conv: fc.nat(2), pages: fc.integer({ min: 1, max: 3 }) }) },
    ),
    { maxLength: 250, size: "max" },
  ),
});

describe("property: stale state + duplicated/reordered/dropped message and change events + gap fill = fresh fetch", () => {
  it("holds for any interleaving", () => {
    fc.assert(
      fc.property(scenario, ({ ops, staleFractions, current, pageLimit, actions }) => {
        const servers = CONVERSATIONS.map((id, i) => new Server(id, ops[i]!, current));

        // The app's view: a fresh fetch at its stale point (messages as they were then, and the
        // conversation's lastSeq and lastChange), after which it only hears from the SDK.
        let state = initialState();
        const app = new Map<string, Map<number, Message>>();
        const changesSeen = new Map<string, number>();
        const stale = new Map<string, { seq: number; change: number }>();
        servers.forEach((server, i) => {
          for (let k = 0; k < Math.floor(ops[i]!.length * staleFractions[i]!); k++) server.advance();
          const id = server.id;
          state = observe(state, id, server.messages.length).state;
          state = observeChanges(state, id, server.changes.length).state;
          app.set(id, new Map(server.messages.map((m) => [m.seq, m])));
          changesSeen.set(id, server.changes.length);
          stale.set(id, { seq: server.messages.length, change: server.changes.length });
        });
        const receipts: ReadUpdatedEvent[] = [];
        const pushedReads: ReadUpdatedEvent[] = [];
        const take = (step: Step) => {
          state = step.state;
          for (const m of step.messages) {
            const held = app.get(m.conversationId)!;
            assert.equal(m.seq, held.size + 1, "each message once, in seq order");
            held.set(m.seq, m);
          }
          for (const c of step.changes) {
            assert.equal(c.changeSeq, changesSeen.get(c.conversationId)! + 1, "each change once, in changeSeq order");
            changesSeen.set(c.conversationId, c.changeSeq);
            const held = app.get(c.conversationId)!.get(c.seq);
            assert.ok(held, "a change comes after its message");
            const next = applyChange(held, c);
            // What the app shows never goes back: no older version, no undeleting.
            assert.ok(next.version >= held.version && (next.deleted || !held.deleted), "a change never takes a message back");
            app.get(c.conversationId)!.set(c.seq, next);
          }
          receipts.push(...step.reads);
        };

        for (const a of actions) {
          const server = servers[a.conv]!;
          const id = server.id;
          if (a.kind === "advance") {
            server.advance();
          } else if (a.kind === "message") {
            // A push of a message that exists, as it was when sent.
            if (server.sent.length === 0) continue;
            const m = server.sent[a.pick % server.sent.length]!;
            take(reduce(state, a.light ? light(id, m.seq) : full(m)));
          } else if (a.kind === "change") {
            // A push of a change that happened, with the message right after it.
            if (server.changes.length === 0) continue;
            const c = server.changes[a.pick % server.changes.length]!;
            const event = { type: c.type, conversationId: id, changeSeq: c.changeSeq, seq: c.seq } as const;
            take(reduce(state, a.light ? event : { ...event, message: c.message }));
          } else if (a.kind === "read") {
            const r = { type: "read.updated", conversationId: id, userId: USERS[a.user]!, lastReadSeq: Math.min(a.seq, server.messages.length) } as const;
            pushedReads.push(r);
            take(reduce(state, r));
          } else {
            state = fill(state, server, pageLimit, take, a.pages);
          }
        }

        // The rest happens; then the reconnect's catch-up: the inbox tells each conversation's
        // lastSeq and lastChange, then gap fill.
        for (const server of servers) {
          while (!server.finished) server.advance();
          take(observe(state, server.id, server.messages.length));
          take(observeChanges(state, server.id, server.changes.length));
          state = fill(state, server, pageLimit, take);
        }

        // Same contents as a fresh fetch: every message once, in its current version; every
        // change since the stale point once, in order; the watermarks at lastSeq and lastChange.
        for (const server of servers) {
          const id = server.id;
          assert.deepEqual([...app.get(id)!.values()], server.messages);
          assert.equal(changesSeen.get(id), server.changes.length);
          const got = state.conversations.get(id)!;
          assert.deepEqual(
            [got.delivered, got.lastSeq, got.changed, got.lastChange, got.ahead.size, got.changesAhead.size],
            [server.messages.length, server.messages.length, server.changes.length, server.changes.length, 0, 0],
          );
          assert.ok(stale.get(id)!.change <= server.changes.length);
        }

        // Read receipts: each emitted one moved a watermark up; the last known is the highest seen.
        const high = new Map<string, number>();
        for (const r of receipts) {
          const k = `${r.conversationId}/${r.userId}`;
          assert.ok(r.lastReadSeq > (high.get(k) ?? -1), "a receipt is emitted only when it advances");
          high.set(k, r.lastReadSeq);
        }
        for (const r of pushedReads) assert.ok(state.conversations.get(r.conversationId)!.reads.get(r.userId)! >= r.lastReadSeq);
      }),
      { numRuns: 500 },
    );
  });
});
