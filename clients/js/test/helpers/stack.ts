// For tests against the running local stack (infra/run-local.sh): its URLs, HS256 tokens like
// infra/mint_token.py, fresh user ids per run (the stack keeps its data), and a client factory.

import { createHmac, randomBytes } from "node:crypto";
import WebSocket from "ws";
import { ChatClient, type ChatClientOptions, type WebSocketConstructor } from "../../src/index.js";

export const API_URL = process.env.CHAT_API_URL || "http://127.0.0.1:9000";
export const WS_URL = process.env.CHAT_WS_URL || "ws://127.0.0.1:9001";
const SECRET = process.env.CHAT_LOCAL_JWT_SECRET || "local-dev-secret";

const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");

/** An HS256 JWT with `sub` and `exp`, as the local stack verifies them (docs/api.md §3). */
export function mintToken(sub: string, ttlSeconds = 3600): string {
  const header = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const payload = b64url(JSON.stringify({ sub, exp: Math.floor(Date.now() / 1000) + ttlSeconds }));
  const signature = createHmac("sha256", SECRET).update(`${header}.${payload}`).digest("base64url");
  return `${header}.${payload}.${signature}`;
}

const run = randomBytes(4).toString("hex");
let users = 0;
/** A user id no earlier run has used. */
export function newUser(name: string): string {
  return `${name}-${run}-${++users}`;
}

/** A client of `user` against the stack; Node has no global WebSocket, so the `ws` package's. */
export function clientFor(user: string, options: Partial<ChatClientOptions> = {}): ChatClient {
  return new ChatClient({
    apiUrl: API_URL,
    wsUrl: WS_URL,
    token: () => mintToken(user),
    WebSocket: WebSocket as unknown as WebSocketConstructor,
    ...options,
  });
}

/** Fails fast, with a hint, when no stack is listening. */
export async function requireStack(): Promise<void> {
  try {
    const res = await fetch(`${API_URL}/inbox`, { headers: { Authorization: `Bearer ${mintToken("probe")}` } });
    if (res.status !== 200) throw new Error(`GET /inbox answered ${res.status}: ${await res.text()}`);
  } catch (e) {
    throw new Error(
      `no chat stack at ${API_URL} (${(e as Error).message}). Start it with infra/run-local.sh, ` +
        `or point CHAT_API_URL / CHAT_WS_URL at one.`,
    );
  }
}

export async function waitFor(what: string, cond: () => boolean, timeoutMs = 30_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Retries `check` until it passes: for reads of the inbox, whose index may trail the latest writes
 * by a moment (docs/api.md §14).
 */
export async function eventually<T>(check: () => Promise<T>, timeoutMs = 10_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (e) {
      if (Date.now() > end) throw e;
      await sleep(200);
    }
  }
}
