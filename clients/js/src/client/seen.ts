/** Which messages of a conversation the app was given: duplicate suppression by seq. */

/** Seqs this far below the floor are still told apart (late pushes, SYNC races). */
export const SEEN_WINDOW = 256n;
/** Most seqs held per conversation before the record is trimmed. */
export const SEEN_CAP = 2048;

/** The seqs of one conversation the app was given, or sent itself.
 *
 * Every seq <= `floor` counts as handled, except that a seq within SEEN_WINDOW below the
 * floor is only a duplicate if `recent` holds it: the floor may jump (a SYNC baseline, a
 * catch-up PULL) past pushes still in flight, and pushes from different senders arrive
 * out of order. `floor` advances over consecutive seqs in `recent`, so after a lost
 * connection the client pulls from the first seq it may have missed. */
export class SeenSeqs {
  floor = 0n;
  recent = new Set<bigint>();

  /** Record `seq`; false if it was handled before (a duplicate). */
  add(seq: bigint): boolean {
    if (seq <= this.floor - SEEN_WINDOW || this.recent.has(seq)) return false;
    this.recent.add(seq);
    this.compact();
    return true;
  }

  /** Everything up to `seq` is handled (listed in a SYNC baseline, or pulled). */
  skipTo(seq: bigint): void {
    if (seq > this.floor) {
      this.floor = seq;
      this.compact();
    }
  }

  private compact(): void {
    let floor = this.floor;
    while (this.recent.has(floor + 1n)) floor += 1n;
    this.floor = floor;
    if (this.recent.size <= SEEN_CAP) return;
    let low = floor - SEEN_WINDOW;
    let kept = [...this.recent].filter((s) => s > low);
    if (kept.length > SEEN_CAP / 2) {
      // The floor is stuck below a hole with many seqs after it: a seq gap.
      kept.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      this.floor = kept[kept.length - Number(SEEN_WINDOW)]!;
      low = this.floor - SEEN_WINDOW;
      kept = kept.filter((s) => s > low);
    }
    this.recent = new Set(kept);
  }
}
