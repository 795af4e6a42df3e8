// The shipped bundle (gateway/web/imgw-client.js) in a real browser: headless Chromium
// loads a page that imports it, chats over WebSocket with a real gateway, rides out a
// dropped connection, and posts what it saw back here. Skipped where no Chromium is
// installed (CHROMIUM names one).

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as http from "node:http";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { SHIPPED } from "../scripts/build-web.mjs";
import { Gateway, TOKEN_KEY, freePort } from "./support/gateway.mjs";
import { within } from "./support/wait.mjs";

function findChromium() {
  for (const name of [process.env.CHROMIUM, "chromium", "chromium-browser", "google-chrome"]) {
    if (!name) continue;
    try {
      execFileSync(name, ["--version"], { stdio: "ignore", timeout: 20_000 });
      return name;
    } catch {
      // not this one
    }
  }
  return null;
}

const PAGE = `<!doctype html>
<meta charset="utf-8">
<script type="module">
  import { browserDialer, connect, mintToken } from "./imgw-client.js";
  const out = { secure: isSecureContext, subtle: Boolean(globalThis.crypto?.subtle) };
  const until = (client, event, pred) => new Promise((resolve) => {
    const off = client.on(event, (x) => pred(x) && (off(), resolve(x)));
  });
  try {
    const q = new URLSearchParams(location.search);
    const url = q.get("ws"), key = q.get("key");
    const big = BigInt(q.get("a")), other = BigInt(q.get("b"));
    const base = browserDialer();
    let away = false; // a's device out of reach: its reconnects fail
    const dial = (endpoint, events, signal) => (away ? Promise.reject(new Error("away")) : base(endpoint, events, signal));
    const a = await connect({ url, uid: big, device: "chromium", key, dial, backoffBaseMs: 50, backoffCapMs: 200 });
    const b = await connect({ url, uid: other, device: "chromium", token: await mintToken({ key, uid: other, device: "chromium" }) });
    const conv = await a.openP2P(other);
    const got = until(b, "message", () => true);
    await a.send(conv, "from chromium");
    const m = await got;
    out.text = m.text;
    out.sender = String(m.senderUid);
    out.states = [];
    a.on("state", (s) => out.states.push(s.state));
    const back = until(a, "state", (s) => s.state === "back");
    const caught = until(a, "message", (x) => x.text === "while a was away");
    away = true;
    a.dropConnection();
    await b.send(conv, "while a was away");
    away = false;
    out.back = (await back).caughtUp;
    const c = await caught;
    out.caughtUpFlag = c.caughtUp;
    out.history = (await a.history(conv)).messages.map((x) => [String(x.senderUid), x.text]);
    await a.close();
    await b.logout();
    out.closed = [a.state, b.state];
  } catch (e) {
    out.error = String(e && e.stack || e);
  }
  await fetch("/result?" + new URLSearchParams({ run: new URLSearchParams(location.search).get("run") }), {
    method: "POST",
    body: JSON.stringify(out),
  });
</script>`;

/** An IPv4 address of this machine other than loopback: a page from there is not a
 * secure context (no crypto.subtle). */
function outsideAddress() {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  }
  return null;
}

const chromium = findChromium();
describe("the bundle in headless Chromium", { skip: chromium ? false : "no Chromium here (set CHROMIUM)" }, () => {
  // Every address, any origin: the page from a non-loopback address connects to it there.
  const gw = new Gateway({ ws: true, wsHost: "0.0.0.0", extra: ["--ws-origins", "*"] });
  const profile = mkdtempSync(join(tmpdir(), "imgw-chromium-"));
  let server;
  let port;
  const browsers = [];
  const results = new Map(); // run: resolve

  before(async () => {
    await gw.start();
    const bundle = readFileSync(SHIPPED);
    server = http.createServer((req, res) => {
      if (req.method === "POST" && req.url.startsWith("/result?")) {
        const run = new URLSearchParams(req.url.split("?")[1]).get("run");
        let body = "";
        req.on("data", (d) => (body += d));
        req.on("end", () => {
          res.end("ok");
          results.get(run)?.(JSON.parse(body));
        });
      } else if (req.url === "/imgw-client.js") {
        res.writeHead(200, { "Content-Type": "text/javascript" }).end(bundle);
      } else if (req.url.startsWith("/page.html")) {
        res.writeHead(200, { "Content-Type": "text/html" }).end(PAGE);
      } else {
        res.writeHead(404).end();
      }
    });
    port = await freePort();
    await new Promise((r) => server.listen(port, "0.0.0.0", r));
  });

  after(async () => {
    for (const browser of browsers) {
      try {
        process.kill(-browser.pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    server?.close();
    server?.closeAllConnections();
    await gw.dispose();
    rmSync(profile, { recursive: true, force: true });
  });

  /** Load the page from `host` in a browser of its own; what it posted. */
  const run = (name, host, a, b) => {
    const posted = new Promise((resolve) => results.set(name, resolve));
    const q = new URLSearchParams({ run: name, ws: gw.wsUrlOn(host), key: TOKEN_KEY, a: String(a), b: String(b) });
    const dir = join(profile, name);
    const browser = spawn(
      chromium,
      ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions", `--user-data-dir=${dir}`, `http://${host}:${port}/page.html?${q}`],
      { stdio: "ignore", detached: true },
    );
    browsers.push(browser);
    return within(45_000, posted, `the page's result (${name})`).finally(() => {
      try {
        process.kill(-browser.pid, "SIGKILL");
      } catch {
        // gone
      }
    });
  };

  const check = (out, a, b) => {
    assert.equal(out.error, undefined, out.error);
    assert.equal(out.text, "from chromium");
    assert.equal(out.sender, String(a));
    assert.equal(out.back, 1);
    assert.equal(out.caughtUpFlag, true);
    assert.deepEqual([out.states[0], ...out.states.slice(-4)], ["offline", "connecting", "online", "back", "closed"]);
    assert.deepEqual(out.history, [
      [String(a), "from chromium"],
      [String(b), "while a was away"],
    ]);
    assert.deepEqual(out.closed, ["closed", "closed"]);
  };

  it("chats, reconnects and catches up", async () => {
    const out = await run("secure", "127.0.0.1", 2n ** 60n + 7n, 77);
    assert.deepEqual([out.secure, out.subtle], [true, true]);
    check(out, 2n ** 60n + 7n, 77);
  });

  const outside = outsideAddress();
  it("mints its token without crypto.subtle on a page that is not a secure context", { skip: outside ? false : "no address but loopback" }, async () => {
    const out = await run("insecure", outside, 2n ** 63n + 1n, 78);
    assert.deepEqual([out.secure, out.subtle], [false, false]);
    check(out, 2n ** 63n + 1n, 78);
  });
});
