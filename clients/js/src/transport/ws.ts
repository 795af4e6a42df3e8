/** WebSocket transport: each binary message carries exactly one frame body, without the
 * 4-byte length of TCP. Works on the browser's WebSocket and on the `ws` package (Node),
 * both through the standard interface below. */

import type { Dialer, Endpoint, Transport, TransportEvents } from "./types.js";

/** The part of the standard WebSocket this transport uses. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  /** `ws` (Node) only: drop the connection without a closing handshake. */
  terminate?(): void;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

const OPEN = 1;

/** Close codes the gateway uses, for people reading `closed`'s reason. */
const CLOSE_CODES: Record<number, string> = {
  1000: "closed",
  1001: "gateway going away",
  1003: "the gateway refused a text message",
  1006: "connection lost",
  1009: "message too large",
};

class WsTransport implements Transport {
  private done = false;

  constructor(
    private readonly sock: WebSocketLike,
    private readonly events: TransportEvents,
  ) {
    sock.onmessage = (ev) => {
      if (this.done) return;
      const data = ev.data;
      if (data instanceof ArrayBuffer) {
        this.events.frame(new Uint8Array(data));
      } else if (ArrayBuffer.isView(data)) {
        this.events.frame(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      } else {
        this.abort("the gateway sent a text message");
      }
    };
    sock.onerror = () => {}; // onclose follows and says it
    sock.onclose = (ev) => {
      const what = CLOSE_CODES[ev.code] ?? `close code ${ev.code}`;
      this.finish(ev.reason ? `${what}: ${ev.reason}` : what);
    };
  }

  write(bodies: readonly Uint8Array[]): void {
    if (this.done || this.sock.readyState !== OPEN) return;
    for (const b of bodies) this.sock.send(b);
  }

  close(): void {
    if (this.done) return;
    try {
      this.sock.close(1000);
    } catch {
      this.abort("closed");
    }
  }

  abort(why: string): void {
    if (this.done) return;
    try {
      if (typeof this.sock.terminate === "function") this.sock.terminate();
      else this.sock.close(1000);
    } catch {
      // closing a socket that is gone already
    }
    this.finish(why);
  }

  private finish(why: string): void {
    if (this.done) return;
    this.done = true;
    this.sock.onmessage = this.sock.onclose = null;
    this.events.closed(why);
  }
}

/** A Dialer for ws:// and wss:// on the given WebSocket class. */
export function webSocketDialer(WebSocketImpl: WebSocketConstructor): Dialer {
  return (endpoint: Endpoint, events: TransportEvents, signal: AbortSignal): Promise<Transport> =>
    new Promise((resolve, reject) => {
      if (endpoint.scheme !== "ws" && endpoint.scheme !== "wss") {
        reject(new TypeError(`${endpoint.url}: not a WebSocket URL`));
        return;
      }
      let sock: WebSocketLike;
      try {
        sock = new WebSocketImpl(endpoint.url);
      } catch (e) {
        reject(e);
        return;
      }
      sock.binaryType = "arraybuffer";
      const drop = (): void => {
        sock.onopen = sock.onclose = null;
        // `ws` reports a handshake cut short as an error event: with no listener, an
        // uncaught exception.
        sock.onerror = () => {};
        try {
          if (typeof sock.terminate === "function") sock.terminate();
          else sock.close();
        } catch {
          // never opened
        }
      };
      const onAbort = (): void => {
        drop();
        reject(new Error(String(signal.reason ?? "aborted")));
      };
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener("abort", onAbort, { once: true });
      sock.onerror = () => {}; // onclose follows
      sock.onclose = (ev) => {
        signal.removeEventListener("abort", onAbort);
        reject(new Error(`cannot open a WebSocket (close code ${ev.code})`));
      };
      sock.onopen = () => {
        signal.removeEventListener("abort", onAbort);
        sock.onopen = null;
        resolve(new WsTransport(sock, events));
      };
    });
}
