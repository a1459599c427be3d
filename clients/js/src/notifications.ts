// Offline notifications (docs/api.md §31–§33) as functions over a ChatClient, a module of its own
// (`@chat-backend/client/notifications`): an app without push does not ship it.
import type { ChatClient } from "./index.js";
import type { Device, DevicePlatform, NotificationSettings } from "./types.js";

const devicePath = (deviceId: string) => `/devices/${encodeURIComponent(deviceId)}`;

/**
 * `PUT /devices/{deviceId}` (registerDevice): this installation gets offline notifications. At
 * most 10 devices per user; a token moves to whoever registered it last.
 */
export const registerDevice = (c: ChatClient, deviceId: string, platform: DevicePlatform, token: string): Promise<Device> =>
  c.request("PUT", devicePath(deviceId), { platform, token });

/** `DELETE /devices/{deviceId}` (unregisterDevice): no more notifications to it (idempotent). */
export const unregisterDevice = (c: ChatClient, deviceId: string): Promise<void> => c.request("DELETE", devicePath(deviceId));

/** `GET /devices`: the caller's registered devices, least recently registered first. */
export const devices = async (c: ChatClient): Promise<Device[]> =>
  (await c.request<{ devices: Device[] }>("GET", "/devices")).devices;

/**
 * `PUT /conversations/{id}/notifications` (setNotifications): mute (`{level: "none"}` or a
 * `mutedUntil`) or unmute (`{level: "all"}`) a conversation's notifications for the caller.
 */
export const setNotifications = (
  c: ChatClient,
  conversationId: string,
  settings: NotificationSettings,
): Promise<{ conversationId: string; notifications: NotificationSettings }> =>
  c.request("PUT", `/conversations/${encodeURIComponent(conversationId)}/notifications`, settings);
