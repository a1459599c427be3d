// An in-memory model of the chat API (docs/api.md) for unit tests: a `fetch` that answers the REST
// routes the SDK calls, and a `WebSocket` class whose sockets the test pushes events into. Bearer
// tokens are simply the user id. Tests inject failures with `failNext`, and read the request log.

import type { Change, ChangeType, Conversation, Message, ServerEvent } from "../../src/index.js";
import type { WebSocketLike } from "../../src/client.js";

interface StoredConversation {
  conversationId: string;
  type: "direct" | "group";
  title?: string;
  memberIds: string[];
  messages: Message[];
  reads: Map<string, number>;
  createdAt: string;
  byClientMsgId: Map<string, Message>;
  /** The change log: entry N has changeSeq N + 1. */
  changes: Change[];
  /** Who reacted with what, per message seq. */
  reactors: Map<number, Map<string, Set<string>>>;
  byClientChangeId: Map<string, { body?: string; message: Message }>;
}

export interface LoggedRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  user: string;
  body: unknown;
  headers: Record<string, string>;
  /** Date.now() when it came in. */
  at: number;
}

/** A canned answer for the next matching request, instead of the model's. */
export interface Fault {
  match?: (r: LoggedRequest) => boolean;
  /** `"network"`: fetch rejects, as with a connection reset. */
  respond: "network" | { status: number; body?: unknown; headers?: Record<string, string> };
}

const T0 = Date.parse("2026-01-01T00:00:00Z");

export class FakeChatServer {
  readonly conversations = new Map<string, StoredConversation>();
  readonly requests: LoggedRequest[] = [];
  readonly sockets: FakeSocket[] = [];
  private faults: Fault[] = [];
  private clock = 0;
  private ids = 0;
  /** While true, new sockets fail to open (as when the network is down). */
  refuseConnections = false;
  /** Also push each message sent through the REST API (and each change) to the members' open sockets. */
  autoPush = false;
  /** Push changes in the light form `{type, conversationId, changeSeq, seq}`. */
  lightChanges = false;

  readonly fetch: typeof fetch = async (input, init) => this.handle(String(input), init ?? {});

  /** A WebSocket class whose instances connect to this server. */
  readonly WebSocket = ((server: FakeChatServer) =>
    class extends FakeSocket {
      constructor(url: string) {
        super(server, url);
      }
    })(this);

  private now(): string {
    return new Date(T0 + ++this.clock * 1000).toISOString();
  }

  failNext(...faults: Fault[]): void {
    this.faults.push(...faults);
  }

  // ---- direct manipulation by tests ----

  createConversation(memberIds: string[], type: "direct" | "group" = "group"): string {
    const id = `c${++this.ids}`;
    this.conversations.set(id, {
      conversationId: id,
      type,
      ...(type === "group" ? { title: `Group ${id}` } : {}),
      memberIds: [...memberIds],
      messages: [],
      reads: new Map(memberIds.map((m) => [m, 0])),
      createdAt: this.now(),
      byClientMsgId: new Map(),
      changes: [],
      reactors: new Map(),
      byClientChangeId: new Map(),
    });
    return id;
  }

  /** Stores a message as the server would (next seq, sender has read it); returns it. */
  addMessage(conversationId: string, senderId: string, body = `message from ${senderId}`, clientMsgId?: string): Message {
    const c = this.conversations.get(conversationId)!;
    const m: Message = {
      conversationId,
      seq: c.messages.length + 1,
      clientMsgId: clientMsgId ?? `00000000-0000-4000-8000-${String(++this.ids).padStart(12, "0")}`,
      senderId,
      body,
      createdAt: this.now(),
      version: 1,
    };
    c.messages.push(m);
    c.byClientMsgId.set(m.clientMsgId, m);
    c.reads.set(senderId, m.seq);
    if (this.autoPush) for (const u of c.memberIds) this.push(u, { type: "message.new", ...m });
    return m;
  }

  /**
   * Changes a message as the server would and logs the change; returns it, or null when
   * nothing changed (a deleted message's repeat delete, a reaction the user already has or has not).
   */
  change(conversationId: string, seq: number, type: ChangeType, userId: string, arg = ""): Change | null {
    const c = this.conversations.get(conversationId)!;
    const old = c.messages[seq - 1]!;
    let m: Message;
    if (type === "message.edited") {
      if (old.deleted) return null;
      m = { ...old, body: arg, version: old.version + 1, editedAt: this.now() };
    } else if (type === "message.deleted") {
      if (old.deleted) return null;
      const { reactions: _, ...rest } = old;
      m = { ...rest, body: "", deleted: true };
      c.reactors.delete(seq);
    } else {
      if (old.deleted) return null;
      const byReaction = c.reactors.get(seq) ?? new Map<string, Set<string>>();
      c.reactors.set(seq, byReaction);
      const users = byReaction.get(arg) ?? new Set<string>();
      if ((type === "reaction.added") === users.has(userId)) return null;
      if (type === "reaction.added") users.add(userId);
      else users.delete(userId);
      byReaction.set(arg, users);
      const reactions = [...byReaction].filter(([, u]) => u.size > 0).map(([reaction, u]) => ({ reaction, count: u.size }));
      const { reactions: _, ...rest } = old;
      m = reactions.length > 0 ? { ...rest, reactions } : rest;
    }
    c.messages[seq - 1] = m;
    const change: Change = {
      changeSeq: c.changes.length + 1,
      type,
      seq,
      userId,
      ...(type.startsWith("reaction.") ? { reaction: arg } : {}),
      at: this.now(),
      message: m,
    };
    c.changes.push(change);
    if (this.autoPush) for (const u of c.memberIds) this.push(u, this.changeEvent(conversationId, change));
    return change;
  }

  /** The push of a change: full, or light when `lightChanges`. */
  changeEvent(conversationId: string, change: Change): Record<string, unknown> {
    const { type, changeSeq, seq, message } = change;
    return this.lightChanges ? { type, conversationId, changeSeq, seq } : { type, conversationId, changeSeq, seq, message };
  }

  changeRequests(conversationId?: string): LoggedRequest[] {
    return this.requests.filter(
      (r) => r.method === "GET" && /\/changes$/.test(r.path) && (!conversationId || r.path.includes(`/${conversationId}/`)),
    );
  }

  /** Sends an event (or a raw frame) to every open socket of `userId`. */
  push(userId: string, event: ServerEvent | Record<string, unknown> | string): void {
    const frame = typeof event === "string" ? event : JSON.stringify(event);
    for (const s of this.openSockets(userId)) s.deliver(frame);
  }

  openSockets(userId?: string): FakeSocket[] {
    return this.sockets.filter((s) => s.readyState === 1 && (userId === undefined || s.user === userId));
  }

  historyRequests(conversationId?: string): LoggedRequest[] {
    return this.requests.filter(
      (r) => r.method === "GET" && /\/messages$/.test(r.path) && (!conversationId || r.path.includes(`/${conversationId}/`)),
    );
  }

  // ---- the REST API ----

  private async handle(url: string, init: RequestInit): Promise<Response> {
    const u = new URL(url);
    const headers = Object.fromEntries(Object.entries((init.headers ?? {}) as Record<string, string>));
    const auth = headers.Authorization ?? headers.authorization ?? "";
    const req: LoggedRequest = {
      method: init.method ?? "GET",
      path: u.pathname,
      query: u.searchParams,
      user: auth.replace(/^Bearer /, ""),
      body: typeof init.body === "string" ? JSON.parse(init.body) : undefined,
      headers,
      at: Date.now(),
    };
    this.requests.push(req);
    await Promise.resolve(); // answer asynchronously, as a network would

    const i = this.faults.findIndex((f) => !f.match || f.match(req));
    if (i >= 0) {
      const [fault] = this.faults.splice(i, 1);
      if (fault!.respond === "network") throw new TypeError("fetch failed");
      const r = fault!.respond;
      return json(r.status, r.body, r.headers);
    }
    if (!req.user) return error(401, "unauthorized", "missing token");
    return this.route(req);
  }

  /** Blocks, bans, reports and moderation (docs/api.md §27–§30): answered as the API does, nothing kept. */
  private safety(r: LoggedRequest, parts: string[]): Response | undefined {
    const words = ["blocks", "bans", "messages", "reports", "suspensions"];
    const key = `${r.method} ${parts.map((p, i) => (i === 0 || words.includes(p) ? p : "*")).join("/")}`;
    const done = () => new Response(null, { status: 204 });
    const routes: Record<string, () => Response> = {
      "PUT me/blocks/*": done,
      "DELETE me/blocks/*": done,
      "GET me/blocks": () => json(200, { blocks: [], nextCursor: null }),
      "POST conversations/*/bans/*": done,
      "DELETE conversations/*/bans/*": done,
      "POST conversations/*/messages/*/reports": () => json(202, { reportId: "r1", createdAt: "2026-01-01T00:00:00.000Z" }),
      "GET moderation/reports": () => json(200, { reports: [], nextCursor: null }),
      "PUT moderation/suspensions/*": done,
      "DELETE moderation/suspensions/*": done,
    };
    return routes[key]?.();
  }

  private route(r: LoggedRequest): Response {
    const parts = r.path.split("/").filter(Boolean).map(decodeURIComponent);
    if (r.method === "GET" && parts[0] === "inbox") return this.inbox(r);
    const safety = this.safety(r, parts);
    if (safety) return safety;
    if (parts[0] !== "conversations") return error(404, "not_found", "no such route");
    if (parts.length === 1 && r.method === "POST") return this.create(r);
    const c = this.conversations.get(parts[1]!);
    if (!c || !c.memberIds.includes(r.user)) return error(404, "not_found", "conversation not found");
    const sub = parts[2];
    if (sub === undefined && r.method === "GET") return json(200, this.view(c));
    if (sub === "messages" && r.method === "POST") return this.send(c, r);
    if (sub === "messages" && r.method === "GET" && parts.length === 3) return this.history(c, r);
    if (sub === "messages" && parts.length >= 4) return this.messageRoute(c, r, parts);
    if (sub === "changes" && r.method === "GET") {
      const after = Number(r.query.get("afterChange") ?? 0);
      const limit = Number(r.query.get("limit") ?? 50);
      const rest = c.changes.filter((x) => x.changeSeq > after);
      return json(200, { changes: rest.slice(0, limit), lastChange: c.changes.length, hasMore: rest.length > limit });
    }
    if (sub === "read" && r.method === "POST") {
      const seq = (r.body as { seq: number }).seq;
      const before = c.reads.get(r.user) ?? 0;
      const after = Math.max(before, Math.min(seq, c.messages.length));
      c.reads.set(r.user, after);
      return json(200, { conversationId: c.conversationId, lastReadSeq: after, advanced: after > before });
    }
    if (sub === "reads" && r.method === "GET") {
      return json(200, {
        conversationId: c.conversationId,
        lastSeq: c.messages.length,
        members: c.memberIds.map((userId) => ({ userId, lastReadSeq: c.reads.get(userId) ?? 0 })),
      });
    }
    if (sub === "members" && r.method === "POST" && parts.length === 3) {
      for (const u of (r.body as { userIds: string[] }).userIds) {
        if (!c.memberIds.includes(u)) {
          c.memberIds.push(u);
          c.reads.set(u, c.messages.length);
        }
      }
      return json(200, this.view(c));
    }
    if (sub === "members" && r.method === "DELETE" && parts.length === 4) {
      c.memberIds = c.memberIds.filter((m) => m !== parts[3]);
      return new Response(null, { status: 204 });
    }
    return error(404, "not_found", "no such route");
  }

  /** `…/messages/{seq}` (PATCH, DELETE) and `…/messages/{seq}/reactions[/{reaction}]` (PUT, DELETE, GET). */
  private messageRoute(c: StoredConversation, r: LoggedRequest, parts: string[]): Response {
    const seq = Number(parts[3]);
    const m = c.messages[seq - 1];
    if (!Number.isSafeInteger(seq) || !m) return error(404, "not_found", "message not found");
    if (parts.length === 4 && (r.method === "PATCH" || r.method === "DELETE")) {
      const id = r.method === "PATCH" ? (r.body as { clientChangeId: string }).clientChangeId : r.query.get("clientChangeId");
      const body = r.method === "PATCH" ? (r.body as { body: string }).body : undefined;
      if (!id) return error(400, "invalid_request", "clientChangeId is required");
      const replay = c.byClientChangeId.get(id);
      if (replay) return replay.body === body ? json(200, replay.message) : error(409, "conflict", "clientChangeId reused");
      if (m.senderId !== r.user) return error(403, "forbidden", "not your message");
      if (body !== undefined && m.deleted) return error(409, "conflict", "message is deleted");
      this.change(c.conversationId, seq, body !== undefined ? "message.edited" : "message.deleted", r.user, body);
      const message = c.messages[seq - 1]!;
      c.byClientChangeId.set(id, { ...(body !== undefined ? { body } : {}), message });
      return json(200, message);
    }
    if (parts[4] === "reactions" && parts.length === 6 && (r.method === "PUT" || r.method === "DELETE")) {
      this.change(c.conversationId, seq, r.method === "PUT" ? "reaction.added" : "reaction.removed", r.user, parts[5]);
      return json(200, { conversationId: c.conversationId, seq, reactions: c.messages[seq - 1]!.reactions ?? [] });
    }
    if (parts[4] === "reactions" && parts.length === 5 && r.method === "GET") {
      const only = r.query.get("reaction");
      const reactions = [...(c.reactors.get(seq) ?? [])]
        .filter(([reaction]) => only === null || reaction === only)
        .flatMap(([reaction, users]) => [...users].map((userId) => ({ userId, reaction })));
      return json(200, { reactions, nextCursor: null });
    }
    return error(404, "not_found", "no such route");
  }

  private create(r: LoggedRequest): Response {
    const b = r.body as { type: string; peerId?: string; title?: string; memberIds?: string[] };
    if (b.type === "direct") {
      const pair = [r.user, b.peerId!].sort();
      for (const c of this.conversations.values()) {
        if (c.type === "direct" && [...c.memberIds].sort().join() === pair.join()) return json(200, this.view(c));
      }
      return json(201, this.view(this.conversations.get(this.createConversation(pair, "direct"))!));
    }
    const id = this.createConversation([r.user, ...(b.memberIds ?? []).filter((m) => m !== r.user)]);
    const c = this.conversations.get(id)!;
    c.title = b.title;
    return json(201, this.view(c));
  }

  private send(c: StoredConversation, r: LoggedRequest): Response {
    const b = r.body as { clientMsgId: string; body: string };
    const replay = c.byClientMsgId.get(b.clientMsgId);
    if (replay) return json(200, replay);
    return json(201, this.addMessage(c.conversationId, r.user, b.body, b.clientMsgId));
  }

  private history(c: StoredConversation, r: LoggedRequest): Response {
    const limit = Number(r.query.get("limit") ?? 50);
    const before = r.query.get("beforeSeq");
    const after = r.query.get("afterSeq");
    const all = c.messages;
    let messages: Message[];
    let hasMore: boolean;
    if (after !== null) {
      const rest = all.filter((m) => m.seq > Number(after));
      messages = rest.slice(0, limit);
      hasMore = rest.length > limit;
    } else {
      const below = before !== null ? all.filter((m) => m.seq < Number(before)) : all;
      messages = below.slice(Math.max(0, below.length - limit));
      hasMore = below.length > limit;
    }
    return json(200, { messages, lastSeq: all.length, hasMore });
  }

  private inbox(r: LoggedRequest): Response {
    const limit = Number(r.query.get("limit") ?? 20);
    const start = Number(r.query.get("cursor") ?? 0);
    const mine = [...this.conversations.values()]
      .filter((c) => c.memberIds.includes(r.user))
      .map((c) => ({ c, at: c.messages.at(-1)?.createdAt ?? c.createdAt }))
      .sort((a, b) => (a.at < b.at ? 1 : a.at > b.at ? -1 : 0));
    const page = mine.slice(start, start + limit).map(({ c }) => {
      const last = c.messages.at(-1);
      const lastReadSeq = c.reads.get(r.user) ?? 0;
      return {
        conversationId: c.conversationId,
        type: c.type,
        ...(c.title !== undefined ? { title: c.title } : {}),
        ...(c.type === "direct" ? { peerId: c.memberIds.find((m) => m !== r.user) } : {}),
        memberCount: c.memberIds.length,
        lastSeq: c.messages.length,
        lastReadSeq,
        unreadCount: c.messages.length - lastReadSeq,
        lastMessageAt: last?.createdAt ?? null,
        lastMessage: last ? { seq: last.seq, senderId: last.senderId, body: last.body.slice(0, 200), createdAt: last.createdAt } : null,
        lastChange: c.changes.length,
      };
    });
    const next = start + limit < mine.length ? String(start + limit) : null;
    return json(200, { conversations: page, nextCursor: next });
  }

  view(c: StoredConversation): Conversation {
    return {
      conversationId: c.conversationId,
      type: c.type,
      ...(c.title !== undefined ? { title: c.title } : {}),
      memberIds: [...c.memberIds],
      memberCount: c.memberIds.length,
      lastSeq: c.messages.length,
      createdAt: c.createdAt,
      lastMessageAt: c.messages.at(-1)?.createdAt ?? null,
      lastChange: c.changes.length,
    };
  }
}

/** A socket of the fake server: opens on the next tick (unless refused), receives what the test pushes. */
export class FakeSocket implements WebSocketLike {
  readyState = 0;
  readonly user: string;
  readonly url: string;
  readonly sent: string[] = [];
  /** Date.now() when the client made it. */
  readonly createdAt = Date.now();
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: unknown) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;

  constructor(server: FakeChatServer, url: string) {
    this.url = url;
    this.user = new URL(url).searchParams.get("token") ?? "";
    server.sockets.push(this);
    const refused = server.refuseConnections || this.user === "";
    setTimeout(() => {
      if (this.readyState !== 0) return;
      if (refused) {
        this.readyState = 3;
        this.onerror?.({});
        this.onclose?.({ code: 1006 });
      } else {
        this.readyState = 1;
        this.onopen?.({});
      }
    }, 0);
  }

  deliver(data: string): void {
    if (this.readyState === 1) this.onmessage?.({ data });
  }

  send(data: string): void {
    this.sent.push(data);
  }

  /** Called by the client. */
  close(): void {
    if (this.readyState >= 2) return;
    this.readyState = 3;
    setTimeout(() => this.onclose?.({ code: 1000 }), 0);
  }

  /** The server (or the network) drops the connection. */
  drop(): void {
    if (this.readyState >= 2) return;
    this.readyState = 3;
    this.onclose?.({ code: 1006 });
  }
}

function json(status: number, body?: unknown, headers: Record<string, string> = {}): Response {
  return new Response(body === undefined ? null : typeof body === "string" ? body : JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", ...headers },
  });
}

function error(status: number, code: string, message: string): Response {
  return json(status, { error: { code, message } });
}
