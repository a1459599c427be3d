export { ChatClient, randomUUID } from "./client.js";
export type {
  ChatClientOptions,
  ChatEventName,
  ChatEvents,
  TokenSource,
  WebSocketConstructor,
  WebSocketLike,
} from "./client.js";
export { ChatApiError, SendError, SyncError } from "./errors.js";
export {
  applyPage,
  forget,
  initialState,
  messageOf,
  missingAfter,
  observe,
  observeReads,
  reduce,
} from "./state.js";
export type { ChatState, ConversationPage, ConversationState, Step } from "./state.js";
export type * from "./types.js";
