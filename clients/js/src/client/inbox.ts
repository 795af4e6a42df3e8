/** What the app receives: duplicate suppression and catch-up.
 *
 * Live PUSH frames and the messages a catch-up pulls both go through `deliver`, which
 * drops any seq the app was given before, so the `message` event fires at most once per
 * message. A catch-up pass is SYNC from the kept `since`, then PULL for every
 * conversation whose max_seq is above what the client holds (docs/protocol.md, Paging
 * and SYNC). The first pass of a session that was not given a `since` is a baseline: it
 * only records where every conversation stands, since what came before the session is
 * history, not news. */

import { type Conv, type Message, type Opaque, type PullResult, type SyncResult, sameOpaque } from "../protocol/frames.js";
import { ErrorCode } from "../protocol/ops.js";
import { ClientError } from "./errors.js";
import { SeenSeqs } from "./seen.js";

/** The server's cap on a PULL page. */
export const CATCH_UP_PAGE = 200;

/** A catch-up's first SYNC page, asked in the LOGIN's write from `since`. */
export interface FirstPage {
  since: Opaque;
  rid: number;
  reply: Promise<SyncResult>;
}

export interface ClientStats {
  /** Successful logins, the first included. */
  connects: number;
  /** Successful logins after a lost connection. */
  reconnects: number;
  requests: number;
  /** Live PUSH frames given to the app. */
  pushes: number;
  /** Messages given to the app from catch-up PULLs. */
  caughtUp: number;
  /** PUSH or pulled messages dropped as seen before. */
  dupDrops: number;
  sendRetries: number;
  /** PINGs the heartbeat sent. */
  heartbeats: number;
}

export function newStats(): ClientStats {
  return { connects: 0, reconnects: 0, requests: 0, pushes: 0, caughtUp: 0, dupDrops: 0, sendRetries: 0, heartbeats: 0 };
}

/** The requests a catch-up makes (the Client). */
export interface CatchUpRequests {
  readonly uid: bigint;
  syncAll(since: Opaque, first?: FirstPage | null): Promise<{ nextSince: Opaque; convs: Conv[] }>;
  pull(convId: bigint, options: { afterSeq?: bigint; limit?: number }): Promise<PullResult>;
}

/** Where the inbox hands things to the app. */
export interface InboxSink {
  message(m: Message, caughtUp: boolean): void;
  synced(nextSince: Opaque, convs: Conv[]): void;
}

export class Inbox {
  /** client_msg_ids of sends waiting for their ack. */
  readonly sending = new Set<string>();
  private readonly seenByConv = new Map<bigint, SeenSeqs>();
  private since: Opaque | null;
  private running: Promise<boolean> | null = null;
  private again = false;
  private first: FirstPage | null = null;
  private stopped = false;

  constructor(
    private readonly api: CatchUpRequests,
    private readonly sink: InboxSink,
    private readonly stats: ClientStats,
    since: Opaque | null = null,
  ) {
    this.since = since;
  }

  seen(convId: bigint): SeenSeqs {
    let seen = this.seenByConv.get(convId);
    if (seen === undefined) this.seenByConv.set(convId, (seen = new SeenSeqs()));
    return seen;
  }

  /** Give `m` to the app unless it was given before. */
  deliver(m: Message, pulled: boolean): void {
    if (!this.seen(m.convId).add(m.seq)) {
      this.stats.dupDrops += 1;
    } else if (pulled && m.senderUid === this.api.uid && this.sending.has(m.clientMsgId)) {
      // our own send whose ack was lost: `send` returns it
    } else {
      if (pulled) this.stats.caughtUp += 1;
      else this.stats.pushes += 1;
      this.sink.message(m, pulled);
    }
  }

  /** Where the next pass's SYNC starts. */
  get nextSince(): Opaque {
    return this.since ?? 0;
  }

  get catchingUp(): boolean {
    return this.running !== null;
  }

  /** Start a catch-up pass, or ask the running one for another pass; resolves when no
   * pass is left, true if the last one completed. `first`: the pass's first SYNC page,
   * already asked (with a new connection's LOGIN). */
  catchUp(first: FirstPage | null = null): Promise<boolean> {
    if (first !== null) this.first = first;
    if (this.running !== null) {
      this.again = true;
      return this.running;
    }
    this.stopped = false;
    const run = this.run().finally(() => {
      if (this.running === run) this.running = null;
    });
    this.running = run;
    return run;
  }

  /** No more passes after the running one's current request. */
  stop(): void {
    this.stopped = true;
    this.again = false;
    this.first = null;
  }

  private async run(): Promise<boolean> {
    let ok = false;
    do {
      this.again = false;
      try {
        await this.pass();
        ok = true;
      } catch (e) {
        // A lost connection (its next login asks again) or a refusal; bugs propagate.
        if (!(e instanceof ClientError)) throw e;
        ok = false;
      }
    } while (this.again && !this.stopped);
    return ok;
  }

  private async pass(): Promise<void> {
    const baseline = this.since === null;
    const since = this.nextSince;
    let first = this.first;
    this.first = null;
    if (first !== null && !sameOpaque(first.since, since)) first = null; // not this pass's
    let result: { nextSince: Opaque; convs: Conv[] };
    try {
      result = await this.api.syncAll(since, first);
    } catch (e) {
      if (!(e instanceof ClientError) || e.code !== ErrorCode.BAD_REQUEST || since === 0) throw e;
      result = await this.api.syncAll(0); // a since of another deployment
    }
    for (const row of result.convs) {
      if (this.stopped) return;
      const seen = this.seen(row.convId);
      if (baseline) seen.skipTo(row.maxSeq);
      else if (row.maxSeq > seen.floor) await this.pullMissed(row.convId, seen);
    }
    if (this.stopped) return;
    this.since = result.nextSince;
    this.sink.synced(result.nextSince, result.convs);
  }

  private async pullMissed(convId: bigint, seen: SeenSeqs): Promise<void> {
    let after = seen.floor;
    for (;;) {
      let page: PullResult;
      try {
        page = await this.api.pull(convId, { afterSeq: after, limit: CATCH_UP_PAGE });
      } catch (e) {
        if (e instanceof ClientError && (e.code === ErrorCode.NOT_MEMBER || e.code === ErrorCode.NO_SUCH_CONVERSATION)) {
          return;
        }
        throw e;
      }
      for (const m of page.messages) this.deliver(m, true);
      const last = page.messages[page.messages.length - 1];
      if (last !== undefined) after = last.seq;
      if (!page.hasMore || last === undefined) break;
    }
    seen.skipTo(after);
  }
}

