// Attachments (docs/api.md §34–§36): the upload and the stable link, a module of its own
// (`@chat-backend/client/attachments`), so that an app without files does not ship it. A message
// carries the ids: `client.send(conversationId, body, { attachments: [id] })`.
import type { ChatClient } from "./index.js";
import { ChatApiError } from "./index.js";
import type { CreatedAttachment } from "./types.js";

/**
 * `POST /conversations/{id}/attachments` (createAttachment, docs/api.md §34) alone: the attachment
 * id and the presigned request for an app that sends the bytes itself (a native uploader, a
 * background transfer). `uploadAttachment` does both.
 */
export const createAttachment = (
  client: ChatClient,
  conversationId: string,
  input: { fileName: string; contentType: string; size: number },
): Promise<CreatedAttachment> =>
  client.request("POST", `/conversations/${encodeURIComponent(conversationId)}/attachments`, input);

/**
 * `POST /conversations/{id}/attachments`, then the bytes straight to S3 with the presigned request
 * it answers (never through the API). Resolves with the attachment id. `onProgress(sent, total)`
 * reports the upload (in browsers as it goes; elsewhere once done). S3's refusal becomes a
 * ChatApiError (`upload_failed`, its status); a network failure rejects.
 */
export async function uploadAttachment(
  client: ChatClient,
  conversationId: string,
  file: Blob | Uint8Array | ArrayBuffer,
  options: { fileName?: string; contentType?: string; onProgress?: (sent: number, total: number) => void } = {},
): Promise<string> {
  const data = file instanceof Blob ? file : new Blob([file as BlobPart]);
  const size = data.size;
  const create = () =>
    createAttachment(client, conversationId, {
      fileName: options.fileName ?? (file as File).name ?? "file",
      // None known: "" (a 415: octet streams are not on the allowlist either).
      contentType: options.contentType || data.type,
      size,
    });
  // Retried as a send is (a retry makes another record; the unused one expires in 24 h).
  let created: CreatedAttachment | undefined;
  for (let attempt = 1; !created; attempt++) {
    try {
      created = await create();
    } catch (e) {
      if (!(e instanceof ChatApiError) || !e.retryable || attempt >= 4) throw e;
      await new Promise((r) => setTimeout(r, e.retryAfterMs ?? 250 * 2 ** attempt));
    }
  }
  const { method, url, headers = {} } = created.upload;
  // Content-Length is set by the sender itself (as signed: the body is exactly `size` bytes).
  delete headers["content-length"];
  const status = await putBytes(client.fetch, method, url, headers, data, (n) => options.onProgress?.(n, size));
  if (status < 200 || status > 299) throw new ChatApiError(status, "upload_failed", "S3");
  return created.attachmentId;
}

/**
 * `GET /conversations/{id}/attachments/{attachmentId}` (getAttachment, docs/api.md §35): the stable
 * link a message's attachment keeps, followed to the file's bytes (the API answers with a fresh
 * presigned URL; the bucket's CORS lets the app's origins read it). A refusal is a ChatApiError:
 * `404` (not a member, or no such attachment), `409 attachment_pending` (scanning; `retryAfter`),
 * `attachment_unsafe`, `attachment_unscannable`; S3's own (`403` once its message is deleted).
 */
export async function getAttachment(client: ChatClient, conversationId: string, attachmentId: string): Promise<Blob> {
  const path = `/conversations/${encodeURIComponent(conversationId)}/attachments/${encodeURIComponent(attachmentId)}`;
  let res: Response;
  try {
    res = await client.fetch(client.apiUrl + path, { headers: { Authorization: `Bearer ${await client.token()}` } });
  } catch (e) {
    throw new ChatApiError(0, "network_error", `GET ${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (res.ok) return res.blob();
  throw ChatApiError.fromResponse(res.status, await res.text(), res.headers.get("Retry-After"));
}

/** Sends `data` with a presigned request: XMLHttpRequest where there is one (upload progress), else fetch. */
function putBytes(
  doFetch: typeof fetch,
  method: string,
  url: string,
  headers: Record<string, string>,
  data: Blob,
  progress: (sent: number) => void,
): Promise<number> {
  const X = (globalThis as { XMLHttpRequest?: new () => XMLHttpRequest }).XMLHttpRequest;
  if (!X) return doFetch(url, { method, headers, body: data }).then((r) => (progress(data.size), r.status));
  return new Promise((resolve) => {
    const xhr = new X();
    xhr.open(method, url);
    for (const k in headers) xhr.setRequestHeader(k, headers[k]!);
    xhr.upload.onprogress = (e) => progress(e.loaded);
    xhr.onload = () => resolve(xhr.status);
    xhr.onerror = () => resolve(0);
    xhr.send(data);
  });
}

