// Presence (docs/api.md §38) as functions over a ChatClient, a module of its own
// (`@chat-backend/client/presence`); the pushes arrive as the client's "presence" event.
import type { ChatClient } from "./index.js";
import type { Presence } from "./types.js";

/** `POST /presence`: whether these users (1–100) are online, and when they last were. */
export const presence = async (c: ChatClient, userIds: string[]): Promise<Presence[]> =>
  (await c.request<{ presence: Presence[] }>("POST", "/presence", { userIds })).presence;

/** `PUT /me/presence`: `false` shows this user offline to everyone (without `lastActiveAt`). */
export const setPresenceVisible = (c: ChatClient, visible: boolean): Promise<{ visible: boolean }> =>
  c.request("PUT", "/me/presence", { visible });
