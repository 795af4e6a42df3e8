/** `Client`: one logged-in device of wire protocol v1 (docs/protocol.md), on any
 * transport an entry point dials (TCP in Node, WebSocket everywhere).
 *
 * Replies are matched to requests by rid (they may come in any order). Server-initiated
 * frames become events. One timer sends PING when nothing was sent for `hb` seconds and
 * drops a connection the server left silent (10 s after a PING, or `idle` seconds).
 *
 * Reconnect and catch-up: after a dropped connection or a KICK draining / shutdown the
 * client logs in again with exponential backoff and full jitter, cycling through its
 * URLs, then runs SYNC from the kept `next_since` and PULLs every conversation whose
 * max_seq is above what it has seen. That SYNC's first page goes in the LOGIN's own
 * write, as docs/protocol.md recommends. Missed messages come out as `message` events
 * with `caughtUp: true`; the per-conversation record of seen seqs drops duplicates, so
 * no message comes twice. SYNC_HINT runs the same catch-up. Sends survive all this:
 * `send` queues while offline and sends again with the same client_msg_id, which the
 * server deduplicates. KICK duplicate_login, slow_consumer and auth_revoked (unless the
 * token is a function that can mint a new one) end the session. */

import {
  type Conv,
  type ErrorFrame,
  type GroupInfoResult,
  type HistoryResult,
  type Kick,
  type LoginOk,
  type MediaUrl,
  type Message,
  type Notice,
  type Opaque,
  type PullResult,
  type ReadNotify,
  type Reply,
  type SendAck,
  type ServerFrame,
  type SyncHint,
  type SyncResult,
  type TypingNotify,
  decodeServerFrame,
  encodeDelivered,
  encodeGroupCreate,
  encodeGroupInfo,
  encodeGroupMembers,
  encodeHistory,
  encodeLogin,
  encodeLogout,
  encodeMediaGet,
  encodeMediaUpload,
  encodeOpenP2P,
  encodePing,
  encodePresence,
  encodePull,
  encodeRead,
  encodeRecall,
  encodeSend,
  encodeSync,
  encodeTyping,
  sameOpaque,
} from "../protocol/frames.js";
import { type Id, toId, toU64 } from "../protocol/ids.js";
import { CAPS, ErrorCode, KickReason, MsgType } from "../protocol/ops.js";
import { type Dialer, type Endpoint, type Transport, hintEndpoint, parseEndpoint } from "../transport/types.js";
import type { MintOptions } from "../token/format.js";
import { encodeMediaContent } from "../content.js";
import { Emitter } from "./emitter.js";
import { ClientError, ConnectionLost, RequestTimeout, SessionEnded } from "./errors.js";
import { type ClientStats, type FirstPage, Inbox, newStats } from "./inbox.js";

// -- public types ---------------------------------------------------------------------

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

// -- internals ------------------------------------------------------------------------

const MAX_RID = 0x7fff_ffff;
const PING_GRACE_MS = 10_000; // docs/protocol.md: no answer to a PING within 10 s: dead
const RECONNECTING_KICKS = new Set<number>([KickReason.DRAINING, KickReason.SHUTDOWN]);
// SEND outcomes answered by sending again with the same client_msg_id (0: no reply)
const SEND_AGAIN = new Set<number>([0, ErrorCode.UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN]);
const utf8 = new TextEncoder();

const now = (): number => performance.now();

interface Waiter {
  resolve(frame: Reply): void;
  reject(error: Error): void;
  timer: ReturnType<typeof setTimeout> | null;
}

/** One connection, from dial to close. */
class Link {
  transport: Transport | null = null;
  loginOk: LoginOk | null = null;
  kick: Kick | null = null;
  lastRx = now();
  dead = false;
  loggedIn: Promise<LoginOk>;
  settle!: { resolve(ok: LoginOk): void; reject(e: Error): void };

  constructor(readonly endpoint: Endpoint) {
    this.loggedIn = new Promise<LoginOk>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    this.loggedIn.catch(() => {}); // awaited by _open; marked handled for early failures
  }
}

function newClientMsgId(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

function expect<K extends Reply["kind"]>(frame: Reply, kind: K): Extract<Reply, { kind: K }> {
  if (frame.kind !== kind) throw new ClientError(0, `expected ${kind}, got ${frame.kind}`);
  return frame as Extract<Reply, { kind: K }>;
}

function page(r: PullResult | HistoryResult): Page {
  return { convId: r.convId, hasMore: r.hasMore, messages: r.messages };
}

export class Client extends Emitter<ClientEvents> {
  readonly uid: bigint;
  readonly device: string;
  readonly endpoints: readonly Endpoint[];
  readonly stats: ClientStats = newStats();
  /** The last LOGIN_OK (null before the first login). */
  loginOk: LoginOk | null = null;

  private readonly platform: Platform;
  private readonly token: TokenSource;
  private readonly autoReconnect: boolean;
  private readonly backoffBaseMs: number;
  private readonly backoffCapMs: number;
  private readonly requestTimeoutMs: number;
  private readonly heartbeat: boolean;
  private readonly catchUpOn: boolean;
  private readonly sendAttempts: number;
  private readonly sendRetryMs: number;
  private readonly caps: readonly string[];
  private readonly inbox: Inbox;

  private link: Link | null = null; // logged in and current
  private active = false; // between connect() and the end of the session
  private closing = false;
  private ended: SessionEnded | null = null;
  private stateNow: ConnectionState = "idle";
  private nextRid = 0;
  private nextEndpoint = 0;
  private hint: Endpoint | null = null;
  private readonly pending = new Map<number, Waiter>();
  private pongs: Array<{ resolve(): void; reject(e: Error): void } | null> = [];
  private readonly linkWaiters = new Set<() => void>();
  private readonly sleepers = new Set<() => void>();
  private readonly outbox = new Map<string, PendingSend>();
  private firstSync: FirstPage | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private lastTx = 0;
  private lastPing = 0;
  private reconnecting = false;
  private giveUpDial: (() => void) | null = null; // abandons the connect in progress

  constructor(options: ClientOptions, platform: Platform) {
    super();
    this.platform = options.dial ? { ...platform, dial: options.dial } : platform;
    const urls = typeof options.url === "string" ? options.url.split(",").filter((u) => u.trim()) : [...options.url];
    if (urls.length === 0) throw new TypeError("no gateway URL given");
    this.endpoints = urls.map((u) => parseEndpoint(u, platform.base));
    this.uid = toId(options.uid, "uid");
    if (!/^[A-Za-z0-9_-]{1,32}$/.test(options.device)) {
      throw new TypeError(`bad device ${JSON.stringify(options.device)}: must match [A-Za-z0-9_-]{1,32}`);
    }
    this.device = options.device;
    if (options.token !== undefined) {
      this.token = options.token;
    } else if (options.key !== undefined) {
      const key = options.key;
      this.token = ({ uid, device }) => this.platform.mintToken({ key, uid, device });
    } else {
      throw new TypeError("give a token (or, in development, a key to mint one)");
    }
    this.autoReconnect = options.reconnect ?? true;
    this.backoffBaseMs = options.backoffBaseMs ?? 200;
    this.backoffCapMs = options.backoffCapMs ?? 10_000;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
    this.heartbeat = options.heartbeat ?? true;
    this.catchUpOn = options.catchUp ?? true;
    this.sendAttempts = options.sendAttempts ?? 8;
    this.sendRetryMs = options.sendRetryMs ?? 30_000;
    this.caps = options.caps ?? CAPS;
    this.inbox = new Inbox(
      this,
      {
        message: (m, caughtUp) =>
          this.emit("message", {
            convId: m.convId,
            seq: m.seq,
            msgId: m.msgId,
            senderUid: m.senderUid,
            msgType: m.msgType,
            content: m.content,
            serverMs: m.serverMs,
            clientMsgId: m.clientMsgId,
            text: m.text,
            caughtUp,
          }),
        synced: (nextSince, convs) => this.emit("synced", { nextSince, convs }),
      },
      this.stats,
      options.since ?? null,
    );
    for (const [conv, seq] of options.seen ?? []) this.inbox.seen(toId(conv, "convId")).skipTo(toU64(seq, "seq"));
  }

  // -- lifecycle ----------------------------------------------------------------------

  /** Whether a connection is logged in now. */
  get connected(): boolean {
    return this.link !== null;
  }

  get state(): ConnectionState {
    return this.stateNow;
  }

  /** Why the session ended; null while it lasts. */
  get endReason(): SessionEnded | null {
    return this.ended;
  }

  /** Where the next catch-up's SYNC starts: keep it to resume a later session. */
  get nextSince(): Opaque {
    return this.inbox.nextSince;
  }

  /** Sends waiting for their ack, oldest first. */
  get pendingSends(): PendingSend[] {
    return [...this.outbox.values()].map((p) => ({ ...p }));
  }

  /** Open a connection and LOGIN (each URL tried once), then run the baseline SYNC.
   * Rejects with ClientError for an ERROR answer (auth_failed...) and ConnectionLost
   * when no URL could be reached. */
  async connect(): Promise<LoginOk> {
    if (this.active) throw new Error("client already connected");
    this.ended = null;
    this.closing = false;
    this.active = true;
    let failure: unknown = null;
    for (let i = 0; i < this.endpoints.length; i++) {
      const endpoint = this.pickEndpoint();
      this.setState({ state: "connecting", url: endpoint.url, attempt: 0 });
      let link: Link;
      try {
        link = await this.open(endpoint);
      } catch (e) {
        if (e instanceof ClientError && e.code !== 0) {
          this.active = false;
          this.setState({ state: "closed", reason: `login refused: ${e.message}`, kick: null });
          throw e;
        }
        failure = e;
        continue;
      }
      if (this.closing) throw this.endedError();
      this.setState({ state: "online", url: endpoint.url, node: link.loginOk!.node, loginOk: link.loginOk!, reconnected: false });
      if (this.catchUpOn) await this.inbox.catchUp(this.takeFirstSync());
      return link.loginOk!;
    }
    this.active = false;
    const where = this.endpoints.map((e) => e.url).join(",");
    const why = failure instanceof Error ? failure.message : String(failure);
    this.setState({ state: "closed", reason: `cannot connect to ${where}`, kick: null });
    throw new ConnectionLost(`cannot connect to ${where}: ${why}`);
  }

  /** Wait until a connection is logged in (after a reconnect, say): its LOGIN_OK.
   * Rejects with SessionEnded if the session ends first, ConnectionLost after
   * `timeoutMs`. */
  async waitConnected(timeoutMs = Infinity): Promise<LoginOk> {
    const link = await this.waitLink(now() + timeoutMs);
    return link.loginOk!;
  }

  /** LOGOUT (the server drops the route at once and closes), then close. */
  async logout(): Promise<void> {
    const link = this.link;
    this.closing = true;
    if (link !== null && !link.dead) {
      const gone = new Promise<void>((resolve) => {
        const done = (): void => {
          off();
          clearTimeout(timer);
          resolve();
        };
        const off = this.on("state", (s) => {
          if (s.state === "closed") done();
        });
        const timer = setTimeout(done, this.requestTimeoutMs);
      });
      this.write(link, [encodeLogout()]);
      await gone;
    }
    await this.close();
  }

  /** Close the connection and end the session; what waits on it fails with
   * SessionEnded. */
  async close(): Promise<void> {
    this.closing = true;
    this.inbox.stop();
    for (const wake of [...this.sleepers]) wake();
    this.giveUpDial?.();
    const link = this.link;
    if (link !== null) this.kill(link, "client closed", true);
    this.end(new SessionEnded("client closed"));
  }

  /** Drop the connection as a network failure would (tests, chaos drills): the client
   * reconnects. */
  dropConnection(): void {
    const link = this.link;
    if (link !== null) link.transport?.abort("dropped by the app");
  }

  // -- catch-up -----------------------------------------------------------------------

  /** Run a catch-up pass now (SYNC, then PULL what was missed): missed messages arrive
   * as `message` events. Apps call it when they come to the foreground, say. Resolves
   * true when the pass completed. */
  catchUp(): Promise<boolean> {
    return this.inbox.catchUp();
  }

  /** Tell the dedup that the app already has these messages (from `history`). */
  markSeen(convId: Id, seqs: Iterable<Id>): void {
    const seen = this.inbox.seen(toId(convId, "convId"));
    for (const seq of seqs) seen.add(toU64(seq, "seq"));
  }

  // -- requests -----------------------------------------------------------------------

  /** SEND; resolves once the message is stored. Offline, it waits for the reconnect;
   * after a lost connection, a timeout, ERROR unavailable or outcome_unknown it sends
   * again with the same client_msg_id, which the server answers with the original ack
   * if the message was stored. A string is sent as UTF-8 text. */
  async send(convId: Id, content: string | Uint8Array, options: SendOptions = {}): Promise<SendResult> {
    const conv = toId(convId, "convId");
    const bytes = typeof content === "string" ? utf8.encode(content) : content;
    const msgType = options.msgType ?? MsgType.TEXT;
    const cmid = options.clientMsgId ?? newClientMsgId();
    const entry: PendingSend = { clientMsgId: cmid, convId: conv, msgType, content: bytes, attempts: 0, queuedAt: Date.now() };
    const deadline = now() + this.sendRetryMs;
    this.outbox.set(cmid, entry);
    this.inbox.sending.add(cmid);
    let attempt = 0;
    try {
      for (;;) {
        const link = await this.waitLink(deadline);
        entry.attempts += 1;
        const rid = this.rid();
        try {
          const ack = expect(await this.call(link, rid, encodeSend(rid, conv, cmid, msgType, bytes), "SEND"), "send_ack");
          return { convId: ack.convId, seq: ack.seq, msgId: ack.msgId, serverMs: ack.serverMs, clientMsgId: cmid };
        } catch (e) {
          if (e instanceof SessionEnded || !(e instanceof ClientError) || !SEND_AGAIN.has(e.code)) throw e;
          attempt += 1;
          if (attempt >= this.sendAttempts || now() >= deadline) throw e;
          this.stats.sendRetries += 1;
          if (e.code !== 0) await this.sleep(this.backoff(attempt));
        }
      }
    } finally {
      if (this.outbox.get(cmid) === entry) this.outbox.delete(cmid);
      this.inbox.sending.delete(cmid);
    }
  }

  /** OPEN_P2P: the conversation of you and `peer` (always the same one). */
  async openP2P(peer: Id): Promise<bigint> {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeOpenP2P(rid, toId(peer, "peer")), "OPEN_P2P"), "conv_ok").convId;
  }

  /** GROUP_CREATE with the others in it (you are its owner); the conversation. */
  async groupCreate(title: string, uids: Iterable<Id>): Promise<bigint> {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeGroupCreate(rid, title, uids), "GROUP_CREATE"), "conv_ok").convId;
  }

  /** GROUP_MEMBERS: add and remove members (the owner; anyone may remove themselves). */
  async groupMembers(convId: Id, change: { add?: Iterable<Id>; remove?: Iterable<Id> }): Promise<void> {
    const rid = this.rid();
    const body = encodeGroupMembers(rid, toId(convId, "convId"), change.add ?? [], change.remove ?? []);
    expect(await this.ask(rid, body, "GROUP_MEMBERS"), "ok");
  }

  async groupInfo(convId: Id): Promise<GroupInfo> {
    const rid = this.rid();
    const r: GroupInfoResult = expect(await this.ask(rid, encodeGroupInfo(rid, toId(convId, "convId")), "GROUP_INFO"), "group_info_result");
    return { convId: r.convId, title: r.title, ownerUid: r.ownerUid, members: r.members };
  }

  /** HISTORY: the last `limit` messages before `beforeSeq` (0: from the newest). Mark
   * them seen (`markSeen`) if they must not come again as events. */
  async history(convId: Id, options: { beforeSeq?: Id; limit?: number } = {}): Promise<Page> {
    const rid = this.rid();
    const body = encodeHistory(rid, toId(convId, "convId"), toU64(options.beforeSeq ?? 0n, "beforeSeq"), options.limit ?? 0);
    return page(expect(await this.ask(rid, body, "HISTORY"), "history_result"));
  }

  /** PULL: the first `limit` messages after `afterSeq` (0: from the start). */
  async pull(convId: Id, options: { afterSeq?: Id; limit?: number } = {}): Promise<PullResult> {
    const rid = this.rid();
    const body = encodePull(rid, toId(convId, "convId"), toU64(options.afterSeq ?? 0n, "afterSeq"), options.limit ?? 0);
    return expect(await this.ask(rid, body, "PULL"), "pull_result");
  }

  /** PULL pages until has_more is false. */
  async pullAll(convId: Id, options: { afterSeq?: Id; limit?: number } = {}): Promise<Message[]> {
    const out: Message[] = [];
    let after = toU64(options.afterSeq ?? 0n, "afterSeq");
    for (;;) {
      const r = await this.pull(convId, { afterSeq: after, limit: options.limit ?? 0 });
      out.push(...r.messages);
      const last = r.messages[r.messages.length - 1];
      if (!r.hasMore || last === undefined) return out;
      after = last.seq;
    }
  }

  /** One SYNC page. */
  async sync(since: Opaque = 0, cursor: Opaque = 0, limit = 0): Promise<SyncResult> {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeSync(rid, since, cursor, limit), "SYNC"), "sync_result");
  }

  /** Every page of one SYNC pass: the next_since to keep and the rows. `first`: the
   * pass's first page, already asked from the same `since`. */
  async syncAll(since: Opaque = 0, first: FirstPage | null = null): Promise<{ nextSince: Opaque; convs: Conv[] }> {
    const convs: Conv[] = [];
    let cursor: Opaque = 0;
    for (;;) {
      let result: SyncResult;
      if (first !== null) {
        result = await first.reply;
        first = null;
      } else {
        result = await this.sync(since, cursor);
      }
      convs.push(...result.convs);
      if (!result.hasMore || sameOpaque(result.nextCursor, cursor)) return { nextSince: result.nextSince, convs };
      cursor = result.nextCursor;
    }
  }

  /** RECALL; the seq of the recall message. */
  async recall(convId: Id, seq: Id): Promise<bigint> {
    const rid = this.rid();
    const body = encodeRecall(rid, toId(convId, "convId"), toU64(seq, "seq"));
    return expect(await this.ask(rid, body, "RECALL"), "recall_ok").recallSeq;
  }

  /** PRESENCE: the online devices of each uid ([] offline, or not visible to you). */
  async presence(uids: Iterable<Id>): Promise<Map<bigint, string[]>> {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodePresence(rid, uids), "PRESENCE"), "presence_result");
    return new Map(r.entries);
  }

  /** READ up to `seq` (cumulative): tells your other devices and the other members.
   * False when offline: nothing was sent (send the latest position again later). */
  read(convId: Id, seq: Id): boolean {
    return this.tell(encodeRead(toId(convId, "convId"), toU64(seq, "seq")));
  }

  /** DELIVERED up to `seq` (cumulative): this device's position. False when offline. */
  delivered(convId: Id, seq: Id): boolean {
    return this.tell(encodeDelivered(toId(convId, "convId"), toU64(seq, "seq")));
  }

  /** TYPING: the other members see `typing` (repeat it while typing; the server drops
   * more than 2/s). False when offline. */
  typing(convId: Id): boolean {
    return this.tell(encodeTyping(toId(convId, "convId")));
  }

  /** MEDIA_UPLOAD: a signed URL to PUT the file to (url "": stored already). */
  async mediaUpload(sha256: string, size: number, contentType: string): Promise<MediaLink> {
    const rid = this.rid();
    const r: MediaUrl = expect(await this.ask(rid, encodeMediaUpload(rid, sha256, size, contentType), "MEDIA_UPLOAD"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }

  /** MEDIA_GET: a signed URL to GET the object of `key` from. */
  async mediaGet(key: string): Promise<MediaLink> {
    const rid = this.rid();
    const r: MediaUrl = expect(await this.ask(rid, encodeMediaGet(rid, key), "MEDIA_GET"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }

  /** Upload a file: hash it, ask for a URL, PUT it there (fetch) unless the server has
   * it; its key, for `sendMedia`. */
  async uploadMedia(data: Uint8Array, contentType: string): Promise<string> {
    let digest = "";
    for (const b of await this.platform.sha256(data)) digest += b.toString(16).padStart(2, "0");
    const link = await this.mediaUpload(digest, data.length, contentType);
    if (link.url) {
      const res = await fetch(link.url, {
        method: "PUT",
        headers: { "Content-Type": contentType },
        body: data as BodyInit,
      });
      if (!res.ok) throw new ClientError(0, `upload refused: HTTP ${res.status} ${res.statusText}`);
    }
    return link.key;
  }

  /** Upload a file and SEND it as an image (2), voice (3) or file (4) message whose
   * content is the msgpack map {key, name, size, type}, as `imgw chat` writes it. */
  async sendMedia(
    convId: Id,
    data: Uint8Array,
    info: { name: string; contentType: string; msgType?: number },
  ): Promise<SendResult & { key: string }> {
    const key = await this.uploadMedia(data, info.contentType);
    const content = encodeMediaContent({ key, name: info.name, size: data.length, type: info.contentType });
    const msgType = info.msgType ?? (info.contentType.startsWith("image/") ? MsgType.IMAGE : info.contentType.startsWith("audio/") ? MsgType.VOICE : MsgType.FILE);
    const sent = await this.send(convId, content, { msgType });
    return { ...sent, key };
  }

  /** PING and wait for the PONG. */
  async ping(): Promise<void> {
    const link = this.needLink();
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new RequestTimeout("no PONG")), this.requestTimeoutMs);
      this.pongs.push({
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.write(link, [encodePing()]);
    });
  }

  // -- request plumbing ---------------------------------------------------------------

  private rid(): number {
    do {
      this.nextRid = (this.nextRid % MAX_RID) + 1;
    } while (this.pending.has(this.nextRid));
    return this.nextRid;
  }

  private needLink(): Link {
    if (this.link !== null) return this.link;
    throw this.ended !== null ? this.endedError() : new ConnectionLost("not connected");
  }

  private endedError(): SessionEnded {
    const e = this.ended;
    return e === null ? new SessionEnded("not connected") : new SessionEnded(e.text, e.kick);
  }

  private async waitLink(deadline: number): Promise<Link> {
    for (;;) {
      if (this.ended !== null || !this.active) throw this.endedError();
      if (this.link !== null) return this.link;
      const left = deadline - now();
      if (left <= 0) throw new ConnectionLost("not connected; gave up waiting for a reconnect");
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.linkWaiters.delete(wake);
          if (timer !== null) clearTimeout(timer);
          resolve();
        };
        const timer = Number.isFinite(left) ? setTimeout(wake, left) : null;
        this.linkWaiters.add(wake);
      });
    }
  }

  private ask(rid: number, body: Uint8Array, name: string): Promise<Reply> {
    return this.call(this.needLink(), rid, body, name);
  }

  private call(link: Link, rid: number, body: Uint8Array, name: string): Promise<Reply> {
    const maxFrame = link.loginOk?.maxFrame ?? Infinity;
    if (body.length > maxFrame) {
      return Promise.reject(new ClientError(0, `${name} of ${body.length} bytes exceeds the server's max_frame ${maxFrame}`));
    }
    this.stats.requests += 1;
    return new Promise<Reply>((resolve, reject) => {
      const waiter: Waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          if (this.pending.get(rid) === waiter) this.pending.delete(rid);
          reject(new RequestTimeout(`no reply to ${name} rid ${rid}`));
        }, this.requestTimeoutMs),
      };
      this.pending.set(rid, waiter);
      try {
        this.write(link, [body]);
      } catch (e) {
        this.pending.delete(rid);
        clearTimeout(waiter.timer!);
        reject(e);
      }
    });
  }

  /** A frame without a reply (READ, DELIVERED, TYPING); false when offline. */
  private tell(body: Uint8Array): boolean {
    const link = this.link;
    if (link === null || link.dead) return false;
    this.write(link, [body]);
    return true;
  }

  private write(link: Link, bodies: readonly Uint8Array[]): void {
    if (link.dead || link.transport === null) throw new ConnectionLost("connection lost");
    link.transport.write(bodies);
    this.lastTx = now();
  }

  private takeFirstSync(): FirstPage | null {
    const first = this.firstSync;
    this.firstSync = null;
    return first;
  }

  // -- connections --------------------------------------------------------------------

  private pickEndpoint(): Endpoint {
    if (this.hint !== null) {
      const hint = this.hint;
      this.hint = null;
      return hint;
    }
    const ep = this.endpoints[this.nextEndpoint % this.endpoints.length]!;
    this.nextEndpoint += 1;
    return ep;
  }

  private async resolveToken(): Promise<string> {
    const source = this.token;
    return typeof source === "string" ? source : await source({ uid: this.uid, device: this.device });
  }

  /** Dial and LOGIN, with the catch-up's first SYNC in the same write; the link is
   * installed when LOGIN_OK arrives. Bounded by requestTimeoutMs. */
  private async open(endpoint: Endpoint): Promise<Link> {
    const link = new Link(endpoint);
    const abort = new AbortController();
    const giveUp = (error: ClientError): void => {
      if (link.loginOk !== null || link.dead) return;
      link.dead = true;
      abort.abort(error.text);
      link.settle.reject(error);
      link.transport?.abort(error.text);
    };
    const timer = setTimeout(
      () => giveUp(new RequestTimeout(`${endpoint.url}: no LOGIN_OK within ${this.requestTimeoutMs} ms`)),
      this.requestTimeoutMs,
    );
    this.giveUpDial = () => giveUp(new SessionEnded("client closed"));
    let first: FirstPage | null = null;
    try {
      const token = await this.resolveToken();
      const bodies = [encodeLogin(1, this.uid, this.device, token, this.caps)];
      if (this.catchUpOn) {
        // The server answers a SYNC sent right behind the LOGIN in LOGIN_OK's write: one
        // round trip fewer for every reconnect (thousands at once after a restart).
        const since = this.inbox.nextSince;
        const rid = this.rid();
        const reply = new Promise<SyncResult>((resolve, reject) => {
          this.pending.set(rid, {
            resolve: (f) => {
              try {
                resolve(expect(f, "sync_result"));
              } catch (e) {
                reject(e);
              }
            },
            reject,
            timer: null,
          });
        });
        reply.catch(() => {}); // a pass may not want it after all
        first = { since, rid, reply };
        this.stats.requests += 1;
        bodies.push(encodeSync(rid, since, 0, 0));
      }
      const transport = await this.platform.dial(
        endpoint,
        { frame: (body) => this.onBody(link, body), closed: (why) => this.onClosed(link, why) },
        abort.signal,
      );
      link.transport = transport;
      if (link.dead) throw new ConnectionLost(`${endpoint.url}: closed at login`);
      transport.write(bodies);
      this.lastTx = now();
      await link.loggedIn;
    } catch (e) {
      if (first !== null && this.pending.get(first.rid) !== undefined && !link.loginOk) {
        this.pending.delete(first.rid);
      }
      if (link.transport !== null && !link.dead) {
        link.dead = true;
        link.transport.abort("login failed");
      }
      link.dead = true;
      throw e instanceof Error ? e : new ConnectionLost(String(e));
    } finally {
      clearTimeout(timer);
      this.giveUpDial = null;
    }
    this.firstSync = first;
    return link;
  }

  /** LOGIN_OK came: `link` is the connection now. */
  private install(link: Link): void {
    this.link = link;
    this.loginOk = link.loginOk;
    this.stats.connects += 1;
    const t = now();
    link.lastRx = this.lastTx = this.lastPing = t;
    for (const wake of [...this.linkWaiters]) wake();
    if (this.heartbeat) this.armTimer(Math.max(1, link.loginOk!.hb) * 1000);
  }

  /** Give up on `link`: close it and fail what waits on it; then reconnect or end.
   * Idempotent. */
  private kill(link: Link, why: string, polite = false): void {
    if (link.dead) return;
    link.dead = true;
    const current = this.link === link;
    if (current) {
      this.link = null;
      if (this.timer !== null) clearTimeout(this.timer);
      this.timer = null;
      const error = new ConnectionLost(why);
      const pending = [...this.pending.values()];
      this.pending.clear();
      for (const w of pending) {
        if (w.timer !== null) clearTimeout(w.timer);
        w.reject(error);
      }
      const pongs = this.pongs;
      this.pongs = [];
      for (const p of pongs) p?.reject(error);
    }
    if (polite) link.transport?.close();
    else link.transport?.abort(why);
    if (current) this.afterLoss(link, why);
  }

  /** The current connection is gone: end the session or reconnect. */
  private afterLoss(link: Link, why: string): void {
    const reason = this.endReasonFor(link);
    if (reason !== null) {
      this.end(new SessionEnded(reason, link.kick));
      return;
    }
    this.setState({ state: "offline", reason: why, kick: link.kick });
    void this.reconnectLoop();
  }

  private end(error: SessionEnded): void {
    if (this.ended === null) {
      this.ended = error;
      this.active = false;
      this.inbox.stop();
      this.setState({ state: "closed", reason: error.text, kick: error.kick });
    }
    for (const wake of [...this.linkWaiters]) wake(); // senders waiting fail now
  }

  /** Why the session ends after a lost connection, or null to reconnect. */
  private endReasonFor(link: Link): string | null {
    const kick = link.kick;
    if (this.closing) return "client closed";
    if (kick === null) return this.autoReconnect ? null : "connection lost";
    const what = `kicked: ${kick.reasonName}${kick.text ? ` (${kick.text})` : ""}`;
    if (!this.autoReconnect) return what;
    if (RECONNECTING_KICKS.has(kick.reason)) {
      this.hint = hintEndpoint(link.endpoint, kick.reconnectHint);
      return null;
    }
    if (kick.reason === KickReason.AUTH_REVOKED && typeof this.token !== "string") return null;
    return what;
  }

  /** Exponential backoff, full jitter applied after the cap. */
  private backoff(attempt: number): number {
    const ceiling = Math.min(this.backoffCapMs, this.backoffBaseMs * 2 ** Math.min(attempt, 32));
    return Math.random() * ceiling;
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = (): void => {
        this.sleepers.delete(wake);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.sleepers.add(wake);
    });
  }

  private async reconnectLoop(): Promise<void> {
    if (this.reconnecting) return;
    this.reconnecting = true;
    try {
      for (let attempt = 0; ; ) {
        await this.sleep(this.backoff(attempt));
        if (this.closing || this.ended !== null) return;
        attempt += 1;
        const endpoint = this.pickEndpoint();
        this.setState({ state: "connecting", url: endpoint.url, attempt });
        let link: Link;
        try {
          link = await this.open(endpoint);
        } catch (e) {
          if (this.closing || this.ended !== null) return;
          if (e instanceof ClientError && e.code !== 0) {
            const retry = e.code === ErrorCode.UNAVAILABLE || (e.code === ErrorCode.AUTH_FAILED && typeof this.token !== "string");
            if (!retry) {
              this.end(new SessionEnded(`reconnect refused: ${e.message}`));
              return;
            }
          }
          this.setState({ state: "offline", reason: e instanceof Error ? e.message : String(e), kick: null });
          continue;
        }
        if (this.closing || this.ended !== null) {
          this.kill(link, "client closed", true);
          return;
        }
        this.stats.reconnects += 1;
        this.setState({ state: "online", url: endpoint.url, node: link.loginOk!.node, loginOk: link.loginOk!, reconnected: true });
        const before = this.stats.caughtUp;
        const done = this.catchUpOn ? this.inbox.catchUp(this.takeFirstSync()) : Promise.resolve(true);
        void done.then((ok) => {
          if (ok && this.link === link) this.setState({ state: "back", caughtUp: this.stats.caughtUp - before });
        });
        return;
      }
    } finally {
      this.reconnecting = false;
    }
  }

  private setState(event: StateEvent): void {
    if (event.state !== "back") this.stateNow = event.state;
    this.emit("state", event);
  }

  // -- inbound frames -----------------------------------------------------------------

  private onClosed(link: Link, why: string): void {
    if (link.loginOk === null) {
      link.dead = true;
      link.settle.reject(new ConnectionLost(`${link.endpoint.url} closed the connection at login (${why})`));
      return;
    }
    this.kill(link, `connection lost: ${why}`);
  }

  private onBody(link: Link, body: Uint8Array): void {
    if (link.dead) return;
    link.lastRx = now();
    let frame: ServerFrame;
    try {
      frame = decodeServerFrame(body);
    } catch (e) {
      const why = `bad frame from the server: ${(e as Error).message}`;
      if (link.loginOk === null) {
        link.settle.reject(new ClientError(0, why));
        link.dead = true;
        link.transport?.abort(why);
      } else {
        this.kill(link, why);
      }
      return;
    }
    if (link.loginOk === null) {
      if (frame.kind === "login_ok") {
        link.loginOk = frame;
        this.install(link);
        link.settle.resolve(frame);
      } else {
        const error = frame.kind === "error" ? new ClientError(frame.code, frame.text) : new ClientError(0, `expected LOGIN_OK, got ${frame.kind}`);
        link.settle.reject(error);
        link.dead = true;
        link.transport?.abort("login refused");
      }
      return;
    }
    this.onFrame(link, frame);
  }

  private onFrame(link: Link, frame: ServerFrame): void {
    switch (frame.kind) {
      case "push":
        this.inbox.deliver(frame, false);
        return;
      case "pong":
        this.pongs.shift()?.resolve();
        return;
      case "read_notify":
        this.emit("read", frame);
        return;
      case "typing_notify":
        this.emit("typing", frame);
        return;
      case "notice":
        this.emit("notice", frame);
        return;
      case "sync_hint":
        this.emit("syncHint", frame);
        if (this.catchUpOn && !this.closing) void this.inbox.catchUp();
        return;
      case "kick":
        link.kick = frame;
        this.emit("kick", frame);
        return;
      case "invalid":
      case "login_ok":
        return; // an op of a later revision, or a stray LOGIN_OK: ignored
      default: {
        if (frame.kind === "send_ack") this.inbox.seen(frame.convId).add(frame.seq); // ours: never an event
        const waiter = this.pending.get(frame.rid);
        if (waiter === undefined) {
          if (frame.kind === "error" && frame.rid === 0) this.emit("error", frame);
          return;
        }
        this.pending.delete(frame.rid);
        if (waiter.timer !== null) clearTimeout(waiter.timer);
        if (frame.kind === "error") waiter.reject(new ClientError(frame.code, frame.text));
        else waiter.resolve(frame);
      }
    }
  }

  /** The heartbeat: PING after `hb` quiet seconds; drop a server that does not answer a
   * PING within 10 s or stays silent for `idle` seconds. */
  private readonly onTimer = (): void => {
    this.timer = null;
    const link = this.link;
    if (link === null || link.loginOk === null) return;
    const t = now();
    const hb = Math.max(1, link.loginOk.hb) * 1000;
    const idle = Math.max(hb + 1000, link.loginOk.idle * 1000);
    const unanswered = this.lastPing > link.lastRx;
    if (t - link.lastRx >= idle || (unanswered && t - this.lastPing >= PING_GRACE_MS)) {
      this.kill(link, `the server went silent (${Math.round((t - link.lastRx) / 1000)} s)`);
      return;
    }
    // Also probe when only one-way frames (READ, TYPING) went out and nothing came in.
    if (t - this.lastTx >= hb || (t - link.lastRx >= hb && t - this.lastPing >= hb)) {
      this.pongs.push(null);
      this.write(link, [encodePing()]);
      this.lastPing = t;
      this.stats.heartbeats += 1;
    }
    let due = Math.min(this.lastTx + hb, Math.max(link.lastRx, this.lastPing) + hb, link.lastRx + idle);
    if (this.lastPing > link.lastRx) due = Math.min(due, this.lastPing + PING_GRACE_MS);
    this.armTimer(Math.max(due - t, 10));
  };

  private armTimer(ms: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = setTimeout(this.onTimer, ms);
  }
}
