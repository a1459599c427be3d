// The demo chat page: everything it shows comes through the SDK (clients/js). Plain DOM, no framework.
//
// Query parameters: ?api=<REST base URL>&ws=<WebSocket URL> (defaults: this page's host on ports 9000
// and 9001, i.e. the local stack), ?user=<id> signs in at once, ?secret=<HS256 secret> (local stack).
// For tests, `window.chatDemo` exposes goOffline()/goOnline() (cut the socket and keep it cut) and the
// client.

import {
  applyChange,
  ChatApiError,
  ChatClient,
  type ConnectionState,
  type InboxEntry,
  type Message,
  type MessageChange,
  type TypingEvent,
  type WebSocketConstructor,
} from "../../js/src/index.js";
import { uploadAttachment } from "../../js/src/attachments.js";
import { setNotifications } from "../../js/src/notifications.js";
import { presence as presenceOf } from "../../js/src/presence.js";

const params = new URLSearchParams(location.search);
const host = location.hostname || "127.0.0.1";
const API_URL = params.get("api") ?? `http://${host}:9000`;
const WS_URL = params.get("ws") ?? `ws://${host}:9001`;

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const el = <K extends keyof HTMLElementTagNameMap>(tag: K, className?: string, text?: string) => {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text; // never innerHTML: bodies are any text, <script> included
  return e;
};

// ---- tokens: the local stack's HS256 JWTs, minted here with WebCrypto ----

const b64url = (bytes: Uint8Array) =>
  btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");

async function mintToken(sub: string, secret: string, ttlSeconds = 3600): Promise<string> {
  if (!crypto.subtle) throw new Error("WebCrypto needs a secure context: open the page on 127.0.0.1/localhost or https");
  const enc = new TextEncoder();
  const header = b64url(enc.encode(JSON.stringify({ alg: "HS256", typ: "JWT" })));
  const payload = b64url(enc.encode(JSON.stringify({ sub, exp: Math.floor(Date.now() / 1000) + ttlSeconds })));
  const key = await crypto.subtle.importKey("raw", enc.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const signature = new Uint8Array(await crypto.subtle.sign("HMAC", key, enc.encode(`${header}.${payload}`)));
  return `${header}.${payload}.${b64url(signature)}`;
}

// ---- a WebSocket the test hook can unplug ----

let offline = false;
const sockets = new Set<WebSocket>();
class DemoSocket extends WebSocket {
  constructor(url: string) {
    // The SDK treats a throwing constructor like a failed connection: it backs off and tries again.
    if (offline) throw new Error("offline (test hook)");
    super(url);
    sockets.add(this);
    this.addEventListener("close", () => sockets.delete(this));
  }
}

// ---- page state ----

interface Row {
  conversationId: string;
  type: "direct" | "group";
  name: string;
  lastSeq: number;
  lastReadSeq: number;
  preview: string;
  /** `lastMessageAt` (RFC 3339, so it sorts as text), "" while there is no message. */
  activity: string;
  /** When it was fetched by `adopt`: a trailing inbox index may not list it yet. */
  adoptedAt?: number;
  /** Direct conversations: the peer, whose presence the green dot shows. */
  peerId?: string;
}

interface OpenConversation {
  id: string;
  type: "direct" | "group";
  messages: Map<number, Message>;
  oldest: number;
  hasOlder: boolean;
  memberIds: string[];
  reads: Map<string, number>;
}

let me = "";
let client: ChatClient | null = null;
let rows: Row[] = []; // by activity, newest first
let open: OpenConversation | null = null;

function notice(text: string | null): void {
  const n = $("notice");
  n.hidden = !text;
  n.textContent = text ?? "";
}

function report(e: unknown): void {
  notice(e instanceof ChatApiError ? `${e.status} ${e.code}: ${e.message}` : String(e instanceof Error ? e.message : e));
}

/** A row's preview of a message; a deleted one's body is "" (a message's is never empty). */
const previewOf = (m: { senderId: string; body: string }) => `${m.senderId}: ${m.body || "message deleted"}`;

function rowFromInbox(c: InboxEntry): Row {
  return {
    conversationId: c.conversationId,
    type: c.type,
    name: c.type === "direct" ? (c.peerId ?? "direct") : (c.title ?? "group"),
    peerId: c.peerId ?? undefined,
    lastSeq: c.lastSeq,
    lastReadSeq: c.lastReadSeq,
    preview: c.lastMessage ? previewOf(c.lastMessage) : "no messages yet",
    activity: c.lastMessageAt ?? "",
  };
}

// ---- the conversation list ----

async function loadInbox(): Promise<void> {
  if (!client) return;
  const fresh: Row[] = [];
  let cursor: string | null = null;
  do {
    const page: Awaited<ReturnType<ChatClient["inbox"]>> = await client.inbox({ limit: 100, cursor });
    fresh.push(...page.conversations.map(rowFromInbox));
    cursor = page.nextCursor;
  } while (cursor && fresh.length < 500);
  // The inbox is read from an index that can trail the latest writes by a moment: what live events
  // told us since is newer. Keep it, and put the conversations it moved on top, newest first.
  const known = new Map(rows.map((r) => [r.conversationId, r]));
  const moved: Row[] = [];
  const rest: Row[] = [];
  for (const r of fresh) {
    const k = known.get(r.conversationId);
    if (k && k.lastSeq > r.lastSeq) moved.push({ ...r, lastSeq: k.lastSeq, preview: k.preview, activity: k.activity, lastReadSeq: Math.max(k.lastReadSeq, r.lastReadSeq) });
    else rest.push(k ? { ...r, lastReadSeq: Math.max(k.lastReadSeq, r.lastReadSeq) } : r);
  }
  const listed = new Set(fresh.map((r) => r.conversationId));
  for (const k of rows) if (!listed.has(k.conversationId) && k.adoptedAt && Date.now() - k.adoptedAt < 10_000) moved.push(k);
  moved.sort((x, y) => (x.activity < y.activity ? 1 : x.activity > y.activity ? -1 : 0));
  rows = [...moved, ...rest];
  renderList();
  void refreshPresence().catch(report);
}

// ---- presence: a green dot for online peers (docs/api.md §38) ----

const online = new Set<string>();
let presenceTimer: ReturnType<typeof setInterval> | undefined;

/** Asks for the presence of the listed direct conversations' peers (the first 100). */
async function refreshPresence(): Promise<void> {
  const c = client;
  const peers = [...new Set(rows.flatMap((r) => (r.peerId ? [r.peerId] : [])))].slice(0, 100);
  if (!c || peers.length === 0) return;
  const presence = await presenceOf(c, peers);
  if (client !== c) return;
  for (const p of presence) {
    if (p.online) online.add(p.userId);
    else online.delete(p.userId);
  }
  renderList();
}

// ---- typing: "Bob is typing…" (docs/api.md §37) ----

function typingText(t: TypingEvent | undefined): string {
  if (!t || t.count === 0) return "";
  if (t.count === 1) return `${t.typing[0]} is typing…`;
  if (t.count === 2 && t.typing.length === 2) return `${t.typing[0]} and ${t.typing[1]} are typing…`;
  return `${t.count} people are typing…`;
}

/** The last typing set per conversation (the SDK clears a stale one with an empty set). */
const typingSets = new Map<string, TypingEvent>();

function renderTyping(): void {
  $("typing").textContent = open ? typingText(typingSets.get(open.id)) : "";
}

let inboxTimer: ReturnType<typeof setTimeout> | undefined;
function reloadInboxSoon(): void {
  clearTimeout(inboxTimer);
  inboxTimer = setTimeout(() => void loadInbox().catch(report), 200);
}

// Rows and messages are updated in place (keyed by id and seq), not rebuilt: a click or a text
// selection in progress survives the next event.
const listItems = new Map<string, HTMLLIElement>();

function renderList(): void {
  const list = $("conversations");
  const present = new Set(rows.map((r) => r.conversationId));
  for (const [id, li] of listItems) {
    if (!present.has(id)) {
      li.remove();
      listItems.delete(id);
    }
  }
  rows.forEach((r, i) => {
    let li = listItems.get(r.conversationId);
    if (!li) {
      li = el("li");
      li.dataset.id = r.conversationId;
      li.append(el("span", "title"), el("span", "badge"), el("span", "preview"));
      listItems.set(r.conversationId, li);
    }
    const [title, badge, preview] = li.children as unknown as [HTMLElement, HTMLElement, HTMLElement];
    title.textContent = r.type === "group" ? `# ${r.name}` : r.name;
    if (r.peerId) {
      const dot = el("span", online.has(r.peerId) ? "dot online" : "dot");
      dot.title = online.has(r.peerId) ? "online" : "offline";
      title.append(dot);
    }
    const unread = Math.max(0, r.lastSeq - r.lastReadSeq);
    badge.textContent = String(unread);
    badge.hidden = unread === 0;
    preview.textContent = r.preview;
    li.classList.toggle("selected", open?.id === r.conversationId);
    if (list.children[i] !== li) list.insertBefore(li, list.children[i] ?? null);
  });
}

/**
 * A conversation we have not listed yet (someone started it, or added us): fetch it directly. The
 * inbox would do too, but its index may not list a conversation created an instant ago.
 */
const adopting = new Map<string, Message | null>(); // id -> newest message seen while fetching
function adopt(id: string, latest: Message | null): void {
  if (adopting.has(id)) {
    const seen = adopting.get(id);
    if (latest && (!seen || latest.seq > seen.seq)) adopting.set(id, latest);
    return;
  }
  adopting.set(id, latest);
  const c = client;
  if (!c) return;
  void Promise.all([c.getConversation(id), c.readStates(id)])
    .then(([conversation, reads]) => {
      const m = adopting.get(id) ?? null;
      adopting.delete(id);
      if (client !== c || rows.some((r) => r.conversationId === id)) return;
      const mine = reads.members.find((x) => x.userId === me)?.lastReadSeq ?? 0;
      const row: Row = {
        conversationId: id,
        type: conversation.type,
        name: conversation.type === "direct" ? (conversation.memberIds.find((u) => u !== me) ?? "direct") : (conversation.title ?? "group"),
        peerId: conversation.type === "direct" ? conversation.memberIds.find((u) => u !== me) : undefined,
        lastSeq: Math.max(conversation.lastSeq, m?.seq ?? 0),
        lastReadSeq: mine,
        preview: m ? previewOf(m) : "no messages yet",
        activity: m?.createdAt ?? conversation.lastMessageAt ?? "",
        adoptedAt: Date.now(),
      };
      rows = [row, ...rows];
      renderList();
    })
    .catch((e) => {
      adopting.delete(id);
      report(e);
    });
}

function touchRow(m: Message): void {
  let row = rows.find((r) => r.conversationId === m.conversationId);
  if (!row) {
    adopt(m.conversationId, m);
    return;
  }
  if (m.seq >= row.lastSeq) {
    row.preview = previewOf(m);
    row.activity = m.createdAt;
  }
  row.lastSeq = Math.max(row.lastSeq, m.seq);
  // Sending marks a message read for its sender.
  if (m.senderId === me) row.lastReadSeq = Math.max(row.lastReadSeq, m.seq);
  rows = [row, ...rows.filter((r) => r !== row)];
  renderList();
}

// ---- the message pane ----

const PAGE = 30;

async function openConversation(id: string): Promise<void> {
  if (!client) return;
  // Open it before the fetches answer, so live messages arriving meanwhile land in it too.
  const target: OpenConversation = { id, type: "direct", messages: new Map(), oldest: 0, hasOlder: false, memberIds: [], reads: new Map() };
  // On screen: after a reconnect the SDK reads its read states again (receipts missed meanwhile).
  if (open) client.unwatch(open.id);
  client.watch(id);
  open = target;
  // The toggle shows this conversation's settings once they are read, never the previous one's
  // (a click meanwhile would set them from the wrong state).
  $("mute").hidden = true;
  renderList();
  renderTyping();
  renderMessages("bottom");
  const [conversation, page, reads] = await Promise.all([client.getConversation(id), client.history(id, { limit: PAGE }), client.readStates(id)]);
  if (open !== target) return;
  for (const m of page.messages) target.messages.set(m.seq, m);
  target.type = conversation.type;
  target.oldest = page.messages[0]?.seq ?? page.lastSeq + 1;
  target.hasOlder = page.hasMore;
  target.memberIds = conversation.memberIds;
  for (const m of reads.members) target.reads.set(m.userId, Math.max(target.reads.get(m.userId) ?? 0, m.lastReadSeq));
  const row = rows.find((r) => r.conversationId === id);
  $("pane-title").textContent =
    conversation.type === "group" ? `# ${conversation.title ?? ""}` : (row?.name ?? conversation.memberIds.find((u) => u !== me) ?? "");
  $("pane-members").textContent = `${conversation.memberCount} members: ${conversation.memberIds.join(", ")}`;
  showMuted(conversation.notifications);
  $("composer").hidden = false;
  renderMessages("bottom");
  markSeen();
}

/** The open conversation's offline notifications (docs/api.md §32): muted or not, and the toggle. */
function showMuted(settings: { level: "all" | "none"; mutedUntil?: string } | undefined): void {
  const button = $<HTMLButtonElement>("mute");
  const muted = settings?.level === "none" || (settings?.mutedUntil !== undefined && settings.mutedUntil > new Date().toISOString());
  button.hidden = false;
  button.textContent = muted ? "Muted (unmute)" : "Mute";
  button.setAttribute("aria-pressed", String(muted));
}

async function toggleMuted(): Promise<void> {
  if (!client || !open) return;
  const muted = $("mute").getAttribute("aria-pressed") === "true";
  const r = await setNotifications(client, open.id, { level: muted ? "all" : "none" });
  showMuted(r.notifications);
}

async function loadOlder(): Promise<void> {
  if (!client || !open || !open.hasOlder) return;
  const target = open;
  const page = await client.history(target.id, { beforeSeq: target.oldest, limit: PAGE });
  if (open !== target) return;
  for (const m of page.messages) target.messages.set(m.seq, m);
  target.oldest = page.messages[0]?.seq ?? target.oldest;
  target.hasOlder = page.hasMore;
  renderMessages("keep");
}

function tick(m: Message): { text: string; read: boolean } | null {
  if (!open || m.senderId !== me) return null;
  const readers = open.memberIds.filter((u) => u !== m.senderId && (open!.reads.get(u) ?? 0) >= m.seq).length;
  if (open.type === "direct") return readers > 0 ? { text: "✓✓ read", read: true } : { text: "✓ sent", read: false };
  return readers > 0 ? { text: `read by ${readers}`, read: true } : { text: "✓ sent", read: false };
}

const messageItems = new Map<number, HTMLLIElement>(); // of the open conversation, by seq
let shownConversation: string | null = null;

// ---- edits, deletions, reactions ----

const EMOJI = ["👍", "❤️", "😂"];
/** Reactions this page added (`conversationId/seq/reaction`): a second click removes them. */
const myReactions = new Set<string>();
/** The message of the open conversation being edited in the composer, if any. */
let editing: number | null = null;

/** Builds a message's item: meta line, body, reaction counts, and its controls. */
function messageItem(m: Message): HTMLLIElement {
  const li = el("li", m.senderId === me ? "mine" : "");
  li.dataset.seq = String(m.seq);
  const meta = el("div", "meta");
  meta.append(el("span", "sender", m.senderId), el("time", "", new Date(m.createdAt).toLocaleTimeString()), el("span", "edited", "edited"));
  const actions = el("div", "actions");
  for (const e of EMOJI) {
    const b = el("button", "", e);
    b.type = "button";
    b.dataset.react = e;
    b.title = `react ${e}`;
    actions.append(b);
  }
  if (m.senderId === me) {
    for (const [action, label] of [["edit", "edit"], ["delete", "delete"]]) {
      const b = el("button", "", label);
      b.type = "button";
      b.dataset.action = action;
      actions.append(b);
    }
  }
  li.append(meta, el("div", "body"), el("div", "reactions"), actions, el("div", "files"));
  return li;
}

const SCAN_LABELS = { pending: "being checked for malware", clean: "", unsafe: "blocked: malware", unscannable: "could not be checked" };

/** Shows a message's current state in its item: body or tombstone, "edited", reaction counts. */
function fillItem(li: HTMLLIElement, m: Message): void {
  const [meta, body, reactions, actions, files] = li.children as unknown as HTMLElement[];
  // Images as their thumbnail (else the image), a click opens the full one; other files as links.
  // A file the malware scan has not cleared (docs/api.md §36) has no URL: its name and why.
  files!.replaceChildren(
    ...(m.deleted ? [] : (m.attachments ?? [])).map((f) => {
      if (!f.url) return el("span", "file", `${f.fileName} (${SCAN_LABELS[f.scan ?? "pending"]})`);
      const a = el("a", "file", f.contentType.startsWith("image/") ? "" : f.fileName);
      a.href = f.url;
      a.target = "_blank";
      if (f.contentType.startsWith("image/")) {
        const img = el("img", "thumb");
        img.src = f.thumbnailUrl ?? f.url;
        img.alt = f.fileName;
        a.append(img);
      }
      return a;
    }),
  );
  li.classList.toggle("deleted", m.deleted === true);
  body!.textContent = m.deleted ? "message deleted" : m.body;
  meta!.querySelector<HTMLElement>(".edited")!.hidden = !m.editedAt || m.deleted === true;
  actions!.hidden = m.deleted === true;
  reactions!.replaceChildren(
    ...(m.reactions ?? []).map((r) => {
      const b = el("button", myReactions.has(`${m.conversationId}/${m.seq}/${r.reaction}`) ? "reaction mine" : "reaction", `${r.reaction} ${r.count}`);
      b.type = "button";
      b.dataset.react = r.reaction;
      return b;
    }),
  );
}

/** Takes a newer state of a message of the open conversation (an answer of ours, or a change event). */
function updateMessage(m: Message | { conversationId: string; seq: number; reactions: Message["reactions"] }): void {
  if (open?.id !== m.conversationId) return;
  const held = open.messages.get(m.seq);
  if (!held) return;
  const next = "version" in m ? applyChange(held, { message: m }) : { ...held, reactions: m.reactions?.length ? m.reactions : undefined };
  open.messages.set(m.seq, next);
  renderMessages("keep");
}

function onChange(c: MessageChange): void {
  const row = rows.find((r) => r.conversationId === c.conversationId);
  if (row && c.seq === row.lastSeq && c.type.startsWith("message.")) {
    row.preview = previewOf(c.message);
    renderList();
  }
  updateMessage(c.message);
}

function toggleReaction(seq: number, reaction: string): void {
  if (!client || !open) return;
  const key = `${open.id}/${seq}/${reaction}`;
  const had = myReactions.has(key);
  if (had) myReactions.delete(key);
  else myReactions.add(key);
  (had ? client.unreact(open.id, seq, reaction) : client.react(open.id, seq, reaction)).then(updateMessage, (e) => {
    if (had) myReactions.add(key);
    else myReactions.delete(key);
    report(e);
  });
}

function startEdit(seq: number): void {
  const m = open?.messages.get(seq);
  if (!m || m.deleted) return;
  editing = seq;
  const box = $<HTMLTextAreaElement>("body");
  box.value = m.body;
  box.focus();
  $("composer").classList.add("editing");
  $("send").textContent = "Save edit";
}

function stopEdit(): void {
  editing = null;
  $("composer").classList.remove("editing");
  $("send").textContent = "Send";
}

function renderMessages(scroll: "bottom" | "keep" | "follow"): void {
  if (!open) return;
  const scroller = $("scroller");
  const fromBottom = scroller.scrollHeight - scroller.scrollTop;
  const atBottom = fromBottom - scroller.clientHeight < 40;
  const list = $("messages");
  if (shownConversation !== open.id) {
    list.replaceChildren();
    messageItems.clear();
    shownConversation = open.id;
  }
  const ordered = [...open.messages.values()].sort((a, b) => a.seq - b.seq);
  ordered.forEach((m, i) => {
    let li = messageItems.get(m.seq);
    if (!li) {
      li = messageItem(m);
      messageItems.set(m.seq, li);
    }
    fillItem(li, m);
    const t = tick(m);
    if (t) {
      const meta = li.firstElementChild!;
      const span = meta.querySelector<HTMLElement>(".tick") ?? meta.appendChild(el("span"));
      span.className = t.read ? "tick read" : "tick";
      span.textContent = t.text;
    }
    if (list.children[i] !== li) list.insertBefore(li, list.children[i] ?? null);
  });
  $("older").hidden = !open.hasOlder;
  if (scroll === "bottom" || (scroll === "follow" && atBottom)) scroller.scrollTop = scroller.scrollHeight;
  else if (scroll === "keep") scroller.scrollTop = scroller.scrollHeight - fromBottom;
}

/** The open conversation is on screen: everything in it is read (the SDK debounces the marks). */
function markSeen(): void {
  if (!client || !open || document.visibilityState !== "visible") return;
  const row = rows.find((r) => r.conversationId === open!.id);
  const newest = Math.max(row?.lastSeq ?? 0, ...open.messages.keys());
  if (newest <= 0) return;
  client.markRead(open.id, newest);
  if (row && row.lastReadSeq < newest) {
    row.lastReadSeq = newest;
    renderList();
  }
}

// ---- live events ----

function onMessage(m: Message): void {
  touchRow(m);
  if (open?.id !== m.conversationId) return;
  open.messages.set(m.seq, m); // by seq: a page fetched at the same moment may hold it too
  open.reads.set(m.senderId, Math.max(open.reads.get(m.senderId) ?? 0, m.seq));
  renderMessages("follow");
  markSeen();
}

function onConnection(state: ConnectionState): void {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = state === "open" ? "live" : state === "connecting" ? "connecting…" : "offline";
  if (state !== "open") return;
  // Conversations started while we were away show up in the inbox; receipts missed meanwhile in reads.
  reloadInboxSoon();
  const target = open;
  if (client && target) {
    void client
      .readStates(target.id)
      .then((r) => {
        for (const m of r.members) target.reads.set(m.userId, Math.max(target.reads.get(m.userId) ?? 0, m.lastReadSeq));
        if (open === target) renderMessages("keep");
      })
      .catch(report);
  }
}

// ---- sign in / out ----

async function signIn(user: string, secret: string): Promise<void> {
  signOut();
  me = user;
  let cached: { token: string; until: number } | null = null;
  client = new ChatClient({
    apiUrl: API_URL,
    wsUrl: WS_URL,
    // Called per request and connect: mint a fresh token when the cached one is near its expiry.
    token: async () => {
      if (!cached || cached.until < Date.now()) cached = { token: await mintToken(user, secret), until: Date.now() + 50 * 60_000 };
      return cached.token;
    },
    WebSocket: DemoSocket as unknown as WebSocketConstructor,
    reconnect: { baseDelayMs: 500, maxDelayMs: 5000 },
  });
  client.on("message", onMessage);
  client.on("change", onChange);
  client.on("connection", onConnection);
  client.on("read", (r) => {
    const row = rows.find((x) => x.conversationId === r.conversationId);
    if (row && r.userId === me && r.lastReadSeq > row.lastReadSeq) {
      row.lastReadSeq = r.lastReadSeq; // read on another device
      renderList();
    }
    if (open?.id === r.conversationId) {
      open.reads.set(r.userId, Math.max(open.reads.get(r.userId) ?? 0, r.lastReadSeq));
      renderMessages("keep");
    }
  });
  client.on("members", (e) => {
    if (!rows.some((r) => r.conversationId === e.conversationId)) adopt(e.conversationId, null); // we were added
    if (open?.id === e.conversationId) void openConversation(e.conversationId).catch(report);
  });
  client.on("typing", (t) => {
    typingSets.set(t.conversationId, t);
    if (open?.id === t.conversationId) renderTyping();
  });
  client.on("presence", (p) => {
    if (p.online) online.add(p.userId);
    else online.delete(p.userId);
    renderList();
  });
  client.on("error", (e) => console.warn("chat:", e));
  presenceTimer = setInterval(() => void refreshPresence().catch(report), 10_000);

  $("me").textContent = user;
  $("login").hidden = true;
  $("session").hidden = false;
  $("app").hidden = false;
  notice(null);
  await loadInbox();
  await client.connect();
  document.body.dataset.ready = "true";
}

function signOut(): void {
  clearInterval(presenceTimer);
  online.clear();
  typingSets.clear();
  $("typing").textContent = "";
  client?.close();
  client = null;
  rows = [];
  open = null;
  me = "";
  delete document.body.dataset.ready;
  $("conversations").replaceChildren();
  $("messages").replaceChildren();
  listItems.clear();
  messageItems.clear();
  adopting.clear();
  myReactions.clear();
  stopEdit();
  shownConversation = null;
  $("composer").hidden = true;
  $("older").hidden = true;
  $("pane-title").textContent = "Pick a conversation";
  $("pane-members").textContent = "";
}

// ---- wiring ----

$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  void signIn($<HTMLInputElement>("user").value.trim(), $<HTMLInputElement>("secret").value).catch(report);
});
$("logout").addEventListener("click", () => {
  signOut();
  $("login").hidden = false;
  $("session").hidden = true;
  $("app").hidden = true;
  onConnection("closed");
});
/** Opens the conversation `create` made (or found), after `clear`ing its form and reloading the inbox. */
function openCreated(create: () => Promise<{ conversationId: string }>, clear: () => void): void {
  void (async () => {
    const c = await create();
    clear();
    await loadInbox();
    await openConversation(c.conversationId);
  })().catch(report);
}
$("new-direct").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const peer = $<HTMLInputElement>("peer");
  openCreated(
    () => client!.openDirect(peer.value.trim()),
    () => (peer.value = ""),
  );
});
$("new-group").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const title = $<HTMLInputElement>("group-title");
  const members = $<HTMLInputElement>("group-members");
  const memberIds = members.value.split(",").map((s) => s.trim()).filter(Boolean);
  openCreated(
    () => client!.createGroup({ title: title.value, memberIds }),
    () => (title.value = members.value = ""),
  );
});
$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const box = $<HTMLTextAreaElement>("body");
  const text = box.value;
  if (!client || !open || text === "") return;
  box.value = "";
  if (editing !== null) {
    const seq = editing;
    stopEdit();
    // The edited message shows at once; its "change" event then changes nothing.
    client.edit(open.id, seq, text).then(updateMessage, report);
    return;
  }
  client.stopTyping(open.id);
  // The message shows up through the "message" event once the server numbered it.
  client.send(open.id, text).catch((e) => {
    box.value = text;
    report(e);
  });
});
$("body").addEventListener("input", () => {
  if (client && open && editing === null && $<HTMLTextAreaElement>("body").value !== "") client.typing(open.id);
});
$("file").addEventListener("change", () => {
  const input = $<HTMLInputElement>("file");
  const file = input.files?.[0];
  input.value = "";
  if (!client || !open || !file) return;
  // Straight to S3 with the presigned request, then a message that carries it.
  const id = open.id;
  uploadAttachment(client, id, file)
    .then((attachment) => client!.send(id, "", { attachments: [attachment] }))
    .catch(report);
});
$("body").addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && editing !== null) {
    stopEdit();
    $<HTMLTextAreaElement>("body").value = "";
  } else if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $<HTMLFormElement>("composer").requestSubmit();
  }
});
$("conversations").addEventListener("click", (ev) => {
  const li = (ev.target as Element).closest<HTMLElement>("li[data-id]");
  if (li?.dataset.id) void openConversation(li.dataset.id).catch(report);
});
$("older").addEventListener("click", () => void loadOlder().catch(report));
$("mute").addEventListener("click", () => void toggleMuted().catch(report));
$("messages").addEventListener("click", (ev) => {
  const b = (ev.target as Element).closest<HTMLButtonElement>("button");
  const seq = Number(b?.closest<HTMLElement>("li[data-seq]")?.dataset.seq);
  if (!b || !client || !open || !seq) return;
  if (b.dataset.react) toggleReaction(seq, b.dataset.react);
  else if (b.dataset.action === "edit") startEdit(seq);
  else if (b.dataset.action === "delete" && confirm("Delete this message for everyone?")) {
    client.delete(open.id, seq).then(updateMessage, report);
  }
});
$("scroller").addEventListener("scroll", () => {
  if ($("scroller").scrollTop === 0 && open?.hasOlder) void loadOlder().catch(report);
});
document.addEventListener("visibilitychange", markSeen);

declare global {
  interface Window {
    chatDemo: unknown;
  }
}
window.chatDemo = {
  /** Cuts the live connection and keeps it cut (reconnect attempts fail) until goOnline(). */
  goOffline() {
    offline = true;
    for (const s of sockets) s.close();
  },
  goOnline() {
    offline = false;
  },
  get client() {
    return client;
  },
  get connection() {
    return client?.connectionState ?? "closed";
  },
};

const initialUser = params.get("user");
if (params.get("secret")) $<HTMLInputElement>("secret").value = params.get("secret")!;
if (initialUser) {
  $<HTMLInputElement>("user").value = initialUser;
  void signIn(initialUser, $<HTMLInputElement>("secret").value).catch(report);
}
