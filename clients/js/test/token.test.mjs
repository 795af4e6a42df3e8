// Development tokens: the SDK mints what `imgw token` mints, on node:crypto, on Web
// Crypto and on the plain-JS fallback alike.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, createHmac, randomBytes } from "node:crypto";
import { describe, it } from "node:test";
import { DEV_KEY, mintToken, mintTokenSync } from "../dist/index.js";
import { mintToken as mintTokenWeb, sha256Digest as sha256Web } from "../dist/token/web.js";
import { hmacSha256, sha256 } from "../dist/token/sha256.js";
import { IMGW_BIN } from "./support/gateway.mjs";

describe("tokens", () => {
  it("are the tokens imgw token mints", async () => {
    for (const [uid, device, kid, secret] of [
      ["5", "d", "test", "test-secret"],
      ["1152921504606846983", "cli-pts-3", "dev", "imgw-dev-secret"],
      ["18446744073709551615", "a_b-C", "k", "s:with:colons"],
    ]) {
      const minted = execFileSync(IMGW_BIN, ["token", "--uid", uid, "--device", device, "--kid", kid, "--secret", secret, "--ttl", "600"], {
        encoding: "utf8",
        timeout: 20_000,
      }).trim();
      const iat = Number(minted.split(".")[4]);
      const options = { key: `${kid}:${secret}`, uid: BigInt(uid), device, ttlS: 600, now: iat };
      assert.equal(mintTokenSync(options), minted);
      assert.equal(await mintToken(options), minted);
      assert.equal(await mintTokenWeb(options), minted);
    }
  });

  it("v1 tokens and the development key", async () => {
    const options = { uid: 7, device: "web", now: 1_700_000_000, ttlS: 100, v1: true };
    const token = mintTokenSync(options);
    const signed = "v1.dev.7.web.1700000100";
    const sig = createHmac("sha256", DEV_KEY.split(":")[1]).update(signed).digest("base64url");
    assert.equal(token, `${signed}.${sig}`);
    assert.equal(await mintTokenWeb(options), token);
  });

  it("refuses what no gateway accepts", () => {
    assert.throws(() => mintTokenSync({ uid: 1, device: "bad device" }), TypeError);
    assert.throws(() => mintTokenSync({ uid: 0, device: "d" }), RangeError);
    assert.throws(() => mintTokenSync({ uid: 1, device: "d", key: "nokid" }), TypeError);
  });

  it("falls back to plain-JS SHA-256 and HMAC that match node:crypto", async () => {
    for (const n of [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 4096 + 3]) {
      const data = randomBytes(n);
      const want = createHash("sha256").update(data).digest("hex");
      assert.equal(Buffer.from(sha256(data)).toString("hex"), want, `sha256 of ${n} bytes`);
      assert.equal(Buffer.from(await sha256Web(data)).toString("hex"), want);
      for (const keyLen of [0, 16, 64, 65, 200]) {
        const key = randomBytes(keyLen);
        assert.equal(Buffer.from(hmacSha256(key, data)).toString("hex"), createHmac("sha256", key).update(data).digest("hex"));
      }
    }
  });

  it("mints on the fallback when crypto.subtle is missing", async () => {
    const saved = Object.getOwnPropertyDescriptor(globalThis, "crypto");
    const options = { uid: 3, device: "insecure", now: 1_700_000_000 };
    const want = mintTokenSync(options);
    Object.defineProperty(globalThis, "crypto", { value: { getRandomValues: (a) => a }, configurable: true });
    try {
      assert.equal(await mintTokenWeb(options), want);
    } finally {
      Object.defineProperty(globalThis, "crypto", saved);
    }
  });
});
