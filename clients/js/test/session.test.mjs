// The session's state machine on a fake transport (no gateway, milliseconds each):
// kicks, hints, SYNC_HINT catch-up, resends, timeouts, heartbeats.

import assert from "node:assert/strict";
import { afterEach, describe, it } from "node:test";
import { decode, encode } from "@msgpack/msgpack";
import { Client, ClientError, ConnectionLost, ErrorCode, RequestTimeout, SessionEnded } from "../dist/index.js";
import { Recorder, sleep, within } from "./support/wait.mjs";

const enc = (v) => encode(v, { useBigInt64: true });
const dec = (b) => decode(b, { useBigInt64: true });
const text = (s) => new TextEncoder().encode(s);
const LOGIN_OK = { node: "fake", hb: 30, idle: 75, max_frame: 65536, max_content: 2048, ts: 1 };

/** One connection the client opened; `frames` it sent, decoded. */
class FakeConn {
  constructor(server, endpoint, events) {
    this.server = server;
    this.endpoint = endpoint;
    this.events = events;
    this.frames = [];
    this.closed = false;
    this.transport = {
      write: (bodies) => {
        for (const b of bodies) {
          const f = dec(b);
          this.frames.push(f);
          server.handle(this, f);
        }
        server.poke();
      },
      close: () => this.drop("closed by the client"),
      abort: (why) => this.drop(why),
    };
  }

  /** Send frames to the client (each one body). */
  send(...frames) {
    for (const f of frames) if (!this.closed) this.events.frame(enc(f));
  }

  drop(why = "dropped by the server") {
    if (this.closed) return;
    this.closed = true;
    this.events.closed(why);
    this.server.poke();
  }

  sent(op) {
    return this.frames.filter((f) => f[0] === op);
  }
}

/** Answers LOGIN, SYNC (nothing changed) and PING unless `handlers` say otherwise. */
class FakeServer {
  constructor(handlers = {}) {
    this.handlers = handlers;
    this.conns = [];
    this.waiters = new Set();
    this.dial = (endpoint, events) => {
      if (this.refuse) return Promise.reject(new Error("refused"));
      const conn = new FakeConn(this, endpoint, events);
      this.conns.push(conn);
      this.poke();
      return Promise.resolve(conn.transport);
    };
  }

  handle(conn, f) {
    const custom = this.handlers[f[0]];
    if (custom) return custom(conn, f);
    if (f[0] === 1) {
      conn.send([2, f[1], this.loginOk ?? LOGIN_OK]);
      conn.loggedIn = true;
    }
    if (!conn.loggedIn) return; // a real gateway answers nothing before LOGIN_OK
    if (f[0] === 30) conn.send([31, f[1], new Uint8Array([1]), new Uint8Array([2]), false, []]);
    if (f[0] === 3) conn.send([4]);
  }

  get last() {
    return this.conns[this.conns.length - 1];
  }

  poke() {
    for (const w of [...this.waiters]) w();
  }

  until(pred, what, ms = 5_000) {
    if (pred()) return Promise.resolve();
    let wake;
    const p = new Promise((resolve) => {
      wake = () => pred() && resolve();
      this.waiters.add(wake);
    });
    return within(ms, p, what).finally(() => this.waiters.delete(wake));
  }
}

const opened = [];
const client = (server, options = {}) => {
  const c = new Client({ url: "tcp://gw:7070", uid: 1, device: "d", token: "t", dial: server.dial, backoffBaseMs: 1, backoffCapMs: 5, requestTimeoutMs: 1_000, ...options });
  opened.push(c);
  return c;
};

describe("session", () => {
  afterEach(async () => {
    await Promise.all(opened.splice(0).map((c) => c.close()));
  });

  it("logs in with the first SYNC in the LOGIN's write, and handles frames that come with LOGIN_OK", async () => {
    const server = new FakeServer({
      1: (conn, f) => {
        conn.send([2, f[1], LOGIN_OK], [20, 7, 5, 50, 2, 1, text("early"), 1, "x"]);
        conn.loggedIn = true;
      },
      30: (conn, f) => conn.send([31, f[1], new Uint8Array([1]), 0, false, [[7, 1, 5, 0, 0, 1, 1, true]]]),
    });
    const c = client(server);
    const rec = new Recorder(c);
    const ok = await c.connect();
    assert.equal(ok.node, "fake");
    const [login, sync] = server.last.frames;
    assert.deepEqual(login, [1, 1, { v: 1, uid: 1, device: "d", token: "t", caps: ["outcome_unknown", "content_denied"] }]);
    assert.deepEqual(sync.slice(0, 2), [30, sync[1]]);
    assert.deepEqual(rec.texts(), ["early"]);
    assert.deepEqual([...c.nextSince], [1]);
    await c.close();
    assert.equal(c.state, "closed");
  });

  it("ends the session on KICK duplicate_login: waiting sends fail with SessionEnded", async () => {
    const server = new FakeServer({ 10: () => {} });
    const c = client(server);
    const rec = new Recorder(c);
    await c.connect();
    const sending = c.send(5, "never acked");
    await server.until(() => server.last.sent(10).length === 1, "the SEND");
    server.last.send([60, 1, "logged in elsewhere", ""]);
    server.last.drop();
    await assert.rejects(sending, (e) => e instanceof SessionEnded && e.kick?.reasonName === "duplicate_login");
    assert.equal(c.state, "closed");
    assert.equal(rec.kicks.length, 1);
    assert.equal(c.endReason.kick.reason, 1);
    assert.equal(server.conns.length, 1, "no reconnect");
    await assert.rejects(c.openP2P(2), SessionEnded);
  });

  it("reconnects on KICK draining, to the reconnect_hint first", async () => {
    const server = new FakeServer();
    const c = client(server);
    const rec = new Recorder(c);
    await c.connect();
    server.last.send([60, 2, "draining", "10.0.0.9:7001"]);
    server.last.drop();
    await server.until(() => server.conns.length === 2, "the reconnect");
    assert.equal(server.last.endpoint.url, "tcp://10.0.0.9:7001");
    await rec.until(() => rec.states.some((s) => s.state === "back"), "back");
    assert.deepEqual(
      rec.states.map((s) => s.state),
      ["connecting", "online", "offline", "connecting", "online", "back"],
    );
    assert.equal(rec.states[4].reconnected, true);
    assert.equal(c.stats.reconnects, 1);
    await c.close();
  });

  it("logs in again with a fresh token after auth_revoked when the token is a function, not with a string", async () => {
    const server = new FakeServer();
    let minted = 0;
    const c = client(server, { token: ({ uid, device }) => `t${++minted}-${uid}-${device}` });
    await c.connect();
    server.last.send([60, 3, "revoked", ""]);
    server.last.drop();
    await server.until(() => server.conns.length === 2 && server.last.frames.length > 0, "the login again");
    assert.equal(server.last.frames[0][2].token, "t2-1-d");
    await c.close();

    const fixed = client(server);
    await fixed.connect();
    server.last.send([60, 3, "revoked", ""]);
    server.last.drop();
    assert.equal(fixed.state, "closed");
    assert.match(fixed.endReason.message, /auth_revoked/);
  });

  it("runs a catch-up on SYNC_HINT: pulls what was missed, once", async () => {
    let rows = [];
    const server = new FakeServer({
      30: (conn, f) => conn.send([31, f[1], new Uint8Array([9]), 0, false, rows]),
      32: (conn, f) => {
        const [, rid, conv, after] = f;
        const msgs = [];
        for (let seq = Number(after) + 1; seq <= 4; seq++) msgs.push([seq, 100 + seq, 2, 1, text(`m${seq}`), 1, `c${seq}`]);
        conn.send([33, rid, conv, false, msgs]);
      },
    });
    const c = client(server);
    const rec = new Recorder(c);
    await c.connect();
    server.last.send([20, 7, 1, 101, 2, 1, text("m1"), 1, "c1"]); // live
    rows = [[7, 1, 4, 0, 0, 4, 1, true]];
    server.last.send([36]);
    await rec.until(() => rec.messages.length === 4, "the missed messages");
    assert.deepEqual(rec.texts(7n), ["m1", "m2", "m3", "m4"]);
    assert.deepEqual(rec.messages.map((m) => m.caughtUp), [false, true, true, true]);
    assert.deepEqual(server.last.sent(32).map((f) => f[3]), [1]); // pulled after what it had
    server.last.send([20, 7, 4, 104, 2, 1, text("m4"), 1, "c4"]); // a late push of the same
    await sleep(20);
    assert.equal(rec.messages.length, 4);
    assert.equal(c.stats.dupDrops, 1);
    await c.close();
  });

  it("sends again with the same client_msg_id after unavailable and outcome_unknown", async () => {
    let n = 0;
    const server = new FakeServer({
      10: (conn, f) => {
        n += 1;
        if (n === 1) conn.send([127, f[1], ErrorCode.UNAVAILABLE, "busy"]);
        else if (n === 2) conn.send([127, f[1], ErrorCode.OUTCOME_UNKNOWN, "maybe"]);
        else conn.send([11, f[1], f[2], 3, 33, 1]);
      },
    });
    const c = client(server);
    await c.connect();
    const ack = await c.send(7, "hi");
    assert.equal(ack.seq, 3n);
    const cmids = server.last.sent(10).map((f) => f[3]);
    assert.equal(cmids.length, 3);
    assert.equal(new Set(cmids).size, 1);
    assert.equal(c.stats.sendRetries, 2);
    server.handlers[10] = (conn, f) => conn.send([127, f[1], ErrorCode.NOT_MEMBER, "no"]);
    await assert.rejects(c.send(7, "refused"), (e) => e instanceof ClientError && e.code === ErrorCode.NOT_MEMBER);
    await c.close();
  });

  it("queues sends while offline and sends them in order after the reconnect", async () => {
    const server = new FakeServer({ 10: (conn, f) => conn.send([11, f[1], f[2], BigInt(conn.sent(10).length), 1, 1]) });
    const c = client(server, { backoffBaseMs: 50, backoffCapMs: 50 });
    await c.connect();
    server.refuse = true;
    server.last.drop();
    const sends = ["one", "two", "three"].map((t) => c.send(7, t));
    await sleep(20);
    assert.deepEqual(c.pendingSends.map((p) => [p.attempts, new TextDecoder().decode(p.content)]), [[0, "one"], [0, "two"], [0, "three"]]);
    server.refuse = false;
    await within(2_000, Promise.all(sends), "the queued sends");
    assert.deepEqual(server.last.sent(10).map((f) => new TextDecoder().decode(f[5])), ["one", "two", "three"]);
    assert.deepEqual(c.pendingSends, []);
    await c.close();
  });

  it("emits ERRORs with rid 0, times requests out, and gives up a login that gets no answer", async () => {
    const server = new FakeServer({ 26: () => {} });
    const c = client(server, { requestTimeoutMs: 100 });
    const rec = new Recorder(c);
    await c.connect();
    server.last.send([127, 0, ErrorCode.RATE_LIMITED, "slow down"]);
    assert.equal(rec.errors[0].codeName, "rate_limited");
    await assert.rejects(c.presence([2]), RequestTimeout);
    await c.close();

    const mute = new FakeServer({ 1: () => {} });
    const m = client(mute, { requestTimeoutMs: 100 });
    await assert.rejects(m.connect(), (e) => e instanceof ConnectionLost && /no LOGIN_OK/.test(e.message));
    assert.equal(m.state, "closed");
    assert.equal(mute.last.closed, true);

    const refusing = new FakeServer({ 1: (conn, f) => (conn.send([127, f[1], ErrorCode.AUTH_FAILED, "token refused"]), conn.drop()) });
    const r = client(refusing);
    await assert.rejects(r.connect(), (e) => e.code === ErrorCode.AUTH_FAILED);
    assert.equal(r.state, "closed");
  });

  it("gives up a first SYNC that gets no answer", async () => {
    const server = new FakeServer({ 30: () => {} });
    const c = client(server, { requestTimeoutMs: 150 });
    await within(2_000, c.connect(), "connect");
    assert.equal(c.state, "online");
    await c.close();
  });

  it("closing during the login ends it", async () => {
    const server = new FakeServer({ 1: () => {} });
    const c = client(server);
    const connecting = c.connect();
    await server.until(() => server.conns.length === 1, "the dial");
    await c.close();
    await assert.rejects(connecting, SessionEnded);
    assert.equal(c.state, "closed");
    assert.equal(server.last.closed, true);
  });

  it("pings after hb quiet seconds and drops a server that goes silent", async () => {
    const server = new FakeServer({ 3: () => {} }); // PINGs unanswered
    server.loginOk = { ...LOGIN_OK, hb: 1, idle: 2 };
    const c = client(server);
    const rec = new Recorder(c);
    await c.connect();
    const first = server.last;
    await server.until(() => first.sent(3).length >= 1, "a PING", 2_000);
    await rec.until(() => rec.states.some((s) => s.state === "offline"), "the drop", 3_000);
    assert.match(rec.states.find((s) => s.state === "offline").reason, /silent/);
    assert.equal(first.closed, true);
    await server.until(() => server.conns.length === 2, "the reconnect");
    await c.close();
  });
});
