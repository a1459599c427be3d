export { ChatClient, randomUUID } from "./client.js";
export type {
  ChatClientOptions,
  ChatEventName,
  ChatEvents,
  TokenSource,
  WebSocketConstructor,
  WebSocketLike,
} from "./client.js";
export { ChangeError, ChatApiError, SendError, SyncError } from "./errors.js";
// The state module is public as a whole: the reducer and its steps, for apps that keep their own store.
export * from "./state.js";
export type * from "./types.js";
