/** Frame bodies of wire protocol v1: encoders for what the client sends, one decoder
 * for what the server sends. Pure: no I/O, no clock.
 *
 * A body is one msgpack array `[op, ...]` (docs/protocol.md, Ops). Ids come out as
 * bigint whatever msgpack format carried them; times (ms since the epoch), counts and
 * codes as number. `decodeServerFrame` throws `ProtocolError` for a body that breaks
 * the protocol (the connection cannot be trusted after it) and returns `{kind:
 * "invalid"}` for a well-formed frame of an op this client does not know (a later
 * revision's: ignored). Trailing array elements and unknown map keys are ignored. */

import { Decoder, Encoder } from "@msgpack/msgpack";
import { type Id, toId, toU64, wireU64 } from "./ids.js";
import { MsgType, Op, PROTOCOL_VERSION, codeName, kickName } from "./ops.js";

/** A SYNC position (`since`, `cursor`): opaque, sent back exactly as received. imgw
 * issues bin; the first SYNC sends 0. */
export type Opaque = Uint8Array | number | bigint | string;

/** The server broke the protocol: an undecodable body, a missing or ill-typed field. */
export class ProtocolError extends Error {
  override name = "ProtocolError";
}

// -- records ------------------------------------------------------------------------

/** One message: a PUSH, or a record of PULL_RESULT / HISTORY_RESULT. `text` is the
 * content decoded as UTF-8 for text messages (msg_type 1), null for other types. */
export interface Message {
  convId: bigint;
  seq: bigint;
  msgId: bigint;
  /** 0n: the server (system messages). */
  senderUid: bigint;
  msgType: number;
  content: Uint8Array;
  /** ms since the Unix epoch. */
  serverMs: number;
  /** "" in the system messages the server writes itself. */
  clientMsgId: string;
  text: string | null;
}

/** One row of SYNC_RESULT. */
export interface Conv {
  convId: bigint;
  /** 1 p2p, 2 group. */
  kind: number;
  maxSeq: bigint;
  readSeq: bigint;
  /** This device's delivered position. */
  deliveredSeq: bigint;
  unread: number;
  lastActiveMs: number;
  isMember: boolean;
}

// -- server frames ------------------------------------------------------------------

export interface LoginOk {
  kind: "login_ok";
  rid: number;
  node: string;
  /** Seconds: PING after this long without sending. */
  hb: number;
  /** Seconds: the server closes a connection silent this long. */
  idle: number;
  maxFrame: number;
  maxContent: number;
  /** The server's clock, ms since the Unix epoch. */
  ts: number;
}
export interface Pong {
  kind: "pong";
}
export interface SendAck {
  kind: "send_ack";
  rid: number;
  convId: bigint;
  seq: bigint;
  msgId: bigint;
  serverMs: number;
}
export interface Push extends Message {
  kind: "push";
}
export interface ReadNotify {
  kind: "read_notify";
  convId: bigint;
  readerUid: bigint;
  seq: bigint;
}
export interface TypingNotify {
  kind: "typing_notify";
  convId: bigint;
  uid: bigint;
}
export interface PresenceResult {
  kind: "presence_result";
  rid: number;
  entries: Array<[bigint, string[]]>;
}
export interface SyncResult {
  kind: "sync_result";
  rid: number;
  nextSince: Opaque;
  nextCursor: Opaque;
  hasMore: boolean;
  convs: Conv[];
  /** Present when `missing` of the `servers` holding your conversations did not answer:
   * their conversations are not in this answer; SYNC again later from `nextSince`. */
  partial?: { missing: number; servers: number };
}
export interface PullResult {
  kind: "pull_result";
  rid: number;
  convId: bigint;
  hasMore: boolean;
  messages: Message[];
}
export interface HistoryResult {
  kind: "history_result";
  rid: number;
  convId: bigint;
  hasMore: boolean;
  messages: Message[];
}
export interface SyncHint {
  kind: "sync_hint";
}
export interface Notice {
  kind: "notice";
  msgType: number;
  content: Uint8Array;
  serverMs: number;
  /** `content` as UTF-8 when msg_type is 1, else null. */
  text: string | null;
}
export interface RecallOk {
  kind: "recall_ok";
  rid: number;
  convId: bigint;
  recallSeq: bigint;
}
export interface ConvOk {
  kind: "conv_ok";
  rid: number;
  convId: bigint;
}
export interface Ok {
  kind: "ok";
  rid: number;
}
export interface GroupInfoResult {
  kind: "group_info_result";
  rid: number;
  convId: bigint;
  title: string;
  ownerUid: bigint;
  members: bigint[];
}
export interface Kick {
  kind: "kick";
  reason: number;
  /** "duplicate_login", "draining", "auth_revoked", "slow_consumer", "shutdown". */
  reasonName: string;
  text: string;
  /** "host:port" to reconnect to, or "". */
  reconnectHint: string;
}
export interface MediaUrl {
  kind: "media_url";
  rid: number;
  key: string;
  /** "" after MEDIA_UPLOAD: the server has the file already, skip the PUT. */
  url: string;
  expiresMs: number;
}
export interface PushRegisterOk {
  kind: "push_register_ok";
  rid: number;
}
export interface ErrorFrame {
  kind: "error";
  /** 0 when the ERROR is about a frame without a rid (READ, DELIVERED, TYPING). */
  rid: number;
  code: number;
  codeName: string;
  text: string;
}
/** A well-formed frame of an op this client does not know: ignored. */
export interface Invalid {
  kind: "invalid";
  op: number;
}

export type ServerFrame =
  | LoginOk
  | Pong
  | SendAck
  | Push
  | ReadNotify
  | TypingNotify
  | PresenceResult
  | SyncResult
  | PullResult
  | HistoryResult
  | SyncHint
  | Notice
  | RecallOk
  | ConvOk
  | Ok
  | GroupInfoResult
  | Kick
  | MediaUrl
  | PushRegisterOk
  | ErrorFrame
  | Invalid;

/** Replies to requests: they carry the request's rid. */
export type Reply = Extract<ServerFrame, { rid: number }>;

// -- decoding -----------------------------------------------------------------------

const decoder = new Decoder({ useBigInt64: true });
const utf8 = new TextDecoder("utf-8", { fatal: false });

function fail(what: string): never {
  throw new ProtocolError(what);
}

function arr(v: unknown, what: string): unknown[] {
  return Array.isArray(v) ? v : fail(`${what}: expected an array`);
}

function int(v: unknown, what: string): number {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= 0n) return Number(v);
  return fail(`${what}: expected an integer`);
}

function u64(v: unknown, what: string): bigint {
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  if (typeof v === "bigint" && v >= 0n) return v;
  return fail(`${what}: expected an unsigned integer`);
}

function str(v: unknown, what: string): string {
  return typeof v === "string" ? v : fail(`${what}: expected a string`);
}

function bin(v: unknown, what: string): Uint8Array {
  // A copy: a view would keep the whole read buffer it came in alive.
  return v instanceof Uint8Array ? v.slice() : fail(`${what}: expected bin`);
}

function bool(v: unknown, what: string): boolean {
  return typeof v === "boolean" ? v : fail(`${what}: expected a bool`);
}

function opaque(v: unknown, what: string): Opaque {
  if (v instanceof Uint8Array) return v.slice();
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "string") return v;
  return fail(`${what}: expected an opaque position`);
}

function at(a: unknown[], i: number, what: string): unknown {
  return i < a.length ? a[i] : fail(`${what}: ${a.length} elements, field ${i} missing`);
}

/** Content as text: UTF-8 for text messages, null otherwise. */
export function textOf(msgType: number, content: Uint8Array): string | null {
  return msgType === MsgType.TEXT ? utf8.decode(content) : null;
}

function message(convId: bigint, f: unknown[], base: number, what: string): Message {
  const msgType = int(at(f, base + 3, what), `${what} msg_type`);
  const content = bin(at(f, base + 4, what), `${what} content`);
  return {
    convId,
    seq: u64(at(f, base, what), `${what} seq`),
    msgId: u64(at(f, base + 1, what), `${what} msg_id`),
    senderUid: u64(at(f, base + 2, what), `${what} sender_uid`),
    msgType,
    content,
    serverMs: int(at(f, base + 5, what), `${what} server_ms`),
    clientMsgId: str(at(f, base + 6, what), `${what} client_msg_id`),
    text: textOf(msgType, content),
  };
}

function messages(convId: bigint, v: unknown, what: string): Message[] {
  return arr(v, what).map((m, i) => message(convId, arr(m, `${what}[${i}]`), 0, `${what}[${i}]`));
}

function conv(v: unknown, what: string): Conv {
  const c = arr(v, what);
  return {
    convId: u64(at(c, 0, what), `${what} conv_id`),
    kind: int(at(c, 1, what), `${what} kind`),
    maxSeq: u64(at(c, 2, what), `${what} max_seq`),
    readSeq: u64(at(c, 3, what), `${what} read_seq`),
    deliveredSeq: u64(at(c, 4, what), `${what} delivered_seq`),
    unread: int(at(c, 5, what), `${what} unread`),
    lastActiveMs: int(at(c, 6, what), `${what} last_active_ms`),
    isMember: bool(at(c, 7, what), `${what} is_member`),
  };
}

/** SYNC_RESULT's optional `partial` map; anything else in its place is ignored. */
function syncPartial(v: unknown, w: string): { partial?: { missing: number; servers: number } } {
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) return {};
  const m = v as Record<string, unknown>;
  return { partial: { missing: int(m.missing, `${w} partial.missing`), servers: int(m.servers, `${w} partial.servers`) } };
}

function uidList(v: unknown, what: string): bigint[] {
  return arr(v, what).map((u) => u64(u, what));
}

/** Decode one frame body the server sent. Throws ProtocolError when it breaks the
 * protocol; `{kind: "invalid"}` for an op this client does not know. */
export function decodeServerFrame(body: Uint8Array): ServerFrame {
  let value: unknown;
  try {
    value = decoder.decode(body);
  } catch (e) {
    throw new ProtocolError(`undecodable frame: ${(e as Error).message}`);
  }
  const f = arr(value, "frame");
  const op = int(at(f, 0, "frame"), "op");
  const rid = (i: number, what: string): number => int(at(f, i, what), `${what} rid`);
  switch (op) {
    case Op.LOGIN_OK: {
      const w = "LOGIN_OK";
      const m = at(f, 2, w);
      if (m === null || typeof m !== "object" || Array.isArray(m) || m instanceof Uint8Array) {
        return fail(`${w}: expected a map`);
      }
      const map = m as Record<string, unknown>;
      return {
        kind: "login_ok",
        rid: rid(1, w),
        node: str(map.node, `${w} node`),
        hb: int(map.hb, `${w} hb`),
        idle: int(map.idle, `${w} idle`),
        maxFrame: int(map.max_frame, `${w} max_frame`),
        maxContent: int(map.max_content, `${w} max_content`),
        ts: int(map.ts, `${w} ts`),
      };
    }
    case Op.PONG:
      return { kind: "pong" };
    case Op.SEND_ACK: {
      const w = "SEND_ACK";
      return {
        kind: "send_ack",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        seq: u64(at(f, 3, w), `${w} seq`),
        msgId: u64(at(f, 4, w), `${w} msg_id`),
        serverMs: int(at(f, 5, w), `${w} server_ms`),
      };
    }
    case Op.PUSH: {
      const w = "PUSH";
      const convId = u64(at(f, 1, w), `${w} conv_id`);
      // PUSH: [20, conv_id, seq, msg_id, sender_uid, msg_type, content, server_ms, cmid]
      return { kind: "push", ...message(convId, f, 2, w) };
    }
    case Op.READ_NOTIFY: {
      const w = "READ_NOTIFY";
      return {
        kind: "read_notify",
        convId: u64(at(f, 1, w), `${w} conv_id`),
        readerUid: u64(at(f, 2, w), `${w} reader_uid`),
        seq: u64(at(f, 3, w), `${w} seq`),
      };
    }
    case Op.TYPING_NOTIFY: {
      const w = "TYPING_NOTIFY";
      return {
        kind: "typing_notify",
        convId: u64(at(f, 1, w), `${w} conv_id`),
        uid: u64(at(f, 2, w), `${w} uid`),
      };
    }
    case Op.PRESENCE_RESULT: {
      const w = "PRESENCE_RESULT";
      const entries = arr(at(f, 2, w), w).map((e): [bigint, string[]] => {
        const pair = arr(e, w);
        const devices = arr(at(pair, 1, w), w).map((d) => str(d, `${w} device`));
        return [u64(at(pair, 0, w), `${w} uid`), devices];
      });
      return { kind: "presence_result", rid: rid(1, w), entries };
    }
    case Op.SYNC_RESULT: {
      const w = "SYNC_RESULT";
      return {
        kind: "sync_result",
        rid: rid(1, w),
        nextSince: opaque(at(f, 2, w), `${w} next_since`),
        nextCursor: opaque(at(f, 3, w), `${w} next_cursor`),
        hasMore: bool(at(f, 4, w), `${w} has_more`),
        convs: arr(at(f, 5, w), w).map((c, i) => conv(c, `${w} conv ${i}`)),
        ...syncPartial(f[6], w),
      };
    }
    case Op.PULL_RESULT:
    case Op.HISTORY_RESULT: {
      const w = op === Op.PULL_RESULT ? "PULL_RESULT" : "HISTORY_RESULT";
      const convId = u64(at(f, 2, w), `${w} conv_id`);
      return {
        kind: op === Op.PULL_RESULT ? "pull_result" : "history_result",
        rid: rid(1, w),
        convId,
        hasMore: bool(at(f, 3, w), `${w} has_more`),
        messages: messages(convId, at(f, 4, w), `${w} msgs`),
      };
    }
    case Op.SYNC_HINT:
      return { kind: "sync_hint" };
    case Op.NOTICE: {
      const w = "NOTICE";
      const msgType = int(at(f, 1, w), `${w} msg_type`);
      const content = bin(at(f, 2, w), `${w} content`);
      return {
        kind: "notice",
        msgType,
        content,
        serverMs: int(at(f, 3, w), `${w} server_ms`),
        text: textOf(msgType, content),
      };
    }
    case Op.RECALL_OK: {
      const w = "RECALL_OK";
      return {
        kind: "recall_ok",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        recallSeq: u64(at(f, 3, w), `${w} recall_seq`),
      };
    }
    case Op.CONV_OK: {
      const w = "CONV_OK";
      return { kind: "conv_ok", rid: rid(1, w), convId: u64(at(f, 2, w), `${w} conv_id`) };
    }
    case Op.OK:
      return { kind: "ok", rid: rid(1, "OK") };
    case Op.GROUP_INFO_RESULT: {
      const w = "GROUP_INFO_RESULT";
      return {
        kind: "group_info_result",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        title: str(at(f, 3, w), `${w} title`),
        ownerUid: u64(at(f, 4, w), `${w} owner_uid`),
        members: uidList(at(f, 5, w), `${w} uids`),
      };
    }
    case Op.KICK: {
      const w = "KICK";
      const reason = int(at(f, 1, w), `${w} reason`);
      return {
        kind: "kick",
        reason,
        reasonName: kickName(reason),
        text: str(at(f, 2, w), `${w} text`),
        reconnectHint: str(at(f, 3, w), `${w} reconnect_hint`),
      };
    }
    case Op.MEDIA_URL: {
      const w = "MEDIA_URL";
      return {
        kind: "media_url",
        rid: rid(1, w),
        key: str(at(f, 2, w), `${w} key`),
        url: str(at(f, 3, w), `${w} url`),
        expiresMs: int(at(f, 4, w), `${w} expires_ms`),
      };
    }
    case Op.PUSH_REGISTER_OK:
      return { kind: "push_register_ok", rid: rid(1, "PUSH_REGISTER_OK") };
    case Op.ERROR: {
      const w = "ERROR";
      const code = int(at(f, 2, w), `${w} code`);
      return {
        kind: "error",
        rid: rid(1, w),
        code,
        codeName: codeName(code),
        text: str(at(f, 3, w), `${w} text`),
      };
    }
    default:
      return { kind: "invalid", op };
  }
}

// -- encoding -----------------------------------------------------------------------

// useBigInt64: a bigint goes out as a msgpack uint64 (wireU64 keeps small ids compact).
const encoder = new Encoder({ useBigInt64: true });

function body(value: unknown[]): Uint8Array {
  return encoder.encode(value);
}

function ids(values: Iterable<Id>, what: string): Array<number | bigint> {
  return Array.from(values, (v) => wireU64(toId(v, what)));
}

function opaqueOut(v: Opaque): Opaque {
  return typeof v === "bigint" ? wireU64(v) : v;
}

export function encodeLogin(
  rid: number,
  uid: bigint,
  device: string,
  token: string,
  caps: readonly string[],
): Uint8Array {
  const map: Record<string, unknown> = { v: PROTOCOL_VERSION, uid: wireU64(uid), device, token };
  if (caps.length) map.caps = [...caps];
  return body([Op.LOGIN, rid, map]);
}

export const encodePing = (): Uint8Array => body([Op.PING]);
export const encodeLogout = (): Uint8Array => body([Op.LOGOUT]);

export function encodeSend(
  rid: number,
  convId: bigint,
  clientMsgId: string,
  msgType: number,
  content: Uint8Array,
): Uint8Array {
  return body([Op.SEND, rid, wireU64(convId), clientMsgId, msgType, content]);
}

export function encodeDelivered(convId: bigint, seq: bigint): Uint8Array {
  return body([Op.DELIVERED, wireU64(convId), wireU64(seq)]);
}

export function encodeRead(convId: bigint, seq: bigint): Uint8Array {
  return body([Op.READ, wireU64(convId), wireU64(seq)]);
}

export function encodeTyping(convId: bigint): Uint8Array {
  return body([Op.TYPING, wireU64(convId)]);
}

export function encodePresence(rid: number, uids: Iterable<Id>): Uint8Array {
  return body([Op.PRESENCE, rid, ids(uids, "uid")]);
}

export function encodeSync(rid: number, since: Opaque, cursor: Opaque, limit: number): Uint8Array {
  return body([Op.SYNC, rid, opaqueOut(since), opaqueOut(cursor), limit]);
}

export function encodePull(rid: number, convId: bigint, afterSeq: bigint, limit: number): Uint8Array {
  return body([Op.PULL, rid, wireU64(convId), wireU64(afterSeq), limit]);
}

export function encodeHistory(
  rid: number,
  convId: bigint,
  beforeSeq: bigint,
  limit: number,
): Uint8Array {
  return body([Op.HISTORY, rid, wireU64(convId), wireU64(beforeSeq), limit]);
}

export function encodeRecall(rid: number, convId: bigint, seq: bigint): Uint8Array {
  return body([Op.RECALL, rid, wireU64(convId), wireU64(seq)]);
}

export function encodeOpenP2P(rid: number, peer: bigint): Uint8Array {
  return body([Op.OPEN_P2P, rid, wireU64(peer)]);
}

export function encodeGroupCreate(rid: number, title: string, uids: Iterable<Id>): Uint8Array {
  return body([Op.GROUP_CREATE, rid, title, ids(uids, "uid")]);
}

export function encodeGroupMembers(
  rid: number,
  convId: bigint,
  add: Iterable<Id>,
  remove: Iterable<Id>,
): Uint8Array {
  return body([Op.GROUP_MEMBERS, rid, wireU64(convId), ids(add, "uid"), ids(remove, "uid")]);
}

export function encodeGroupInfo(rid: number, convId: bigint): Uint8Array {
  return body([Op.GROUP_INFO, rid, wireU64(convId)]);
}

export function encodeMediaUpload(
  rid: number,
  sha256: string,
  size: number,
  contentType: string,
): Uint8Array {
  return body([Op.MEDIA_UPLOAD, rid, sha256, wireU64(toU64(size, "size")), contentType]);
}

export function encodeMediaGet(rid: number, key: string): Uint8Array {
  return body([Op.MEDIA_GET, rid, key]);
}

/** PUSH_REGISTER's opts map: `preview` (may a notification carry the message's text;
 * false by default) and `locale` (the notification's language, BCP 47; "" by default).
 * Keys left out take the server's defaults. */
export interface PushOptions {
  preview?: boolean;
  locale?: string;
}

export function encodePushRegister(rid: number, provider: string, token: string, opts: PushOptions): Uint8Array {
  const map: Record<string, unknown> = {};
  if (opts.preview !== undefined) map.preview = opts.preview;
  if (opts.locale !== undefined) map.locale = opts.locale;
  return body([Op.PUSH_REGISTER, rid, provider, token, map]);
}

export function encodePushUnregister(rid: number): Uint8Array {
  return body([Op.PUSH_UNREGISTER, rid]);
}

export function encodeMute(rid: number, convId: bigint, untilMs: bigint): Uint8Array {
  return body([Op.MUTE, rid, wireU64(convId), wireU64(untilMs)]);
}

/** Whether two SYNC positions are the same value. */
export function sameOpaque(a: Opaque, b: Opaque): boolean {
  if (a instanceof Uint8Array && b instanceof Uint8Array) {
    return a.length === b.length && a.every((x, i) => x === b[i]);
  }
  if ((typeof a === "number" || typeof a === "bigint") && (typeof b === "number" || typeof b === "bigint")) {
    return BigInt(a) === BigInt(b);
  }
  return a === b;
}
