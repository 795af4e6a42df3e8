/** Token minting and hashing on Web Crypto (crypto.subtle), with the plain-JS fallback
 * where a page is not a secure context. */

import { type MintOptions, base64url, tokenToSign } from "./format.js";
import { hmacSha256, sha256 } from "./sha256.js";

function subtle(): SubtleCrypto | undefined {
  return (globalThis as { crypto?: Crypto }).crypto?.subtle;
}

/** Mint a development token (see token/format.ts), as `imgw chat` does. */
export async function mintToken(options: MintOptions): Promise<string> {
  const { signed, secret } = tokenToSign(options);
  const data = new TextEncoder().encode(signed);
  const s = subtle();
  let sig: Uint8Array;
  if (s !== undefined) {
    const key = await s.importKey("raw", secret, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    sig = new Uint8Array(await s.sign("HMAC", key, data));
  } else {
    sig = hmacSha256(secret, data);
  }
  return `${signed}.${base64url(sig)}`;
}

/** SHA-256 of `data`. */
export async function sha256Digest(data: Uint8Array): Promise<Uint8Array> {
  const s = subtle();
  if (s === undefined) return sha256(data);
  return new Uint8Array(await s.digest("SHA-256", data as Uint8Array<ArrayBuffer>));
}
