import { ChangeError, ChatApiError, SendError, SyncError, retryDelay } from "./errors.js";
import {
  applyChanges,
  applyPage,
  forget,
  initialState,
  messageOf,
  missingAfter,
  missingChangesAfter,
  observe,
  observeChanges,
  observeReads,
  reduce,
  type ChatState,
  type Step,
} from "./state.js";
import type {
  ChangesOptions,
  ChangesPage,
  ConnectionState,
  Conversation,
  CreateGroupInput,
  HistoryOptions,
  HistoryPage,
  InboxOptions,
  InboxPage,
  MembersEvent,
  Message,
  MessageChange,
  MessageNewEvent,
  Presence,
  ReactionsResult,
  ReactorsOptions,
  ReactorsPage,
  ReadResult,
  ReadStates,
  ReadUpdatedEvent,
  ServerEvent,
  PresenceEvent,
  HelloFrame,
  TypingEvent,
} from "./types.js";

/** What the SDK needs of a WebSocket: the browser's, or Node's `ws` package. */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

export type TokenSource = string | (() => string | Promise<string>);

export interface ChatClientOptions {
  /** REST base URL, e.g. `http://127.0.0.1:9000` or the HTTP API's invoke URL. */
  apiUrl: string;
  /** WebSocket URL, e.g. `ws://127.0.0.1:9001` (the SDK adds `?token=`). */
  wsUrl: string;
  /** A JWT, or a function returning one (sync or async), called before every request and connect. */
  token: TokenSource;
  /** Defaults to `globalThis.WebSocket`; Node 20 has none: pass `WebSocket` from the `ws` package. */
  WebSocket?: WebSocketConstructor;
  /** Defaults to `globalThis.fetch`. */
  fetch?: typeof fetch;
  /** A request without an answer after this long fails with code `timeout` (default 30 s). */
  requestTimeoutMs?: number;
  /** Retries of `send` (network errors, 429, 5xx), same clientMsgId. Default 6 attempts within 30 s. */
  sendRetry?: { maxAttempts?: number; maxElapsedMs?: number; baseDelayMs?: number };
  /** `markRead` window: one request per conversation per window, highest seq wins (default 1000 ms). */
  readDebounceMs?: number;
  /**
   * Reconnect backoff: jittered, doubling from `baseDelayMs` (500 ms) up to `maxDelayMs` (30 s); it starts
   * over only once a connection has stayed open (and caught up) for `resetAfterMs` (30 s), so a
   * connection that keeps opening and dropping backs off too. The same backoff paces the retries of a
   * conversation whose catch-up or gap fill failed.
   */
  reconnect?: { baseDelayMs?: number; maxDelayMs?: number; resetAfterMs?: number };
  /**
   * How long a gap may stay open before it is fetched (default 100 ms): lets pushes already on the way
   * close it, and folds a burst of light payloads into one history request.
   */
  gapFillDelayMs?: number;
  /**
   * Which light payloads (groups of more than 200 members push `message.new` without content) are
   * fetched as they come: `"all"` (default) for every conversation; `"watched"` only for those the
   * app has on screen (`watch`), each burst in one request after `gapFillDelayMs`. Elsewhere the
   * news is kept (the inbox's `lastSeq`, unread counts) and fetched once the conversation is
   * watched: a busy group costs nothing while nobody looks at it (docs/cost.md).
   */
  lightFetch?: "all" | "watched";
  /** Catch-up after a reconnect walks at most this many inbox pages of 100 (default 50). */
  catchUpMaxPages?: number;
  /**
   * A frame sent this often keeps the socket open (API Gateway closes one idle for 10 minutes).
   * Default 5 minutes; 0 turns it off.
   */
  keepAliveMs?: number;
}

/** The payload of each event `on` can listen to. */
export interface ChatEvents {
  /** A message, delivered once, in seq order per conversation (own messages included). */
  message: Message;
  /**
   * A change to a message (edit, deletion, reaction), delivered once per (conversationId, changeSeq),
   * in changeSeq order per conversation, and never before its message. Apply it with `applyChange`.
   */
  change: MessageChange;
  /** A member's read watermark moved (repeats and stale receipts are dropped). */
  read: ReadUpdatedEvent;
  /** Members were added to or removed from a conversation. */
  members: MembersEvent;
  /**
   * Who else is typing in a conversation changed (docs/api.md §37). Cleared (an empty set) by the SDK
   * itself when the server has not sent the set again within 6 s, so a lost frame never leaves it on.
   */
  typing: TypingEvent;
  /** A direct-conversation peer came online or went offline (docs/api.md §38; at most once per 10 s per user). */
  presence: PresenceEvent;
  connection: ConnectionState;
  /**
   * A background task failed; the SDK goes on. A debounced read mark: the `ChatApiError` (retried in a
   * later window when retryable). A conversation's catch-up or gap fill, or the inbox walk: a
   * `SyncError` (`conversationId`, `cause`), retried with backoff while the connection stays open.
   */
  error: Error;
}
export type ChatEventName = keyof ChatEvents;
type Listener<K extends ChatEventName> = (payload: ChatEvents[K]) => void;

const OPEN = 1;
/** The server drops starts closer than 2 s; a start every 2.5 s keeps the typist on (6 s expiry). */
const TYPING_REFRESH_MS = 2500;
/** A typing set not sent again within this long is stale (the server resends it every ~2 s). */
const TYPING_EXPIRY_MS = 6000;
type Timer = ReturnType<typeof setTimeout>;
interface Typer {
  /** When this client last sent `start`. */
  at?: number;
  /** A `start` went out since the last `stop`. */
  on?: boolean;
  /** A `start` after a `stop`, held until the server's throttle lets it through. */
  later?: Timer;
  expiry?: Timer;
}
const HISTORY_PAGE = 100;
const INBOX_PAGE = 100;
const CATCH_UP_PARALLEL = 4;
/** Empty `afterSeq` pages in a row (a history read trailing the push) before a fill counts as failed. */
const FILL_STALLS = 3;
/**
 * The inbox is read from an index that may trail the latest writes by a moment (docs/api.md §14), so
 * a message committed just before the catch-up's walk can be missing from it; a second look at the
 * inbox's first page (where anything that recent is) this long after opening catches it.
 */
const INBOX_RECHECK_MS = 2000;

export class ChatClient {
  /** The REST API's base URL, as given (no trailing slash). */
  readonly apiUrl: string;
  readonly #wsUrl: string;
  readonly #tokenSource: TokenSource;
  readonly #WS: WebSocketConstructor | undefined;
  /** The fetch this client calls with (its option, else the global one). */
  readonly fetch: typeof globalThis.fetch;
  readonly #requestTimeoutMs: number;
  readonly #retry: { maxAttempts: number; maxElapsedMs: number; baseDelayMs: number };
  readonly #readDebounceMs: number;
  readonly #reconnectBase: number;
  readonly #reconnectMax: number;
  readonly #reconnectResetMs: number;
  readonly #gapFillDelayMs: number;
  readonly #lightFetch: "all" | "watched";
  /** Conversations on screen (`watch`), and those whose pushes came in the light form. */
  readonly #watched = new Set<string>();
  private readonly light = new Set<string>();
  readonly #catchUpMaxPages: number;
  readonly #keepAliveMs: number;

  readonly #listeners = new Map<ChatEventName, Set<Listener<never>>>();
  private state: ChatState = initialState();

  // Read marks: the highest seq waiting per conversation, its window timer, the watermark the server
  // last confirmed (no request for anything at or below it), requests in flight (for flushReads).
  readonly #pendingReads = new Map<string, number>();
  readonly #readTimers = new Map<string, ReturnType<typeof setTimeout>>();
  readonly #readAttempts = new Map<string, number>();
  readonly #confirmedReads = new Map<string, number>();
  readonly #readsInFlight = new Set<Promise<void>>();
  /** Conversations first seen through a light push, and their events, while `#start` runs. */
  readonly #starting = new Map<string, ServerEvent[]>();

  // Live connection.
  #wanted = false;
  #ws: WebSocketLike | null = null;
  #connection: ConnectionState = "closed";
  private attempt = 0;
  /** Bumped by every openSocket and close: an attempt that awaited a token while another began is void. */
  #generation = 0;
  #reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  #keepAliveTimer: ReturnType<typeof setInterval> | undefined;
  /** The inbox's second look (INBOX_RECHECK_MS), or the retry of an inbox walk that failed. */
  #recheckTimer: ReturnType<typeof setTimeout> | undefined;
  /** Starts the reconnect backoff over once the connection has stayed open for `reconnectResetMs`. */
  #stableTimer: ReturnType<typeof setTimeout> | undefined;
  /** Live events held back while the current socket's catch-up runs. */
  private held: ServerEvent[] | null = null;
  /**
   * The open socket's `hello` frame: requests name its `connectionId` (`X-Connection-Id`), so the
   * pushes of the sends and reads among them skip this socket, which has their answers (docs/api.md
   * §15.4; other requests ignore it).
   */
  private hello: HelloFrame | null = null;
  /** The last react/unreact call per reaction path: the next one waits for it. */
  readonly #reacting = new Map<string, Promise<unknown>>();
  readonly #fillTimers = new Map<string, ReturnType<typeof setTimeout>>();
  readonly #filling = new Map<string, Promise<void>>();
  /** Per conversation whose last fill failed: failures in a row, and the earliest time to try again. */
  readonly #fillFailures = new Map<string, { count: number; retryAt: number }>();
  #waiters: { resolve: () => void; reject: (e: Error) => void }[] = [];
  /** Typing per conversation: this client's last `start`; who else types, and the timer clearing it. */
  readonly #typers = new Map<string, Typer>();

  constructor(options: ChatClientOptions) {
    this.apiUrl = options.apiUrl.replace(/\/+$/, "");
    this.#wsUrl = options.wsUrl;
    this.#tokenSource = options.token;
    this.#WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    // Bound: browsers throw "Illegal invocation" for a detached fetch.
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
    this.#retry = {
      maxAttempts: options.sendRetry?.maxAttempts ?? 6,
      maxElapsedMs: options.sendRetry?.maxElapsedMs ?? 30_000,
      baseDelayMs: options.sendRetry?.baseDelayMs ?? 250,
    };
    this.#readDebounceMs = options.readDebounceMs ?? 1000;
    this.#reconnectBase = options.reconnect?.baseDelayMs ?? 500;
    this.#reconnectMax = options.reconnect?.maxDelayMs ?? 30_000;
    this.#reconnectResetMs = options.reconnect?.resetAfterMs ?? 30_000;
    this.#gapFillDelayMs = options.gapFillDelayMs ?? 100;
    this.#lightFetch = options.lightFetch ?? "all";
    this.#catchUpMaxPages = options.catchUpMaxPages ?? 50;
    this.#keepAliveMs = options.keepAliveMs ?? 300_000;
  }

  // ---------------------------------------------------------------------------------------------
  // REST, one method per route (docs/api.md §6–§14)
  // ---------------------------------------------------------------------------------------------

  /** `POST /conversations {"type":"direct"}`: the one direct conversation with `peerId`, created if needed. */
  async openDirect(peerId: string): Promise<Conversation> {
    return this.#seen(await this.#call<Conversation>("POST", "/conversations", { type: "direct", peerId }));
  }

  /** `POST /conversations {"type":"group"}`; the caller is its owner and a member. */
  async createGroup(input: CreateGroupInput): Promise<Conversation> {
    const body: Record<string, unknown> = { type: "group", title: input.title, memberIds: input.memberIds };
    if (input.clientRequestId !== undefined) body.clientRequestId = input.clientRequestId;
    return this.#seen(await this.#call<Conversation>("POST", "/conversations", body));
  }

  /** `GET /conversations/{id}`. */
  async getConversation(conversationId: string): Promise<Conversation> {
    return this.#seen(await this.#call<Conversation>("GET", conversationPath(conversationId)));
  }

  /** `POST /conversations/{id}/members` (groups; any member may add). */
  async addMembers(conversationId: string, userIds: string[]): Promise<Conversation> {
    return this.#seen(
      await this.#call<Conversation>("POST", `${conversationPath(conversationId)}/members`, { userIds }),
    );
  }

  /** `DELETE /conversations/{id}/members/{userId}` (yourself, or anyone if you own the group). */
  async removeMember(conversationId: string, userId: string): Promise<void> {
    await this.#call("DELETE", `${conversationPath(conversationId)}/members/${encodeURIComponent(userId)}`);
  }

  /**
   * `POST /conversations/{id}/messages`. Network errors, timeouts, 429 and 5xx (503: the outcome is
   * unknown) are retried with the same `clientMsgId` (after `Retry-After` plus jitter when given;
   * `rate_limited` or `slow_mode` refusals are waited out, however many, even past
   * `sendRetry.maxElapsedMs` and `maxAttempts`, up to 2 minutes in all: nothing was stored, and the
   * server said when it is admitted), so a retry can never
   * create a second message: the server answers a replay with the original. Gives
   * up with a `SendError` carrying the `clientMsgId`: pass it back as `options.clientMsgId` to try
   * again later, just as safely.
   */
  async send(
    conversationId: string,
    body: string,
    options: { clientMsgId?: string; attachments?: string[] } = {},
  ): Promise<Message> {
    const clientMsgId = options.clientMsgId ?? randomUUID();
    const path = `${conversationPath(conversationId)}/messages`;
    const request: Record<string, unknown> = { clientMsgId, body };
    if (options.attachments?.length) request.attachments = options.attachments;
    let message: Message;
    try {
      message = await this.#withRetries(() => this.#call<Message>("POST", path, request));
    } catch (e) {
      throw new SendError(conversationId, clientMsgId, e);
    }
    // The sender's own message is news like any other: deliver it now (once; its push is then a repeat).
    this.#handleEvent({ type: "message.new", ...message });
    return message;
  }


  /**
   * `PATCH /conversations/{id}/messages/{seq}`: your own message gets a new body. Resolves with the
   * message as edited (`version` + 1, `editedAt`); the "change" event for it follows. Retried like
   * `send`, with the same `clientChangeId` (made per call unless given), so an edit lands once; gives
   * up with a `ChangeError` carrying it.
   */
  edit(conversationId: string, seq: number, body: string, options: { clientChangeId?: string } = {}): Promise<Message> {
    return this.change(conversationId, seq, options, (clientChangeId) =>
      this.#call("PATCH", messagePath(conversationId, seq), { clientChangeId, body }),
    );
  }

  /**
   * `DELETE /conversations/{id}/messages/{seq}?clientChangeId=`: your own message, or any in a group
   * you own. Resolves with the tombstone (`deleted: true`, `body: ""`, no reactions). Retried like `edit`.
   */
  delete(conversationId: string, seq: number, options: { clientChangeId?: string } = {}): Promise<Message> {
    return this.change(conversationId, seq, options, (clientChangeId) =>
      this.#call("DELETE", messagePath(conversationId, seq) + query({ clientChangeId })),
    );
  }

  private async change(
    conversationId: string,
    seq: number,
    options: { clientChangeId?: string },
    request: (clientChangeId: string) => Promise<Message>,
  ): Promise<Message> {
    const clientChangeId = options.clientChangeId ?? randomUUID();
    try {
      return await this.#withRetries(() => request(clientChangeId));
    } catch (e) {
      throw new ChangeError(conversationId, seq, clientChangeId, e);
    }
  }

  /**
   * `PUT /conversations/{id}/messages/{seq}/reactions/{reaction}`: adds your reaction (an emoji or a
   * short name, 1–32 characters). Resolves with the message's reaction counts. Adding one you have
   * changes nothing, so it is retried like `send` (network errors, 429, 5xx); `react` and `unreact`
   * of the same reaction run one after the other, so a retry never undoes a later call.
   */
  react(conversationId: string, seq: number, reaction: string): Promise<ReactionsResult> {
    return this.reaction("PUT", conversationId, seq, reaction);
  }

  /** `DELETE /conversations/{id}/messages/{seq}/reactions/{reaction}`: removes your reaction. */
  unreact(conversationId: string, seq: number, reaction: string): Promise<ReactionsResult> {
    return this.reaction("DELETE", conversationId, seq, reaction);
  }

  private reaction(method: string, conversationId: string, seq: number, reaction: string): Promise<ReactionsResult> {
    const path = `${messagePath(conversationId, seq)}/reactions/${encodeURIComponent(reaction)}`;
    const run = (this.#reacting.get(path) ?? Promise.resolve())
      .catch(() => {})
      .then(() => this.#withRetries(() => this.#call<ReactionsResult>(method, path)));
    this.#reacting.set(path, run);
    void run.finally(() => this.#reacting.get(path) === run && this.#reacting.delete(path)).catch(() => {});
    return run;
  }

  /** `GET /conversations/{id}/messages/{seq}/reactions`: who reacted (optionally with one `reaction`), paged. */
  reactions(conversationId: string, seq: number, options: ReactorsOptions = {}): Promise<ReactorsPage> {
    return this.#call(
      "GET",
      `${messagePath(conversationId, seq)}/reactions${query({
        reaction: options.reaction,
        limit: options.limit,
        cursor: options.cursor ?? undefined,
      })}`,
    );
  }

  /**
   * `GET /conversations/{id}/changes?afterChange=&limit=`: the change log, ascending changeSeq. Like
   * `history`, the changes it returns count as held by the app: live delivery goes on after them.
   */
  async changes(conversationId: string, options: ChangesOptions = {}): Promise<ChangesPage> {
    const page = await this.#call<ChangesPage>(
      "GET",
      `${conversationPath(conversationId)}/changes${query({ afterChange: options.afterChange, limit: options.limit })}`,
    );
    const newest = page.changes.at(-1)?.changeSeq;
    this.#apply(observeChanges(this.state, conversationId, page.lastChange, newest), conversationId);
    return page;
  }

  /** A conversation the app asked for: live delivery of it starts after its `lastSeq` (if not known yet). */
  #seen(c: Conversation): Conversation {
    this.#summary(c.conversationId, c.lastSeq, c.lastChange);
    return c;
  }

  /** A conversation summary's news: messages after `lastSeq`, changes after `lastChange` (when the server sent it). */
  #summary(conversationId: string, lastSeq: number, lastChange: number | undefined, through?: number): void {
    // Changes first: a start (`through`) would otherwise start them at the first.
    if (lastChange !== undefined) this.#apply(observeChanges(this.state, conversationId, lastChange), conversationId);
    this.#apply(observe(this.state, conversationId, lastSeq, through), conversationId);
  }

  /** `GET /conversations/{id}/messages`: the newest page, or `beforeSeq` / `afterSeq` pages. */
  async history(conversationId: string, options: HistoryOptions = {}): Promise<HistoryPage> {
    const page = await this.#call<HistoryPage>(
      "GET",
      `${conversationPath(conversationId)}/messages${query({
        beforeSeq: options.beforeSeq,
        afterSeq: options.afterSeq,
        limit: options.limit,
      })}`,
    );
    // The app now holds these messages: live delivery goes on after the newest of them.
    const newest = page.messages.length > 0 ? page.messages[page.messages.length - 1]!.seq : undefined;
    this.#apply(observe(this.state, conversationId, page.lastSeq, newest), conversationId);
    return page;
  }

  /** `GET /conversations/{id}/reads` (readStates): every member's watermark ("read" / "read by N"). */
  async readStates(conversationId: string): Promise<ReadStates> {
    const r = await this.#call<ReadStates>("GET", `${conversationPath(conversationId)}/reads`);
    this.#take(observeReads(this.state, r));
    return r;
  }

  /** `GET /inbox`: conversations by latest activity, with unread counts. */
  async inbox(options: InboxOptions = {}): Promise<InboxPage> {
    const page = await this.#call<InboxPage>(
      "GET",
      `/inbox${query({ limit: options.limit, cursor: options.cursor ?? undefined })}`,
    );
    for (const c of page.conversations) this.#summary(c.conversationId, c.lastSeq, c.lastChange);
    return page;
  }

  /**
   * Marks everything up to `seq` read, debounced: the first mark of a conversation opens a window
   * (about 1 s); when it ends, one request carries the highest seq marked meanwhile. Failures are
   * retried in a later window and reported as "error" events.
   */
  markRead(conversationId: string, seq: number): void {
    if (!Number.isSafeInteger(seq) || seq < 0) throw new RangeError(`markRead: seq must be an integer ≥ 0, got ${seq}`);
    this.#queueRead(conversationId, seq, this.#readDebounceMs);
  }

  #queueRead(conversationId: string, seq: number, windowMs: number): void {
    if (seq <= (this.#confirmedReads.get(conversationId) ?? -1)) return;
    this.#pendingReads.set(conversationId, Math.max(seq, this.#pendingReads.get(conversationId) ?? -1));
    if (!this.#readTimers.has(conversationId)) {
      this.#readTimers.set(
        conversationId,
        setTimeout(() => void this.#sendRead(conversationId).catch((e) => this.#emit("error", e)), windowMs),
      );
    }
  }

  /** Sends every pending read mark now and waits for them (and for those already on their way). */
  async flushReads(): Promise<void> {
    const sends = [...this.#pendingReads.keys()].map((id) => this.#sendRead(id));
    const results = await Promise.allSettled([...sends, ...this.#readsInFlight]);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) throw failed.reason;
  }

  #sendRead(conversationId: string): Promise<void> {
    clearTimeout(this.#readTimers.get(conversationId));
    this.#readTimers.delete(conversationId);
    const seq = this.#pendingReads.get(conversationId);
    this.#pendingReads.delete(conversationId);
    if (seq === undefined) return Promise.resolve();
    const request = (async () => {
      try {
        const r = await this.#call<ReadResult>("POST", `${conversationPath(conversationId)}/read`, { seq });
        this.#readAttempts.delete(conversationId);
        this.#confirmedReads.set(conversationId, Math.max(r.lastReadSeq, this.#confirmedReads.get(conversationId) ?? -1));
      } catch (e) {
        // A later window retries a retryable failure (with the highest seq by then), a few times;
        // not before the server's Retry-After (plus jitter).
        const attempts = (this.#readAttempts.get(conversationId) ?? 0) + 1;
        if (e instanceof ChatApiError && e.retryable && attempts < this.#retry.maxAttempts) {
          this.#readAttempts.set(conversationId, attempts);
          this.#queueRead(conversationId, seq, Math.max(this.#readDebounceMs, retryDelay(e, 1, 0, 0)));
        } else {
          this.#readAttempts.delete(conversationId);
        }
        throw e;
      }
    })();
    this.#readsInFlight.add(request);
    void request.finally(() => this.#readsInFlight.delete(request)).catch(() => {});
    return request;
  }

  // ---------------------------------------------------------------------------------------------
  // Events
  // ---------------------------------------------------------------------------------------------

  // ---------------------------------------------------------------------------------------------
  // Typing and presence (docs/api.md §37, §38)
  // ---------------------------------------------------------------------------------------------

  /**
   * The user is typing in `conversationId`: call it on every keystroke. A `start` frame goes out at
   * most every 2.5 s while the calls go on (the server's 6 s expiry ends it when they stop, or
   * `stopTyping` at once). Nothing is sent while the socket is not open.
   */
  typing(conversationId: string): void {
    this.#sendTyping(conversationId, "start");
  }

  /** The user stopped typing (sent the message, cleared the field): the others see it at once. */
  stopTyping(conversationId: string): void {
    this.#sendTyping(conversationId, "stop");
  }

  #typer(conversationId: string): Typer {
    let t = this.#typers.get(conversationId);
    if (!t) this.#typers.set(conversationId, (t = {}));
    return t;
  }

  /**
   * A `start` at most every 2.5 s; a `stop` only after a `start`. The server ignores a `start` within
   * 2 s of the last, a `stop` in between or not (docs/api.md §37): one that comes too soon after a
   * `stop` (the user sent a message and types the next) goes out when it would count.
   */
  #sendTyping(conversationId: string, state: "start" | "stop"): void {
    const t = this.#typer(conversationId);
    const start = state === "start";
    const wait = (t.at ?? 0) + TYPING_REFRESH_MS - Date.now();
    clearTimeout(t.later);
    if (start && wait > 0) {
      if (!t.on) t.later = setTimeout(() => this.#sendTyping(conversationId, state), wait);
    } else if ((start || t.on) && this.#ws?.readyState === OPEN) {
      this.#ws.send(JSON.stringify({ action: "typing", conversationId, state }));
      if ((t.on = start)) t.at = Date.now();
    }
  }

  /** A typing set from the server, or its expiry: a set not sent again within 6 s is cleared. */
  #onTyping(event: TypingEvent): void {
    const t = this.#typer(event.conversationId);
    clearTimeout(t.expiry);
    if (event.count) t.expiry = setTimeout(() => this.#onTyping({ ...event, typing: [], count: 0 }), TYPING_EXPIRY_MS);
    this.#emit("typing", event);
  }

  /** Listens to an event; returns a function that stops listening. */
  on<K extends ChatEventName>(event: K, fn: Listener<K>): () => void {
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => this.off(event, fn);
  }

  off<K extends ChatEventName>(event: K, fn: Listener<K>): void {
    this.#listeners.get(event)?.delete(fn as Listener<never>);
  }

  #emit<K extends ChatEventName>(event: K, payload: ChatEvents[K]): void {
    for (const fn of [...(this.#listeners.get(event) ?? [])]) {
      try {
        (fn as Listener<K>)(payload);
      } catch (e) {
        // An app's listener must not break delivery to the others, nor the client's state: report
        // it the way an uncaught error in an event handler is reported.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Live connection (docs/api.md §15)
  // ---------------------------------------------------------------------------------------------

  /** The connection's state, as last announced by a "connection" event. */
  get connectionState(): ConnectionState {
    return this.#connection;
  }

  /**
   * Opens the live connection and keeps it open (reconnecting with backoff) until `close()`.
   * Resolves once it is open and its catch-up has run; rejects if `close()` comes first. A
   * conversation (or the inbox walk) whose catch-up failed does not keep it from opening: it is
   * reported as a `SyncError` "error" event and retried with backoff while everything else goes on.
   */
  connect(): Promise<void> {
    if (!this.#WS) throw new Error("ChatClient: no WebSocket; pass options.WebSocket (Node: `ws`)");
    if (this.#connection === "open" && this.#wanted) return Promise.resolve();
    const ready = new Promise<void>((resolve, reject) => this.#waiters.push({ resolve, reject }));
    // Callers that do not await this must not get an unhandled rejection for a close() before open.
    ready.catch(() => {});
    if (!this.#wanted) {
      this.#wanted = true;
      this.attempt = 0;
      void this.#openSocket();
    }
    return ready;
  }

  /** Closes the live connection and stops reconnecting. Pending read marks stay pending (see flushReads). */
  close(): void {
    this.#wanted = false;
    this.#generation += 1;
    clearTimeout(this.#reconnectTimer);
    for (const t of this.#fillTimers.values()) clearTimeout(t);
    this.#fillTimers.clear();
    this.#fillFailures.clear();
    const ws = this.#ws;
    this.#dropSocket();
    if (ws) ws.close(1000, "client closed");
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.reject(new Error("ChatClient closed before the connection opened"));
  }

  #setConnection(state: ConnectionState): void {
    if (this.#connection === state) return;
    this.#connection = state;
    this.#emit("connection", state);
  }

  async #openSocket(): Promise<void> {
    if (!this.#wanted || this.#ws) return;
    const generation = ++this.#generation;
    this.#setConnection("connecting");
    let ws: WebSocketLike;
    try {
      const url = new URL(this.#wsUrl);
      url.searchParams.set("token", await this.token());
      if (!this.#wanted || this.#ws || generation !== this.#generation) return;
      ws = new this.#WS!(url.toString());
    } catch (e) {
      this.#emit("error", toError(e));
      this.#scheduleReconnect();
      return;
    }
    this.#ws = ws;
    ws.onopen = () => {
      if (this.#ws === ws) void this.#onSocketOpen(ws);
    };
    ws.onmessage = (ev) => {
      if (this.#ws === ws) this.#onFrame(ev.data);
    };
    ws.onclose = () => {
      if (this.#ws === ws) this.#onSocketClosed();
    };
    ws.onerror = () => {
      // A close event follows; the browser tells nothing more (not even the handshake's status).
    };
  }

  async #onSocketOpen(ws: WebSocketLike): Promise<void> {
    // Which socket this is: until its answer, requests name none (and their pushes come here too).
    ws.send('{"action":"hello"}');
    // Hold live events until the catch-up has fetched what was missed, so nothing newer is
    // processed (and fetched again) first.
    const held: ServerEvent[] = [];
    this.held = held;
    // The catch-up: the inbox says which conversations moved, then `afterSeq` fills them. Neither
    // throws: a conversation whose fill fails is retried on its own (see fill), with its newer
    // pushes held back by the state until its gap is filled; a failed inbox walk is retried below.
    let inboxFailure: unknown;
    try {
      await this.#walkInbox(this.#catchUpMaxPages);
    } catch (e) {
      inboxFailure = e;
    }
    const due = [...this.state.conversations.keys()].filter((id) => this.#missing(id));
    const workers = Array.from({ length: Math.min(CATCH_UP_PARALLEL, due.length) }, async () => {
      for (let id = due.shift(); id !== undefined; id = due.shift()) await this.fill(id);
    });
    await Promise.all(workers);
    // Receipts pushed while the socket was down are gone: the read states of the conversations on
    // screen whose watermarks the app holds are read again (each one that moved comes out as a
    // `read` event). Best effort: a failure leaves them as they were, for the next receipt.
    const shown = [...this.#watched].filter((id) => this.state.conversations.get(id)?.reads.size);
    await Promise.all(shown.map((id) => this.readStates(id).catch(() => {})));

    if (this.held === held) this.held = null;
    for (const event of held) this.#handleEvent(event);
    // Gaps that REST answers revealed while fills were held back, and retries of failed fills.
    for (const id of this.state.conversations.keys()) this.#scheduleFill(id);
    if (this.#ws !== ws) return; // closed meanwhile; that close already scheduled the reconnect
    if (inboxFailure === undefined) this.#scheduleRecheck(ws, INBOX_RECHECK_MS, 1);
    else this.#inboxFailed(ws, inboxFailure, 1);
    this.#startKeepAlive(ws);
    // The reconnect backoff starts over only once this connection has proved stable: one that opens
    // and drops again at once keeps backing off instead of reconnecting twice a second.
    clearTimeout(this.#stableTimer);
    this.#stableTimer = setTimeout(() => {
      if (this.#ws === ws) this.attempt = 0;
    }, this.#reconnectResetMs);
    this.#setConnection("open");
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.resolve();
  }

  #onSocketClosed(): void {
    this.#dropSocket();
    if (this.#wanted) this.#scheduleReconnect();
  }

  /** Forgets the socket and everything that was its own (closed, or being closed by `close`). */
  #dropSocket(): void {
    clearTimeout(this.#recheckTimer);
    clearTimeout(this.#stableTimer);
    this.#ws = null;
    this.held = null;
    this.hello = null;
    this.#stopKeepAlive();
    this.#setConnection("closed");
  }

  #scheduleReconnect(): void {
    if (!this.#wanted) return;
    clearTimeout(this.#reconnectTimer);
    // Jittered exponential backoff: after an outage, clients spread their reconnects out.
    const delay = retryDelay(undefined, ++this.attempt, this.#reconnectBase, this.#reconnectMax);
    this.#reconnectTimer = setTimeout(() => void this.#openSocket(), delay);
  }

  #startKeepAlive(ws: WebSocketLike): void {
    this.#stopKeepAlive();
    if (this.#keepAliveMs <= 0) return;
    this.#keepAliveTimer = setInterval(() => {
      // The server ignores client frames (it routes them to `$default`); any frame resets the idle clock.
      if (ws.readyState === OPEN) ws.send('{"type":"ping"}');
    }, this.#keepAliveMs);
  }

  #stopKeepAlive(): void {
    clearInterval(this.#keepAliveTimer);
    this.#keepAliveTimer = undefined;
  }

  #onFrame(data: unknown): void {
    let event: ServerEvent;
    try {
      event = JSON.parse(typeof data === "string" ? data : String(data)) as ServerEvent;
    } catch {
      return; // not an event of ours
    }
    // A user's, not a conversation's: no order to keep, nothing to hold back.
    const type = (event as { type?: string } | null)?.type;
    if (type === "presence") return this.#emit("presence", event as unknown as PresenceEvent);
    if (type === "hello") return void (this.hello = event as unknown as HelloFrame);
    // The server refused a frame of ours (a malformed `typing`, docs/api.md §15.2): tell the app.
    if (type === "error") return this.#emit("error", frameError(event));
    if (typeof event !== "object" || event === null || typeof event.conversationId !== "string") return;
    if (this.held) this.held.push(event);
    else this.#handleEvent(event);
  }

  /**
   * The conversation is on screen: with `lightFetch: "watched"` its light payloads are fetched as
   * they come, and what came while it was not watched is fetched now.
   */
  watch(conversationId: string): void {
    this.#watched.add(conversationId);
    this.#scheduleFill(conversationId);
  }

  /** The conversation left the screen: with `lightFetch: "watched"`, its light payloads wait again. */
  unwatch(conversationId: string): void {
    this.#watched.delete(conversationId);
  }

  #handleEvent(event: ServerEvent): void {
    const lightChange = "changeSeq" in event && event.message === undefined;
    if ((event.type === "message.new" && messageOf(event) === null) || lightChange) {
      this.light.add(event.conversationId);
    }
    if (event.type === "typing") {
      this.#onTyping(event);
    } else if (event.type === "member.added" || event.type === "member.removed") {
      if (Array.isArray(event.userIds)) this.#emit("members", event);
    } else {
      const id = event.conversationId;
      const held = this.#starting.get(id);
      if (held) return void held.push(event);
      // First sight through a message push: a burst before it may have come as this one light push
      // (docs/api.md §15.3), and an earlier push may be lost or still on its way, so the
      // conversation starts where the user's reading does. A first message has nothing before it.
      const first = event.type === "message.new" && !(messageOf(event) !== null && event.seq === 1);
      if (first && !this.state.conversations.has(id)) {
        this.#starting.set(id, [event]);
        return void this.#start(id);
      }
      this.#apply(reduce(this.state, event), id);
    }
  }

  /**
   * A conversation first seen through a message push starts at the user's `lastReadSeq`, so every
   * unread message comes (a full push's own message too, even one the user sent from another
   * device); its events wait meanwhile. The watermark comes from the inbox entry (it has just moved
   * to the top) or, while the index trails, from the conversation's read states. Without either,
   * it starts at the push, as any first sight.
   */
  async #start(id: string): Promise<void> {
    const push = this.#starting.get(id)![0] as MessageNewEvent;
    const entry = await this.#call<InboxPage>("GET", "/inbox?limit=100").then(
      (p) => p.conversations.find((c) => c.conversationId === id),
      () => undefined,
    );
    const read =
      entry ??
      (await this.#call<ReadStates>("GET", `${conversationPath(id)}/reads`).then(
        (r) => ({ lastSeq: r.lastSeq, lastChange: undefined, lastReadSeq: this.#own(r) }),
        () => undefined,
      ));
    if (read?.lastReadSeq !== undefined && !this.state.conversations.has(id)) {
      const through = messageOf(push) ? Math.min(read.lastReadSeq, push.seq - 1) : read.lastReadSeq;
      this.#summary(id, read.lastSeq, read.lastChange, through);
    }
    for (const held of this.#starting.get(id)!) this.#apply(reduce(this.state, held), id);
    this.#starting.delete(id);
  }

  /** The caller's own watermark among a conversation's read states (known once the socket said hello). */
  #own(r: ReadStates): number | undefined {
    const me = this.hello?.userId;
    return me === undefined ? undefined : r.members.find((m) => m.userId === me)?.lastReadSeq;
  }

  /** Takes a step's state and announces what it delivered; then looks for a gap in that conversation. */
  #apply(step: Step, conversationId: string): void {
    this.#take(step);
    this.#scheduleFill(conversationId);
  }

  /** Takes a step's state and announces what it delivered: messages, then the changes they freed. */
  #take(step: Step): void {
    this.state = step.state;
    for (const m of step.messages) this.#emit("message", m);
    for (const c of step.changes) this.#emit("change", c);
    for (const r of step.reads) this.#emit("read", r);
  }

  /** Whether messages or changes of a conversation are known to exist that the app does not hold yet. */
  #missing(conversationId: string): boolean {
    return missingAfter(this.state, conversationId) !== null || missingChangesAfter(this.state, conversationId) !== null;
  }

  /**
   * A fill of the conversation's gap after `gapFillDelayMs`, or, after failed fills, not before its
   * retry time. Not while a catch-up holds events back (it fills everything at its end).
   */
  #scheduleFill(conversationId: string): void {
    if (!this.#wanted || this.held || this.#fillTimers.has(conversationId) || !this.#missing(conversationId)) return;
    // Light news of a conversation nobody looks at waits for `watch` (or the next catch-up).
    if (this.#lightFetch === "watched" && this.light.has(conversationId) && !this.#watched.has(conversationId)) return;
    const retryAt = this.#fillFailures.get(conversationId)?.retryAt ?? 0;
    this.#fillTimers.set(
      conversationId,
      setTimeout(
        () => {
          this.#fillTimers.delete(conversationId);
          if (this.#wanted) void this.fill(conversationId);
        },
        Math.max(this.#gapFillDelayMs, retryAt - Date.now()),
      ),
    );
  }

  /**
   * Fetches `afterSeq = delivered` pages, then `afterChange = changed` pages, until nothing is
   * missing. One run per conversation at a time; events arriving meanwhile are seen by its next
   * check. Never rejects: a failure is reported as a `SyncError` and retried with backoff (jittered,
   * at least the server's `Retry-After`), for as long as the connection is wanted. Until then the
   * state holds this conversation's newer messages and changes back, so they still come out once
   * each and in order when the gap is filled.
   */
  private fill(conversationId: string): Promise<void> {
    const running = this.#filling.get(conversationId);
    if (running) return running;
    const run = (async () => {
      try {
        const path = conversationPath(conversationId);
        // Messages first: a change is delivered only after its message.
        const at = () => `seq ${missingAfter(this.state, conversationId)}, change ${missingChangesAfter(this.state, conversationId)}`;
        for (let stalls = 0, before = at(); this.#missing(conversationId); ) {
          const after = missingAfter(this.state, conversationId);
          if (after !== null) {
            const page = await this.#call<HistoryPage>("GET", `${path}/messages${query({ afterSeq: after, limit: HISTORY_PAGE })}`);
            this.#take(applyPage(this.state, { conversationId, messages: page.messages, lastSeq: page.lastSeq }));
          } else {
            const afterChange = missingChangesAfter(this.state, conversationId)!;
            const page = await this.#call<ChangesPage>("GET", `${path}/changes${query({ afterChange, limit: HISTORY_PAGE })}`);
            this.#take(applyChanges(this.state, { conversationId, changes: page.changes, lastChange: page.lastChange }));
          }
          const now = at();
          if (now !== before) {
            stalls = 0;
            before = now;
          } else if (++stalls > FILL_STALLS) {
            // The read may lag the push that announced the message or change (an eventually
            // consistent read): give it a moment, then retry later like any failure.
            throw new Error(`${conversationId} has nothing after ${now} yet`);
          } else {
            await sleep(200 * 2 ** stalls);
          }
        }
      } catch (e) {
        if (!(e instanceof ChatApiError && e.status === 404)) {
          if (!this.#wanted) return; // closed meanwhile: the next connect's catch-up starts afresh
          const count = (this.#fillFailures.get(conversationId)?.count ?? 0) + 1;
          const delay = retryDelay(e, count, this.#reconnectBase, this.#reconnectMax);
          this.#fillFailures.set(conversationId, { count, retryAt: Date.now() + delay });
          return this.#emit("error", new SyncError(conversationId, e, count, delay));
        }
        // Removed from the conversation (or it is gone): nothing more to deliver; stop tracking it.
        this.state = forget(this.state, conversationId);
      }
      this.#fillFailures.delete(conversationId);
    })();
    this.#filling.set(conversationId, run);
    void run.then(() => {
      this.#filling.delete(conversationId);
      // A retry after a failure; or a gap that opened in the moment after the last check.
      this.#scheduleFill(conversationId);
    });
    return run;
  }

  /**
   * Walks `/inbox` (at most `pages` pages of 100) for the conversations already delivered from, and
   * takes in their `lastSeq`: one beyond the watermark is a gap, which `scheduleFill` fills (at the
   * end of a catch-up: the catch-up does).
   */
  async #walkInbox(pages: number): Promise<void> {
    const remaining = new Set(
      [...this.state.conversations].filter(([, c]) => c.delivered !== null || c.changed !== null).map(([id]) => id),
    );
    // Conversations new to this client (one it was added to, or that got messages, while it was
    // away) that rank above one it holds have news: they start where the user's reading is, so
    // every unread message comes. Those below every held one are old; the app lists them itself.
    let news: InboxPage["conversations"] = [];
    let cursor: string | null = null;
    for (let n = 0; remaining.size > 0 && n < pages && (n === 0 || cursor); n++) {
      const page: InboxPage = await this.#call<InboxPage>(
        "GET",
        `/inbox${query({ limit: INBOX_PAGE, cursor: cursor ?? undefined })}`,
      );
      for (const c of page.conversations) {
        if (remaining.delete(c.conversationId)) {
          this.#summary(c.conversationId, c.lastSeq, c.lastChange);
          for (const e of news) {
            if (!this.state.conversations.has(e.conversationId)) this.#summary(e.conversationId, e.lastSeq, e.lastChange, e.lastReadSeq);
          }
          news = [];
        } else if (c.unreadCount > 0 && !this.state.conversations.has(c.conversationId)) {
          news.push(c);
        }
      }
      cursor = page.nextCursor;
    }
  }

  /**
   * After `delay`, walks the inbox again while `ws` is the connection: `pages` 1 is the second look
   * (see INBOX_RECHECK_MS), more is the retry of a failed catch-up's walk.
   */
  #scheduleRecheck(ws: WebSocketLike, delay: number, pages: number, failures = 0): void {
    clearTimeout(this.#recheckTimer);
    this.#recheckTimer = setTimeout(() => {
      if (this.#ws !== ws) return;
      this.#walkInbox(pages).then(
        () => {
          if (failures > 0) this.#scheduleRecheck(ws, INBOX_RECHECK_MS, 1);
        },
        (e) => {
          if (failures > 0) this.#inboxFailed(ws, e, failures + 1);
          else this.#emit("error", toError(e)); // only the second look: the catch-up's walk went through
        },
      );
    }, delay);
  }

  /** The catch-up's inbox walk failed (`failures` times in a row): report it, retry it with backoff. */
  #inboxFailed(ws: WebSocketLike, e: unknown, failures: number): void {
    const delay = retryDelay(e, failures, this.#reconnectBase, this.#reconnectMax);
    this.#emit("error", new SyncError(null, e, failures, delay));
    this.#scheduleRecheck(ws, delay, this.#catchUpMaxPages, failures);
  }

  // ---------------------------------------------------------------------------------------------
  // HTTP
  // ---------------------------------------------------------------------------------------------

  /** The bearer token for the next request (the option's value, or what its function gives now). */
  async token(): Promise<string> {
    return typeof this.#tokenSource === "function" ? await this.#tokenSource() : this.#tokenSource;
  }

  /**
   * One call of the REST API, for the SDK's other modules (`safety`, `attachments`, `presence`):
   * JSON in and out, failures as ChatApiError; not retried.
   */
  request<T>(method: string, path: string, body?: unknown): Promise<T> {
    return this.#call(method, path, body);
  }

  /**
   * One request; any answer but 2xx, and no answer at all, becomes a ChatApiError. It names the open
   * socket (`X-Connection-Id`), whose push of what it changes is then skipped.
   */
  async #call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${await this.token()}`,
      Accept: "application/json",
    };
    if (this.hello) headers["X-Connection-Id"] = this.hello.connectionId;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.#requestTimeoutMs);
    let status: number;
    let text: string;
    let retryAfter: string | null;
    try {
      const res = await this.fetch(this.apiUrl + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: abort.signal,
      });
      status = res.status;
      retryAfter = res.headers.get("Retry-After");
      text = await res.text();
    } catch (e) {
      const timedOut = abort.signal.aborted;
      throw new ChatApiError(
        0,
        timedOut ? "timeout" : "network_error",
        timedOut ? `${method} ${path}: no answer within ${this.#requestTimeoutMs} ms` : `${method} ${path}: ${toError(e).message}`,
      );
    } finally {
      clearTimeout(timer);
    }
    if (status >= 200 && status < 300) return (text === "" ? undefined : JSON.parse(text)) as T;
    throw ChatApiError.fromResponse(status, text, retryAfter);
  }

  async #withRetries<T>(request: () => Promise<T>): Promise<T> {
    const start = Date.now();
    let deadline = start + this.#retry.maxElapsedMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await request();
      } catch (e) {
        // A rate limit's or slow mode's refusal says when it is admitted (nothing was stored): they
        // are waited out, however many, for 2 minutes (the last one's wait may end after them).
        const limited =
          e instanceof ChatApiError && e.limited && (e.retryAfterMs ?? 0) <= LIMITED_WAIT_MAX_MS && Date.now() - start < LIMITED_WAIT_MAX_MS;
        if (!(e instanceof ChatApiError) || !e.retryable || (attempt >= this.#retry.maxAttempts && !limited)) throw e;
        // Jittered exponential backoff, and not before the server's Retry-After plus jitter.
        const delay = retryDelay(e, attempt, this.#retry.baseDelayMs, 5000);
        if (limited) deadline = Math.max(deadline, Date.now() + delay);
        if (Date.now() + delay > deadline) throw e;
        await sleep(delay);
      }
    }
  }
}

/** The longest `Retry-After` of a rate limit or slow mode a send waits out (slow mode's maximum). */
const LIMITED_WAIT_MAX_MS = 120_000;

function conversationPath(id: string): string {
  return `/conversations/${encodeURIComponent(id)}`;
}

function messagePath(id: string, seq: number): string {
  return `${conversationPath(id)}/messages/${seq}`;
}

function query(params: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return s === "" ? "" : `?${s}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A server `error` frame (docs/api.md §15.2): a frame of ours refused as a request would be, 400. */
function frameError(event: unknown): ChatApiError {
  const e = (event as { error?: { code?: unknown; message?: unknown } }).error;
  const code = typeof e?.code === "string" ? e.code : "invalid_request";
  return new ChatApiError(400, code, typeof e?.message === "string" ? e.message : "a frame was refused");
}

function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}

/** A v4 UUID. `crypto.randomUUID` exists only in secure contexts (https, localhost); getRandomValues everywhere. */
export function randomUUID(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
