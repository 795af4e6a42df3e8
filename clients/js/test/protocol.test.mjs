// The pure parts, without a gateway: framing, frame codec, ids, dedup, URLs, contents.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { decode, encode } from "@msgpack/msgpack";
import { SeenSeqs } from "../dist/client/seen.js";
import { decodeMediaContent, decodeSystemContent, encodeMediaContent, parseEndpoint, recalledSeq, toId } from "../dist/index.js";
import {
  ProtocolError,
  decodeServerFrame,
  encodeLogin,
  encodeMute,
  encodePresence,
  encodePushRegister,
  encodePushUnregister,
  encodeSend,
  encodeSync,
} from "../dist/protocol/frames.js";
import { StreamDecoder, frameStream } from "../dist/protocol/framing.js";

const BIG = 2n ** 60n + 7n;
const enc = (v) => encode(v, { useBigInt64: true });
const dec = (b) => decode(b, { useBigInt64: true });

function rng(seed) {
  let x = seed;
  return () => ((x = (x * 1103515245 + 12345) % 2 ** 31), x / 2 ** 31);
}

describe("StreamDecoder", () => {
  const bodies = [enc([4]), enc([20, 1, 2, 3, 4, 1, new Uint8Array(3000), 5, "c"]), enc([36]), enc([55, 9])];
  const stream = frameStream(bodies);

  it("takes the stream a byte at a time", () => {
    const d = new StreamDecoder();
    const out = [];
    for (let i = 0; i < stream.length; i++) {
      const { bodies: got, error } = d.feed(stream.subarray(i, i + 1));
      assert.equal(error, null);
      out.push(...got);
    }
    assert.deepEqual(out.map((b) => [...b]), bodies.map((b) => [...b]));
    assert.equal(d.pending, 0);
  });

  it("takes the stream at random cut points", () => {
    const next = rng(7);
    for (let round = 0; round < 200; round++) {
      const d = new StreamDecoder();
      const out = [];
      let at = 0;
      while (at < stream.length) {
        const n = 1 + Math.floor(next() * 400);
        out.push(...d.feed(stream.subarray(at, at + n)).bodies);
        at += n;
      }
      assert.deepEqual(out.map((b) => [...b]), bodies.map((b) => [...b]));
    }
  });

  it("refuses a length of 0 or above its limit, and stays broken", () => {
    const zero = new StreamDecoder();
    const r = zero.feed(new Uint8Array([...frameStream([enc([4])]), 0, 0, 0, 0, 1]));
    assert.equal(r.bodies.length, 1);
    assert.match(r.error, /length 0/);
    assert.match(zero.feed(frameStream([enc([4])])).error, /length 0/);
    const big = new StreamDecoder(100);
    assert.match(big.feed(new Uint8Array([0, 0, 0, 101])).error, /101 bytes/);
    assert.equal(new StreamDecoder(100).feed(frameStream([new Uint8Array(100)])).bodies.length, 1);
  });
});

describe("frames", () => {
  it("decodes ids as bigint whatever msgpack format carried them", () => {
    const small = decodeServerFrame(enc([20, 5, 1, 2, 3, 1, new TextEncoder().encode("hi"), 1_700_000_000_000, "c1"]));
    assert.equal(small.kind, "push");
    assert.equal(small.convId, 5n);
    assert.equal(small.seq, 1n);
    assert.equal(small.senderUid, 3n);
    assert.equal(small.text, "hi");
    assert.equal(small.serverMs, 1_700_000_000_000);
    const big = decodeServerFrame(enc([20, BIG, BIG + 1n, BIG + 2n, BIG + 3n, 2, new Uint8Array([1]), 1, ""]));
    assert.equal(big.convId, BIG);
    assert.equal(big.seq, BIG + 1n);
    assert.equal(big.msgId, BIG + 2n);
    assert.equal(big.senderUid, BIG + 3n);
    assert.equal(big.text, null);
    const max = decodeServerFrame(enc([57, 1, 2n ** 64n - 1n, "t", BIG, [BIG, 3, 2n ** 64n - 1n]]));
    assert.deepEqual(max.members, [BIG, 3n, 2n ** 64n - 1n]);
    assert.equal(max.convId, 2n ** 64n - 1n);
  });

  it("decodes every reply and notification the client handles", () => {
    const ok = decodeServerFrame(enc([2, 1, { node: "n", hb: 30, idle: 75, max_frame: 65536, max_content: 2048, ts: 2n ** 40n, later: 1 }]));
    assert.deepEqual(ok, { kind: "login_ok", rid: 1, node: "n", hb: 30, idle: 75, maxFrame: 65536, maxContent: 2048, ts: 2 ** 40 });
    const sync = decodeServerFrame(enc([31, 3, new Uint8Array([1, 2]), new Uint8Array([3]), true, [[7, 2, 9, 1, 1, 8, 5, true]], "extra"]));
    assert.deepEqual(sync.convs, [{ convId: 7n, kind: 2, maxSeq: 9n, readSeq: 1n, deliveredSeq: 1n, unread: 8, lastActiveMs: 5, isMember: true }]);
    assert.deepEqual([...sync.nextSince], [1, 2]);
    assert.equal(sync.partial, undefined);
    const partial = decodeServerFrame(enc([31, 3, new Uint8Array([1]), 0, false, [], { missing: 1, servers: 2, later: 0 }]));
    assert.deepEqual(partial.partial, { missing: 1, servers: 2 });
    const pull = decodeServerFrame(enc([33, 4, 7, false, [[1, 10, 2, 1, new Uint8Array([104]), 5, "x"]]]));
    assert.equal(pull.messages[0].convId, 7n);
    assert.equal(pull.messages[0].text, "h");
    assert.deepEqual(decodeServerFrame(enc([127, 0, 24, "slow down"])), { kind: "error", rid: 0, code: 24, codeName: "rate_limited", text: "slow down" });
    assert.deepEqual(decodeServerFrame(enc([60, 2, "bye", "h:1"])), { kind: "kick", reason: 2, reasonName: "draining", text: "bye", reconnectHint: "h:1" });
    assert.deepEqual(decodeServerFrame(enc([27, 5, [[BIG, ["a", "b"]]]])).entries, [[BIG, ["a", "b"]]]);
    assert.deepEqual(decodeServerFrame(enc([81, 6])), { kind: "push_register_ok", rid: 6 });
    assert.deepEqual(decodeServerFrame(enc([99, 1])), { kind: "invalid", op: 99 });
  });

  it("refuses a body that breaks the protocol", () => {
    assert.throws(() => decodeServerFrame(new Uint8Array([0xc1])), ProtocolError);
    assert.throws(() => decodeServerFrame(enc({ op: 1 })), ProtocolError);
    assert.throws(() => decodeServerFrame(enc([11, 1, 2, 3])), ProtocolError); // fields missing
    assert.throws(() => decodeServerFrame(enc([11, 1, "2", 3, 4, 5])), ProtocolError);
    assert.throws(() => decodeServerFrame(new Uint8Array([...enc([4]), 0])), ProtocolError); // trailing
  });

  it("encodes ids above 2^32 as uint64 and small ones compact; never a float", () => {
    const send = encodeSend(9, BIG, "cm", 1, new Uint8Array([1]));
    assert.deepEqual(dec(send), [10, 9, BIG, "cm", 1, new Uint8Array([1])]);
    assert.ok(!send.includes(0xcb), "no float64");
    const small = encodeSend(9, 5n, "cm", 1, new Uint8Array([1]));
    assert.equal(small.length, send.length - 8);
    assert.deepEqual(dec(encodePresence(3, [1, 2n ** 32n, "18446744073709551615"])), [26, 3, [1, 2n ** 32n, 2n ** 64n - 1n]]);
    const login = dec(encodeLogin(1, BIG, "d", "tok", ["outcome_unknown"]));
    assert.deepEqual(login, [1, 1, { v: 1, uid: BIG, device: "d", token: "tok", caps: ["outcome_unknown"] }]);
    assert.deepEqual(dec(encodeSync(2, 0, 0, 0)), [30, 2, 0, 0, 0]);
  });

  it("encodes PUSH_REGISTER with the opts given, PUSH_UNREGISTER and MUTE", () => {
    assert.deepEqual(dec(encodePushRegister(4, "apns", "ab", { preview: true, locale: "pt-BR" })), [80, 4, "apns", "ab", { preview: true, locale: "pt-BR" }]);
    assert.deepEqual(dec(encodePushRegister(4, "fcm", "t", {})), [80, 4, "fcm", "t", {}]);
    assert.deepEqual(dec(encodePushRegister(4, "fcm", "t", { preview: false })), [80, 4, "fcm", "t", { preview: false }]);
    assert.deepEqual(dec(encodePushUnregister(5)), [82, 5]);
    const forever = encodeMute(6, BIG, 2n ** 63n - 1n);
    assert.deepEqual(dec(forever), [84, 6, BIG, 2n ** 63n - 1n]);
    assert.ok(!forever.includes(0xcb), "no float64");
    assert.deepEqual(dec(encodeMute(6, 7n, 0n)), [84, 6, 7, 0]);
  });

  it("takes ids as bigint, safe numbers or decimal strings, and refuses the rest", () => {
    assert.equal(toId(5), 5n);
    assert.equal(toId("1152921504606846983"), BIG);
    assert.throws(() => toId(0), RangeError);
    assert.throws(() => toId(2 ** 60), RangeError); // not safe: would be rounded
    assert.throws(() => toId(2n ** 64n), RangeError);
    assert.throws(() => toId(1.5), RangeError);
    assert.throws(() => toId("-1"), TypeError);
  });
});

describe("SeenSeqs", () => {
  it("drops what it saw, and late pushes below a jumped floor only if seen", () => {
    const s = new SeenSeqs();
    assert.equal(s.add(1n), true);
    assert.equal(s.add(1n), false);
    assert.equal(s.add(3n), true);
    assert.equal(s.floor, 1n);
    assert.equal(s.add(2n), true);
    assert.equal(s.floor, 3n);
    s.skipTo(10n);
    assert.equal(s.add(9n), true); // a late push below the baseline, not seen before
    assert.equal(s.add(9n), false);
    s.skipTo(1000n);
    assert.equal(s.add(700n), false); // far below the floor
  });

  it("moves past a gap once too many seqs wait behind it", () => {
    const s = new SeenSeqs();
    for (let i = 2n; i < 3000n; i++) s.add(i);
    assert.ok(s.floor > 2000n);
    assert.ok(s.recent.size <= 2048);
  });
});

describe("URLs", () => {
  it("parses tcp, tls, ws and wss, and host:port as tcp", () => {
    assert.deepEqual(parseEndpoint("tcp://127.0.0.1:7070"), { scheme: "tcp", host: "127.0.0.1", port: 7070, path: "", url: "tcp://127.0.0.1:7070" });
    assert.equal(parseEndpoint("10.0.0.5:7070").url, "tcp://10.0.0.5:7070");
    assert.equal(parseEndpoint("ws://h:8080/ws").url, "ws://h:8080/ws");
    assert.equal(parseEndpoint("wss://h/ws").port, 443);
    assert.equal(parseEndpoint("tcp://[::1]:7070").host, "::1");
    assert.equal(parseEndpoint("/ws", "https://chat.example:8443/index.html").url, "wss://chat.example:8443/ws");
    assert.throws(() => parseEndpoint("http://h:1/"), TypeError);
    assert.throws(() => parseEndpoint("tcp://h"), TypeError);
  });
});

describe("contents", () => {
  it("reads media maps, system events and recalls", () => {
    const media = encodeMediaContent({ key: "media/1/ab", name: "a.png", size: 3, type: "image/png" });
    assert.deepEqual(decodeMediaContent(media), { key: "media/1/ab", name: "a.png", size: 3, type: "image/png" });
    assert.equal(decodeMediaContent(new TextEncoder().encode("plain")), null);
    const sys = decodeSystemContent(enc({ event: "created", by: BIG, uids: [BIG, 2], title: "t" }));
    assert.deepEqual(sys, { event: "created", by: BIG, uids: [BIG, 2n], title: "t" });
    assert.equal(recalledSeq(enc([12])), 12n);
    assert.equal(recalledSeq(new Uint8Array()), null);
  });
});
