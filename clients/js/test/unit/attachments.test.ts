// uploadAttachment, getAttachment and send with attachments, against a stub API and a stub S3 (fake
// fetch): the bytes go to the presigned URL with its signed headers, never to the API, and the send
// names the id; the stable link is asked with the token and its refusals are ChatApiErrors.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createAttachment, getAttachment, uploadAttachment } from "../../src/attachments.js";
import { ChatApiError, ChatClient } from "../../src/index.js";
import type { Attachment, AttachmentScan } from "../../src/index.js";

function stub(s3Status = 200) {
  const seen: { url: string; method: string; headers: Record<string, string>; body: unknown }[] = [];
  const fetch = (async (input: string | URL, init: RequestInit = {}) => {
    const url = String(input);
    const headers = (init.headers ?? {}) as Record<string, string>;
    const body = init.body instanceof Blob ? new Uint8Array(await init.body.arrayBuffer()) : init.body ? JSON.parse(String(init.body)) : undefined;
    seen.push({ url, method: init.method ?? "GET", headers, body });
    if (url.startsWith("http://s3.test/")) return new Response(null, { status: s3Status });
    if (url.endsWith("/attachments")) {
      const upload = { method: "PUT", url: "http://s3.test/b/a/c/att-1?X-Amz-Signature=x", expiresAt: "t",
        headers: { "content-type": "image/png", "content-length": "3", "x-amz-tagging": "chat-unattached=1" } };
      return new Response(JSON.stringify({ attachmentId: "att-1", upload }), { status: 201 });
    }
    const sent = JSON.parse(String(init.body));
    const message = { conversationId: "c", seq: 1, clientMsgId: sent.clientMsgId, senderId: "alice", body: sent.body,
      createdAt: "t", version: 1, attachments: sent.attachments?.map((attachmentId: string) => ({ attachmentId })) };
    return new Response(JSON.stringify(message), { status: 201 });
  }) as typeof globalThis.fetch;
  const client = new ChatClient({ apiUrl: "http://api.test", wsUrl: "ws://ws.test", token: "alice", fetch, sendRetry: { baseDelayMs: 1 } });
  return { client, seen };
}

describe("attachments", () => {
  it("uploads straight to the presigned URL with its signed headers, then sends the id", async () => {
    const { client, seen } = stub();
    const progress: number[] = [];
    const id = await uploadAttachment(client, "c", new Blob([new Uint8Array([1, 2, 3])], { type: "image/png" }), {
      fileName: "a.png",
      onProgress: (sent) => progress.push(sent),
    });
    assert.equal(id, "att-1");
    assert.deepEqual(seen[0]!.body, { fileName: "a.png", contentType: "image/png", size: 3 });
    const put = seen[1]!;
    assert.equal(put.method, "PUT");
    assert.ok(put.url.startsWith("http://s3.test/"), put.url);
    assert.equal(put.headers["content-type"], "image/png");
    assert.equal(put.headers["x-amz-tagging"], "chat-unattached=1");
    assert.deepEqual(put.body, new Uint8Array([1, 2, 3]));
    assert.equal(progress.at(-1), 3);
    const m = await client.send("c", "", { attachments: [id] });
    assert.deepEqual((seen[2]!.body as { attachments: string[] }).attachments, ["att-1"]);
    assert.equal(m.attachments?.[0]?.attachmentId, "att-1");
    client.close();
  });

  it("createAttachment alone answers the id and the presigned request, sending no bytes", async () => {
    const { client, seen } = stub();
    const created = await createAttachment(client, "c", { fileName: "a.png", contentType: "image/png", size: 3 });
    assert.equal(created.attachmentId, "att-1");
    assert.equal(created.upload.method, "PUT");
    assert.ok(created.upload.url.startsWith("http://s3.test/"));
    assert.deepEqual(seen.map((r) => [r.method, r.url]), [["POST", "http://api.test/conversations/c/attachments"]]);
    assert.deepEqual(seen[0]!.body, { fileName: "a.png", contentType: "image/png", size: 3 });
    client.close();
  });

  it("types a file the malware scan has not cleared, and its stable link's 409", async () => {
    const fetch = (async (input: string | URL) => {
      const url = String(input);
      if (url.endsWith("/attachments/att-1")) {
        const error = { error: { code: "attachment_pending", message: "being scanned" } };
        return new Response(JSON.stringify(error), { status: 409, headers: { "Retry-After": "2" } });
      }
      const att: Attachment = { attachmentId: "att-1", fileName: "a.txt", contentType: "text/plain", size: 3, scan: "pending" };
      return new Response(JSON.stringify({ messages: [{ conversationId: "c", seq: 1, clientMsgId: "m", senderId: "alice",
        body: "", createdAt: "t", version: 1, attachments: [att] }], lastSeq: 1, hasMore: false }), { status: 200 });
    }) as typeof globalThis.fetch;
    const client = new ChatClient({ apiUrl: "http://api.test", wsUrl: "ws://ws.test", token: "alice", fetch });
    const page = await client.history("c");
    const file = page.messages[0]!.attachments![0]!;
    const scan: AttachmentScan | undefined = file.scan;
    assert.equal(scan, "pending");
    assert.equal(file.url, undefined);
    await assert.rejects(getAttachment(client, "c", "att-1"), (e) =>
      e instanceof ChatApiError && e.status === 409 && e.code === "attachment_pending" && e.retryAfter === 2);
    client.close();
  });

  it("gets a file's bytes through its stable link, with the token", async () => {
    const seen: { url: string; auth: string | undefined }[] = [];
    const fetch = (async (input: string | URL, init: RequestInit = {}) => {
      seen.push({ url: String(input), auth: (init.headers as Record<string, string>).Authorization });
      // As fetch answers once it followed the API's 302 to the presigned URL.
      if (String(input).endsWith("/attachments/a%2F1")) return new Response(new Uint8Array([7, 8]), { status: 200, headers: { "content-type": "image/png" } });
      return new Response(JSON.stringify({ error: { code: "not_found", message: "attachment not found" } }), { status: 404 });
    }) as typeof globalThis.fetch;
    const client = new ChatClient({ apiUrl: "http://api.test/", wsUrl: "ws://ws.test", token: async () => "alice", fetch });
    const file = await getAttachment(client, "c 1", "a/1");
    assert.deepEqual(new Uint8Array(await file.arrayBuffer()), new Uint8Array([7, 8]));
    assert.equal(file.type, "image/png");
    assert.deepEqual(seen[0], { url: "http://api.test/conversations/c%201/attachments/a%2F1", auth: "Bearer alice" });
    await assert.rejects(getAttachment(client, "c", "gone"), (e) =>
      e instanceof ChatApiError && e.status === 404 && e.message === "attachment not found");
    client.close();
  });

  it("turns S3's refusal into a ChatApiError", async () => {
    const { client } = stub(403);
    await assert.rejects(uploadAttachment(client, "c", new Uint8Array([1]), { contentType: "image/png" }), (e) =>
      e instanceof ChatApiError && e.status === 403 && e.code === "upload_failed");
    client.close();
  });
});
