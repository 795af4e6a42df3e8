/** Token minting and hashing on node:crypto. */

import { createHash, createHmac } from "node:crypto";
import { type MintOptions, base64url, tokenToSign } from "./format.js";

/** Mint a development token (see token/format.ts), as `imgw chat` does. */
export function mintTokenSync(options: MintOptions): string {
  const { signed, secret } = tokenToSign(options);
  const sig = createHmac("sha256", secret).update(signed, "utf8").digest();
  return `${signed}.${base64url(new Uint8Array(sig.buffer, sig.byteOffset, sig.byteLength))}`;
}

/** `mintTokenSync` with the browser build's signature. */
export async function mintToken(options: MintOptions): Promise<string> {
  return mintTokenSync(options);
}

/** SHA-256 of `data`. */
export async function sha256Digest(data: Uint8Array): Promise<Uint8Array> {
  const d = createHash("sha256").update(data).digest();
  return new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
}
