/** `Session`: the connection half of the client. It logs in, keeps one connection up
 * (heartbeat, reconnect, catch-up), matches replies to requests and turns what the
 * server starts into events; `Client` (client.ts) adds the requests of the protocol.
 *
 * Replies are matched to requests by rid (they may come in any order). One timer sends
 * PING when nothing was sent for `hb` seconds and drops a connection the server left
 * silent (no answer to a PING within 10 s, or nothing for `idle` seconds).
 *
 * Reconnect and catch-up: after a dropped connection or a KICK draining / shutdown the
 * session logs in again with exponential backoff and full jitter, cycling through its
 * URLs (a KICK's reconnect_hint first), then runs SYNC from the kept `next_since` and
 * PULLs every conversation whose max_seq is above what it has seen. That SYNC's first
 * page goes in the LOGIN's own write, as docs/protocol.md recommends. Missed messages
 * come out as `message` events with `caughtUp: true`; the per-conversation record of
 * seen seqs drops duplicates, so no message comes twice. SYNC_HINT runs the same
 * catch-up. Sends survive all this: `send` waits while offline and sends again with the
 * same client_msg_id, which the server deduplicates. KICK duplicate_login,
 * slow_consumer and auth_revoked (unless the token is a function that can mint a new
 * one) end the session. */

import {
  type Conv,
  type Kick,
  type LoginOk,
  type Opaque,
  type PullResult,
  type Reply,
  type ServerFrame,
  type SyncResult,
  decodeServerFrame,
  encodeLogin,
  encodeLogout,
  encodePing,
  encodePull,
  encodeSend,
  encodeSync,
  sameOpaque,
} from "../protocol/frames.js";
import { type Id, toId, toU64 } from "../protocol/ids.js";
import { CAPS, ErrorCode, KickReason, MsgType } from "../protocol/ops.js";
import { type Endpoint, type Transport, hintEndpoint, parseEndpoint } from "../transport/types.js";
import { Emitter } from "./emitter.js";
import { ClientError, ConnectionLost, RequestTimeout, SessionEnded } from "./errors.js";
import { type ClientStats, type FirstPage, Inbox, newStats } from "./inbox.js";
import type {
  ClientEvents,
  ClientOptions,
  ConnectionState,
  PendingSend,
  Platform,
  SendOptions,
  SendResult,
  StateEvent,
  TokenSource,
} from "./types.js";

const MAX_RID = 0x7fff_ffff;
const PING_GRACE_MS = 10_000; // docs/protocol.md: no answer to a PING within 10 s: dead
const RECONNECTING_KICKS = new Set<number>([KickReason.DRAINING, KickReason.SHUTDOWN]);
// SEND outcomes answered by sending again with the same client_msg_id (0: no reply)
const SEND_AGAIN = new Set<number>([0, ErrorCode.UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN]);
const utf8 = new TextEncoder();

export const now = (): number => performance.now();

interface Waiter {
  resolve(frame: Reply): void;
  reject(error: Error): void;
  timer: ReturnType<typeof setTimeout> | null;
}

/** One connection, from dial to close. */
export class Link {
  transport: Transport | null = null;
  loginOk: LoginOk | null = null;
  kick: Kick | null = null;
  lastRx = now();
  dead = false;
  readonly loggedIn: Promise<LoginOk>;
  settle!: { resolve(ok: LoginOk): void; reject(e: Error): void };

  constructor(readonly endpoint: Endpoint) {
    this.loggedIn = new Promise<LoginOk>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    this.loggedIn.catch(() => {}); // awaited by `open`; handled for failures before that
  }
}

function newClientMsgId(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

/** `frame` as the reply kind a request expects. */
export function expect<K extends Reply["kind"]>(frame: Reply, kind: K): Extract<Reply, { kind: K }> {
  if (frame.kind !== kind) throw new ClientError(0, `expected ${kind}, got ${frame.kind}`);
  return frame as Extract<Reply, { kind: K }>;
}

export class Session extends Emitter<ClientEvents> {
  readonly uid: bigint;
  readonly device: string;
  readonly endpoints: readonly Endpoint[];
  readonly stats: ClientStats = newStats();
  /** The last LOGIN_OK (null before the first login). */
  loginOk: LoginOk | null = null;

  protected readonly platform: Platform;
  protected readonly requestTimeoutMs: number;
  protected readonly inbox: Inbox;
  private readonly token: TokenSource;
  private readonly autoReconnect: boolean;
  private readonly backoffBaseMs: number;
  private readonly backoffCapMs: number;
  private readonly heartbeat: boolean;
  private readonly catchUpOn: boolean;
  private readonly sendAttempts: number;
  private readonly sendRetryMs: number;
  private readonly caps: readonly string[];

  private link: Link | null = null; // logged in and current
  private active = false; // between connect() and the end of the session
  private closing = false;
  private ended: SessionEnded | null = null;
  private stateNow: ConnectionState = "idle";
  private logins = 0; // of this session
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
  private giveUpDial: (() => void) | null = null; // abandons the login in progress

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

  /** Why the session ended; null while it lasts (and before it starts). */
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
   * Rejects with ClientError for an ERROR answer (auth_failed...), ConnectionLost when
   * no URL could be reached, SessionEnded when closed meanwhile. */
  async connect(): Promise<LoginOk> {
    if (this.active) throw new Error("client already connected");
    this.ended = null;
    this.closing = false;
    this.active = true;
    this.logins = 0;
    let failure: unknown = null;
    for (let i = 0; i < this.endpoints.length; i++) {
      const endpoint = this.pickEndpoint();
      this.setState({ state: "connecting", url: endpoint.url, attempt: 0 });
      let link: Link;
      try {
        link = await this.open(endpoint);
      } catch (e) {
        if (this.closing) throw this.endedError();
        if (e instanceof ClientError && e.code !== 0) {
          this.end(new SessionEnded(`login refused: ${e.message}`));
          throw e;
        }
        failure = e;
        continue;
      }
      if (this.closing) throw this.endedError();
      const first = this.takeFirstSync();
      if (this.catchUpOn && !link.dead) await this.inbox.catchUp(first);
      return link.loginOk!;
    }
    const why = failure instanceof Error ? failure.message : String(failure);
    const what = this.endpoints.length === 1 ? "cannot connect" : `cannot connect to any of ${this.endpoints.map((e) => e.url).join(", ")}`;
    this.end(new SessionEnded(what));
    throw new ConnectionLost(`${what}: ${why}`);
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
    this.link?.transport?.abort("dropped by the app");
  }

  // -- what catch-up needs --------------------------------------------------------------

  /** Run a catch-up pass now (SYNC, then PULL what was missed): missed messages arrive
   * as `message` events. Apps call it when they come to the foreground, say. Resolves
   * true when the pass completed. */
  catchUp(): Promise<boolean> {
    return this.inbox.catchUp();
  }

  /** Tell the dedup that the app already has these messages (from `history`): they
   * will not come as events. */
  markSeen(convId: Id, seqs: Iterable<Id>): void {
    const seen = this.inbox.seen(toId(convId, "convId"));
    for (const seq of seqs) seen.add(toU64(seq, "seq"));
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
        result = await this.answer(first);
        first = null;
      } else {
        result = await this.sync(since, cursor);
      }
      convs.push(...result.convs);
      if (!result.hasMore || sameOpaque(result.nextCursor, cursor)) return { nextSince: result.nextSince, convs };
      cursor = result.nextCursor;
    }
  }

  /** PULL: the first `limit` messages after `afterSeq` (0: from the start). */
  async pull(convId: Id, options: { afterSeq?: Id; limit?: number } = {}): Promise<PullResult> {
    const rid = this.rid();
    const body = encodePull(rid, toId(convId, "convId"), toU64(options.afterSeq ?? 0n, "afterSeq"), options.limit ?? 0);
    return expect(await this.ask(rid, body, "PULL"), "pull_result");
  }

  // -- sending --------------------------------------------------------------------------

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

  // -- request plumbing ---------------------------------------------------------------

  protected rid(): number {
    do {
      this.nextRid = (this.nextRid % MAX_RID) + 1;
    } while (this.pending.has(this.nextRid));
    return this.nextRid;
  }

  /** Send a request on the current connection; its reply. ERROR rejects with
   * ClientError, no reply within requestTimeoutMs with RequestTimeout. */
  protected ask(rid: number, body: Uint8Array, name: string): Promise<Reply> {
    try {
      return this.call(this.needLink(), rid, body, name);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** A frame without a reply (READ, DELIVERED, TYPING); false when offline. */
  protected tell(body: Uint8Array): boolean {
    const link = this.link;
    if (link === null || link.dead) return false;
    this.write(link, [body]);
    return true;
  }

  /** PING and wait for the PONG. */
  async ping(): Promise<void> {
    const link = this.needLink();
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new RequestTimeout("no PONG")), this.requestTimeoutMs);
      const settle = (e?: Error): void => {
        clearTimeout(timer);
        if (e) reject(e);
        else resolve();
      };
      this.pongs.push({ resolve: () => settle(), reject: settle });
      this.write(link, [encodePing()]);
    });
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

  /** Dial and LOGIN, with the catch-up's first SYNC in the same write; the link is
   * installed the moment LOGIN_OK arrives. Bounded by requestTimeoutMs. */
  private async open(endpoint: Endpoint): Promise<Link> {
    const link = new Link(endpoint);
    const abort = new AbortController();
    let gaveUp: ClientError | null = null;
    const giveUp = (error: ClientError, why: string): void => {
      if (link.loginOk !== null || link.dead) return;
      link.dead = true;
      gaveUp = error;
      abort.abort(why);
      link.settle.reject(error);
      link.transport?.abort(why);
    };
    const timer = setTimeout(() => {
      const why = `no LOGIN_OK within ${this.requestTimeoutMs} ms`;
      giveUp(new RequestTimeout(`${endpoint.url}: ${why}`), why);
    }, this.requestTimeoutMs);
    this.giveUpDial = () => giveUp(new SessionEnded("client closed"), "client closed");
    let first: FirstPage | null = null;
    try {
      const source = this.token;
      const token = typeof source === "string" ? source : await source({ uid: this.uid, device: this.device });
      if (link.dead) await link.loggedIn; // given up while minting: its error
      const bodies = [encodeLogin(1, this.uid, this.device, token, this.caps)];
      if (this.catchUpOn) {
        // The server answers a SYNC sent right behind the LOGIN in LOGIN_OK's write: one
        // round trip fewer for every reconnect (thousands at once after a restart).
        first = this.askAhead(this.inbox.nextSince);
        bodies.push(encodeSync(first.rid, first.since, 0, 0));
      }
      const transport = await this.platform.dial(
        endpoint,
        { frame: (body) => this.onBody(link, body), closed: (why) => this.onClosed(link, why) },
        abort.signal,
      );
      link.transport = transport;
      if (link.dead) {
        transport.abort("given up");
        await link.loggedIn;
      }
      transport.write(bodies);
      this.lastTx = now();
      await link.loggedIn;
    } catch (e) {
      if (first !== null && link.loginOk === null) this.pending.delete(first.rid);
      if (!link.dead) {
        link.dead = true;
        link.transport?.abort("login failed");
      }
      if (gaveUp !== null) throw gaveUp;
      if (e instanceof ClientError) throw e;
      throw new ConnectionLost(`${endpoint.url}: ${e instanceof Error ? e.message : String(e)}`); // the dialer's
    } finally {
      clearTimeout(timer);
      this.giveUpDial = null;
    }
    this.firstSync = first;
    return link;
  }

  /** Register a SYNC's reply before the request goes out (with a LOGIN). */
  private askAhead(since: Opaque): FirstPage {
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
        timer: null, // `answer` bounds the wait for it
      });
    });
    reply.catch(() => {}); // a pass may not want it after all
    this.stats.requests += 1;
    return { since, rid, reply };
  }

  /** The reply to a SYNC asked ahead, within requestTimeoutMs of now. */
  private answer(first: FirstPage): Promise<SyncResult> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(first.rid); // still ours: it would have cleared the timer
        reject(new RequestTimeout(`no reply to SYNC rid ${first.rid}`));
      }, this.requestTimeoutMs);
      first.reply.then(
        (r) => (clearTimeout(timer), resolve(r)),
        (e: unknown) => (clearTimeout(timer), reject(e)),
      );
    });
  }

  /** LOGIN_OK came: `link` is the connection now. */
  private install(link: Link): void {
    const ok = link.loginOk!;
    this.link = link;
    this.loginOk = ok;
    this.stats.connects += 1;
    const reconnected = this.logins > 0;
    this.logins += 1;
    if (reconnected) this.stats.reconnects += 1;
    const t = now();
    link.lastRx = this.lastTx = this.lastPing = t;
    if (this.heartbeat) this.armTimer(Math.max(1, ok.hb) * 1000);
    this.setState({ state: "online", url: link.endpoint.url, node: ok.node, loginOk: ok, reconnected });
    for (const wake of [...this.linkWaiters]) wake();
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

  /** Why the session ends after `link` was lost, or null to reconnect. */
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

  /** A sleep that `close` cuts short. */
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
        const first = this.takeFirstSync();
        if (this.closing || this.ended !== null) return; // close() closed the link
        if (link.dead) continue; // lost again before we got here: afterLoss left it to us
        const before = this.stats.caughtUp;
        const done = this.catchUpOn ? this.inbox.catchUp(first) : Promise.resolve(true);
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
      if (link.loginOk !== null) {
        this.kill(link, why);
      } else {
        link.dead = true;
        link.settle.reject(new ClientError(0, why));
        link.transport?.abort(why);
      }
      return;
    }
    if (link.loginOk !== null) {
      this.onFrame(link, frame);
    } else if (frame.kind === "login_ok") {
      link.loginOk = frame;
      this.install(link);
      link.settle.resolve(frame);
    } else {
      const error = frame.kind === "error" ? new ClientError(frame.code, frame.text) : new ClientError(0, `expected LOGIN_OK, got ${frame.kind}`);
      link.dead = true;
      link.settle.reject(error);
      link.transport?.abort("login refused");
    }
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
