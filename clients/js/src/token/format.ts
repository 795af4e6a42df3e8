/** LOGIN tokens for development (docs/protocol.md, Tokens): what `imgw token` and
 * `imgw chat` mint, so that a dev page or script logs in the same way.
 *
 *     v2.<kid>.<uid>.<device>.<iat>.<exp>.<sig>     (v1: without iat)
 *     sig = base64url_nopad(HMAC-SHA256(utf8(secret), "v2.<kid>.<uid>.<device>.<iat>.<exp>"))
 *
 * A real app gets its tokens from its login service, never from a secret it holds. */

import { type Id, toId } from "../protocol/ids.js";

/** The gateway's development key: what `imgw serve` uses without --token-key. */
export const DEV_KEY = "dev:imgw-dev-secret";
/** How long minted tokens last by default, as `imgw chat`'s: a day. */
export const TOKEN_TTL_S = 86_400;

const KID_RE = /^[A-Za-z0-9_-]{1,16}$/;
const DEVICE_RE = /^[A-Za-z0-9_-]{1,32}$/;

export interface MintOptions {
  uid: Id;
  device: string;
  /** "KID:SECRET" (the secret may hold ':'); DEV_KEY by default. */
  key?: string;
  /** Seconds of validity; TOKEN_TTL_S by default. */
  ttlS?: number;
  /** The minting time, Unix seconds; the clock by default. */
  now?: number;
  /** Mint a v1 token (no iat). v2 by default: a revocation refuses every v1 token of
   * the user for the whole token lifetime, v2 ones only up to the revocation. */
  v1?: boolean;
}

/** The signed part of a token and the secret to sign it with. Throws on values no
 * gateway would accept. */
export function tokenToSign(options: MintOptions): { signed: string; secret: Uint8Array<ArrayBuffer> } {
  const spec = options.key ?? DEV_KEY;
  const colon = spec.indexOf(":");
  const kid = colon < 0 ? "" : spec.slice(0, colon);
  const secret = colon < 0 ? "" : spec.slice(colon + 1);
  if (!KID_RE.test(kid) || !secret) {
    throw new TypeError("key must be KID:SECRET with KID of 1-16 [A-Za-z0-9_-] and a secret");
  }
  if (!DEVICE_RE.test(options.device)) {
    throw new TypeError(`bad device ${JSON.stringify(options.device)}: must match [A-Za-z0-9_-]{1,32}`);
  }
  const uid = toId(options.uid, "uid");
  const now = options.now ?? Math.floor(Date.now() / 1000);
  const ttl = options.ttlS ?? TOKEN_TTL_S;
  if (!Number.isSafeInteger(now) || now < 0 || !Number.isSafeInteger(ttl) || ttl < 1) {
    throw new RangeError("now and ttlS must be whole seconds, ttlS at least 1");
  }
  const exp = now + ttl;
  const signed = options.v1
    ? `v1.${kid}.${uid}.${options.device}.${exp}`
    : `v2.${kid}.${uid}.${options.device}.${now}.${exp}`;
  return { signed, secret: new TextEncoder().encode(secret) };
}

/** Unpadded base64url. */
export function base64url(bytes: Uint8Array): string {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  let out = "";
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
    out += abc[n >> 18]! + abc[(n >> 12) & 63]! + abc[(n >> 6) & 63]! + abc[n & 63]!;
  }
  if (i + 1 === bytes.length) {
    const n = bytes[i]! << 16;
    out += abc[n >> 18]! + abc[(n >> 12) & 63]!;
  } else if (i + 2 === bytes.length) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8);
    out += abc[n >> 18]! + abc[(n >> 12) & 63]! + abc[(n >> 6) & 63]!;
  }
  return out;
}

/** Lowercase hex. */
export function hex(bytes: Uint8Array): string {
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}
