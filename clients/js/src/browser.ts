/** imgw-client for browsers: WebSocket (ws://, wss://) only, tokens and hashes on Web
 * Crypto. The same API as the Node entry (index.ts), which adds TCP. */

import { Client as BaseClient } from "./client/client.js";
import type { ClientOptions, Platform } from "./client/types.js";
import { mintToken, sha256Digest } from "./token/web.js";
import type { Dialer } from "./transport/types.js";
import { type WebSocketConstructor, webSocketDialer } from "./transport/ws.js";

export * from "./common.js";
export { mintToken, sha256Digest } from "./token/web.js";

export interface ConnectOptions extends ClientOptions {
  /** The WebSocket class (the browser's by default). */
  WebSocket?: WebSocketConstructor;
}

/** A Dialer for ws:// and wss:// on the page's WebSocket. */
export function browserDialer(WebSocketImpl?: WebSocketConstructor): Dialer {
  return (endpoint, events, signal) => {
    const impl = WebSocketImpl ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (impl === undefined) return Promise.reject(new Error("no WebSocket in this runtime"));
    if (endpoint.scheme !== "ws" && endpoint.scheme !== "wss") {
      return Promise.reject(new TypeError(`${endpoint.url}: a browser connects by WebSocket: use ws://host:port/ws`));
    }
    return webSocketDialer(impl)(endpoint, events, signal);
  };
}

function platform(options: ConnectOptions): Platform {
  const location = (globalThis as { location?: { href: string } }).location;
  return {
    dial: options.dial ?? browserDialer(options.WebSocket),
    sha256: sha256Digest,
    mintToken,
    ...(location ? { base: location.href } : {}),
  };
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
