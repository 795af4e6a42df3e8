// The transports against stand-in servers: what goes on the wire (a length in front of
// each body on TCP, one body per binary message on WebSocket) and what the client does
// when a server misbehaves: never answers, sends text, breaks the framing, goes away.

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, describe, it } from "node:test";
import { decode, encode } from "@msgpack/msgpack";
import { WebSocketServer } from "ws";
import { Client, ConnectionLost } from "../dist/index.js";
import { Recorder, within } from "./support/wait.mjs";

const enc = (v) => encode(v, { useBigInt64: true });
const dec = (b) => decode(b, { useBigInt64: true });
const LOGIN_OK = { node: "stand-in", hb: 30, idle: 75, max_frame: 65536, max_content: 2048, ts: 1 };
const lengthPrefixed = (body) => {
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  return Buffer.concat([head, Buffer.from(body)]);
};

const closers = [];
after(async () => {
  for (const close of closers.splice(0)) await close();
});

function tcpServer(onConnection) {
  return new Promise((resolve) => {
    const sockets = new Set();
    const srv = net.createServer((sock) => {
      sockets.add(sock);
      sock.on("close", () => sockets.delete(sock));
      sock.on("error", () => {});
      onConnection(sock);
    });
    srv.listen(0, "127.0.0.1", () => resolve(srv.address().port));
    closers.push(() => new Promise((r) => {
      for (const s of sockets) s.destroy();
      srv.close(r);
    }));
  });
}

function wsServer(onConnection) {
  return new Promise((resolve) => {
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, path: "/ws" }, () => resolve(wss.address().port));
    wss.on("connection", onConnection);
    closers.push(() => new Promise((r) => {
      for (const c of wss.clients) c.terminate();
      wss.close(() => r());
    }));
  });
}

const opened = [];
const client = (url, options = {}) => {
  const c = new Client({ url, uid: 1, device: "d", token: "t", requestTimeoutMs: 300, backoffBaseMs: 20, backoffCapMs: 50, ...options });
  opened.push(c);
  return c;
};
after(async () => {
  await Promise.all(opened.map((c) => c.close()));
});

describe("TCP", () => {
  it("puts a 4-byte length in front of each body, the first SYNC in the LOGIN's write", async () => {
    const chunks = [];
    const port = await tcpServer((sock) => {
      sock.once("data", (data) => {
        chunks.push(data);
        const first = dec(data.subarray(4, 4 + data.readUInt32BE(0)));
        sock.write(lengthPrefixed(enc([2, first[1], LOGIN_OK])));
      });
    });
    const c = client(`tcp://127.0.0.1:${port}`, { catchUp: false });
    await c.connect();
    const data = chunks[0];
    const n = data.readUInt32BE(0);
    assert.deepEqual(dec(data.subarray(4, 4 + n))[0], 1);
    assert.equal(data.length, 4 + n, "LOGIN alone without catch-up");
    await c.close();

    const all = [];
    const port2 = await tcpServer((sock) => sock.once("data", (d) => all.push(d)));
    const c2 = client(`tcp://127.0.0.1:${port2}`);
    const connecting = c2.connect().catch((e) => e);
    await within(2_000, new Promise((r) => { const t = setInterval(() => all.length && (clearInterval(t), r()), 5); }), "the LOGIN");
    const d = all[0];
    const n1 = d.readUInt32BE(0);
    const n2 = d.readUInt32BE(4 + n1);
    assert.deepEqual([dec(d.subarray(4, 4 + n1))[0], dec(d.subarray(8 + n1, 8 + n1 + n2))[0]], [1, 30]);
    assert.equal(d.length, 8 + n1 + n2);
    assert.ok((await connecting) instanceof ConnectionLost);
  });

  it("gives up a server that accepts and never answers", async () => {
    const port = await tcpServer(() => {});
    await assert.rejects(client(`tcp://127.0.0.1:${port}`).connect(), /cannot connect: tcp:\/\/127\.0\.0\.1:\d+: no LOGIN_OK within 300 ms/);
  });

  it("drops a connection whose framing breaks, and comes back", async () => {
    let n = 0;
    const port = await tcpServer((sock) => {
      n += 1;
      const mine = n;
      sock.once("data", (d) => {
        const login = dec(d.subarray(4, 4 + d.readUInt32BE(0)));
        sock.write(lengthPrefixed(enc([2, login[1], LOGIN_OK])));
        if (mine === 1) setTimeout(() => sock.write(Buffer.from([0xff, 0xff, 0xff, 0xff])), 20);
      });
    });
    const c = client(`tcp://127.0.0.1:${port}`, { catchUp: false });
    const rec = new Recorder(c);
    await c.connect();
    await rec.until(() => rec.states.filter((s) => s.state === "online").length === 2, "the reconnect", 3_000);
    assert.match(rec.states.find((s) => s.state === "offline").reason, /broke the framing/);
  });
});

describe("WebSocket", () => {
  it("sends one body per binary message, without a length", async () => {
    const got = [];
    const port = await wsServer((sock) => {
      sock.on("message", (data, isBinary) => {
        got.push({ body: dec(data), isBinary });
        const f = dec(data);
        if (f[0] === 1) sock.send(enc([2, f[1], LOGIN_OK]));
        if (f[0] === 30) sock.send(enc([31, f[1], new Uint8Array([1]), 0, false, []]));
        if (f[0] === 26) sock.send(enc([27, f[1], [[2n ** 60n, ["x"]]]]));
      });
    });
    const c = client(`ws://127.0.0.1:${port}/ws`);
    await c.connect();
    const presence = await c.presence([2n ** 60n]);
    assert.deepEqual([...presence], [[2n ** 60n, ["x"]]]);
    assert.deepEqual(got.map((g) => [g.body[0], g.isBinary]), [[1, true], [30, true], [26, true]]);
  });

  it("drops a connection that gets a text message, or one the gateway closes, and comes back", async () => {
    let n = 0;
    const port = await wsServer((sock) => {
      n += 1;
      const mine = n;
      sock.on("message", (data) => {
        const f = dec(data);
        if (f[0] !== 1) return;
        sock.send(enc([2, f[1], LOGIN_OK]));
        if (mine === 1) setTimeout(() => sock.send("a text message"), 20);
        if (mine === 2) setTimeout(() => sock.close(1001, "going away"), 20);
      });
    });
    const c = client(`ws://127.0.0.1:${port}/ws`, { catchUp: false });
    const rec = new Recorder(c);
    await c.connect();
    await rec.until(() => rec.states.filter((s) => s.state === "online").length === 3, "two reconnects", 3_000);
    const reasons = rec.states.filter((s) => s.state === "offline").map((s) => s.reason);
    assert.match(reasons[0], /text message/);
    assert.match(reasons[1], /going away/);
  });

  it("gives up a server that never completes the handshake, without an uncaught error", async () => {
    const port = await tcpServer(() => {}); // accepts, never answers the upgrade
    await assert.rejects(client(`ws://127.0.0.1:${port}/ws`).connect(), /no LOGIN_OK within 300 ms/);
    await new Promise((r) => setTimeout(r, 50)); // where `ws` would throw
  });

  it("is refused by a server that is not there", async () => {
    const port = await tcpServer(() => {});
    await Promise.all(closers.splice(-1).map((c) => c()));
    await assert.rejects(client(`ws://127.0.0.1:${port}/ws`).connect(), /cannot open a WebSocket/);
  });
});
