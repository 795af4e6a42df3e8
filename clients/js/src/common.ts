/** What both entry points export: everything but the transports and the platform's
 * crypto. */

export {
  type ClientEvents,
  type ClientOptions,
  type ConnectionState,
  type GroupInfo,
  type IncomingMessage,
  type MediaLink,
  type Page,
  type PendingSend,
  type Platform,
  type SendOptions,
  type SendResult,
  type StateEvent,
  type SyncedEvent,
  type TokenSource,
} from "./client/types.js";
export type { Listener } from "./client/emitter.js";
export { ClientError, ConnectionLost, RequestTimeout, SessionEnded } from "./client/errors.js";
export type { ClientStats, FirstPage } from "./client/inbox.js";
export {
  type MediaContent,
  type SystemEvent,
  decodeMediaContent,
  decodeSystemContent,
  encodeMediaContent,
  recalledSeq,
} from "./content.js";
export type {
  Conv,
  ErrorFrame,
  Kick,
  LoginOk,
  Message,
  Notice,
  Opaque,
  PullResult,
  PushOptions,
  ReadNotify,
  SyncHint,
  SyncResult,
  TypingNotify,
} from "./protocol/frames.js";
export { ProtocolError } from "./protocol/frames.js";
export { type Id, MAX_U64, toId, toU64 } from "./protocol/ids.js";
export { CAPS, ErrorCode, KickReason, MsgType, PROTOCOL_VERSION, codeName, kickName } from "./protocol/ops.js";
export { DEV_KEY, type MintOptions, TOKEN_TTL_S } from "./token/format.js";
export type { Dialer, Endpoint, Transport, TransportEvents } from "./transport/types.js";
export { parseEndpoint } from "./transport/types.js";
export { type WebSocketConstructor, type WebSocketLike, webSocketDialer } from "./transport/ws.js";
