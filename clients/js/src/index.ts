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
export {
  applyChange,
  applyChanges,
  applyPage,
  forget,
  initialState,
  messageOf,
  missingAfter,
  missingChangesAfter,
  observe,
  observeChanges,
  observeReads,
  reduce,
} from "./state.js";
export type { ChatState, ConversationChanges, ConversationPage, ConversationState, Step } from "./state.js";
export type * from "./types.js";
