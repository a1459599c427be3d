// The API's objects, exactly as docs/api.md §5 and §15 name them (camelCase JSON, ids are strings, seq values
// are integers, times are RFC 3339 UTC strings).

export type ConversationType = "direct" | "group";

export interface Conversation {
  conversationId: string;
  type: ConversationType;
  /** Groups only. */
  title?: string;
  memberIds: string[];
  memberCount: number;
  lastSeq: number;
  createdAt: string;
  lastMessageAt: string | null;
}

export interface Message {
  conversationId: string;
  seq: number;
  clientMsgId: string;
  senderId: string;
  body: string;
  createdAt: string;
}

/** `GET /conversations/{id}/messages`: `messages` ascending by seq; `hasMore` in the direction of travel. */
export interface HistoryPage {
  messages: Message[];
  lastSeq: number;
  hasMore: boolean;
}

export interface HistoryOptions {
  /** Scroll back: the newest `limit` messages with `seq < beforeSeq`. */
  beforeSeq?: number;
  /** Catch up: the oldest `limit` messages with `seq > afterSeq`. */
  afterSeq?: number;
  /** 1–100, the server's default is 50. */
  limit?: number;
}

export interface ReadResult {
  conversationId: string;
  lastReadSeq: number;
  advanced: boolean;
}

export interface MemberReadState {
  userId: string;
  lastReadSeq: number;
}

/** `GET /conversations/{id}/reads` (docs/api.md §13, readStates): every member's watermark. */
export interface ReadStates {
  conversationId: string;
  lastSeq: number;
  members: MemberReadState[];
}

export interface InboxLastMessage {
  seq: number;
  senderId: string;
  /** The first 200 characters. */
  body: string;
  createdAt: string;
}

export interface InboxEntry {
  conversationId: string;
  type: ConversationType;
  title?: string;
  /** Direct conversations only. */
  peerId?: string;
  memberCount: number;
  lastSeq: number;
  lastReadSeq: number;
  unreadCount: number;
  lastMessageAt: string | null;
  lastMessage?: InboxLastMessage | null;
}

export interface InboxPage {
  conversations: InboxEntry[];
  nextCursor: string | null;
}

export interface InboxOptions {
  /** 1–100, the server's default is 20. */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string | null;
}

export interface CreateGroupInput {
  title: string;
  memberIds: string[];
  /** Makes the create idempotent: re-sending the same id returns the group it created. */
  clientRequestId?: string;
}

// ---- Push events (server -> client WebSocket frames, docs/api.md §15.2) ----

/** Full form, or the light form `{type, conversationId, seq}` pushed for groups of more than 200 members. */
export interface MessageNewEvent {
  type: "message.new";
  conversationId: string;
  seq: number;
  senderId?: string;
  clientMsgId?: string;
  body?: string;
  createdAt?: string;
}

export interface ReadUpdatedEvent {
  type: "read.updated";
  conversationId: string;
  userId: string;
  lastReadSeq: number;
}

export interface MembersEvent {
  type: "member.added" | "member.removed";
  conversationId: string;
  userIds: string[];
}

export type ServerEvent = MessageNewEvent | ReadUpdatedEvent | MembersEvent;

export type ConnectionState = "connecting" | "open" | "closed";
