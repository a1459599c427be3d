// Group roles and slow mode, blocking, reports and moderation (docs/api.md §25–§30) as functions over a ChatClient: a module
// of its own (`@chat-backend/client/safety`), so that an app that does not use them does not ship
// them. A blocked caller gets ChatApiError code `blocked` (403), a suspended one `suspended` (403)
// on every call.
import type { ChatClient } from "./index.js";
import type { BlocksPage, Conversation, PageOptions, ReportReason, ReportReceipt, ReportsPage } from "./types.js";

const u = encodeURIComponent;
const conversationPath = (id: string) => `/conversations/${u(id)}`;
const messagePath = (id: string, seq: number) => `${conversationPath(id)}/messages/${seq}`;
const page = <T>(c: ChatClient, path: string, o: PageOptions): Promise<T> => {
  const q = new URLSearchParams();
  if (o.limit !== undefined) q.set("limit", String(o.limit));
  if (o.cursor) q.set("cursor", o.cursor);
  const s = q.toString();
  return c.request("GET", s ? `${path}?${s}` : path);
};

/** `PUT /me/blocks/{userId}` (blockUser): that user can no longer open or send in your direct conversation, nor add you to a group. */
export const block = (c: ChatClient, userId: string): Promise<void> => c.request("PUT", `/me/blocks/${u(userId)}`);

/** `DELETE /me/blocks/{userId}` (unblockUser). */
export const unblock = (c: ChatClient, userId: string): Promise<void> => c.request("DELETE", `/me/blocks/${u(userId)}`);

/** `GET /me/blocks` (blocks): the users you block, a page at a time. */
export const blocks = (c: ChatClient, options: PageOptions = {}): Promise<BlocksPage> => page(c, "/me/blocks", options);

/** `POST /conversations/{id}/bans/{userId}` (banMember; owner and admins): removes the user and keeps them out. */
export const ban = (c: ChatClient, conversationId: string, userId: string): Promise<void> =>
  c.request("POST", `${conversationPath(conversationId)}/bans/${u(userId)}`);

/** `DELETE /conversations/{id}/bans/{userId}` (unbanMember). */
export const unban = (c: ChatClient, conversationId: string, userId: string): Promise<void> =>
  c.request("DELETE", `${conversationPath(conversationId)}/bans/${u(userId)}`);

/** `POST /conversations/{id}/messages/{seq}/reports` (reportMessage): 202, a 30-day snapshot for the moderators. */
export const report = (c: ChatClient, conversationId: string, seq: number, reason: ReportReason, note?: string): Promise<ReportReceipt> =>
  // JSON drops an undefined `note`.
  c.request("POST", `${messagePath(conversationId, seq)}/reports`, { reason, note });

/** `GET /moderation/reports` (moderationReports; a moderator's token): open reports, oldest first. */
export const moderationReports = (c: ChatClient, options: PageOptions = {}): Promise<ReportsPage> =>
  page(c, "/moderation/reports", options);

/** `PUT /moderation/suspensions/{userId}` (suspendUser; moderators): every request of the user is then `403 suspended`. */
export const suspend = (c: ChatClient, userId: string): Promise<void> =>
  c.request("PUT", `/moderation/suspensions/${u(userId)}`);

/** `DELETE /moderation/suspensions/{userId}` (unsuspendUser; moderators). */
export const unsuspend = (c: ChatClient, userId: string): Promise<void> =>
  c.request("DELETE", `/moderation/suspensions/${u(userId)}`);

/** `PATCH /conversations/{id}` (updateConversation): a group's slow mode, 0–120 seconds (0: off). The owner or an admin. */
export const updateConversation = (c: ChatClient, conversationId: string, update: { slowModeSeconds: number }): Promise<Conversation> =>
  c.request("PATCH", conversationPath(conversationId), update);

/** `PUT /conversations/{id}/admins/{userId}` (addAdmin): the group's owner names a member an admin. */
export const addAdmin = (c: ChatClient, conversationId: string, userId: string): Promise<Conversation> =>
  c.request("PUT", `${conversationPath(conversationId)}/admins/${u(userId)}`);

/** `DELETE /conversations/{id}/admins/{userId}` (removeAdmin): the group's owner no longer names them an admin. */
export const removeAdmin = (c: ChatClient, conversationId: string, userId: string): Promise<Conversation> =>
  c.request("DELETE", `${conversationPath(conversationId)}/admins/${u(userId)}`);
