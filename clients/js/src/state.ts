// The client's half of the delivery contract (docs/api.md §15.3), as pure functions: no I/O, no clocks, no
// mutation. `ChatClient` keeps one `ChatState`, feeds it every push event, every page it fetches and
// every conversation summary the REST API returns, and emits what each step says is deliverable.
//
// Per conversation the state holds a watermark, `delivered`: every message with seq ≤ delivered has
// been handed to the app (as a "message" event or in a page the app fetched itself), and nothing
// above it has. Messages that arrive above delivered + 1 wait in `ahead` until the gap below them is
// filled; a message at or below the watermark is a duplicate and is dropped. Because `seq` is gap-free,
// `lastSeq > delivered` alone says messages are missing, and `afterSeq = delivered` fetches exactly
// them. So duplicates, reordering, drops (then filled) and light payloads all end in the same place:
// messages delivered once each, in seq order, up to the conversation's lastSeq.
//
// Changes to messages (edits, deletions, reactions) have a second gap-free log, `changeSeq`,
// kept the same way: a watermark `changed`, changes above it held in `changesAhead`, `lastChange`
// above it meaning changes are missing (fetched with `afterChange = changed`). One more rule ties the
// two logs together: a change is delivered only once the message it changes has been (its seq ≤
// delivered), so the app always holds the message a change is about; a message delivered while
// changes of it are held comes out with them applied. `applyChange` is how a held message takes a
// change: the newer state wins (a higher `version`; a tombstone is final), repeats change nothing.

import type {
  Change,
  Message,
  MessageChange,
  MessageNewEvent,
  ReadUpdatedEvent,
  ReadStates,
  ServerEvent,
} from "./types.js";

export interface ConversationState {
  /**
   * Every message with seq ≤ delivered has been delivered, in order. `null` until the client has a
   * starting point for this conversation (e.g. it has only seen a read receipt of it).
   */
  readonly delivered: number | null;
  /** The highest seq known to exist (from events, pages, summaries). */
  readonly lastSeq: number;
  /** Messages received above `delivered + 1`, by seq, waiting for the gap below them. */
  readonly ahead: ReadonlyMap<number, Message>;
  /** Read watermarks per member, as far as this client knows them (they only grow). */
  readonly reads: ReadonlyMap<string, number>;
  /** Every change with changeSeq ≤ changed has been delivered, in order; `null` until a starting point. */
  readonly changed: number | null;
  /** The highest changeSeq known to exist. */
  readonly lastChange: number;
  /** Changes received above `changed + 1`, or whose message is not delivered yet, by changeSeq. */
  readonly changesAhead: ReadonlyMap<number, MessageChange>;
}

export interface ChatState {
  readonly conversations: ReadonlyMap<string, ConversationState>;
}

/** What one step produced: the next state, and what the app should now be told, in this order. */
export interface Step {
  readonly state: ChatState;
  /** Newly deliverable messages, ascending seq, per conversation contiguous with what came before. */
  readonly messages: Message[];
  /** Read receipts that moved a watermark this client knew (repeats and stale ones are dropped). */
  readonly reads: ReadUpdatedEvent[];
  /** Newly deliverable changes, ascending changeSeq per conversation; each after its message. */
  readonly changes: MessageChange[];
}

/** A page of history for one conversation (a `GET …/messages` answer plus its conversation id). */
export interface ConversationPage {
  readonly conversationId: string;
  readonly messages: readonly Message[];
  readonly lastSeq: number;
}

/** A page of the change log for one conversation (a `GET …/changes` answer plus its conversation id). */
export interface ConversationChanges {
  readonly conversationId: string;
  readonly changes: readonly Change[];
  readonly lastChange: number;
}

export function initialState(): ChatState {
  return { conversations: new Map() };
}

const EMPTY_AHEAD: ReadonlyMap<number, Message> = new Map();
const EMPTY_READS: ReadonlyMap<string, number> = new Map();
const EMPTY_CHANGES: ReadonlyMap<number, MessageChange> = new Map();
const CHANGE_TYPES = new Set(["message.edited", "message.deleted", "reaction.added", "reaction.removed"]);

function emptyConversation(): ConversationState {
  return {
    delivered: null,
    lastSeq: 0,
    ahead: EMPTY_AHEAD,
    reads: EMPTY_READS,
    changed: null,
    lastChange: 0,
    changesAhead: EMPTY_CHANGES,
  };
}

function done(state: ChatState): Step {
  return { state, messages: [], reads: [], changes: [] };
}

function isSeq(n: unknown): n is number {
  return typeof n === "number" && Number.isSafeInteger(n) && n >= 0;
}

/** The message a full `message.new` carries, or null for the light form (content to be fetched). */
export function messageOf(e: MessageNewEvent): Message | null {
  if (
    typeof e.body !== "string" ||
    typeof e.senderId !== "string" ||
    typeof e.clientMsgId !== "string" ||
    typeof e.createdAt !== "string"
  ) {
    return null;
  }
  const { type: _, ...message } = e;
  return message as Message;
}

/**
 * A message the app holds, after a change to it (or any newer copy: `{ message }`, e.g. what `edit`
 * answered): the change's message if it is at least as new, else `held` itself. A higher `version`
 * wins, a lower one loses, a tombstone is final; at the same version the change's copy wins (its
 * reactions are the later ones once changes come in order). Idempotent: a repeat changes nothing.
 */
export function applyChange(held: Message, change: { message?: Message }): Message {
  const m = change.message;
  if (!m || m.seq !== held.seq || m.conversationId !== held.conversationId) return held;
  return held.deleted || (m.version ?? 1) < (held.version ?? 1) ? held : m;
}

function withConversation(state: ChatState, id: string, conv: ConversationState): ChatState {
  const conversations = new Map(state.conversations);
  conversations.set(id, conv);
  return { conversations };
}

/**
 * Takes one message (or, with `message` null, just the news that `seq` exists) into a conversation,
 * then delivers whatever became contiguous.
 */
function takeMessage(conv: ConversationState | undefined, seq: number, message: Message | null, out: Step): ConversationState {
  // First sight of a conversation through a live event: start from this message. (Conversations the
  // app listed or opened through the REST API already have a starting point; see `observe`.) Its
  // changes then start from the first: the app holds this message as it is now, and every change
  // after it must come, whenever the change log's length is learnt (a summary must not count
  // changes missed meanwhile as delivered; changes of messages the app does not hold come too, as
  // they do for any conversation).
  const base = conv ?? emptyConversation();
  const delivered = base.delivered ?? seq - 1;
  const next = { ...base, delivered, lastSeq: Math.max(base.lastSeq, seq, delivered), changed: base.changed ?? 0 };
  if (seq <= delivered || message === null || base.ahead.has(seq)) return next;
  return drain({ ...next, ahead: new Map(base.ahead).set(seq, message) }, out);
}

/**
 * Takes one change (or, with `change` null, just the news that `changeSeq` exists: a light push) into
 * a conversation, then delivers whatever became deliverable. A change of message `seq` also says
 * that message exists.
 */
function takeChange(
  conv: ConversationState | undefined,
  changeSeq: number,
  seq: number,
  change: MessageChange | null,
  out: Step,
): ConversationState {
  const base = conv ?? emptyConversation();
  // First sight of the conversation through a change: its messages start at the changed one, which
  // the app must get before the change (a later summary's lastSeq must not count it as delivered),
  // and its changes at the first, as for a message (`takeMessage`): the messages pushed next are as
  // sent, so an earlier change (e.g. a deletion, pushed late) must still come to them.
  const changed = base.changed ?? 0;
  const delivered = base.delivered ?? Math.max(0, seq - 1);
  const next = {
    ...base,
    delivered,
    changed,
    lastChange: Math.max(base.lastChange, changeSeq),
    lastSeq: Math.max(base.lastSeq, seq, delivered),
  };
  if (changeSeq <= changed || change === null || base.changesAhead.has(changeSeq)) return next;
  return drain({ ...next, changesAhead: new Map(base.changesAhead).set(changeSeq, change) }, out);
}

/**
 * Moves the contiguous run above `delivered` out of `ahead` into `out.messages` (each with the changes
 * held for it applied), then the changes that became deliverable into `out.changes`: the run above
 * `changed` whose messages have been delivered.
 */
function drain(conv: ConversationState, out: Step): ConversationState {
  let { delivered, changed } = conv;
  const due = (mark: number | null, held: ReadonlyMap<number, unknown>) => mark !== null && held.has(mark + 1);
  if (!due(delivered, conv.ahead) && !due(changed, conv.changesAhead)) return conv;
  const ahead = new Map(conv.ahead);
  const changesAhead = new Map(conv.changesAhead);
  if (delivered !== null) {
    for (let next = ahead.get(delivered + 1); next !== undefined; next = ahead.get(delivered + 1)) {
      const seq = next.seq;
      out.messages.push(
        [...changesAhead.values()]
          .filter((c) => c.seq === seq)
          .sort((a, b) => a.changeSeq - b.changeSeq)
          .reduce(applyChange, next),
      );
      ahead.delete(++delivered);
    }
  }
  if (changed !== null) {
    for (
      let c = changesAhead.get(changed + 1);
      c && (delivered === null || c.seq <= delivered);
      c = changesAhead.get(changed + 1)
    ) {
      out.changes.push(c);
      changesAhead.delete(++changed);
    }
  }
  return {
    ...conv,
    delivered,
    changed,
    ahead: ahead.size === 0 ? EMPTY_AHEAD : ahead,
    changesAhead: changesAhead.size === 0 ? EMPTY_CHANGES : changesAhead,
  };
}

/** Applies one push event (docs/api.md §15.2, and the message changes). Membership events change nothing here: the client passes them on. */
export function reduce(state: ChatState, event: ServerEvent): Step {
  const out = done(state);
  const id = event.conversationId;
  if (typeof id !== "string") return out;
  const conv = state.conversations.get(id);

  if (event.type === "message.new") {
    if (!isSeq(event.seq) || event.seq === 0) return out;
    return { ...out, state: withConversation(state, id, takeMessage(conv, event.seq, messageOf(event), out)) };
  }

  if (event.type === "read.updated") {
    if (!isSeq(event.lastReadSeq) || typeof event.userId !== "string") return out;
    const base = conv ?? emptyConversation();
    const known = base.reads.get(event.userId);
    if (known !== undefined && known >= event.lastReadSeq) return out;
    const nextReads = new Map(base.reads);
    nextReads.set(event.userId, event.lastReadSeq);
    // A watermark never exceeds lastSeq, so a receipt for N also says message N exists: if its push
    // was lost, the gap shows here instead of waiting for the next message.
    const lastSeq = base.delivered === null ? base.lastSeq : Math.max(base.lastSeq, event.lastReadSeq);
    out.reads.push(event);
    return { ...out, state: withConversation(state, id, { ...base, lastSeq, reads: nextReads }) };
  }

  if (CHANGE_TYPES.has(event.type) && "changeSeq" in event) {
    const { changeSeq, seq, message } = event;
    if (!isSeq(changeSeq) || changeSeq === 0 || !isSeq(seq) || seq === 0) return out;
    // The light form (no message, or not this one) only says the change exists: it is fetched.
    const full = typeof message === "object" && message !== null && message.seq === seq && message.conversationId === id;
    const next = takeChange(conv, changeSeq, seq, full ? (event as MessageChange) : null, out);
    return { ...out, state: withConversation(state, id, next) };
  }

  return out;
}

/**
 * Applies a page of history fetched to fill a gap (`afterSeq = delivered`) or to fetch light
 * payloads' content: its messages are delivered from `delivered + 1` on, and its `lastSeq` may
 * reveal more to fetch.
 */
export function applyPage(state: ChatState, page: ConversationPage): Step {
  const out = done(state);
  let conv = state.conversations.get(page.conversationId);
  for (const m of page.messages) {
    if (m.conversationId === page.conversationId && isSeq(m.seq) && m.seq > 0) conv = takeMessage(conv, m.seq, m, out);
  }
  conv ??= emptyConversation();
  if (isSeq(page.lastSeq) && page.lastSeq > conv.lastSeq) conv = { ...conv, lastSeq: page.lastSeq };
  return { ...out, state: withConversation(state, page.conversationId, conv) };
}

/**
 * Applies a page of the change log fetched to fill a gap (`afterChange = changed`) or to fetch light
 * changes: its changes are delivered from `changed + 1` on (each once its message is), and its
 * `lastChange` may reveal more to fetch.
 */
export function applyChanges(state: ChatState, page: ConversationChanges): Step {
  const out = done(state);
  const conversationId = page.conversationId;
  let conv = state.conversations.get(conversationId);
  for (const c of page.changes) {
    if (isSeq(c.changeSeq) && c.changeSeq > 0 && isSeq(c.seq) && c.seq > 0 && c.message?.seq === c.seq) {
      conv = takeChange(conv, c.changeSeq, c.seq, { ...c, conversationId }, out);
    }
  }
  conv ??= emptyConversation();
  if (isSeq(page.lastChange) && page.lastChange > conv.lastChange) conv = { ...conv, lastChange: page.lastChange };
  return { ...out, state: withConversation(state, conversationId, conv) };
}

/**
 * Takes in what a REST answer says about a conversation the app itself asked for: its `lastSeq`
 * (inbox, getConversation, …) and, for history pages the app fetched, `through` = the newest seq the
 * app now holds. A conversation seen for the first time starts at `through`, else at `lastSeq` (the
 * app has its summary; messages after it are news). For a known conversation, `through` moves the
 * watermark up (the app has those messages already) and a higher `lastSeq` marks a gap to fill.
 */
export function observe(state: ChatState, conversationId: string, lastSeq: number, through?: number): Step {
  return watch(state, conversationId, lastSeq, through, false);
}

/** The same as `observe` for the change log: a summary's `lastChange`, or a changes page the app fetched. */
export function observeChanges(state: ChatState, conversationId: string, lastChange: number, through?: number): Step {
  return watch(state, conversationId, lastChange, through, true);
}

function watch(state: ChatState, conversationId: string, last: number, through: number | undefined, changes: boolean): Step {
  const out = done(state);
  if (!isSeq(last)) return out;
  const base = state.conversations.get(conversationId) ?? emptyConversation();
  const was = changes ? base.changed : base.delivered;
  let mark = was;
  if (mark === null) mark = through ?? last;
  else if (through !== undefined && through > mark) mark = through;
  const held: ReadonlyMap<number, unknown> = changes ? base.changesAhead : base.ahead;
  const kept = new Map([...held].filter(([k]) => mark === was || k > mark!));
  const high = Math.max(changes ? base.lastChange : base.lastSeq, last, mark);
  const conv = drain(
    changes
      ? { ...base, changed: mark, changesAhead: kept as Map<number, MessageChange>, lastChange: high }
      : // A history page (`through`) seen first starts the changes at the first: those made after
        // the page and before the app's first summary must come.
        { ...base, delivered: mark, ahead: kept as Map<number, Message>, lastSeq: high, changed: base.changed ?? (through === undefined ? null : 0) },
    out,
  );
  return { ...out, state: withConversation(state, conversationId, conv) };
}

/**
 * Takes in every member's watermark from `GET …/reads`. When the state held watermarks of the
 * conversation already, `reads` are those it moved, as receipts (after a reconnect: the receipts
 * whose pushes were missed); a first answer announces nothing (the app that asked has it).
 */
export function observeReads(state: ChatState, r: ReadStates): Step {
  const out = done(state);
  const base = state.conversations.get(r.conversationId) ?? emptyConversation();
  const reads = new Map(base.reads);
  for (const { userId, lastReadSeq } of r.members) {
    if (isSeq(lastReadSeq) && (reads.get(userId) ?? -1) < lastReadSeq) {
      if (base.reads.size) out.reads.push({ type: "read.updated", conversationId: r.conversationId, userId, lastReadSeq });
      reads.set(userId, lastReadSeq);
    }
  }
  const lastSeq = base.delivered === null ? base.lastSeq : Math.max(base.lastSeq, r.lastSeq);
  return { ...out, state: withConversation(state, r.conversationId, { ...base, reads, lastSeq }) };
}

/** Drops a conversation the user can no longer see (removed from it: the API answers 404). */
export function forget(state: ChatState, conversationId: string): ChatState {
  if (!state.conversations.has(conversationId)) return state;
  const conversations = new Map(state.conversations);
  conversations.delete(conversationId);
  return { conversations };
}

/**
 * The `afterSeq` to fetch for a conversation, or null when nothing is missing: known messages above
 * the watermark that the client does not hold (a gap, a light payload, news from a summary).
 */
export function missingAfter(state: ChatState, conversationId: string): number | null {
  const conv = state.conversations.get(conversationId);
  if (!conv || conv.delivered === null || conv.lastSeq <= conv.delivered) return null;
  return conv.delivered;
}

/**
 * The `afterChange` to fetch for a conversation, or null when no change is missing: the first known
 * change above the watermark that the client does not hold, minus one. (Changes held only because
 * their message is not delivered yet are not fetched again: the message's gap fill frees them.)
 */
export function missingChangesAfter(state: ChatState, conversationId: string): number | null {
  const conv = state.conversations.get(conversationId);
  if (!conv || conv.changed === null) return null;
  for (let k = conv.changed + 1; k <= conv.lastChange; k++) if (!conv.changesAhead.has(k)) return k - 1;
  return null;
}
