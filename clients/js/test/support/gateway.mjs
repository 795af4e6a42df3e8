// A real `imgw serve` for the tests: its own free ports, its embedded store in a temp
// dir, the test token key; killed at the end. Every wait is bounded.

import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
/** clients/js */
export const ROOT = resolve(HERE, "..", "..");
export const IMGW_BIN = process.env.IMGW_BIN ?? resolve(ROOT, "../../.venv/bin/imgw");
export const TOKEN_KEY = "test:test-secret";

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** Resolves after `ms` without keeping the process alive. */
const idle = (ms) => new Promise((r) => setTimeout(r, ms).unref());

/** Whether a gateway answers on `port`: a PING before LOGIN is answered ERROR
 * not_logged_in and closed (an open port alone proves nothing: the gateway binds it
 * before its store is open). */
function serving(port, timeoutMs = 500) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: "127.0.0.1", port });
    const done = (ok) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    sock.on("connect", () => sock.write(Buffer.from([0, 0, 0, 2, 0x91, 0x03])));
    sock.on("data", () => done(true));
    sock.on("end", () => done(true));
    sock.on("error", (e) => done(e.code === "ECONNRESET"));
  });
}

function accepting(port, timeoutMs = 500) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: "127.0.0.1", port });
    const timer = setTimeout(() => {
      sock.destroy();
      resolve(false);
    }, timeoutMs);
    sock.on("connect", () => {
      clearTimeout(timer);
      sock.destroy();
      resolve(true);
    });
    sock.on("error", () => {
      clearTimeout(timer);
      resolve(false);
    });
  });
}

export class Gateway {
  /** `ws`: also serve WebSocket clients; `media`: store media in the data dir and serve
   * its signed URLs. */
  constructor({ ws = false, wsHost = "127.0.0.1", media = false, admin = false, extra = [] } = {}) {
    this.ws = ws;
    this.admin = admin;
    this.adminPort = 0;
    this.wsHost = wsHost;
    this.media = media;
    this.mediaPort = 0;
    this.extra = extra;
    this.dir = mkdtempSync(join(tmpdir(), "imgw-js-"));
    this.dataDir = join(this.dir, "data");
    this.logPath = join(this.dir, "gateway.log");
    this.proc = null;
    this.port = 0;
    this.wsPort = 0;
  }

  get tcpUrl() {
    return `tcp://127.0.0.1:${this.port}`;
  }

  /** The WebSocket URL, on `host` (where `wsHost` listens on every address). */
  wsUrlOn(host = "127.0.0.1") {
    return `ws://${host}:${this.wsPort}/ws`;
  }

  get wsUrl() {
    return this.wsUrlOn();
  }

  /** Start it (the first time on new free ports, later on the same ones and data dir)
   * and wait until it serves. */
  async start(timeoutMs = 20_000) {
    if (!this.port) this.port = await freePort();
    if (this.ws && !this.wsPort) this.wsPort = await freePort();
    if (this.media && !this.mediaPort) this.mediaPort = await freePort();
    if (this.admin && !this.adminPort) this.adminPort = await freePort();
    const args = [
      "serve",
      "--host", "127.0.0.1",
      "--port", String(this.port),
      "--data-dir", this.dataDir,
      "--token-key", TOKEN_KEY,
      "--node-id", "js-test",
      "--shutdown-timeout", "2",
      "--log-level", "warning",
      ...(this.ws ? ["--ws-listen", `${this.wsHost}:${this.wsPort}`] : []),
      ...(this.admin ? ["--admin-port", String(this.adminPort)] : []),
      ...(this.media ? ["--media", `file://${join(this.dir, "media")}`, "--media-listen", `127.0.0.1:${this.mediaPort}`] : []),
      ...this.extra,
    ];
    const { openSync, closeSync } = await import("node:fs");
    const log = openSync(this.logPath, "a");
    this.proc = spawn(IMGW_BIN, args, { stdio: ["ignore", log, log] });
    closeSync(log);
    const proc = this.proc;
    let exited = null;
    proc.once("exit", (code, signal) => (exited = { code, signal }));
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (exited) throw new Error(`imgw serve exited (${JSON.stringify(exited)}):\n${this.logTail()}`);
      if ((await serving(this.port)) && (!this.ws || (await accepting(this.wsPort)))) return this;
      if (Date.now() > deadline) {
        this.kill();
        throw new Error(`imgw serve did not listen in ${timeoutMs} ms:\n${this.logTail()}`);
      }
      await sleep(50);
    }
  }

  /** SIGKILL (a crash) and wait for the exit. */
  async kill(timeoutMs = 10_000) {
    const proc = this.proc;
    this.proc = null;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGKILL");
    await Promise.race([gone, idle(timeoutMs)]);
  }

  /** SIGTERM, SIGKILL if it has not exited after `timeoutMs`. */
  async stop(timeoutMs = 5_000) {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    if ((await Promise.race([gone.then(() => true), idle(timeoutMs).then(() => false)])) === false) {
      await this.kill();
    }
    this.proc = null;
  }

  /** POST `body` (JSON) to the server API (`admin`); the JSON answer. */
  async api(path, body) {
    const res = await fetch(`http://127.0.0.1:${this.adminPort}/api/v1/${path}`, { method: "POST", body: JSON.stringify(body) });
    if (!res.ok) throw new Error(`POST ${path}: HTTP ${res.status} ${await res.text()}`);
    return res.json();
  }

  /** Stop it and remove its files. */
  async dispose() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  logTail(lines = 30) {
    try {
      return readFileSync(this.logPath, "utf8").split("\n").slice(-lines).join("\n");
    } catch {
      return "(no gateway log)";
    }
  }
}
