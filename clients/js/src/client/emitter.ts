/** A small typed event emitter that runs in browsers and Node alike. A listener that
 * throws does not stop the others nor the client: its exception is rethrown on a
 * microtask, where the runtime reports it as uncaught. */

export type Listener<T> = (payload: T) => void;

export class Emitter<Events extends object> {
  private readonly listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Call `fn` on every `name` event; the function returned removes it. */
  on<K extends keyof Events>(name: K, fn: Listener<Events[K]>): () => void {
    let set = this.listeners.get(name);
    if (set === undefined) this.listeners.set(name, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => this.off(name, fn);
  }

  /** Call `fn` on the next `name` event only. */
  once<K extends keyof Events>(name: K, fn: Listener<Events[K]>): () => void {
    const off = this.on(name, (payload) => {
      off();
      fn(payload);
    });
    return off;
  }

  off<K extends keyof Events>(name: K, fn: Listener<Events[K]>): void {
    this.listeners.get(name)?.delete(fn as Listener<never>);
  }

  protected emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    const set = this.listeners.get(name);
    if (set === undefined || set.size === 0) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<Events[K]>)(payload);
      } catch (e) {
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  /** Whether anyone listens to `name`. */
  protected listens(name: keyof Events): boolean {
    return (this.listeners.get(name)?.size ?? 0) > 0;
  }
}
