"""Asyncio client of wire protocol v1 (docs/protocol.md) for apps, tests and the bench.

One `Client` is one logged-in device. It owns a single reader task that decodes the
server's frames, resolves request futures by rid (replies may come in any order) and
puts server-initiated frames on an incoming queue; one timer handle sends PING when
nothing was sent for `hb` seconds and drops a connection the server left silent for
`idle` seconds. It works on plain asyncio and on uvloop.

Reconnect and catch-up: after a dropped connection or a KICK draining / shutdown the
reader task logs in again with exponential backoff and full jitter, cycling through
the addresses (a KICK's reconnect_hint first), then runs SYNC from the kept `since`
and PULLs every conversation whose max_seq is above what the client has seen. That
SYNC's first page is asked in the LOGIN's own write, as docs/protocol.md recommends:
the server answers it in LOGIN_OK's write, a round trip fewer for every reconnect
(thousands at once after a gateway restart). Missed
messages come out of `incoming()` as `Push` frames, so the app reads one stream; the
per-conversation record of seen seqs drops duplicates, so no message comes twice. A
SYNC_HINT runs the same catch-up. Sends survive all this: `send` retries with the same
client_msg_id, which the server deduplicates. KICK duplicate_login, slow_consumer and
auth_revoked (unless a token callable can mint a new token) end the session.

Modules: `core` (Client), `inbox` (incoming queue, dedup, catch-up), `seen` (dedup by
seq, sans-I/O), `link` (addresses, connect + LOGIN), `errors`.

Exception tree::

    ClientError                .code: the server's ERROR code, 0 for local failures
    ├── ConnectionLost         the connection dropped (or is down) before the reply
    │   ├── TlsMismatch        TLS and the server disagree, said how (link)
    │   └── SessionEnded       the session is over: closed, logged out, or a KICK that
    │                          does not reconnect (.kick holds it)
    └── RequestTimeout         no reply within request_timeout (also a TimeoutError)
"""

from gateway.client.core import Client, TokenSource
from gateway.client.errors import (
    ClientError,
    ConnectionLost,
    RequestTimeout,
    SessionEnded,
    code_name,
    kick_name,
)
from gateway.client.inbox import ClientStats, Event
from gateway.client.link import Address, Endpoint, parse_addresses

__all__ = [
    "Address",
    "Client",
    "ClientError",
    "ClientStats",
    "ConnectionLost",
    "Endpoint",
    "Event",
    "RequestTimeout",
    "SessionEnded",
    "TokenSource",
    "code_name",
    "kick_name",
    "parse_addresses",
]
