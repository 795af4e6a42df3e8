/** Op codes, error codes, KICK reasons and message types of wire protocol v1
 * (docs/protocol.md, Ops and Errors and kicks). */

export const PROTOCOL_VERSION = 1;

export const Op = {
  LOGIN: 1,
  LOGIN_OK: 2,
  PING: 3,
  PONG: 4,
  SEND: 10,
  SEND_ACK: 11,
  PUSH: 20,
  DELIVERED: 21,
  READ: 22,
  READ_NOTIFY: 23,
  TYPING: 24,
  TYPING_NOTIFY: 25,
  PRESENCE: 26,
  PRESENCE_RESULT: 27,
  SYNC: 30,
  SYNC_RESULT: 31,
  PULL: 32,
  PULL_RESULT: 33,
  HISTORY: 34,
  HISTORY_RESULT: 35,
  SYNC_HINT: 36,
  NOTICE: 37,
  RECALL: 40,
  RECALL_OK: 41,
  OPEN_P2P: 50,
  CONV_OK: 51,
  GROUP_CREATE: 52,
  GROUP_MEMBERS: 54,
  OK: 55,
  GROUP_INFO: 56,
  GROUP_INFO_RESULT: 57,
  KICK: 60,
  LOGOUT: 62,
  MEDIA_UPLOAD: 70,
  MEDIA_URL: 71,
  MEDIA_GET: 72,
  PUSH_REGISTER: 80,
  PUSH_REGISTER_OK: 81,
  PUSH_UNREGISTER: 82,
  MUTE: 84,
  ERROR: 127,
} as const;

export const ErrorCode = {
  BAD_FRAME: 1,
  FRAME_TOO_LARGE: 2,
  UNKNOWN_OP: 3,
  BAD_REQUEST: 4,
  NOT_LOGGED_IN: 10,
  AUTH_FAILED: 11,
  VERSION_UNSUPPORTED: 12,
  NOT_MEMBER: 20,
  NO_SUCH_CONVERSATION: 21,
  CONTENT_TOO_LARGE: 22,
  BAD_MSG_TYPE: 23,
  RATE_LIMITED: 24,
  RECALL_DENIED: 25,
  IDEMPOTENCY_CONFLICT: 26,
  FORBIDDEN: 27,
  NO_SUCH_MESSAGE: 28,
  UNAVAILABLE: 30,
  INTERNAL: 31,
  OUTCOME_UNKNOWN: 32,
  CONTENT_DENIED: 33,
} as const;

export const KickReason = {
  DUPLICATE_LOGIN: 1,
  DRAINING: 2,
  AUTH_REVOKED: 3,
  SLOW_CONSUMER: 4,
  SHUTDOWN: 5,
} as const;

export const MsgType = {
  TEXT: 1,
  IMAGE: 2,
  VOICE: 3,
  FILE: 4,
  RECALL: 5,
  SYSTEM: 6,
} as const;

/** Capabilities this client lists in LOGIN: it handles ERROR outcome_unknown (32) and
 * content_denied (33). */
export const CAPS: readonly string[] = ["outcome_unknown", "content_denied"];

function nameOf(table: Record<string, number>, value: number): string | undefined {
  for (const [name, v] of Object.entries(table)) {
    if (v === value) return name.toLowerCase();
  }
  return undefined;
}

/** "auth_failed" for ERROR code 11, and so on; "error 99" for a code this client does
 * not know, and "client" for 0 (a local failure). */
export function codeName(code: number): string {
  if (code === 0) return "client";
  return nameOf(ErrorCode, code) ?? `error ${code}`;
}

/** "shutdown" for KICK reason 5, and so on. */
export function kickName(reason: number): string {
  return nameOf(KickReason, reason) ?? `reason ${reason}`;
}
