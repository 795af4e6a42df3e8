/** imgw-client for Node: TCP (tcp://, tls://) and WebSocket (ws://, wss://, on the `ws`
 * package unless another WebSocket class is given). Browsers get browser.ts, which has
 * the same API on WebSocket alone. */

import type * as tls from "node:tls";
import WebSocket from "ws";
import { Client as BaseClient } from "./client/client.js";
import type { ClientOptions, Platform } from "./client/types.js";
import { mintToken, sha256Digest } from "./token/node.js";
import { tcpDialer } from "./transport/tcp.js";
import type { Dialer } from "./transport/types.js";
import { type WebSocketConstructor, webSocketDialer } from "./transport/ws.js";

export * from "./common.js";
export { mintToken, mintTokenSync, sha256Digest } from "./token/node.js";
export { tcpDialer } from "./transport/tcp.js";

export interface ConnectOptions extends ClientOptions {
  /** For tls:// and wss:// URLs: node:tls options (ca, servername...). */
  tls?: tls.ConnectionOptions;
  /** The WebSocket class for ws:// and wss:// (the `ws` package by default). */
  WebSocket?: WebSocketConstructor;
}

/** The `ws` package's WebSocket, with `tlsOptions` for wss:// (ca, servername...). */
function wsWithTls(tlsOptions: tls.ConnectionOptions | undefined): WebSocketConstructor {
  if (tlsOptions === undefined) return WebSocket as unknown as WebSocketConstructor;
  return class extends WebSocket {
    constructor(url: string) {
      super(url, tlsOptions);
    }
  } as unknown as WebSocketConstructor;
}

/** A Dialer for tcp://, tls://, ws:// and wss:// (`tls`: node:tls options for tls://
 * and, on the `ws` package, wss://). */
export function nodeDialer(options: { tls?: tls.ConnectionOptions; WebSocket?: WebSocketConstructor } = {}): Dialer {
  const tcp = tcpDialer(options.tls);
  const ws = webSocketDialer(options.WebSocket ?? wsWithTls(options.tls));
  return (endpoint, events, signal) =>
    endpoint.scheme === "tcp" || endpoint.scheme === "tls" ? tcp(endpoint, events, signal) : ws(endpoint, events, signal);
}

function platform(options: ConnectOptions): Platform {
  return { dial: options.dial ?? nodeDialer(options), sha256: sha256Digest, mintToken };
}

/** One device's session with a gateway; `connect()` it, or use the `connect` function. */
export class Client extends BaseClient {
  constructor(options: ConnectOptions) {
    super(options, platform(options));
  }
}

/** A new Client, connected: logged in and its baseline SYNC done. */
export async function connect(options: ConnectOptions): Promise<Client> {
  const client = new Client(options);
  await client.connect();
  return client;
}
