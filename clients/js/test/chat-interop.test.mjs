// A client written only against the SDK chats with `imgw chat` (the Python terminal
// chat), driven through pipes: stdin lines in, stdout lines out. Over TCP, and over
// WebSocket (both ends on ws://), and across the two (the SDK on ws://, imgw chat on
// TCP, to the same gateway).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { Client } from "../dist/index.js";
import { Gateway, IMGW_BIN, TOKEN_KEY } from "./support/gateway.mjs";
import { Recorder, sleep, within } from "./support/wait.mjs";

/** `imgw chat` as a child process: `lines` it printed, `until` one matches. */
class Chat {
  constructor(args) {
    this.lines = [];
    this.waiters = new Set();
    this.proc = spawn(IMGW_BIN, ["chat", ...args], { stdio: ["pipe", "pipe", "pipe"] });
    this.exited = new Promise((resolve) => this.proc.once("exit", (code) => resolve(code)));
    for (const stream of [this.proc.stdout, this.proc.stderr]) {
      createInterface({ input: stream }).on("line", (line) => {
        this.lines.push(line);
        for (const w of [...this.waiters]) w();
      });
    }
  }

  type(line) {
    this.proc.stdin.write(`${line}\n`);
  }

  until(re, what, ms = 15_000) {
    const found = () => this.lines.find((l) => re.test(l));
    if (found()) return Promise.resolve(found());
    let wake;
    const p = new Promise((resolve) => {
      wake = () => {
        const line = found();
        if (line !== undefined) resolve(line);
      };
      this.waiters.add(wake);
    });
    return within(ms, p, `${what}; imgw chat printed:\n${this.lines.join("\n")}`).finally(() => this.waiters.delete(wake));
  }

  async quit() {
    this.type("/quit");
    this.proc.stdin.end();
    const code = await within(10_000, this.exited, "imgw chat to exit").catch((e) => {
      this.proc.kill("SIGKILL");
      throw e;
    });
    return code;
  }
}

describe("imgw-client chats with imgw chat", () => {
  const gw = new Gateway({ ws: true });
  const clients = [];

  before(async () => {
    await gw.start();
  });

  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await gw.dispose();
  });

  const exchange = async (sdkUrl, chatUrl, sdkUid, chatUid) => {
    const sdk = new Client({ url: sdkUrl, uid: sdkUid, device: "sdk", key: TOKEN_KEY });
    clients.push(sdk);
    const rec = new Recorder(sdk);
    await sdk.connect();
    const conv = await sdk.openP2P(chatUid);
    const chat = new Chat(["--uid", String(chatUid), "--peer", String(sdkUid), "--addr", chatUrl, "--key", TOKEN_KEY, "--device", "cli"]);
    try {
      await chat.until(new RegExp(`^--- chat with ${sdkUid}, conversation ${conv} `), "imgw chat's banner");

      await sdk.send(conv, "hello from the sdk");
      await chat.until(new RegExp(`^\\[\\d\\d:\\d\\d:\\d\\d\\] ${sdkUid}: hello from the sdk$`), "the SDK's message in imgw chat");
      // imgw chat reads what it shows: the SDK gets the receipt
      await rec.until(() => rec.reads.some((r) => r.convId === conv && r.readerUid === BigInt(chatUid)), "imgw chat's read receipt");

      chat.type("hello from imgw chat");
      await rec.until(() => rec.texts(conv).includes("hello from imgw chat"), "imgw chat's message in the SDK");
      const m = rec.messages.find((x) => x.text === "hello from imgw chat");
      assert.equal(m.senderUid, BigInt(chatUid));
      // imgw chat names a receipt only for a message whose ack it has handled; a
      // READ_NOTIFY that overtakes its ack inside it is not shown. Give it the time.
      await sleep(500);
      assert.equal(sdk.read(conv, m.seq), true);
      await chat.until(new RegExp(`^\\(read by ${sdkUid}: "hello from imgw chat"\\)$`), "the SDK's read receipt in imgw chat");

      assert.equal(await chat.quit(), 0);
      assert.deepEqual(rec.texts(conv), ["hello from imgw chat"]);
    } finally {
      chat.proc.kill("SIGKILL");
    }
  };

  it("over TCP", async () => {
    await exchange(gw.tcpUrl, `127.0.0.1:${gw.port}`, 101, 102);
  });

  it("over WebSocket", async () => {
    await exchange(gw.wsUrl, gw.wsUrl, 201, 202);
  });

  it("the SDK over WebSocket, imgw chat over TCP", async () => {
    await exchange(gw.wsUrl, `127.0.0.1:${gw.port}`, 301, 302);
  });
});
