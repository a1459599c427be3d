// registerDevice, unregisterDevice, devices and setNotifications against a stub API (fake fetch):
// each sends the documented method, path and body (docs/api.md §31–§33), and a refusal comes back
// as a ChatApiError with the server's code.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ChatApiError, ChatClient } from "../../src/index.js";
import { devices, registerDevice, setNotifications, unregisterDevice } from "../../src/notifications.js";

type Seen = { url: string; method: string; body: unknown };

/** A client whose API answers `answer(request)` and records each request. */
function stub(answer: (r: Seen) => Response) {
  const seen: Seen[] = [];
  const fetch = (async (input: string | URL, init: RequestInit = {}) => {
    const r = { url: String(input), method: init.method ?? "GET", body: init.body ? JSON.parse(String(init.body)) : undefined };
    seen.push(r);
    return answer(r);
  }) as typeof globalThis.fetch;
  const client = new ChatClient({ apiUrl: "http://api.test", wsUrl: "ws://ws.test", token: "alice", fetch });
  return { client, seen };
}

const json = (status: number, body: unknown) => new Response(JSON.stringify(body), { status });
const refusal = (status: number, code: string) => json(status, { error: { code, message: code } });

describe("notifications", () => {
  it("registerDevice PUTs the platform and token to the encoded device path", async () => {
    const device = { deviceId: "phone 1", platform: "fcm", token: "tok", registeredAt: "t" };
    const { client, seen } = stub(() => json(200, device));
    assert.deepEqual(await registerDevice(client, "phone 1", "fcm", "tok"), device);
    assert.equal(seen[0]!.method, "PUT");
    assert.equal(seen[0]!.url, "http://api.test/devices/phone%201");
    assert.deepEqual(seen[0]!.body, { platform: "fcm", token: "tok" });
    client.close();
  });

  it("registerDevice's refusal (an empty token) is a ChatApiError with the server's code", async () => {
    const { client } = stub(() => refusal(400, "invalid_request"));
    await assert.rejects(registerDevice(client, "d", "apns", ""), (e) =>
      e instanceof ChatApiError && e.status === 400 && e.code === "invalid_request");
    client.close();
  });

  it("unregisterDevice DELETEs the device, with no body", async () => {
    const { client, seen } = stub(() => new Response(null, { status: 204 }));
    assert.equal(await unregisterDevice(client, "d/1"), undefined);
    assert.equal(seen[0]!.method, "DELETE");
    assert.equal(seen[0]!.url, "http://api.test/devices/d%2F1");
    assert.equal(seen[0]!.body, undefined);
    client.close();
  });

  it("devices lists the caller's devices", async () => {
    const list = [{ deviceId: "d", platform: "apns", token: "t", registeredAt: "t" }];
    const { client, seen } = stub(() => json(200, { devices: list }));
    assert.deepEqual(await devices(client), list);
    assert.equal(seen[0]!.method, "GET");
    assert.equal(seen[0]!.url, "http://api.test/devices");
    client.close();
  });

  it("setNotifications PUTs the settings to the conversation's notifications", async () => {
    const settings = { level: "none" as const, mutedUntil: "2030-01-01T00:00:00Z" };
    const { client, seen } = stub((r) => json(200, { conversationId: "c", notifications: r.body }));
    assert.deepEqual(await setNotifications(client, "c", settings), { conversationId: "c", notifications: settings });
    assert.equal(seen[0]!.method, "PUT");
    assert.equal(seen[0]!.url, "http://api.test/conversations/c/notifications");
    assert.deepEqual(seen[0]!.body, settings);
    client.close();
  });

  it("setNotifications' refusals keep their status and code", async () => {
    for (const [status, code] of [[403, "forbidden"], [404, "not_found"], [400, "invalid_request"]] as const) {
      const { client } = stub(() => refusal(status, code));
      await assert.rejects(setNotifications(client, "c", { level: "all" }), (e) =>
        e instanceof ChatApiError && e.status === status && e.code === code);
      client.close();
    }
  });
});
