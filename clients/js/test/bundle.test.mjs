// The browser bundle gateway/web/imgw-client.js: built from these very sources (its
// first line names their hash), the same bytes on every build, self-contained (no
// import of anything, no Node built-in), and it chats over WebSocket.

import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, describe, it } from "node:test";
import WebSocket from "ws";
import { SHIPPED, bundle } from "../scripts/build-web.mjs";
import { ROOT, sourcesHash } from "../scripts/sources-hash.mjs";
import { Gateway, TOKEN_KEY } from "./support/gateway.mjs";
import { Recorder, within } from "./support/wait.mjs";

const version = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).version;

describe("the browser bundle", () => {
  const shipped = readFileSync(SHIPPED, "utf8");

  it("names the version and the hash of the sources it was built from", () => {
    assert.equal(shipped.split("\n", 1)[0], `// imgw-client ${version} sources-sha256:${sourcesHash()}`);
  });

  it("is what the sources build, byte for byte (npm run build:web)", async () => {
    assert.equal(await bundle(), shipped);
  });

  it("is one module that imports nothing and no Node built-in", () => {
    assert.doesNotMatch(shipped, /^\s*import\s/m);
    assert.doesNotMatch(shipped, /\bimport\(/);
    assert.doesNotMatch(shipped, /\brequire\(/);
    assert.doesNotMatch(shipped, /["']node:/);
    assert.doesNotMatch(shipped, /from\s*["']ws["']/);
    assert.match(shipped, /^export \{/m);
  });
});

describe("the browser bundle over WebSocket", () => {
  const gw = new Gateway({ ws: true });
  const dir = mkdtempSync(join(tmpdir(), "imgw-bundle-"));
  let sdk;

  before(async () => {
    await gw.start();
    // Node takes a .js file outside a "type": "module" package for CommonJS: copy it.
    copyFileSync(SHIPPED, join(dir, "imgw-client.mjs"));
    sdk = await import(pathToFileURL(join(dir, "imgw-client.mjs")).href);
  });

  after(async () => {
    await gw.dispose();
    rmSync(dir, { recursive: true, force: true });
  });

  it("exports what a chat page needs", () => {
    for (const name of ["connect", "Client", "mintToken", "DEV_KEY", "ClientError", "SessionEnded", "MsgType", "decodeSystemContent"]) {
      assert.ok(name in sdk, name);
    }
    assert.equal(sdk.DEV_KEY, "dev:imgw-dev-secret");
  });

  it("logs in with a minted token, chats, and refuses tcp://", async () => {
    const big = 2n ** 60n + 7n;
    const options = { url: gw.wsUrl, device: "page", WebSocket };
    const token = await sdk.mintToken({ key: TOKEN_KEY, uid: big, device: "page" });
    const a = await sdk.connect({ ...options, uid: big, token });
    const b = await sdk.connect({ ...options, uid: 9, key: TOKEN_KEY });
    try {
      const rec = new Recorder(b);
      const conv = await a.openP2P(9);
      await a.send(conv, "from the bundle");
      await rec.until(() => rec.messages.length === 1, "the message", 10_000);
      assert.equal(rec.messages[0].text, "from the bundle");
      assert.equal(rec.messages[0].senderUid, big);
      const tcp = new sdk.Client({ url: gw.tcpUrl, uid: 3, device: "page", key: TOKEN_KEY });
      await assert.rejects(within(5_000, tcp.connect(), "refusal"), /cannot connect/);
    } finally {
      await a.close();
      await b.close();
    }
  });
});
