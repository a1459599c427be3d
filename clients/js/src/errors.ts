/**
 * An error answer of the API (`{"error": {"code", "message"}}`, docs/api.md §2), or a request that got no
 * answer at all: then `status` is 0 and `code` is `"network_error"` (or `"timeout"`).
 */
export class ChatApiError extends Error {
  readonly status: number;
  readonly code: string;
  /** From a `Retry-After` header (429, sometimes 503), in milliseconds. */
  readonly retryAfterMs: number | undefined;

  constructor(status: number, code: string, message: string, retryAfterMs?: number) {
    super(message);
    this.name = "ChatApiError";
    this.status = status;
    this.code = code;
    this.retryAfterMs = retryAfterMs;
  }

  /** Whether the same request may succeed later: no answer, 429, or a server error. */
  get retryable(): boolean {
    return this.status === 0 || this.status === 429 || this.status >= 500;
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
