/** What message contents hold beyond text (docs/protocol.md, Message types): media
 * maps, the server's system events, recall records. Pure functions over bytes. */

import { decode, encode } from "@msgpack/msgpack";

export interface MediaContent {
  /** The object key of the upload: media/<uid>/<sha256>. */
  key: string;
  name?: string;
  size?: number;
  /** The content type of the upload. */
  type?: string;
}

export interface SystemEvent {
  /** "created", "added", "removed", "left", "titled", "notice"; ignore others. */
  event: string;
  /** Who did it (0n: the server's backend). */
  by: bigint;
  uids: bigint[];
  /** "created", "titled": the group's title. */
  title?: string;
  /** "notice": its text, and the backend's data if any. */
  text?: string;
  data?: unknown;
}

function tryDecode(content: Uint8Array): unknown {
  try {
    return decode(content, { useBigInt64: true });
  } catch {
    return undefined;
  }
}

function isMap(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function big(v: unknown): bigint | null {
  if (typeof v === "bigint") return v;
  if (typeof v === "number" && Number.isSafeInteger(v)) return BigInt(v);
  return null;
}

/** The content of an image, voice or file message: a msgpack map with the key, as
 * `imgw chat` writes it (name, size, type). */
export function encodeMediaContent(media: MediaContent): Uint8Array {
  const map: Record<string, unknown> = { key: media.key };
  if (media.name !== undefined) map.name = media.name;
  if (media.size !== undefined) map.size = media.size;
  if (media.type !== undefined) map.type = media.type;
  return encode(map);
}

/** The media map of an image, voice or file message's content; null when the content
 * is not one (a client's own format). */
export function decodeMediaContent(content: Uint8Array): MediaContent | null {
  const v = tryDecode(content);
  if (!isMap(v) || typeof v.key !== "string") return null;
  const out: MediaContent = { key: v.key };
  if (typeof v.name === "string") out.name = v.name;
  const size = big(v.size);
  if (size !== null) out.size = Number(size);
  if (typeof v.type === "string") out.type = v.type;
  return out;
}

/** The event a system message (msg_type 6) carries; null when it cannot be read. */
export function decodeSystemContent(content: Uint8Array): SystemEvent | null {
  const v = tryDecode(content);
  if (!isMap(v) || typeof v.event !== "string") return null;
  const uids = Array.isArray(v.uids) ? v.uids.map(big).filter((u): u is bigint => u !== null) : [];
  const out: SystemEvent = { event: v.event, by: big(v.by) ?? 0n, uids };
  if (typeof v.title === "string") out.title = v.title;
  if (typeof v.text === "string") out.text = v.text;
  if ("data" in v) out.data = v.data;
  return out;
}

/** The seq a recall message (msg_type 5 with content) recalled; null for the recalled
 * original itself (empty content) or unreadable content. */
export function recalledSeq(content: Uint8Array): bigint | null {
  const v = tryDecode(content);
  return Array.isArray(v) && v.length >= 1 ? big(v[0]) : null;
}
