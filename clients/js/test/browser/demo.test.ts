// The demo page in headless Chromium (Debian's `chromium`, driven by playwright-core), two pages as
// two users against the local stack: a new conversation and messages both ways; the unread badge,
// and the read tick once the other side has read; a page whose socket is cut while messages are sent
// catches up with no duplicate and no gap; an edit and a reaction show live on the other page
// ("edited", the reaction's count); a green dot for an online peer and "… is typing" (docs/api.md
// §37, §38); the open conversation's mute toggle, kept across a reload (§32); an image both ways.
// Screenshots of both pages go to test-results/ on failure.
//
// The page: CHAT_DEMO_URL, else the stack's http://127.0.0.1:9003/, else this test serves
// clients/demo/dist itself. The API: the page's defaults, or CHAT_API_URL / CHAT_WS_URL.
// The browser: CHROMIUM_PATH, else `chromium` on PATH (apt-get install -y chromium).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it, type TestContext } from "node:test";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { newUser, requireStack } from "../helpers/stack.js";

const packageRoot = fileURLToPath(new URL("../../../", import.meta.url)); // clients/js (from build/test/browser)
const demoDist = join(packageRoot, "..", "demo", "dist");
const resultsDir = join(packageRoot, "test-results");

function chromiumPath(): string {
  if (process.env.CHROMIUM_PATH) return process.env.CHROMIUM_PATH;
  for (const name of ["chromium", "chromium-browser"]) {
    try {
      return execFileSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" }).trim();
    } catch {
      // not this one
    }
  }
  throw new Error("no Chromium found: apt-get install -y chromium (or set CHROMIUM_PATH)");
}

const TYPES: Record<string, string> = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".map": "application/json" };

/** Serves clients/demo/dist on a free port, for when no stack serves the page. */
async function serveDemo(): Promise<{ url: string; server: Server }> {
  if (!existsSync(join(demoDist, "index.html"))) throw new Error(`${demoDist} is missing: run npm run build`);
  const server = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname)).replace(/^(\.\.[/\\])+/, "");
    const file = join(demoDist, path.endsWith("/") ? "index.html" : path);
    if (!file.startsWith(demoDist) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" }).end(readFileSync(file));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return { url: `http://127.0.0.1:${port}/`, server };
}

async function reachable(url: string): Promise<boolean> {
  try {
    return (await fetch(url, { signal: AbortSignal.timeout(2000) })).ok;
  } catch {
    return false;
  }
}

let context: BrowserContext;
let profile: string;
let demoUrl: string;
let ownServer: Server | undefined;

before(async () => {
  await requireStack();
  if (process.env.CHAT_DEMO_URL) demoUrl = process.env.CHAT_DEMO_URL;
  else if (await reachable("http://127.0.0.1:9003/")) demoUrl = "http://127.0.0.1:9003/";
  else {
    const served = await serveDemo();
    ownServer = served.server;
    demoUrl = served.url;
    console.log(`no page at :9003; serving ${demoDist} at ${demoUrl}`);
  }
  profile = mkdtempSync(join(tmpdir(), "chat-demo-chromium-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath(),
    headless: true,
    args: [
      "--no-sandbox",
      "--headless",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await context?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  ownServer?.close();
});

function pageUrl(user: string): string {
  const u = new URL(demoUrl);
  u.searchParams.set("user", user);
  if (process.env.CHAT_API_URL) u.searchParams.set("api", process.env.CHAT_API_URL);
  if (process.env.CHAT_WS_URL) u.searchParams.set("ws", process.env.CHAT_WS_URL);
  if (process.env.CHAT_LOCAL_JWT_SECRET) u.searchParams.set("secret", process.env.CHAT_LOCAL_JWT_SECRET);
  return u.toString();
}

/** Requests each page has sent and not yet seen answered (REST calls, not the WebSocket). */
const inFlight = new WeakMap<Page, Set<unknown>>();

/** Waits until the page has had no request in flight for `quietMs`. */
async function restIdle(page: Page, quietMs = 500, timeoutMs = 30_000): Promise<void> {
  const started = Date.now();
  let quietSince = Date.now();
  while (Date.now() - quietSince < quietMs) {
    if (Date.now() - started > timeoutMs) throw new Error("the page's requests did not settle");
    if ((inFlight.get(page)?.size ?? 0) > 0) quietSince = Date.now();
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function openAs(user: string, log: string[], pages: Record<string, Page>, as: string): Promise<Page> {
  const page = await context.newPage();
  pages[as] = page; // for the screenshot, should anything below fail
  const pending = new Set<unknown>();
  inFlight.set(page, pending);
  page.on("request", (r) => pending.add(r));
  page.on("requestfinished", (r) => pending.delete(r));
  page.on("requestfailed", (r) => pending.delete(r));
  page.on("console", (m) => log.push(`[${user} console.${m.type()}] ${m.text()}`));
  page.on("pageerror", (e) => log.push(`[${user} pageerror] ${e.message}`));
  await page.goto(pageUrl(user));
  await page.waitForSelector("body[data-ready=true]", { timeout: 30_000 });
  return page;
}

/** The seqs and bodies of the messages shown in a page's pane, in DOM order. */
function shown(page: Page): Promise<{ seq: number; body: string }[]> {
  return page.$$eval("#messages li", (lis) =>
    lis.map((li) => ({ seq: Number((li as HTMLElement).dataset.seq), body: li.querySelector(".body")?.textContent ?? "" })),
  );
}

async function send(page: Page, text: string): Promise<void> {
  await page.fill("#body", text);
  await page.press("#body", "Enter");
}

/**
 * Runs `body` with a page for each of two new users; should it fail, screenshots of both pages
 * (test-results/browser-<prefix><user>.png) and their last log lines go with the failure.
 */
async function withTwoPages(
  t: TestContext,
  prefix: string,
  body: (a: Page, b: Page, alice: string, bob: string) => Promise<void>,
): Promise<void> {
  const alice = newUser("alice");
  const bob = newUser("bob");
  const log: string[] = [];
  const pages: Record<string, Page> = {};
  try {
    const a = await openAs(alice, log, pages, "alice");
    const b = await openAs(bob, log, pages, "bob");
    await body(a, b, alice, bob);
  } catch (e) {
    mkdirSync(resultsDir, { recursive: true });
    for (const [who, page] of Object.entries(pages)) {
      const file = join(resultsDir, `browser-${prefix}${who}.png`);
      await page.screenshot({ path: file, fullPage: true }).catch(() => {});
      t.diagnostic(`screenshot: ${file}`);
    }
    for (const line of log.slice(-40)) t.diagnostic(line);
    throw e;
  }
}

describe("demo page, two users in Chromium", () => {
  it("conversation, unread badge, read tick, catch-up after a cut socket, a live edit and reaction", { timeout: 180_000 }, (t) =>
    withTwoPages(t, "", async (a, b, alice, bob) => {
      // Alice starts a direct conversation with Bob and writes.
      await a.fill("#peer", bob);
      await a.click("#new-direct button");
      await a.waitForSelector("#composer:not([hidden])");
      await send(a, "Hello Bob <b>not bold</b> 👋");
      await a.waitForSelector('#messages li[data-seq="1"]');
      assert.equal(await a.textContent('#messages li[data-seq="1"] .tick'), "✓ sent");

      // Bob sees it in his list, unread.
      const bobRow = b.locator("#conversations li", { hasText: alice });
      await bobRow.waitFor({ timeout: 30_000 });
      await b.waitForFunction(() => document.querySelector("#conversations .badge:not([hidden])")?.textContent === "1", null, { timeout: 30_000 });

      // Bob opens it: the badge goes, and Alice's tick turns to read once his (debounced) mark lands.
      await bobRow.click();
      await b.waitForSelector('#messages li[data-seq="1"]');
      assert.equal(await b.textContent('#messages li[data-seq="1"] .body'), "Hello Bob <b>not bold</b> 👋");
      await b.waitForFunction(() => document.querySelectorAll("#conversations .badge:not([hidden])").length === 0);
      await a.waitForFunction(() => document.querySelector('#messages li[data-seq="1"] .tick')?.textContent === "✓✓ read", null, { timeout: 30_000 });

      // Bob replies; Alice has the conversation open and sees it.
      await send(b, "Hi Alice");
      await a.waitForSelector('#messages li[data-seq="2"]', { timeout: 30_000 });
      assert.equal(await a.textContent('#messages li[data-seq="2"] .body'), "Hi Alice");

      // Cut Bob's socket (and keep it cut), send meanwhile, then let him back. First his socket must
      // be live and caught up, and every REST call of his page answered: a catch-up, list reload or
      // gap fill still in flight would fetch the messages sent meanwhile over REST, which is right
      // for the SDK but would not show the catch-up after the cut.
      await b.waitForFunction(() => document.getElementById("status")?.dataset.state === "open", null, { timeout: 60_000 });
      await b.evaluate(() => (window as unknown as { chatDemo: { goOffline(): void } }).chatDemo.goOffline());
      await b.waitForFunction(() => document.getElementById("status")?.dataset.state !== "open");
      await restIdle(b);
      const offline = [1, 2, 3, 4, 5].map((i) => `sent while Bob was offline ${i}`);
      for (const text of offline) {
        await send(a, text);
        await a.waitForFunction((n) => document.querySelectorAll("#messages li").length >= n, 2 + offline.indexOf(text) + 1);
      }
      await new Promise((r) => setTimeout(r, 1500));
      assert.deepEqual((await shown(b)).map((m) => m.seq), [1, 2], "nothing reached Bob while his socket was cut");

      await b.evaluate(() => (window as unknown as { chatDemo: { goOnline(): void } }).chatDemo.goOnline());
      await b.waitForFunction(() => document.getElementById("status")?.dataset.state === "open", null, { timeout: 60_000 });
      await b.waitForFunction(() => document.querySelectorAll("#messages li").length >= 7, null, { timeout: 30_000 });
      await new Promise((r) => setTimeout(r, 1500)); // a duplicate would show up by now
      const caughtUp = await shown(b);
      assert.deepEqual(caughtUp.map((m) => m.seq), [1, 2, 3, 4, 5, 6, 7], "no gap, no duplicate, in order");
      assert.deepEqual(caughtUp.slice(2).map((m) => m.body), offline);
      // Bob has the conversation open, so he read them; Alice's ticks say so.
      await a.waitForFunction(() => document.querySelector('#messages li[data-seq="7"] .tick')?.textContent === "✓✓ read", null, { timeout: 30_000 });

      // Alice edits one of her messages and reacts to it: Bob's page shows both live, through the
      // "change" events (the message keeps its place; nothing is added to the list).
      await a.hover('#messages li[data-seq="3"]'); // its controls show on hover
      await a.click('#messages li[data-seq="3"] button[data-action="edit"]');
      await a.waitForSelector("#composer.editing");
      assert.equal(await a.inputValue("#body"), offline[0]);
      await send(a, "edited while Bob was online");
      await a.waitForSelector('#messages li[data-seq="3"] .edited:not([hidden])');
      await b.waitForSelector('#messages li[data-seq="3"] .edited:not([hidden])', { timeout: 30_000 });
      assert.equal(await b.textContent('#messages li[data-seq="3"] .body'), "edited while Bob was online");
      await a.hover('#messages li[data-seq="3"]');
      await a.click('#messages li[data-seq="3"] .actions button[data-react="👍"]');
      await a.waitForSelector('#messages li[data-seq="3"] .reactions button.mine[data-react="👍"]');
      await b.waitForFunction(
        () => document.querySelector('#messages li[data-seq="3"] .reactions button[data-react="👍"]')?.textContent === "👍 1",
        null,
        { timeout: 30_000 },
      );
      assert.equal(await b.$$eval('#messages li[data-seq="3"] .reactions button.mine', (bs) => bs.length), 0, "not Bob's reaction");
      assert.deepEqual((await shown(b)).map((m) => m.seq), [1, 2, 3, 4, 5, 6, 7], "an edit adds no message");
    }),
  );

  it("a green dot for an online peer, and \"… is typing\" while the other types", { timeout: 120_000 }, (t) =>
    withTwoPages(t, "typing-", async (a, b, alice, bob) => {
      await a.fill("#peer", bob);
      await a.click("#new-direct button");
      await a.waitForSelector("#composer:not([hidden])");
      await send(a, "are you there?");
      const bobRow = b.locator("#conversations li", { hasText: alice });
      await bobRow.waitFor({ timeout: 30_000 });
      await bobRow.click();
      await b.waitForSelector('#messages li[data-seq="1"]');
      // Both pages hold a live socket: each shows the other online (within a presence refresh).
      await b.waitForSelector("#conversations li .dot.online", { timeout: 30_000 });
      await a.waitForSelector("#conversations li .dot.online", { timeout: 30_000 });

      // Alice types (no send): Bob's page says so, and stops saying so when she sends.
      await a.fill("#body", "typing a reply");
      await b.waitForFunction((who) => document.getElementById("typing")?.textContent === `${who} is typing…`, alice, { timeout: 10_000 });
      assert.equal(await a.textContent("#typing"), "", "one's own typing is not shown");
      await a.press("#body", "Enter");
      await b.waitForFunction(() => document.getElementById("typing")?.textContent === "", null, { timeout: 10_000 });
      await b.waitForSelector('#messages li[data-seq="2"]', { timeout: 30_000 });

      // Bob leaves: Alice's dot for him goes grey.
      await b.close();
      await a.waitForSelector("#conversations li .dot:not(.online)", { timeout: 30_000 });
    }),
  );
  it("the open conversation's mute toggle: shown, kept across a reload, and the member's own", { timeout: 120_000 }, (t) =>
    withTwoPages(t, "mute-", async (a, b, alice, bob) => {
      const muteState = (page: Page) =>
        page.$eval("#mute", (m) => ({ shown: !(m as HTMLElement).hidden, pressed: m.getAttribute("aria-pressed"), text: m.textContent }));
      const waitPressed = (page: Page, pressed: boolean) =>
        page.waitForFunction(
          (p) => {
            const m = document.getElementById("mute");
            return m !== null && !m.hidden && m.getAttribute("aria-pressed") === String(p);
          },
          pressed,
          { timeout: 30_000 },
        );
      const reopen = async (page: Page, peer: string) => {
        await page.reload();
        await page.waitForSelector("body[data-ready=true]", { timeout: 30_000 });
        await page.locator("#conversations li", { hasText: peer }).click({ timeout: 30_000 });
        await page.waitForSelector("#composer:not([hidden])");
      };
      await a.fill("#peer", bob);
      await a.click("#new-direct button");
      await a.waitForSelector("#composer:not([hidden])");
      await send(a, "mute me if you like");
      await waitPressed(a, false);
      assert.deepEqual(await muteState(a), { shown: true, pressed: "false", text: "Mute" });

      // Alice mutes it: the page says so, and so does the page loaded again.
      await a.click("#mute");
      await waitPressed(a, true);
      assert.deepEqual(await muteState(a), { shown: true, pressed: "true", text: "Muted (unmute)" });
      await reopen(a, bob);
      await waitPressed(a, true);
      assert.equal(await a.textContent("#mute"), "Muted (unmute)", "still muted after a reload");

      // Bob's settings are his own: the conversation is not muted for him.
      await b.locator("#conversations li", { hasText: alice }).click({ timeout: 30_000 });
      await waitPressed(b, false);

      // Unmuted, and still so after a reload.
      await a.click("#mute");
      await waitPressed(a, false);
      await reopen(a, bob);
      await waitPressed(a, false);
      assert.deepEqual(await muteState(a), { shown: true, pressed: "false", text: "Mute" });
    }),
  );
  it("an image sent from one page shows on the other, a click away from the full image", { timeout: 120_000 }, (t) =>
    withTwoPages(t, "image-", async (a, b, alice, bob) => {
      await a.fill("#peer", bob);
      await a.click("#new-direct button");
      await a.waitForSelector("#composer:not([hidden])");
      // A 2×2 PNG: uploaded straight to S3 (the S3 gate) by the page, then sent.
      const png = Buffer.from(
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg==",
        "base64",
      );
      await a.setInputFiles("#file", { name: "dot.png", mimeType: "image/png", buffer: png });
      await a.waitForSelector('#messages li[data-seq="1"] img.thumb', { timeout: 30_000 });
      await b.locator("#conversations li", { hasText: alice }).click({ timeout: 30_000 });
      // Bob's page shows the image itself (loaded from its presigned URL), linked to the full one.
      await b.waitForFunction(
        () => (document.querySelector('#messages li[data-seq="1"] img.thumb') as HTMLImageElement | null)?.naturalWidth === 2,
        null,
        { timeout: 30_000 },
      );
      const href = await b.getAttribute('#messages li[data-seq="1"] a.file', "href");
      const full = await fetch(href!);
      assert.equal(full.status, 200);
      assert.deepEqual(Buffer.from(await full.arrayBuffer()), png);
    }),
  );
});
