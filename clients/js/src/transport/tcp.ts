/** TCP and TLS transport (Node only): frames are a 4-byte big-endian length and a body
 * on the byte stream (protocol/framing.ts). */

import * as net from "node:net";
import * as tls from "node:tls";
import { StreamDecoder, frameStream } from "../protocol/framing.js";
import type { Dialer, Endpoint, Transport, TransportEvents } from "./types.js";

class TcpTransport implements Transport {
  private readonly decoder = new StreamDecoder();
  private done = false;

  constructor(
    private readonly sock: net.Socket,
    private readonly events: TransportEvents,
  ) {
    sock.on("data", (chunk: Buffer) => {
      if (this.done) return;
      const { bodies, error } = this.decoder.feed(chunk);
      for (const body of bodies) {
        if (this.done) return;
        this.events.frame(body);
      }
      if (error !== null) this.abort(`the gateway broke the framing: ${error}`);
    });
    sock.on("error", () => {}); // "close" follows and ends the transport
    sock.on("close", (hadError: boolean) => this.finish(hadError ? "connection reset" : "connection closed"));
  }

  write(bodies: readonly Uint8Array[]): void {
    if (this.done || this.sock.destroyed) return;
    this.sock.write(frameStream(bodies));
  }

  close(): void {
    if (this.done) return;
    this.sock.end();
    // The gateway closes on our FIN; if it does not, do not wait for it.
    setTimeout(() => this.sock.destroy(), 1000).unref();
  }

  abort(why: string): void {
    if (this.done) return;
    this.sock.destroy();
    this.finish(why);
  }

  private finish(why: string): void {
    if (this.done) return;
    this.done = true;
    this.events.closed(why);
  }
}

/** A Dialer for tcp:// and tls:// (`tlsOptions` for tls://: ca, servername...). */
export function tcpDialer(tlsOptions: tls.ConnectionOptions = {}): Dialer {
  return (endpoint: Endpoint, events: TransportEvents, signal: AbortSignal): Promise<Transport> =>
    new Promise((resolve, reject) => {
      const secure = endpoint.scheme === "tls";
      if (endpoint.scheme !== "tcp" && !secure) {
        reject(new TypeError(`${endpoint.url}: not a tcp:// or tls:// URL`));
        return;
      }
      const sock = secure
        ? tls.connect({ servername: net.isIP(endpoint.host) ? undefined : endpoint.host, ...tlsOptions, host: endpoint.host, port: endpoint.port })
        : net.connect({ host: endpoint.host, port: endpoint.port });
      const onAbort = (): void => {
        sock.destroy();
        reject(new Error(String(signal.reason ?? "aborted")));
      };
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener("abort", onAbort, { once: true });
      const onError = (e: Error): void => {
        signal.removeEventListener("abort", onAbort);
        sock.destroy();
        reject(e);
      };
      sock.once("error", onError);
      sock.once(secure ? "secureConnect" : "connect", () => {
        signal.removeEventListener("abort", onAbort);
        sock.off("error", onError);
        sock.setNoDelay(true);
        resolve(new TcpTransport(sock, events));
      });
    });
}
