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
  /** The conversation's newest changeSeq, 0 when none. */
  lastChange: number;
  /** A group's admins (docs/api.md §26); absent when none. */
  admins?: string[];
  /** A group's slow mode in seconds (docs/api.md §25); absent when off. */
  slowModeSeconds?: number;
  /** The caller's notification settings (`getConversation` only; docs/api.md §32). */
  notifications?: NotificationSettings;
}

/** Offline notifications of one conversation (docs/api.md §32): `none`, or a `mutedUntil` in the future, sends nothing. */
export interface NotificationSettings {
  level: "all" | "none";
  /** RFC 3339; nothing is sent before it. */
  mutedUntil?: string;
}

export type DevicePlatform = "apns" | "apns_sandbox" | "fcm";

/** A device registered for offline notifications (docs/api.md §31). */
export interface Device {
  deviceId: string;
  platform: DevicePlatform;
  token: string;
  registeredAt: string;
}

export interface ReactionCount {
  reaction: string;
  count: number;
}

export interface Message {
  conversationId: string;
  seq: number;
  clientMsgId: string;
  senderId: string;
  /** `""` once deleted. */
  body: string;
  createdAt: string;
  /** 1 = never edited, +1 per edit. */
  version: number;
  /** When it was last edited; absent if never. */
  editedAt?: string;
  /** A tombstone: `body` is `""` and there are no reactions. */
  deleted?: boolean;
  /** Counts per reaction; absent when none. */
  reactions?: ReactionCount[];
  /** Files sent with it (docs/api.md §34); absent when none. */
  attachments?: Attachment[];
}

/**
 * Where an attachment's malware scan stands (docs/api.md §36), on deployments that scan uploads:
 * `pending` until the verdict, then `clean` (served), `unsafe` (infected) or `unscannable` (could not
 * be scanned): never served. The stable link `GET /conversations/{id}/attachments/{attachmentId}`
 * answers `409` with the code `attachment_pending` (and `retryAfter`) until the verdict, then
 * redirects to a clean file, or answers `attachment_unsafe` / `attachment_unscannable` for good.
 */
export type AttachmentScan = "pending" | "clean" | "unsafe" | "unscannable";

/**
 * A file of a message. `url` is presigned afresh on every read: store the stable link instead. `url`
 * and `urlExpiresAt` are absent while `scan` says anything but `clean` (malware scanning, §36).
 */
export interface Attachment {
  attachmentId: string;
  fileName: string;
  contentType: string;
  size: number;
  url?: string;
  urlExpiresAt?: string;
  width?: number;
  height?: number;
  thumbnailUrl?: string;
  /** Only where uploads are scanned for malware, for a file uploaded while they were. */
  scan?: AttachmentScan;
}

/** `createAttachment`'s answer: the presigned request that carries the bytes straight to S3. */
export interface CreatedAttachment {
  attachmentId: string;
  upload: { method: string; url: string; headers?: Record<string, string>; fields?: Record<string, string>; expiresAt: string };
}

export type ChangeType = "message.edited" | "message.deleted" | "reaction.added" | "reaction.removed";

/** One entry of a conversation's change log (`GET /conversations/{id}/changes`). */
export interface Change {
  /** Gap-free per conversation: 1, 2, 3 … */
  changeSeq: number;
  type: ChangeType;
  /** The message it changed. */
  seq: number;
  /** Who made the change. */
  userId: string;
  /** Reactions only. */
  reaction?: string;
  at: string;
  /** The message as it is after the change. */
  message: Message;
}

/**
 * What the "change" event hands over: a change with its conversation and the message after it.
 * `userId`, `reaction` and `at` are there when the server sent them (always for changes fetched
 * from `/changes`; a push carries at least `conversationId`, `changeSeq`, `seq` and `message`).
 */
export interface MessageChange {
  conversationId: string;
  changeSeq: number;
  type: ChangeType;
  seq: number;
  message: Message;
  userId?: string;
  reaction?: string;
  at?: string;
}

/** `GET /conversations/{id}/changes`: ascending changeSeq. */
export interface ChangesPage {
  changes: Change[];
  lastChange: number;
  hasMore: boolean;
}

export interface ChangesOptions {
  /** The changes with `changeSeq > afterChange` (default 0: from the start). */
  afterChange?: number;
  /** 1–100. */
  limit?: number;
}

/** The answer of adding or removing a reaction. */
export interface ReactionsResult {
  conversationId: string;
  seq: number;
  reactions: ReactionCount[];
}

/** One member's reaction, in `GET …/messages/{seq}/reactions` (who reacted). */
export interface Reactor {
  userId: string;
  reaction: string;
  at?: string;
}

/** `GET /conversations/{id}/messages/{seq}/reactions`: who reacted, paged. */
export interface ReactorsPage {
  reactions: Reactor[];
  nextCursor: string | null;
}

export interface ReactorsOptions {
  /** Only this reaction. */
  reaction?: string;
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string | null;
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
  /** The conversation's newest changeSeq, 0 when none. */
  lastChange: number;
  /** The caller's notification settings of it (docs/api.md §32). */
  notifications: NotificationSettings;
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
  version?: number;
  editedAt?: string;
  deleted?: boolean;
  reactions?: ReactionCount[];
}

/**
 * A change to a message: with the message as it is now, or, for groups of more than 200
 * members, the light form `{type, conversationId, changeSeq, seq}` (the client fetches `/changes`).
 */
export interface MessageChangedEvent {
  type: ChangeType;
  conversationId: string;
  changeSeq: number;
  seq: number;
  message?: Message;
  userId?: string;
  reaction?: string;
  at?: string;
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

/** Who else is typing in a conversation now: the whole set (docs/api.md §37); at most 3 listed, `count` all. */
export interface TypingEvent {
  type: "typing";
  conversationId: string;
  typing: string[];
  count: number;
}

/** `POST /presence` (docs/api.md §38). */
export interface Presence {
  userId: string;
  online: boolean;
  lastActiveAt: string | null;
}

/** A direct-conversation peer's presence changed (docs/api.md §38). */
export interface PresenceEvent extends Presence {
  type: "presence";
}

/**
 * The answer to `{"action":"hello"}`, which the SDK sends on every new socket: the socket's own id
 * (for `X-Connection-Id`) and whose it is (docs/api.md §15.4).
 */
export interface HelloFrame {
  type: "hello";
  connectionId: string;
  userId?: string;
}

/** The events of a conversation (a `presence` event is a user's, not a conversation's). */
export type ServerEvent = MessageNewEvent | MessageChangedEvent | ReadUpdatedEvent | MembersEvent | TypingEvent;

export type ConnectionState = "connecting" | "open" | "closed";

/** A page request of a list (blocks, reports): `cursor` is the previous page's `nextCursor`. */
export interface PageOptions {
  limit?: number;
  cursor?: string | null;
}

export interface BlocksPage {
  blocks: { userId: string; createdAt: string }[];
  nextCursor?: string | null;
}

export type ReportReason = "spam" | "abuse" | "other";

export interface ReportReceipt {
  reportId: string;
  createdAt: string;
}

/** An open report with its snapshot of the message as it was when reported (docs/api.md §29). */
export interface Report {
  reportId: string;
  conversationId: string;
  seq: number;
  reporterId: string;
  reason: ReportReason;
  note?: string;
  createdAt: string;
  message: Message;
}

export interface ReportsPage {
  reports: Report[];
  nextCursor?: string | null;
}
