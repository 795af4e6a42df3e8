/** `Client`: one device's session with a gateway (session.ts: login, heartbeat,
 * reconnect, catch-up, send) and every request of wire protocol v1 (docs/protocol.md):
 * conversations, groups, history, receipts, presence, recall, media, offline push. */

import { encodeMediaContent } from "../content.js";
import {
  type Message,
  type PushOptions,
  encodeDelivered,
  encodeGroupCreate,
  encodeGroupInfo,
  encodeGroupMembers,
  encodeHistory,
  encodeMediaGet,
  encodeMediaUpload,
  encodeMute,
  encodeOpenP2P,
  encodePushRegister,
  encodePushUnregister,
  encodePresence,
  encodeRead,
  encodeRecall,
  encodeTyping,
} from "../protocol/frames.js";
import { type Id, toId, toU64 } from "../protocol/ids.js";
import { MsgType } from "../protocol/ops.js";
import { ClientError } from "./errors.js";
import { Session, expect } from "./session.js";
import type { GroupInfo, MediaLink, Page, SendResult } from "./types.js";

export class Client extends Session {
  /** OPEN_P2P: the conversation of you and `peer` (always the same one). The peer sees
   * it with its first message. */
  async openP2P(peer: Id): Promise<bigint> {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeOpenP2P(rid, toId(peer, "peer")), "OPEN_P2P"), "conv_ok").convId;
  }

  /** GROUP_CREATE with the others in it (you are its owner); the conversation. */
  async groupCreate(title: string, uids: Iterable<Id>): Promise<bigint> {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeGroupCreate(rid, title, uids), "GROUP_CREATE"), "conv_ok").convId;
  }

  /** GROUP_MEMBERS: add and remove members (the owner; anyone may remove themselves). */
  async groupMembers(convId: Id, change: { add?: Iterable<Id>; remove?: Iterable<Id> }): Promise<void> {
    const rid = this.rid();
    const body = encodeGroupMembers(rid, toId(convId, "convId"), change.add ?? [], change.remove ?? []);
    expect(await this.ask(rid, body, "GROUP_MEMBERS"), "ok");
  }

  async groupInfo(convId: Id): Promise<GroupInfo> {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodeGroupInfo(rid, toId(convId, "convId")), "GROUP_INFO"), "group_info_result");
    return { convId: r.convId, title: r.title, ownerUid: r.ownerUid, members: r.members };
  }

  /** HISTORY: the last `limit` messages before `beforeSeq` (0: from the newest), in
   * ascending seq order. Pass them to `markSeen` if they must not come again as
   * events. */
  async history(convId: Id, options: { beforeSeq?: Id; limit?: number } = {}): Promise<Page> {
    const rid = this.rid();
    const body = encodeHistory(rid, toId(convId, "convId"), toU64(options.beforeSeq ?? 0n, "beforeSeq"), options.limit ?? 0);
    const r = expect(await this.ask(rid, body, "HISTORY"), "history_result");
    return { convId: r.convId, hasMore: r.hasMore, messages: r.messages };
  }

  /** PULL pages from `afterSeq` until has_more is false. */
  async pullAll(convId: Id, options: { afterSeq?: Id; limit?: number } = {}): Promise<Message[]> {
    const out: Message[] = [];
    let after = toU64(options.afterSeq ?? 0n, "afterSeq");
    for (;;) {
      const r = await this.pull(convId, { afterSeq: after, limit: options.limit ?? 0 });
      out.push(...r.messages);
      const last = r.messages[r.messages.length - 1];
      if (!r.hasMore || last === undefined) return out;
      after = last.seq;
    }
  }

  /** RECALL your message (within the server's recall window); the seq of the recall
   * message. */
  async recall(convId: Id, seq: Id): Promise<bigint> {
    const rid = this.rid();
    const body = encodeRecall(rid, toId(convId, "convId"), toU64(seq, "seq"));
    return expect(await this.ask(rid, body, "RECALL"), "recall_ok").recallSeq;
  }

  /** PRESENCE: the online devices of each uid ([] offline, or not visible to you). */
  async presence(uids: Iterable<Id>): Promise<Map<bigint, string[]>> {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodePresence(rid, uids), "PRESENCE"), "presence_result");
    return new Map(r.entries);
  }

  /** READ up to `seq` (cumulative): tells your other devices and the other members.
   * False when offline: nothing was sent (send the latest position again later). */
  read(convId: Id, seq: Id): boolean {
    return this.tell(encodeRead(toId(convId, "convId"), toU64(seq, "seq")));
  }

  /** DELIVERED up to `seq` (cumulative): this device's position. False when offline. */
  delivered(convId: Id, seq: Id): boolean {
    return this.tell(encodeDelivered(toId(convId, "convId"), toU64(seq, "seq")));
  }

  /** TYPING: the other members see `typing` (repeat it while typing; the server drops
   * more than 2/s). False when offline. */
  typing(convId: Id): boolean {
    return this.tell(encodeTyping(toId(convId, "convId")));
  }

  /** MEDIA_UPLOAD: a signed URL to PUT the file to (url "": stored already). */
  async mediaUpload(sha256: string, size: number, contentType: string): Promise<MediaLink> {
    const rid = this.rid();
    const body = encodeMediaUpload(rid, sha256, size, contentType);
    const r = expect(await this.ask(rid, body, "MEDIA_UPLOAD"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }

  /** MEDIA_GET: a signed URL to GET the object of `key` from. */
  async mediaGet(key: string): Promise<MediaLink> {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodeMediaGet(rid, key), "MEDIA_GET"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }

  /** PUSH_REGISTER: this device (its uid and device) can be reached through push
   * service `provider` (`apns`, `fcm`, `webpush`...: 1-16 of `[a-z0-9_-]`) at `token`
   * (1-2,048 UTF-8 bytes) while it has no connection. Registering again replaces the
   * registration; a token another device holds moves here. Call it at every start and
   * whenever the push service hands the app a new token. */
  async pushRegister(provider: string, token: string, opts: PushOptions = {}): Promise<void> {
    const rid = this.rid();
    const body = encodePushRegister(rid, provider, token, opts);
    expect(await this.ask(rid, body, "PUSH_REGISTER"), "push_register_ok");
  }

  /** PUSH_UNREGISTER: this device's registration goes (also when it had none). `logout`
   * removes it too, but without an answer: call this first to be sure. */
  async pushUnregister(): Promise<void> {
    const rid = this.rid();
    expect(await this.ask(rid, encodePushUnregister(rid), "PUSH_UNREGISTER"), "ok");
  }

  /** MUTE: no push notifications of `convId` to your uid's devices until `untilMs` (ms
   * since the epoch; 0, or a time past, unmutes; a time far ahead such as 2n ** 63n - 1n
   * mutes for good). Messages still arrive on connections and count unread. */
  async mute(convId: Id, untilMs: Id): Promise<void> {
    const rid = this.rid();
    const body = encodeMute(rid, toId(convId, "convId"), toU64(untilMs, "untilMs"));
    expect(await this.ask(rid, body, "MUTE"), "ok");
  }

  /** Upload a file: hash it, ask for a URL, PUT it there (fetch) unless the server has
   * it already; its key. */
  async uploadMedia(data: Uint8Array, contentType: string): Promise<string> {
    let digest = "";
    for (const b of await this.platform.sha256(data)) digest += b.toString(16).padStart(2, "0");
    const link = await this.mediaUpload(digest, data.length, contentType);
    if (link.url) {
      const res = await fetch(link.url, {
        method: "PUT",
        headers: { "Content-Type": contentType },
        body: data as Uint8Array<ArrayBuffer>,
      });
      if (!res.ok) throw new ClientError(0, `upload refused: HTTP ${res.status} ${res.statusText}`);
    }
    return link.key;
  }

  /** Upload a file and SEND it as an image (2), voice (3) or file (4) message, by its
   * content type unless `msgType` says; the content is the msgpack map {key, name,
   * size, type}, as `imgw chat` writes it. */
  async sendMedia(
    convId: Id,
    data: Uint8Array,
    info: { name: string; contentType: string; msgType?: number },
  ): Promise<SendResult & { key: string }> {
    const key = await this.uploadMedia(data, info.contentType);
    const content = encodeMediaContent({ key, name: info.name, size: data.length, type: info.contentType });
    const type = info.contentType;
    const msgType = info.msgType ?? (type.startsWith("image/") ? MsgType.IMAGE : type.startsWith("audio/") ? MsgType.VOICE : MsgType.FILE);
    return { ...(await this.send(convId, content, { msgType })), key };
  }
}
