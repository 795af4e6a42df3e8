/** The seam between the client and the wire: a Transport moves whole frame bodies.
 * TCP (transport/tcp.ts, Node only) puts a length in front of each; WebSocket
 * (transport/ws.ts) sends each as one binary message. The client core imports neither:
 * an entry point (index.ts for Node, browser.ts) hands it a `Dialer`. */

/** Where a gateway listens: `tcp://host:port`, `tls://host:port`, `ws://host:port/ws`,
 * `wss://host:port/ws`. */
export interface Endpoint {
  scheme: "tcp" | "tls" | "ws" | "wss";
  host: string;
  port: number;
  /** Path and query (WebSocket only; "" for TCP). */
  path: string;
  /** The endpoint written back as a URL. */
  url: string;
}

/** What a transport tells the client. A transport calls `frame` for each body, in
 * order, and `closed` exactly once, after which it calls nothing. */
export interface TransportEvents {
  frame(body: Uint8Array): void;
  closed(why: string): void;
}

export interface Transport {
  /** Send frame bodies in order, in as few writes as the transport allows. */
  write(bodies: readonly Uint8Array[]): void;
  /** Close politely (TCP FIN, WebSocket close 1000); `closed` follows. */
  close(): void;
  /** Drop the connection at once, as a network failure would; `closed` follows
   * synchronously. */
  abort(why: string): void;
}

/** Opens a connection to `endpoint`. Rejects when it cannot (refused, TLS, HTTP
 * upgrade refused) or when `signal` aborts first, with an Error saying why (the caller
 * names the endpoint). */
export type Dialer = (endpoint: Endpoint, events: TransportEvents, signal: AbortSignal) => Promise<Transport>;

const SCHEMES = new Set(["tcp", "tls", "ws", "wss"]);
const DEFAULT_PORTS: Record<string, number> = { ws: 80, wss: 443 };

/** Parse a gateway URL. `host:port` alone means `tcp://host:port`; IPv6 hosts go in
 * brackets. A path starting with "/" is resolved against `base` (a page's location:
 * http becomes ws, https wss). */
export function parseEndpoint(spec: string, base?: string): Endpoint {
  let text = spec.trim();
  if (text.startsWith("/") && base !== undefined) {
    const page = new URL(text, base);
    text = `${page.protocol === "https:" ? "wss" : "ws"}://${page.host}${page.pathname}${page.search}`;
  } else if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) {
    text = `tcp://${text}`;
  }
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: expected tcp://host:port or ws://host:port/ws`);
  }
  const scheme = url.protocol.slice(0, -1).toLowerCase();
  if (!SCHEMES.has(scheme)) {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: the scheme must be tcp, tls, ws or wss`);
  }
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = url.port ? Number(url.port) : DEFAULT_PORTS[scheme];
  if (!host || port === undefined) {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: it needs a host and a port`);
  }
  const isWs = scheme === "ws" || scheme === "wss";
  const path = isWs ? `${url.pathname || "/"}${url.search}` : "";
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return {
    scheme: scheme as Endpoint["scheme"],
    host,
    port,
    path,
    url: `${scheme}://${hostPart}:${port}${path}`,
  };
}

/** The endpoint a KICK's reconnect_hint ("host:port") names, on `current`'s scheme;
 * null when it is unusable. Hints name the gateway's TCP port, so they are used on
 * tcp:// and tls:// only. */
export function hintEndpoint(current: Endpoint, hint: string): Endpoint | null {
  if (!hint || (current.scheme !== "tcp" && current.scheme !== "tls")) return null;
  try {
    const ep = parseEndpoint(`${current.scheme}://${hint}`);
    return ep;
  } catch {
    return null;
  }
}
