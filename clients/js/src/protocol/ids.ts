/** 64-bit ids. The wire carries unsigned 64-bit integers that can exceed 2^53, so the
 * SDK hands every id and seq out as a `bigint`; it takes a `bigint`, a safe integer
 * `number` or a decimal string. */

/** What the SDK accepts wherever it wants an id or a seq. */
export type Id = bigint | number | string;

export const MAX_U64 = (1n << 64n) - 1n;

/** `value` as a u64 bigint; throws RangeError outside 0..2^64-1 (or 1.. when `min` is
 * 1n, which ids require). */
export function toU64(value: Id, what = "id", min = 0n): bigint {
  let big: bigint;
  if (typeof value === "bigint") {
    big = value;
  } else if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) {
      throw new RangeError(`${what} must be an integer (a bigint above 2^53), got ${value}`);
    }
    big = BigInt(value);
  } else if (typeof value === "string" && /^[0-9]{1,20}$/.test(value)) {
    big = BigInt(value);
  } else {
    throw new TypeError(`${what} must be a bigint, a safe integer or a decimal string`);
  }
  if (big < min || big > MAX_U64) {
    throw new RangeError(`${what} must be in ${min}..2^64-1, got ${big}`);
  }
  return big;
}

/** An id (1..2^64-1): uid, conv_id, msg_id. */
export function toId(value: Id, what = "id"): bigint {
  return toU64(value, what, 1n);
}

/** A u64 on the wire: a number below 2^32 (a compact msgpack int), a bigint above (the
 * encoder writes it as uint64; a number there would become a float64, which the server
 * refuses). */
export function wireU64(value: bigint): number | bigint {
  return value < 0x1_0000_0000n ? Number(value) : value;
}
