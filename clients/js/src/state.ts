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

import type { Message, MessageNewEvent, ReadUpdatedEvent, ReadStates, ServerEvent } from "./types.js";

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
}

/** A page of history for one conversation (a `GET …/messages` answer plus its conversation id). */
export interface ConversationPage {
  readonly conversationId: string;
  readonly messages: readonly Message[];
  readonly lastSeq: number;
}

export function initialState(): ChatState {
  return { conversations: new Map() };
}

const EMPTY_AHEAD: ReadonlyMap<number, Message> = new Map();
const EMPTY_READS: ReadonlyMap<string, number> = new Map();

function emptyConversation(delivered: number | null): ConversationState {
  return { delivered, lastSeq: delivered ?? 0, ahead: EMPTY_AHEAD, reads: EMPTY_READS };
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
  return {
    conversationId: e.conversationId,
    seq: e.seq,
    clientMsgId: e.clientMsgId,
    senderId: e.senderId,
    body: e.body,
    createdAt: e.createdAt,
  };
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
function takeMessage(
  conv: ConversationState | undefined,
  seq: number,
  message: Message | null,
  out: Message[],
): ConversationState {
  // First sight of a conversation through a live event: start from this message. (Conversations the
  // app listed or opened through the REST API already have a starting point; see `observe`.)
  const base = conv ?? emptyConversation(null);
  const delivered = base.delivered ?? seq - 1;
  const lastSeq = Math.max(base.lastSeq, seq, delivered);
  if (seq <= delivered || message === null || base.ahead.has(seq)) {
    return { ...base, delivered, lastSeq };
  }
  const ahead = new Map(base.ahead);
  ahead.set(seq, message);
  return drain({ ...base, delivered, lastSeq, ahead }, out);
}

/** Moves the contiguous run above `delivered` out of `ahead` into `out`. */
function drain(conv: ConversationState, out: Message[]): ConversationState {
  let delivered = conv.delivered;
  if (delivered === null || !conv.ahead.has(delivered + 1)) return conv;
  const ahead = new Map(conv.ahead);
  for (let next = ahead.get(delivered + 1); next !== undefined; next = ahead.get(delivered + 1)) {
    out.push(next);
    ahead.delete(delivered + 1);
    delivered += 1;
  }
  return { ...conv, delivered, ahead: ahead.size === 0 ? EMPTY_AHEAD : ahead };
}

/** Applies one push event (docs/api.md §15.2). Membership events change nothing here: the client passes them on. */
export function reduce(state: ChatState, event: ServerEvent): Step {
  const messages: Message[] = [];
  const reads: ReadUpdatedEvent[] = [];
  const id = event.conversationId;
  if (typeof id !== "string") return { state, messages, reads };
  const conv = state.conversations.get(id);

  if (event.type === "message.new") {
    if (!isSeq(event.seq) || event.seq === 0) return { state, messages, reads };
    const next = takeMessage(conv, event.seq, messageOf(event), messages);
    return { state: withConversation(state, id, next), messages, reads };
  }

  if (event.type === "read.updated") {
    if (!isSeq(event.lastReadSeq) || typeof event.userId !== "string") return { state, messages, reads };
    const base = conv ?? emptyConversation(null);
    const known = base.reads.get(event.userId);
    if (known !== undefined && known >= event.lastReadSeq) return { state, messages, reads };
    const nextReads = new Map(base.reads);
    nextReads.set(event.userId, event.lastReadSeq);
    // A watermark never exceeds lastSeq, so a receipt for N also says message N exists: if its push
    // was lost, the gap shows here instead of waiting for the next message.
    const lastSeq = base.delivered === null ? base.lastSeq : Math.max(base.lastSeq, event.lastReadSeq);
    reads.push(event);
    return { state: withConversation(state, id, { ...base, lastSeq, reads: nextReads }), messages, reads };
  }

  return { state, messages, reads };
}

/**
 * Applies a page of history fetched to fill a gap (`afterSeq = delivered`) or to fetch light
 * payloads' content: its messages are delivered from `delivered + 1` on, and its `lastSeq` may
 * reveal more to fetch.
 */
export function applyPage(state: ChatState, page: ConversationPage): Step {
  const messages: Message[] = [];
  let conv = state.conversations.get(page.conversationId);
  for (const m of page.messages) {
    if (m.conversationId === page.conversationId && isSeq(m.seq) && m.seq > 0) {
      conv = takeMessage(conv, m.seq, m, messages);
    }
  }
  conv ??= emptyConversation(null);
  if (isSeq(page.lastSeq) && page.lastSeq > conv.lastSeq) conv = { ...conv, lastSeq: page.lastSeq };
  return { state: withConversation(state, page.conversationId, conv), messages, reads: [] };
}

/**
 * Takes in what a REST answer says about a conversation the app itself asked for: its `lastSeq`
 * (inbox, getConversation, …) and, for history pages the app fetched, `through` = the newest seq the
 * app now holds. A conversation seen for the first time starts at `through`, else at `lastSeq` (the
 * app has its summary; messages after it are news). For a known conversation, `through` moves the
 * watermark up (the app has those messages already) and a higher `lastSeq` marks a gap to fill.
 */
export function observe(
  state: ChatState,
  conversationId: string,
  lastSeq: number,
  through?: number,
): Step {
  const messages: Message[] = [];
  if (!isSeq(lastSeq)) return { state, messages, reads: [] };
  const known = state.conversations.get(conversationId);
  const base = known ?? emptyConversation(null);
  let delivered = base.delivered;
  if (delivered === null) delivered = through ?? lastSeq;
  else if (through !== undefined && through > delivered) delivered = through;
  let ahead = base.ahead;
  if (ahead.size > 0 && delivered !== base.delivered) {
    const kept = new Map<number, Message>();
    for (const [seq, m] of ahead) if (seq > delivered) kept.set(seq, m);
    ahead = kept;
  }
  const conv = drain(
    { ...base, delivered, ahead, lastSeq: Math.max(base.lastSeq, lastSeq, delivered) },
    messages,
  );
  return { state: withConversation(state, conversationId, conv), messages, reads: [] };
}

/** Takes in every member's watermark from `GET …/reads` (no events: the app has the answer). */
export function observeReads(state: ChatState, r: ReadStates): ChatState {
  const base = state.conversations.get(r.conversationId) ?? emptyConversation(null);
  const reads = new Map(base.reads);
  for (const m of r.members) {
    if (isSeq(m.lastReadSeq) && (reads.get(m.userId) ?? -1) < m.lastReadSeq) reads.set(m.userId, m.lastReadSeq);
  }
  const lastSeq = base.delivered === null ? base.lastSeq : Math.max(base.lastSeq, r.lastSeq);
  return withConversation(state, r.conversationId, { ...base, reads, lastSeq });
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
