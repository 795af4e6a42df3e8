/** The byte-stream framing of TCP: each frame is a 4-byte big-endian length, then that
 * many bytes of body (docs/protocol.md, Frames). Over WebSocket each binary message is
 * one body and none of this applies.
 *
 * `StreamDecoder.feed` takes the bytes as they come and returns the whole bodies they
 * complete; it never calls back. Work is O(bytes fed): a body that sits inside one chunk
 * is a view of it, one split over chunks is copied once. Memory is bounded by
 * `maxFrame` plus one chunk. A length of 0 or above `maxFrame` breaks the framing:
 * `feed` reports it in `error` (with the bodies before it) and the decoder stays
 * broken, since nothing after it can be framed. */

export const HEADER_SIZE = 4;
/** The client's limit on a server frame: pages of PULL may exceed the server's
 * max_frame (that one bounds what the server reads). */
export const MAX_INBOUND_FRAME = 64 << 20;

export interface Fed {
  bodies: Uint8Array[];
  /** Why the stream cannot be framed any more; null while it can. */
  error: string | null;
}

export class StreamDecoder {
  private chunks: Uint8Array[] = [];
  private buffered = 0;
  private need = -1; // the body length being waited for; -1: waiting for a header
  private broken: string | null = null;

  constructor(readonly maxFrame: number = MAX_INBOUND_FRAME) {}

  feed(data: Uint8Array): Fed {
    const bodies: Uint8Array[] = [];
    if (this.broken !== null) return { bodies, error: this.broken };
    if (data.length) {
      this.chunks.push(data);
      this.buffered += data.length;
    }
    for (;;) {
      if (this.need < 0) {
        if (this.buffered < HEADER_SIZE) break;
        const head = this.take(HEADER_SIZE);
        const len = ((head[0]! << 24) | (head[1]! << 16) | (head[2]! << 8) | head[3]!) >>> 0;
        if (len === 0 || len > this.maxFrame) {
          this.broken = len === 0 ? "a frame of length 0" : `a frame of ${len} bytes (limit ${this.maxFrame})`;
          this.chunks = [];
          this.buffered = 0;
          return { bodies, error: this.broken };
        }
        this.need = len;
      }
      if (this.buffered < this.need) break;
      bodies.push(this.take(this.need));
      this.need = -1;
    }
    return { bodies, error: null };
  }

  /** Bytes held for a frame not complete yet. */
  get pending(): number {
    return this.buffered;
  }

  private take(n: number): Uint8Array {
    const first = this.chunks[0]!;
    this.buffered -= n;
    if (first.length >= n) {
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = new Uint8Array(n);
    let filled = 0;
    while (filled < n) {
      const chunk = this.chunks[0]!;
      const part = Math.min(chunk.length, n - filled);
      out.set(chunk.subarray(0, part), filled);
      filled += part;
      if (part === chunk.length) this.chunks.shift();
      else this.chunks[0] = chunk.subarray(part);
    }
    return out;
  }
}

/** Frame bodies for the byte stream: each with its length in front, in one buffer (one
 * write). */
export function frameStream(bodies: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const b of bodies) total += HEADER_SIZE + b.length;
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  let at = 0;
  for (const b of bodies) {
    view.setUint32(at, b.length);
    out.set(b, at + HEADER_SIZE);
    at += HEADER_SIZE + b.length;
  }
  return out;
}
