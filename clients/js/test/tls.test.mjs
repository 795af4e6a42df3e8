// TLS: a gateway with --tls-cert serves tls:// on its client port and wss:// on its
// WebSocket port; the SDK trusts the certificate it is told to, and no other.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Client, ConnectionLost } from "../dist/index.js";
import { Gateway, TOKEN_KEY } from "./support/gateway.mjs";
import { Recorder, within } from "./support/wait.mjs";

function haveOpenssl() {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore", timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
}

describe("imgw-client over TLS", { skip: haveOpenssl() ? false : "no openssl to make a certificate" }, () => {
  const gw = new Gateway({ ws: true });
  const cert = join(gw.dir, "cert.pem");
  const key = join(gw.dir, "key.pem");
  gw.extra = ["--tls-cert", cert, "--tls-key", key];
  const clients = [];
  let ca;

  before(async () => {
    execFileSync("openssl", [
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
      "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
    ], { stdio: "ignore", timeout: 20_000 });
    ca = readFileSync(cert);
    await gw.start();
  });

  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await gw.dispose();
  });

  const open = async (url, uid, tls) => {
    const client = new Client({ url, uid, device: "tls", key: TOKEN_KEY, tls, requestTimeoutMs: 5_000 });
    clients.push(client);
    const rec = new Recorder(client);
    await within(10_000, client.connect(), `uid ${uid} to log in`);
    return { client, rec };
  };

  it("chats between tls:// and wss://", async () => {
    const a = await open(`tls://127.0.0.1:${gw.port}`, 1, { ca });
    const b = await open(`wss://127.0.0.1:${gw.wsPort}/ws`, 2, { ca });
    const conv = await a.client.openP2P(2);
    await a.client.send(conv, "over tls");
    await b.rec.until(() => b.rec.texts(conv).includes("over tls"), "the message over wss");
    await b.client.send(conv, "over wss");
    await a.rec.until(() => a.rec.texts(conv).includes("over wss"), "the message over tls");
  });

  it("refuses a certificate it was not told to trust", async () => {
    for (const url of [`tls://127.0.0.1:${gw.port}`, `wss://127.0.0.1:${gw.wsPort}/ws`]) {
      const c = new Client({ url, uid: 3, device: "tls", key: TOKEN_KEY, requestTimeoutMs: 5_000 });
      clients.push(c);
      await assert.rejects(within(10_000, c.connect(), url), ConnectionLost);
    }
  });
});
