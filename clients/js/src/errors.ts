/**
 * An error answer of the API (`{"error": {"code", "message"}}`, docs/api.md §2), or a request that got no
 * answer at all: then `status` is 0 and `code` is `"network_error"` (or `"timeout"`).
 */
export class ChatApiError extends Error {
  readonly status: number;
  readonly code: string;
  /** From a `Retry-After` header (429, sometimes 503), in milliseconds. */
  readonly retryAfterMs: number | undefined;

  constructor(status: number, code: string, message: string, retryAfterMs?: number, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ChatApiError";
    this.status = status;
    this.code = code;
    this.retryAfterMs = retryAfterMs;
  }

  /**
   * `Retry-After` in whole seconds (429 `rate_limited`, `slow_mode`, `throttled`; sometimes 503; 409
   * `attachment_pending`, an attachment whose malware scan has no verdict yet): when the same request
   * is admitted again (docs/api.md §24, §25, §35).
   */
  get retryAfter(): number | undefined {
    return this.retryAfterMs === undefined ? undefined : Math.ceil(this.retryAfterMs / 1000);
  }

  /**
   * A definite refusal by the caller's own rate limit or the group's slow mode: nothing was stored,
   * and the same request is admitted after `retryAfter`.
   */
  get limited(): boolean {
    return this.status === 429 && (this.code === "rate_limited" || this.code === "slow_mode");
  }

  /** Whether the same request may succeed later: no answer, 429, or a server error. */
  get retryable(): boolean {
    return this.status === 0 || this.status === 429 || this.status >= 500;
  }

  /**
   * An error answer: the API's error body (`{"error":{"code","message"}}`); for answers from in
   * front of the functions (API Gateway's own `{"message":"Unauthorized"}`, `{"message":"Too Many
   * Requests"}`, `{"message":"Request Entity Too Large"}`, `{"message":"Service Unavailable"}`, …,
   * or no JSON at all) a code from the status: `unauthorized`, `throttled`, `payload_too_large`,
   * `unavailable` (503, 504: the outcome is unknown), `internal` (other 5xx). `retryAfter`: the
   * answer's `Retry-After` header.
   */
  static fromResponse(status: number, text: string, retryAfter: string | null): ChatApiError {
    let code = CODE_BY_STATUS[status] ?? (status >= 500 ? "internal" : `http_${status}`);
    let message = text.slice(0, 200) || `HTTP ${status}`;
    try {
      const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown }; message?: unknown };
      if (typeof parsed.error?.code === "string") code = parsed.error.code;
      if (typeof parsed.error?.message === "string") message = parsed.error.message;
      else if (typeof parsed.message === "string") message = parsed.message;
    } catch {
      // not JSON: keep the status's code and the text
    }
    return new ChatApiError(status, code, message, parseRetryAfter(retryAfter));
  }
}

const CODE_BY_STATUS: Record<number, string> = {
  400: "invalid_request",
  401: "unauthorized",
  403: "forbidden",
  404: "not_found",
  409: "conflict",
  413: "payload_too_large",
  429: "throttled",
  503: "unavailable",
  504: "unavailable",
};

/**
 * A `send` that failed (after its retries). Keep `clientMsgId` with the pending message and send it
 * again later with `send(conversationId, body, { clientMsgId })`: if an earlier attempt was stored after
 * all (a `503`, a timeout, a network error: the outcome is unknown), the server answers with that
 * message instead of creating a second one.
 */
export class SendError extends ChatApiError {
  readonly conversationId: string;
  readonly clientMsgId: string;

  constructor(conversationId: string, clientMsgId: string, cause: unknown) {
    super(...failure(cause));
    this.name = "SendError";
    this.conversationId = conversationId;
    this.clientMsgId = clientMsgId;
  }
}

/**
 * An `edit` or `delete` that failed (after its retries). As with `SendError`: keep `clientChangeId`
 * and pass it back (`edit(id, seq, body, { clientChangeId })`, `delete(id, seq, { clientChangeId })`)
 * to try again later: an attempt that was stored after all is answered, not repeated.
 */
export class ChangeError extends ChatApiError {
  readonly conversationId: string;
  readonly seq: number;
  readonly clientChangeId: string;

  constructor(conversationId: string, seq: number, clientChangeId: string, cause: unknown) {
    super(...failure(cause));
    this.name = "ChangeError";
    this.conversationId = conversationId;
    this.seq = seq;
    this.clientChangeId = clientChangeId;
  }
}

/** The ChatApiError fields of whatever a request failed with (status 0, `client_error` if no API answer). */
function failure(cause: unknown): [number, string, string, number | undefined, { cause: unknown }] {
  const api = cause instanceof ChatApiError ? cause : undefined;
  return [
    api?.status ?? 0,
    api?.code ?? "client_error",
    api?.message ?? String(cause instanceof Error ? cause.message : cause),
    api?.retryAfterMs,
    { cause },
  ];
}

/**
 * Passed to "error" listeners when the live connection could not bring a conversation up to date
 * (its catch-up after a reconnect, or a gap fill), or could not read the inbox (`conversationId`
 * null). The connection stays open and other conversations go on; the client retries this one with
 * backoff, and holds its newer pushes back until the gap below them is filled.
 */
export class SyncError extends Error {
  readonly conversationId: string | null;
  /** How many times in a row it has failed. */
  readonly attempt: number;
  /** When the client tries again, in milliseconds from now. */
  readonly retryInMs: number;

  constructor(conversationId: string | null, cause: unknown, attempt: number, retryInMs: number) {
    const what = conversationId === null ? "the inbox" : `conversation ${conversationId}`;
    super(
      `could not catch up ${what} (attempt ${attempt}; retrying in ${Math.round(retryInMs)} ms): ${cause instanceof Error ? cause.message : String(cause)}`,
      { cause },
    );
    this.name = "SyncError";
    this.conversationId = conversationId;
    this.attempt = attempt;
    this.retryInMs = retryInMs;
  }
}

/** `Retry-After` is either delay-seconds or an HTTP date (RFC 9110 §10.2.3). */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+(\.\d+)?$/.test(v)) return Math.round(Number(v) * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/**
 * How long to wait before retry number `attempt` (1, 2, …): jittered exponential backoff (between half
 * and all of `base · 2^(attempt−1)`, at most `cap`), and never less than the server's `Retry-After`
 * plus a random jitter of up to half of it, at least up to 1 s, so that clients throttled together
 * do not come back together.
 */
export function retryDelay(error: unknown, attempt: number, base: number, cap: number, random = Math.random): number {
  const ceiling = Math.min(cap, base * 2 ** Math.min(attempt - 1, 30));
  const backoff = ceiling / 2 + random() * (ceiling / 2);
  const after = error instanceof ChatApiError ? error.retryAfterMs : undefined;
  return after === undefined ? backoff : Math.max(backoff, after + random() * Math.max(after / 2, 1000));
}
