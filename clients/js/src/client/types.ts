/** The public types of the client: its options, what its requests return, its events. */

import type { Conv, ErrorFrame, Kick, LoginOk, Message, Notice, Opaque, ReadNotify, SyncHint, TypingNotify } from "../protocol/frames.js";
import type { Id } from "../protocol/ids.js";
import type { MintOptions } from "../token/format.js";
import type { Dialer } from "../transport/types.js";

/** A token, or a function (sync or async) that mints a fresh one for each login. */
export type TokenSource = string | ((who: { uid: bigint; device: string }) => string | Promise<string>);

export interface ClientOptions {
  /** `tcp://host:port` (Node), `tls://host:port` (Node), `ws://host:port/ws`,
   * `wss://host:port/ws`; several are tried in turn. In a browser a path such as "/ws"
   * is resolved against the page's location. */
  url: string | readonly string[];
  uid: Id;
  /** 1-32 characters of [A-Za-z0-9_-]; the same uid and device elsewhere kicks this one. */
  device: string;
  /** The LOGIN token, or a function minting one per login. */
  token?: TokenSource;
  /** Development only: "KID:SECRET" to mint a token for each login, as `imgw chat`
   * does (DEV_KEY is the gateway's development key). Used when `token` is not given. */
  key?: string;
  /** Log in again after a lost connection or KICK draining / shutdown (true). */
  reconnect?: boolean;
  /** Backoff before the n-th reconnect: random(0, min(cap, base * 2^n)) ms (200, 10000). */
  backoffBaseMs?: number;
  backoffCapMs?: number;
  /** Bounds every reply and each connect + LOGIN (10000). */
  requestTimeoutMs?: number;
  /** PING after `hb` quiet seconds and drop a silent server (true). */
  heartbeat?: boolean;
  /** SYNC / PULL what was missed after a reconnect or SYNC_HINT (true). */
  catchUp?: boolean;
  /** A `send` is tried at most this many times (8) within this long (30000 ms). */
  sendAttempts?: number;
  sendRetryMs?: number;
  /** A `next_since` kept from an earlier session (the `synced` event gives it): the
   * first SYNC starts there and what changed since is pulled, from the positions given
   * in `seen`. Without it the first SYNC is a baseline: nothing before is news. */
  since?: Opaque;
  /** [convId, seq]: the app holds every message of convId up to seq. */
  seen?: Iterable<readonly [Id, Id]>;
  /** LOGIN capabilities (CAPS: this client handles outcome_unknown and content_denied). */
  caps?: readonly string[];
  /** How to open a connection; the entry point's `connect` fills it in. */
  dial?: Dialer;
}

/** What the platform gives the client (the entry points fill it in). */
export interface Platform {
  dial: Dialer;
  sha256(data: Uint8Array): Promise<Uint8Array>;
  mintToken(options: MintOptions): Promise<string>;
  /** The page's location, to resolve "/ws"; undefined in Node. */
  base?: string;
}

/** A message as an event: `caughtUp` when a catch-up PULL brought it, false for a live
 * PUSH. */
export interface IncomingMessage extends Message {
  caughtUp: boolean;
}

export interface SendResult {
  convId: bigint;
  seq: bigint;
  msgId: bigint;
  serverMs: number;
  clientMsgId: string;
}

export interface SendOptions {
  /** 1 text (the default for a string), 2 image, 3 voice, 4 file, 100-127 yours. */
  msgType?: number;
  /** 1-64 UTF-8 bytes; generated (32 hex digits) when not given. The server answers a
   * second SEND with the same id with the first one's ack. */
  clientMsgId?: string;
}

/** A send waiting for its ack: queued while offline, or in flight. */
export interface PendingSend {
  clientMsgId: string;
  convId: bigint;
  msgType: number;
  content: Uint8Array;
  /** SENDs written so far (0 while it waits for a connection). */
  attempts: number;
  /** Date.now() when `send` was called. */
  queuedAt: number;
}

export interface Page {
  convId: bigint;
  hasMore: boolean;
  /** In ascending seq order. */
  messages: Message[];
}

export interface GroupInfo {
  convId: bigint;
  title: string;
  ownerUid: bigint;
  members: bigint[];
}

export interface MediaLink {
  key: string;
  /** "" after mediaUpload: the server has the file already, skip the PUT. */
  url: string;
  expiresMs: number;
}

export type ConnectionState = "idle" | "connecting" | "online" | "offline" | "closed";

/** The `state` event: where the connection stands.
 * - connecting: a connect or reconnect attempt to `url` (attempt 0: the first connect)
 * - online: logged in (`reconnected` after a lost connection)
 * - offline: the connection was lost; the client reconnects
 * - back: the catch-up after a reconnect is done: `caughtUp` messages it brought
 * - closed: the session is over (close, logout, a KICK or a refused login) */
export type StateEvent =
  | { state: "connecting"; url: string; attempt: number }
  | { state: "online"; url: string; node: string; loginOk: LoginOk; reconnected: boolean }
  | { state: "offline"; reason: string; kick: Kick | null }
  | { state: "back"; caughtUp: number }
  | { state: "closed"; reason: string; kick: Kick | null };

/** One catch-up pass completed: keep `nextSince` with your messages to resume from it
 * (`ClientOptions.since`); `convs` are the conversations that changed. */
export interface SyncedEvent {
  nextSince: Opaque;
  convs: Conv[];
}

export interface ClientEvents {
  message: IncomingMessage;
  read: ReadNotify;
  typing: TypingNotify;
  notice: Notice;
  kick: Kick;
  /** An ERROR with rid 0: about a READ, DELIVERED or TYPING. */
  error: ErrorFrame;
  syncHint: SyncHint;
  synced: SyncedEvent;
  state: StateEvent;
}
