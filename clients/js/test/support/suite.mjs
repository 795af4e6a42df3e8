// The cases every transport must pass, against a real `imgw serve`: login, p2p and
// group chat, resend idempotency, a resend after a lost ack, reconnect across a gateway
// restart with nothing missed or doubled, and ids above 2^53.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  Client,
  ClientError,
  ErrorCode,
  MsgType,
  decodeMediaContent,
  decodeSystemContent,
  mintTokenSync,
  nodeDialer,
  recalledSeq,
} from "../../dist/index.js";
import { Gateway, TOKEN_KEY } from "./gateway.mjs";
import { Recorder, sleep, within } from "./wait.mjs";

const FAST = { backoffBaseMs: 50, backoffCapMs: 300, requestTimeoutMs: 5_000 };

/** A dialer that refuses while `closed` (a device out of reach). */
function gatedDialer() {
  const base = nodeDialer();
  const dial = (endpoint, events, signal) =>
    dial.closed ? Promise.reject(new Error("out of reach")) : base(endpoint, events, signal);
  dial.closed = false;
  return dial;
}

/** A dialer whose connections lose everything the gateway sends after the SEND of
 * `clientMsgId` went out, then drop: the message is stored, its ack never arrives. */
function ackLosingDialer(clientMsgId) {
  const base = nodeDialer();
  const marker = Buffer.from(clientMsgId, "utf8");
  const dial = async (endpoint, events, signal) => {
    let deaf = false;
    const transport = await base(
      endpoint,
      { frame: (body) => deaf || events.frame(body), closed: (why) => events.closed(why) },
      signal,
    );
    return {
      write(bodies) {
        transport.write(bodies);
        const isOurSend = (b) => b[1] === 10 && Buffer.from(b).includes(marker); // [10, rid, ...]
        if (!dial.used && bodies.some(isOurSend)) {
          dial.used = true;
          deaf = true;
          setTimeout(() => transport.abort("the test dropped the connection"), 300);
        }
      },
      close: () => transport.close(),
      abort: (why) => transport.abort(why),
    };
  };
  dial.used = false;
  return dial;
}

export function chatSuite(transport) {
  describe(`imgw-client over ${transport}`, () => {
    const gw = new Gateway({ ws: transport === "ws", media: true, admin: true });
    const clients = [];
    const url = () => (transport === "ws" ? gw.wsUrl : gw.tcpUrl);
    const open = async (uid, device, options = {}) => {
      const client = new Client({ url: url(), uid, device, key: TOKEN_KEY, ...FAST, ...options });
      clients.push(client);
      const rec = new Recorder(client);
      await within(10_000, client.connect(), `uid ${uid} to log in`);
      return { client, rec };
    };

    before(async () => {
      await gw.start();
    });

    after(async () => {
      await Promise.all(clients.map((c) => c.close()));
      await gw.dispose();
    });

    it("logs in, and a bad token is auth_failed", async () => {
      const { client, rec } = await open(1, "login");
      assert.equal(client.state, "online");
      assert.equal(client.loginOk.kind, "login_ok");
      assert.equal(client.loginOk.node, "js-test");
      assert.ok(client.loginOk.maxFrame >= 65_536);
      assert.deepEqual(
        rec.states.map((s) => s.state),
        ["connecting", "online"],
      );
      const stranger = new Client({ url: url(), uid: 2, device: "login", token: mintTokenSync({ key: "test:wrong", uid: 2, device: "login" }), ...FAST });
      await assert.rejects(stranger.connect(), (e) => e instanceof ClientError && e.code === ErrorCode.AUTH_FAILED);
      assert.equal(stranger.state, "closed");
      await client.logout();
      assert.equal(client.state, "closed");
    });

    it("sends and receives in a p2p conversation, with receipts and typing", async () => {
      const a = await open(11, "p2p");
      const b = await open(12, "p2p");
      const conv = await a.client.openP2P(12);
      assert.equal(await b.client.openP2P(11n), conv);
      const ack = await a.client.send(conv, "hello b");
      assert.equal(typeof ack.seq, "bigint");
      assert.equal(typeof ack.msgId, "bigint");
      await b.rec.until(() => b.rec.messages.length === 1, "b to receive");
      const m = b.rec.messages[0];
      assert.equal(m.text, "hello b");
      assert.equal(m.senderUid, 11n);
      assert.equal(m.seq, ack.seq);
      assert.equal(m.msgId, ack.msgId);
      assert.equal(m.clientMsgId, ack.clientMsgId);
      assert.equal(m.caughtUp, false);
      await b.client.send(conv, new TextEncoder().encode("hello a"));
      await a.rec.until(() => a.rec.texts(conv).includes("hello a"), "a to receive");
      assert.deepEqual(a.rec.texts(conv), ["hello a"]); // never its own send
      assert.equal(b.client.read(conv, m.seq), true);
      await a.rec.until(() => a.rec.reads.some((r) => r.readerUid === 12n && r.seq === m.seq), "a's read receipt");
      b.client.typing(conv);
      await a.rec.until(() => a.rec.typing.some((t) => t.uid === 12n && t.convId === conv), "typing");
      const page = await a.client.history(conv);
      assert.deepEqual(page.messages.map((x) => x.text), ["hello b", "hello a"]);
      assert.equal(page.hasMore, false);
    });

    it("recalls a message", async () => {
      const a = await open(13, "recall");
      const b = await open(14, "recall");
      const conv = await a.client.openP2P(14);
      const sent = await a.client.send(conv, "oops");
      const recallSeq = await a.client.recall(conv, sent.seq);
      assert.ok(recallSeq > sent.seq);
      await b.rec.until(() => b.rec.messages.some((m) => m.msgType === MsgType.RECALL), "the recall message");
      const recall = b.rec.messages.find((m) => m.msgType === MsgType.RECALL);
      assert.equal(recall.seq, recallSeq);
      assert.equal(recalledSeq(recall.content), sent.seq);
      const page = await b.client.history(conv);
      assert.deepEqual(page.messages.map((m) => [m.seq, m.msgType, m.content.length]), [[sent.seq, MsgType.RECALL, 0], [recallSeq, MsgType.RECALL, recall.content.length]]);
    });

    it("uploads a file, sends it, and signs its download URL", async () => {
      const a = await open(15, "media");
      const b = await open(16, "media");
      const conv = await a.client.openP2P(16);
      const data = new TextEncoder().encode("the file's bytes\n");
      const sent = await a.client.sendMedia(conv, data, { name: "notes.txt", contentType: "text/plain" });
      assert.match(sent.key, /^media\/15\/[0-9a-f]{64}$/);
      await b.rec.until(() => b.rec.messages.length === 1, "the file message");
      const m = b.rec.messages[0];
      assert.equal(m.msgType, MsgType.FILE);
      assert.deepEqual(decodeMediaContent(m.content), { key: sent.key, name: "notes.txt", size: data.length, type: "text/plain" });
      const link = await b.client.mediaGet(sent.key);
      const res = await fetch(link.url);
      assert.equal(res.status, 200);
      assert.deepEqual(new Uint8Array(await res.arrayBuffer()), data);
      assert.equal((await a.client.mediaUpload(sent.key.split("/")[2], data.length, "text/plain")).url, "", "stored already");
    });

    it("registers for offline push, unregisters, and mutes a conversation", async () => {
      const a = await open(25, "phone");
      const b = await open(26, "phone");
      await a.client.pushRegister("apns", "a1".repeat(32), { preview: true, locale: "pt-BR" });
      await a.client.pushRegister("fcm", "fcm-token"); // again: replaces it
      await a.client.pushUnregister();
      await a.client.pushUnregister(); // none left: OK too
      const bad = await a.client.pushRegister("Not A Provider", "t").catch((e) => e);
      assert.ok(bad instanceof ClientError && bad.code === ErrorCode.BAD_REQUEST, String(bad));
      const conv = await a.client.openP2P(26);
      await a.client.mute(conv, Date.now() + 3_600_000);
      await a.client.mute(conv, 2n ** 63n - 1n); // for good
      await a.client.mute(conv, 0); // unmuted
      const group = await b.client.groupCreate("b's", [27]);
      const notMember = await a.client.mute(group, Date.now() + 60_000).catch((e) => e);
      assert.ok(notMember instanceof ClientError && notMember.code === ErrorCode.NOT_MEMBER, String(notMember));
    });

    it("resumes a later session from a kept next_since: what came meanwhile is pulled", async () => {
      const a = await open(17, "resume");
      const b = await open(18, "resume");
      const conv = await a.client.openP2P(18);
      const first = await a.client.send(conv, "seen before");
      await b.rec.until(() => b.rec.messages.length === 1, "the first message");
      b.client.delivered(conv, first.seq);
      await b.client.catchUp();
      const kept = b.client.nextSince;
      assert.ok(kept instanceof Uint8Array);
      await b.client.close();
      await a.client.send(conv, "while closed 1");
      await a.client.send(conv, "while closed 2");
      const again = await open(18, "resume", { since: kept, seen: [[conv, first.seq]] });
      assert.deepEqual(again.rec.texts(conv), ["while closed 1", "while closed 2"]);
      assert.ok(again.rec.messages.every((m) => m.caughtUp));
      const row = (await again.client.sync()).convs.find((c) => c.convId === conv);
      assert.equal(row.deliveredSeq, first.seq);
      assert.equal(row.maxSeq, first.seq + 2n);
      assert.equal(row.unread, 3);
    });

    it("ends the older session when the same uid and device log in again", async () => {
      const first = await open(19, "twice");
      const second = await open(19, "twice");
      await first.rec.until(() => first.client.state === "closed", "the older session to end");
      assert.equal(first.rec.kicks[0]?.reasonName, "duplicate_login");
      assert.equal(first.client.endReason.kick.reasonName, "duplicate_login");
      assert.equal(second.client.state, "online");
      await assert.rejects(first.client.send(1, "x"), (e) => e.name === "SessionEnded");
    });

    it("gets broadcast notices, logs in again after an auth_revoked kick, and ends on slow_consumer", async () => {
      const a = await open(24, "kicks");
      assert.deepEqual(await gw.api("broadcast", { uids: [24], text: "to everyone" }), { uids: 1 });
      await a.rec.until(() => a.rec.notices.length === 1, "the notice");
      assert.equal(a.rec.notices[0].text, "to everyone");
      await gw.api("kick", { uid: 24, device: "kicks", reason: "auth_revoked" });
      await a.rec.until(() => a.rec.states.some((s) => s.state === "online" && s.reconnected), "a login with a fresh token");
      assert.equal(a.rec.kicks[0].reasonName, "auth_revoked");
      await gw.api("kick", { uid: 24, device: "kicks", reason: "slow_consumer", text: "read faster" });
      await a.rec.until(() => a.client.state === "closed", "the end of the session");
      assert.equal(a.client.endReason.kick.reasonName, "slow_consumer");
      assert.match(a.client.endReason.message, /slow_consumer \(read faster\)/);
    });

    it("sends and receives in a group", async () => {
      const a = await open(21, "group");
      const b = await open(22, "group");
      const c = await open(23, "group");
      const conv = await a.client.groupCreate("team", [22, 23]);
      const info = await b.client.groupInfo(conv);
      assert.equal(info.title, "team");
      assert.equal(info.ownerUid, 21n);
      assert.deepEqual([...info.members].sort(), [21n, 22n, 23n]);
      await a.client.send(conv, "hi team");
      for (const who of [b, c]) {
        await who.rec.until(() => who.rec.texts(conv).includes("hi team"), "the group message");
      }
      const created = b.rec.messages.find((m) => m.msgType === MsgType.SYSTEM);
      assert.equal(decodeSystemContent(created.content)?.event, "created");
      await c.client.send(conv, "hi from c");
      await a.rec.until(() => a.rec.texts(conv).includes("hi from c"), "a to receive c's");
      await b.rec.until(() => b.rec.texts(conv).includes("hi from c"), "b to receive c's");
      await a.client.groupMembers(conv, { remove: [23] });
      await c.rec.until(
        () => c.rec.messages.some((m) => m.msgType === MsgType.SYSTEM && decodeSystemContent(m.content)?.event === "removed"),
        "c to see its removal",
      );
      await assert.rejects(c.client.send(conv, "still here?"), (e) => e instanceof ClientError && e.code === ErrorCode.NOT_MEMBER);
      for (const who of [a, b]) {
        assert.deepEqual(who.rec.texts(conv).filter((t) => t !== null).length, who === a ? 1 : 2);
      }
    });

    it("sends a client_msg_id twice and stores one message", async () => {
      const a = await open(31, "idem");
      const b = await open(32, "idem");
      const conv = await a.client.openP2P(32);
      const first = await a.client.send(conv, "once", { clientMsgId: "idem-1" });
      const again = await a.client.send(conv, "once", { clientMsgId: "idem-1" });
      assert.equal(again.seq, first.seq);
      assert.equal(again.msgId, first.msgId);
      await assert.rejects(
        a.client.send(conv, "another text", { clientMsgId: "idem-1" }),
        (e) => e instanceof ClientError && e.code === ErrorCode.IDEMPOTENCY_CONFLICT,
      );
      await b.rec.until(() => b.rec.messages.length >= 1, "b to receive");
      await sleep(200);
      assert.deepEqual(b.rec.texts(conv), ["once"]);
      const page = await b.client.history(conv);
      assert.equal(page.messages.filter((m) => m.clientMsgId === "idem-1").length, 1);
    });

    it("sends again with the same client_msg_id when the ack is lost, and the message is stored once", async () => {
      const dial = ackLosingDialer("lost-ack-1");
      const a = await open(41, "lostack", { dial });
      const b = await open(42, "lostack");
      const conv = await a.client.openP2P(42);
      const ack = await within(10_000, a.client.send(conv, "ack lost", { clientMsgId: "lost-ack-1" }), "the resent send");
      assert.ok(dial.used, "the first SEND's connection was dropped");
      assert.ok(a.client.stats.sendRetries >= 1);
      assert.ok(a.client.stats.reconnects >= 1);
      await b.rec.until(() => b.rec.messages.length >= 1, "b to receive");
      await sleep(200);
      assert.deepEqual(b.rec.texts(conv), ["ack lost"]);
      const page = await a.client.history(conv);
      assert.deepEqual(page.messages.map((m) => [m.seq, m.clientMsgId]), [[ack.seq, "lost-ack-1"]]);
    });

    it("keeps ids above 2^53 exact: uids, conversations, messages, history", async () => {
      const big = 2n ** 60n + 7n;
      const other = 2n ** 63n + 9n;
      const a = await open(big, "big");
      const b = await open(other, "big");
      const conv = await a.client.openP2P(other);
      const ack = await a.client.send(conv, "big ids");
      await b.rec.until(() => b.rec.messages.length === 1, "b to receive");
      const m = b.rec.messages[0];
      assert.equal(m.senderUid, big);
      assert.equal(m.msgId, ack.msgId);
      const back = await b.client.send(conv, "and back");
      await a.rec.until(() => a.rec.messages.length === 1, "a to receive");
      assert.equal(a.rec.messages[0].senderUid, other);
      const page = await b.client.history(conv);
      assert.deepEqual(page.messages.map((x) => x.senderUid), [big, other]);
      assert.deepEqual(page.messages.map((x) => x.msgId), [ack.msgId, back.msgId]);
      const group = await a.client.groupCreate("big", [other]);
      const info = await b.client.groupInfo(group);
      assert.equal(info.ownerUid, big);
      assert.deepEqual([...info.members].sort(), [big, other].sort());
      b.client.read(conv, back.seq);
      await a.rec.until(() => a.rec.reads.some((r) => r.readerUid === other), "the read receipt");
      const presence = await a.client.presence([other]);
      assert.deepEqual(presence.get(other), ["big"]);
    });

    // Last: it restarts the gateway.
    it("reconnects across a gateway restart: what the peer sent meanwhile arrives once", async () => {
      const dial = gatedDialer();
      const a = await open(51, "restart");
      const b = await open(52, "restart", { dial });
      const conv = await a.client.openP2P(52);
      await a.client.send(conv, "before");
      await b.rec.until(() => b.rec.texts(conv).includes("before"), "the first message");

      await gw.kill();
      dial.closed = true; // b stays away until the end
      await a.rec.until(() => a.client.state !== "online", "a to notice");
      await b.rec.until(() => b.client.state !== "online", "b to notice");
      const whileDown = a.client.send(conv, "while down"); // queued: no gateway
      const bOffline = b.client.send(conv, "from b, offline");
      await sleep(100);
      assert.deepEqual(a.client.pendingSends.map((p) => new TextDecoder().decode(p.content)), ["while down"]);

      await gw.start();
      await within(10_000, whileDown, "the queued send");
      await a.client.send(conv, "while b is away 1");
      await a.client.send(conv, "while b is away 2");
      await a.rec.until(() => a.rec.states.some((s) => s.state === "back"), "a to be back");

      dial.closed = false;
      await within(10_000, bOffline, "b's queued send");
      await b.rec.until(() => b.rec.states.some((s) => s.state === "back"), "b to be back");
      await a.rec.until(() => a.rec.texts(conv).includes("from b, offline"), "a to get b's queued message");
      await sleep(300); // time for anything doubled to show
      assert.deepEqual(b.rec.texts(conv), ["before", "while down", "while b is away 1", "while b is away 2"]);
      assert.deepEqual(
        b.rec.messages.map((m) => m.caughtUp),
        [false, true, true, true],
      );
      const back = b.rec.states.filter((s) => s.state === "back");
      assert.deepEqual(back.map((s) => s.caughtUp), [3]);
      assert.deepEqual(a.rec.texts(conv), ["from b, offline"]);
      const states = a.rec.states.map((s) => s.state);
      assert.ok(states.includes("offline") && states.lastIndexOf("online") > states.indexOf("offline"), states.join(","));
      const page = await a.client.history(conv);
      assert.deepEqual(page.messages.map((m) => m.text), ["before", "while down", "while b is away 1", "while b is away 2", "from b, offline"]);
    });

    it("comes back after a graceful gateway stop (SIGTERM: KICK draining)", async () => {
      const a = await open(61, "stop");
      const b = await open(62, "stop");
      const conv = await a.client.openP2P(62);
      await gw.stop();
      for (const who of [a, b]) {
        await who.rec.until(() => who.rec.states.some((s) => s.state === "offline" && s.kick !== null), "offline after a KICK");
        assert.match(who.rec.kicks[0].reasonName, /^(draining|shutdown)$/);
      }
      await gw.start();
      await within(10_000, a.client.waitConnected(), "a to reconnect");
      await within(10_000, b.client.waitConnected(), "b to reconnect");
      await a.client.send(conv, "after the restart");
      await b.rec.until(() => b.rec.texts(conv).includes("after the restart"), "the message");
      await sleep(200);
      assert.deepEqual(b.rec.texts(conv), ["after the restart"]);
    });
  });
}
