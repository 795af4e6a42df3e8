/** The client's errors, as a tree:
 *
 *     ClientError            .code: the server's ERROR code, 0 for a local failure
 *     ├── ConnectionLost     the connection dropped (or is down) before the reply
 *     │   └── SessionEnded   the session is over: closed, logged out, a login refused
 *     │                      on reconnect, or a KICK that does not reconnect (.kick)
 *     └── RequestTimeout     no reply within requestTimeoutMs
 */

import type { Kick } from "../protocol/frames.js";
import { codeName } from "../protocol/ops.js";

export class ClientError extends Error {
  override name = "ClientError";
  /** The server's ERROR code (ErrorCode), 0 when the request failed locally. */
  readonly code: number;
  /** "auth_failed", "not_member"...; "client" for code 0. */
  readonly codeName: string;
  /** The server's text (for people: do not parse it), or what failed locally. */
  readonly text: string;

  constructor(code: number, text: string) {
    super(code ? `${codeName(code)}: ${text}` : text);
    this.code = code;
    this.codeName = codeName(code);
    this.text = text;
  }
}

export class ConnectionLost extends ClientError {
  override name = "ConnectionLost";
  constructor(text: string) {
    super(0, text);
  }
}

export class SessionEnded extends ConnectionLost {
  override name = "SessionEnded";
  /** The KICK that ended the session, if one did. */
  readonly kick: Kick | null;
  constructor(text: string, kick: Kick | null = null) {
    super(text);
    this.kick = kick;
  }
}

export class RequestTimeout extends ClientError {
  override name = "RequestTimeout";
  constructor(text: string) {
    super(0, text);
  }
}
