// Bounded waits on clients' events.

/** `promise`, or a rejection naming `what` after `ms`. */
export function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Record a client's events as they come: `messages`, `reads`, `states`... and wait
 * on them with `until`. */
export class Recorder {
  constructor(client) {
    this.messages = [];
    this.reads = [];
    this.typing = [];
    this.states = [];
    this.kicks = [];
    this.errors = [];
    this.notices = [];
    this.waiters = new Set();
    const poke = () => {
      for (const w of [...this.waiters]) w();
    };
    client.on("message", (m) => (this.messages.push(m), poke()));
    client.on("read", (r) => (this.reads.push(r), poke()));
    client.on("typing", (t) => (this.typing.push(t), poke()));
    client.on("state", (s) => (this.states.push(s), poke()));
    client.on("kick", (k) => (this.kicks.push(k), poke()));
    client.on("error", (e) => (this.errors.push(e), poke()));
    client.on("notice", (n) => (this.notices.push(n), poke()));
  }

  /** Texts of the messages received in `convId`, in order. */
  texts(convId) {
    return this.messages.filter((m) => convId === undefined || m.convId === convId).map((m) => m.text);
  }

  /** Wait until `pred()` holds (checked on every event), at most `ms`. */
  until(pred, what, ms = 10_000) {
    if (pred()) return Promise.resolve();
    let wake;
    const p = new Promise((resolve) => {
      wake = () => {
        if (pred()) resolve();
      };
      this.waiters.add(wake);
    });
    return within(ms, p, what).finally(() => this.waiters.delete(wake));
  }
}
