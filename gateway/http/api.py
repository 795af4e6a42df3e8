"""The server API: JSON over HTTP under /api/v1/ on the admin listener, for the
product's own backends (docs/api.md is its reference).

Every call that a client can make over TCP runs through the same handler as the TCP op
(`gateway.handlers.dispatch`), as a `Call`: a `Session` of the uid the call acts as,
whose one reply frame becomes the HTTP response. So a send here is the SEND path itself
(the same checks, the group commit, SEND_ACK only after the commit, PUSH to every online
device of the members on every node) and an error is the same ERROR, as JSON. What no
TCP op does (a system message, the group title, kicks, broadcast notices, reads across
users) is small and sits beside the handlers it shares its rules with.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs

import msgpack
from aiohttp import web

from gateway.handlers import conversations, dispatch, receipts
from gateway.handlers.base import RequestError
from gateway.handlers.messaging import MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX
from gateway.handlers.receipts import PRESENCE_MAX_UIDS
from gateway.handlers.sync import CONV_LIMIT_DEFAULT, CONV_LIMIT_MAX
from gateway.http.jsonout import message_json, out_id
from gateway.http.keys import MANAGE, MODERATE, PUSH, READ, SEND, Caller
from gateway.ratelimit import Bucket
from protocol.codec import encode
from protocol.frames import (
    ConvOk,
    Delivered,
    Error,
    GroupCreate,
    GroupMembers,
    History,
    HistoryResult,
    MsgRecord,
    Mute,
    Notice,
    Ok,
    OpenP2P,
    Pull,
    PullResult,
    Read,
    Recall,
    RecallOk,
    Send,
    SendAck,
    ServerFrame,
    Sync,
    SyncResult,
)
from protocol.ops import (
    KNOWN_CAPS,
    MAX_U64,
    PUSH_TOKEN_MAX_BYTES,
    ErrorCode,
    KickReason,
    MsgType,
    is_client_msg_type,
)
from protocol.parsers import PUSH_PROVIDER_RE, FieldError, client_msg_id
from protocol.token import DEVICE_RE, sign_token
from storage.errors import BackendUnavailable
from storage.rules import SERVER_UID

if TYPE_CHECKING:
    from gateway.node import Node
    from storage.models import Route, StoredMessage

PREFIX: Final = "/api/v1/"
RID: Final = 1  # the rid of a Call's one request (nothing else shares its replies)
CALL_TIMEOUT_S: Final = 30.0
BROADCAST_MAX_UIDS: Final = 1000
TEXT_MAX_BYTES: Final = 256  # a kick's text
DATA_DEPTH_MAX: Final = 32  # arrays and objects nested in a system message's "data"
MEMBERS_LIMIT_DEFAULT: Final = 500
MEMBERS_LIMIT_MAX: Final = 5000
TOKEN_MINT_BURST: Final = 1000  # client tokens minted at once, then TOKEN_MINT_PER_S
TOKEN_MINT_PER_S: Final = 100.0
TOKEN_TTL_DEFAULT_S: Final = 86_400
TOKEN_TTL_MIN_S: Final = 60
TOKEN_TTL_MAX_S: Final = 30 * 86_400

# The HTTP status of each error code.
STATUS: Final[Mapping[ErrorCode, int]] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.BAD_MSG_TYPE: 400,
    ErrorCode.UNKNOWN_OP: 404,
    ErrorCode.AUTH_FAILED: 401,
    ErrorCode.NOT_MEMBER: 403,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.RECALL_DENIED: 403,
    ErrorCode.CONTENT_DENIED: 403,
    ErrorCode.NO_SUCH_CONVERSATION: 404,
    ErrorCode.NO_SUCH_MESSAGE: 404,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.CONTENT_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.OUTCOME_UNKNOWN: 503,
}


class ApiError(Exception):
    """Answer the call with this error code (and its HTTP status)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        status: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 400)
        self.headers = headers or {}


def error_body(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error": {"code": code.name.lower(), "message": message}}


def code_of_status(status: int) -> ErrorCode:
    """The error code of an answer the listener gives by itself (a malformed request, a
    cap, a path that is no call)."""
    if status in (401, 403, 404, 413, 429, 500, 503):
        return {
            401: ErrorCode.AUTH_FAILED,
            403: ErrorCode.FORBIDDEN,
            404: ErrorCode.UNKNOWN_OP,
            413: ErrorCode.CONTENT_TOO_LARGE,
            429: ErrorCode.RATE_LIMITED,
            500: ErrorCode.INTERNAL,
            503: ErrorCode.UNAVAILABLE,
        }[status]
    return ErrorCode.INTERNAL if status >= 500 else ErrorCode.BAD_REQUEST


def json_response(
    status: int, body: object, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=dumps(body), content_type="application/json", headers=headers
    )


def error_page(status: int, text: str) -> web.Response:
    """The listener's own error answers, in the API's JSON shape."""
    return json_response(status, error_body(code_of_status(status), text))


# -- the Session of one call -------------------------------------------------------------


class Call:
    """One API request as a `gateway.ports.Session` of the uid it acts as: the handler
    answers it with one frame (a result or ERROR), which `reply` resolves to. It is no
    connection: it holds no route, and pushes reach every device of its uid."""

    def __init__(self, loop: asyncio.AbstractEventLoop, uid: int, device: str = "") -> None:
        self.reply: asyncio.Future[ServerFrame] = loop.create_future()
        self._uid = uid
        self._device = device

    conn_id = 0
    route: Route | None = None
    active = True
    caps: frozenset[str] = KNOWN_CAPS  # API callers read every error code

    @property
    def uid(self) -> int:
        return self._uid

    @property
    def device(self) -> str:
        return self._device

    async def log_in(
        self, uid: int, device: str, exp: int, iat: int | None, caps: frozenset[str]
    ) -> bool:
        return False

    async def log_out(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass

    def send(self, frame: ServerFrame) -> None:
        if not self.reply.done():
            self.reply.set_result(frame)

    send_ahead = send

    def error(self, rid: int, code: ErrorCode, text: str = "") -> None:
        self.send(Error(rid, int(code), text))

    def fail(self, code: ErrorCode, text: str, rid: int = 0) -> None:
        self.error(rid, code, text)

    def kick(self, reason: KickReason, text: str = "", reconnect_hint: str = "") -> None:
        pass

    def close(self) -> None:
        pass

    def hold_sends(self) -> None:
        pass


# -- JSON in ---------------------------------------------------------------------------


def as_id(value: Any, name: str, *, zero: bool = False) -> int:
    """An id: a JSON integer, or a decimal string (ids above 2^53), in 1..2^64-1 (0 too
    with `zero`)."""
    if type(value) is str and value.isascii() and value.isdigit() and len(value) <= 20:
        value = int(value)
    if type(value) is int and (1 - zero) <= value <= MAX_U64:
        return value
    low = 0 if zero else 1
    raise ApiError(ErrorCode.BAD_REQUEST, f"{name} must be an integer in {low}..2^64-1")


def as_count(value: Any, name: str) -> int:
    """A seq or limit: an integer (or decimal string) in 0..2^64-1."""
    return as_id(value, name, zero=True)


def as_ids(value: Any, name: str) -> tuple[int, ...]:
    if type(value) is not list:
        raise ApiError(ErrorCode.BAD_REQUEST, f"{name} must be an array of ids")
    return tuple(as_id(v, f"{name}[{i}]") for i, v in enumerate(value))


def as_str(value: Any, name: str) -> str:
    if type(value) is not str:
        raise ApiError(ErrorCode.BAD_REQUEST, f"{name} must be a string")
    return value


def field(body: Mapping[str, Any], name: str) -> Any:
    if name not in body:
        raise ApiError(ErrorCode.BAD_REQUEST, f"{name} is required")
    return body[name]


def content_of(body: Mapping[str, Any]) -> bytes:
    """The message content: "text" (sent as its UTF-8 bytes) or "content_b64"."""
    if ("text" in body) == ("content_b64" in body):
        raise ApiError(ErrorCode.BAD_REQUEST, 'give one of "text" and "content_b64"')
    if "text" in body:
        return as_str(body["text"], "text").encode()
    try:
        return base64.b64decode(as_str(body["content_b64"], "content_b64"), validate=True)
    except ValueError as e:  # binascii.Error, or a character outside ASCII
        raise ApiError(ErrorCode.BAD_REQUEST, "content_b64 is not base64") from e


def query_ids(query: Mapping[str, list[str]], name: str) -> tuple[int, ...]:
    raw = ",".join(query.get(name, []))
    return tuple(as_id(v, name) for v in raw.split(",") if v)


def query_count(query: Mapping[str, list[str]], name: str) -> int:
    return as_count(query[name][0], name) if name in query else 0


def query_limit(query: Mapping[str, list[str]], default: int, cap: int) -> int:
    """`limit`: 1..cap, `default` when it is left out."""
    if "limit" not in query:
        return default
    raw = query["limit"][0]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and 1 <= int(raw) <= cap):
        raise ApiError(ErrorCode.BAD_REQUEST, f"limit must be an integer in 1..{cap}")
    return int(raw)


def _known(values: dict[str, Any], known: frozenset[str], what: str) -> dict[str, Any]:
    """`values`, if every name in it is one the call takes; else the error naming them."""
    unknown = sorted(set(values) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"unknown {what} {', '.join(unknown)} (this call takes: {takes})"
        )
    return values


# -- JSON out --------------------------------------------------------------------------


def record_json(r: MsgRecord) -> dict[str, Any]:
    return message_json(
        r.seq, r.msg_id, r.sender_uid, r.msg_type, r.content, r.server_ms, r.client_msg_id
    )


def stored_json(m: StoredMessage) -> dict[str, Any]:
    return message_json(
        m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms, m.client_msg_id
    )


# -- routing ---------------------------------------------------------------------------

Result = tuple[int, dict[str, Any]]
Handler = Callable[..., Awaitable[Result]]
Answer = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, headers
BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# The calls under PREFIX: (method, path with {id} for a path id, the Api method that
# answers it, the scope a key needs, the JSON keys of its body or, for GET, its query
# parameters). gateway/http/openapi.py documents each one.
ROUTES: Final[tuple[tuple[str, str, str, str, str], ...]] = (
    ("POST", "conversations/{id}/messages", "send", SEND,
     "sender_uid client_msg_id msg_type text content_b64 data"),
    ("GET", "conversations/{id}/messages", "messages", READ,
     "limit before_seq after_seq as_uid cursor"),
    ("GET", "conversations/{id}", "conversation", READ, ""),
    ("GET", "conversations/{id}/members", "member_page", READ, "limit cursor"),
    ("POST", "conversations/{id}/members", "members", MANAGE, "add remove by_uid"),
    ("PUT", "conversations/{id}/title", "title", MANAGE, "title by_uid"),
    ("POST", "conversations/{id}/recall", "recall", SEND, "uid seq"),
    ("POST", "conversations/{id}/read", "read", SEND, "uid seq"),
    ("POST", "conversations/{id}/delivered", "delivered", SEND, "uid device seq"),
    ("POST", "p2p", "open_p2p", MANAGE, "uid peer_uid"),
    ("POST", "groups", "group_create", MANAGE, "owner_uid title uids"),
    ("GET", "users/{id}/conversations", "user_conversations", READ,
     "device limit cursor"),
    ("POST", "tokens", "mint_token", MANAGE, "uid device ttl_s"),
    ("GET", "presence", "presence", READ, "uids"),
    ("POST", "kick", "kick", MODERATE, "uid device reason text"),
    ("POST", "revoke", "revoke", MODERATE, "uid device"),
    ("POST", "broadcast", "broadcast", MODERATE, "uids msg_type text content_b64"),
    ("GET", "users/{id}/push-devices", "push_devices", PUSH, ""),
    ("POST", "push-tokens/invalid", "push_token_invalid", PUSH, "provider token"),
    ("POST", "conversations/{id}/mute", "mute", PUSH, "uid until_ms"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str  # under PREFIX, with {id} for a path id
    pattern: re.Pattern[str]
    handler: Handler
    scope: str  # what a key needs to call it (gateway/http/keys.py)
    # the JSON keys of its body (a call without a body: its query parameters)
    keys: frozenset[str]

    @property
    def body(self) -> bool:
        return self.method in BODY_METHODS


class Api:
    """The /api/v1/ calls of one node."""

    def __init__(self, node: Node) -> None:
        self._node = node
        cfg = node.config
        # Broadcast: recipients (uids) per second for the whole node, in bursts.
        self.broadcast_budget = Bucket(
            cfg.api_broadcast_burst, cfg.api_broadcast_per_s, node.loop.time
        )
        self.token_budget = Bucket(TOKEN_MINT_BURST, TOKEN_MINT_PER_S, node.loop.time)
        self.endpoints: list[Endpoint] = []
        for method, path, name, scope, keys in ROUTES:
            handler = getattr(self, name)
            regex = re.escape(path).replace(re.escape("{id}"), r"([^/]+)")
            self.endpoints.append(
                Endpoint(method, path, re.compile(regex), handler, scope, frozenset(keys.split()))
            )

    async def handle(
        self, method: str, path: str, query: str, body: bytes, caller: Caller
    ) -> Answer:
        """The status, JSON body and headers answering one request to `path` (under
        PREFIX) from `caller`."""
        called = ["unknown"]  # the call's name, once its endpoint is found
        headers: dict[str, str] = {}
        try:
            result = await self._handle(method, path, query, body, caller, called)
        except ApiError as e:
            result = e.status, error_body(e.code, e.message)
            headers = e.headers
        except BackendUnavailable as e:
            result = 503, error_body(ErrorCode.UNAVAILABLE, f"storage unavailable: {e}")
        except TimeoutError:
            result = 503, error_body(ErrorCode.UNAVAILABLE, "timed out; retry (sends: same key)")
        except Exception:
            node = self._node
            if (held := node.log_throttle.allow("api failed")) is not None:
                node.log.exception("api call failed", path=path, similar_held_back=held)
            result = 500, error_body(ErrorCode.INTERNAL, "internal error")
        error = result[1].get("error")
        code = "ok" if error is None else str(error["code"])
        self._node.metrics.api_calls.labels(call=called[0], code=code, key=caller.name).inc()
        return result[0], result[1], headers

    async def _handle(
        self, method: str, path: str, query: str, raw: bytes, caller: Caller, called: list[str]
    ) -> Result:
        rest = path[len(PREFIX) :]
        allowed: list[str] = []
        for route in self.endpoints:
            m = route.pattern.fullmatch(rest)
            if m is None:
                continue
            if route.method != method:
                allowed.append(route.method)
                continue
            called[0] = route.handler.__name__
            if route.scope not in caller.scopes:
                raise ApiError(
                    ErrorCode.FORBIDDEN, f"the key {caller.name} lacks the scope {route.scope}"
                )
            if method != "GET" and not self._node.accepting:
                # its batcher is being drained: a send could no longer be committed
                raise ApiError(ErrorCode.UNAVAILABLE, "this node is draining; call another")
            args: list[Any] = [as_id(g, "id") for g in m.groups()]
            if route.body:
                args.append(_known(_json_object(raw), route.keys, "key"))
            else:
                # a parameter given empty (cursor=) is malformed, not left out
                params = parse_qs(query, keep_blank_values=True)
                args.append(_known(params, route.keys, "query parameter"))
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await route.handler(*args)
        if allowed:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"use {' or '.join(allowed)}",
                status=405,
                headers={"Allow": ", ".join(allowed)},
            )
        raise ApiError(ErrorCode.UNKNOWN_OP, f"no API call {path}")

    async def _call(self, uid: int, frame: Any, device: str = "") -> ServerFrame:
        """Run `frame` through its TCP handler as `uid`; the result frame, or ApiError."""
        node = self._node
        call = Call(node.loop, uid, device)
        await dispatch(node, call, frame)
        reply = await call.reply
        if isinstance(reply, Error):
            raise ApiError(ErrorCode(reply.code), reply.text)
        return reply

    # -- messages ------------------------------------------------------------------------

    async def send(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        """A message into `conv_id` as `sender_uid`, or from the server (sender_uid 0: a
        system message carrying {"event": "notice", "text", "data"}): SEND itself."""
        sender = as_id(field(body, "sender_uid"), "sender_uid", zero=True)
        try:
            key = client_msg_id(field(body, "client_msg_id"))
        except FieldError as e:
            raise ApiError(ErrorCode.BAD_REQUEST, f"client_msg_id {e}") from None
        if sender == SERVER_UID:
            if "msg_type" in body or "content_b64" in body:
                raise ApiError(
                    ErrorCode.BAD_REQUEST, 'a system message takes "text" (and "data") only'
                )
            event: dict[str, Any] = {"event": "notice", "by": 0, "uids": []}
            event["text"] = as_str(field(body, "text"), "text")
            if "data" in body:
                if _depth(body["data"]) > DATA_DEPTH_MAX:
                    raise ApiError(
                        ErrorCode.BAD_REQUEST, f"data nests deeper than {DATA_DEPTH_MAX} levels"
                    )
                event["data"] = body["data"]
            try:
                content: bytes = msgpack.packb(event)
            except (OverflowError, TypeError, ValueError) as e:
                raise ApiError(ErrorCode.BAD_REQUEST, f"data cannot be stored: {e}") from e
            msg_type = int(MsgType.SYSTEM)
        else:
            msg_type = body.get("msg_type", int(MsgType.TEXT))
            if type(msg_type) is not int:
                raise ApiError(ErrorCode.BAD_REQUEST, "msg_type must be an integer")
            content = content_of(body)
        ack = await self._call(sender, Send(RID, conv_id, key, msg_type, content))
        assert isinstance(ack, SendAck)
        return 200, {
            "conv_id": out_id(ack.conv_id),
            "seq": out_id(ack.seq),
            "msg_id": str(ack.msg_id),
            "server_ms": ack.server_ms,
        }

    async def messages(self, conv_id: int, query: Mapping[str, list[str]]) -> Result:
        """A page of history: the last `limit` before `before_seq` (0: the newest), or
        with `after_seq` the first `limit` after it; `cursor` (a page's `next_cursor`)
        goes on from where that page ended, the same way. With `as_uid`, as that member
        reads it over TCP (HISTORY / PULL, membership and all); else the whole
        conversation."""
        limit = query_limit(query, MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX)
        given = [name for name in ("cursor", "before_seq", "after_seq") if name in query]
        if len(given) > 1:
            raise ApiError(ErrorCode.BAD_REQUEST, f"give one of {', '.join(given)}")
        if "cursor" in query:
            after, seq = _history_cursor(query["cursor"][0])
        else:
            after = "after_seq" in query
            seq = query_count(query, "after_seq" if after else "before_seq")
        as_uid = query_count(query, "as_uid")
        if as_uid:
            frame = Pull(RID, conv_id, seq, limit) if after else History(RID, conv_id, seq, limit)
            page = await self._call(as_uid, frame)
            assert isinstance(page, PullResult | HistoryResult)
            msgs = [record_json(r) for r in page.msgs]
            seqs = [r.seq for r in page.msgs]
            more = page.has_more
        else:
            store = self._node.store
            if await store.get_conversation(conv_id) is None:
                raise ApiError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
            read = store.read_after if after else store.read_before
            stored, more = await read(conv_id, seq, limit, min_seq=0, max_seq=None)
            msgs = [stored_json(m) for m in stored]
            seqs = [m.seq for m in stored]
        cursor = None
        if more and seqs:
            cursor = f"a{max(seqs)}" if after else f"b{min(seqs)}"
        return 200, {
            "conv_id": out_id(conv_id),
            "has_more": more,
            "next_cursor": cursor,
            "messages": msgs,
        }

    async def recall(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        """RECALL of message `seq` as `uid` (its sender, or the group's owner)."""
        uid = as_id(field(body, "uid"), "uid")
        seq = as_id(field(body, "seq"), "seq")
        ok = await self._call(uid, Recall(RID, conv_id, seq))
        assert isinstance(ok, RecallOk)
        return 200, {
            "conv_id": out_id(conv_id),
            "seq": out_id(seq),
            "recall_seq": out_id(ok.recall_seq),
        }

    async def read(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        """READ as `uid`: its read position moves up to `seq` (never back), and the
        members are told (READ_NOTIFY), as over TCP."""
        uid = as_id(field(body, "uid"), "uid")
        seq = as_count(field(body, "seq"), "seq")
        await self._receipt(receipts.read, uid, "", Read(conv_id, seq))
        return 200, {"conv_id": out_id(conv_id), "uid": out_id(uid), "seq": out_id(seq)}

    async def delivered(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        """DELIVERED as `uid` on `device`: that device's delivered position moves up to
        `seq` (never back)."""
        uid = as_id(field(body, "uid"), "uid")
        device = as_str(field(body, "device"), "device")
        if not DEVICE_RE.fullmatch(device):
            raise ApiError(ErrorCode.BAD_REQUEST, "device must match [A-Za-z0-9_-]{1,32}")
        seq = as_count(field(body, "seq"), "seq")
        await self._receipt(receipts.delivered, uid, device, Delivered(conv_id, seq))
        return 200, {
            "conv_id": out_id(conv_id),
            "uid": out_id(uid),
            "device": device,
            "seq": out_id(seq),
        }

    async def _receipt(
        self, handler: Callable[..., Awaitable[None]], uid: int, device: str, frame: Any
    ) -> None:
        """A TCP op that answers nothing (READ, DELIVERED), run as `uid`."""
        try:
            await handler(self._node, Call(self._node.loop, uid, device), frame)
        except RequestError as e:
            raise ApiError(e.code, e.text) from None

    # -- conversations -------------------------------------------------------------------

    async def conversation(self, conv_id: int, query: Mapping[str, list[str]]) -> Result:
        store = self._node.store
        conv = await store.get_conversation(conv_id)
        if conv is None:
            raise ApiError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
        members = await store.member_uids(conv_id)
        return 200, {
            "conv_id": out_id(conv.conv_id),
            "kind": "group" if conv.kind == 2 else "p2p",
            "title": conv.title,
            "owner_uid": out_id(conv.owner_uid),
            "created_ms": conv.created_ms,
            "members": [out_id(u) for u in members],
        }

    async def member_page(self, conv_id: int, query: Mapping[str, list[str]]) -> Result:
        """The members in uid order, `limit` at a time after `cursor` (a page's
        `next_cursor`)."""
        limit = query_limit(query, MEMBERS_LIMIT_DEFAULT, MEMBERS_LIMIT_MAX)
        after = 0
        if "cursor" in query:
            raw = query["cursor"][0]
            digits = raw[1:]
            if not (raw[:1] == "u" and digits.isascii() and digits.isdigit() and len(raw) <= 21):
                raise ApiError(ErrorCode.BAD_REQUEST, "cursor was not issued here")
            after = int(digits)
        store = self._node.store
        if await store.get_conversation(conv_id) is None:
            raise ApiError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
        uids = sorted(u for u in await store.member_uids(conv_id) if u > after)
        page = uids[:limit]
        cursor = f"u{page[-1]}" if len(uids) > limit else None
        return 200, {
            "conv_id": out_id(conv_id),
            "members": [out_id(u) for u in page],
            "next_cursor": cursor,
        }

    async def open_p2p(self, body: Mapping[str, Any]) -> Result:
        uid = as_id(field(body, "uid"), "uid")
        peer = as_id(field(body, "peer_uid"), "peer_uid")
        ok = await self._call(uid, OpenP2P(RID, peer))
        assert isinstance(ok, ConvOk)
        return 200, {"conv_id": out_id(ok.conv_id)}

    async def group_create(self, body: Mapping[str, Any]) -> Result:
        owner = as_id(field(body, "owner_uid"), "owner_uid")
        title = as_str(body.get("title", ""), "title")
        uids = as_ids(body.get("uids", []), "uids")
        ok = await self._call(owner, GroupCreate(RID, title, uids))
        assert isinstance(ok, ConvOk)
        return 200, {"conv_id": out_id(ok.conv_id)}

    async def _acting(self, conv_id: int, body: Mapping[str, Any]) -> int:
        """The uid a group change acts as: `by_uid`, or the group's owner."""
        if "by_uid" in body:
            return as_id(body["by_uid"], "by_uid")
        conv = await self._node.store.get_conversation(conv_id)
        if conv is None:
            raise ApiError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
        if not conv.owner_uid:
            raise ApiError(ErrorCode.BAD_REQUEST, f"conversation {conv_id} is not a group")
        return conv.owner_uid

    async def members(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        add = as_ids(body.get("add", []), "add")
        remove = as_ids(body.get("remove", []), "remove")
        by = await self._acting(conv_id, body)
        ok = await self._call(by, GroupMembers(RID, conv_id, add, remove))
        assert isinstance(ok, Ok)
        members = await self._node.store.member_uids(conv_id)
        return 200, {"conv_id": out_id(conv_id), "members": [out_id(u) for u in members]}

    async def title(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        title = as_str(field(body, "title"), "title")
        by = await self._acting(conv_id, body)
        try:
            msg = await conversations.set_title(self._node, by, conv_id, title)
        except RequestError as e:
            raise ApiError(e.code, e.text) from None
        return 200, {"conv_id": out_id(conv_id), "seq": out_id(msg.seq)}

    async def user_conversations(self, uid: int, query: Mapping[str, list[str]]) -> Result:
        """The user's conversations with unread counts, newest activity first: SYNC
        from the start, as `uid` (on `device`, whose delivered positions it shows)."""
        device = query["device"][0] if "device" in query else ""
        if "device" in query and not DEVICE_RE.fullmatch(device):
            raise ApiError(ErrorCode.BAD_REQUEST, "device must match [A-Za-z0-9_-]{1,32}")
        cursor: int | bytes = 0
        if "cursor" in query:
            try:
                cursor = bytes.fromhex(query["cursor"][0])
            except ValueError:
                raise ApiError(ErrorCode.BAD_REQUEST, "cursor was not issued here") from None
        limit = query_limit(query, CONV_LIMIT_DEFAULT, CONV_LIMIT_MAX)
        page = await self._call(uid, Sync(RID, 0, cursor, limit), device)
        assert isinstance(page, SyncResult)
        rows = [
            {
                "conv_id": out_id(r.conv_id),
                "kind": "group" if r.kind == 2 else "p2p",
                "max_seq": out_id(r.max_seq),
                "read_seq": out_id(r.read_seq),
                "delivered_seq": out_id(r.delivered_seq),
                "unread": r.unread,
                "last_active_ms": r.last_active_ms,
                "is_member": r.is_member,
            }
            for r in page.convs
        ]
        next_cursor = page.next_cursor.hex() if isinstance(page.next_cursor, bytes) else None
        out: dict[str, Any] = {"conversations": rows, "next_cursor": next_cursor}
        if page.partial is not None:  # some storage servers did not answer
            out["partial"] = {"missing": page.partial.missing, "servers": page.partial.servers}
        return 200, out

    # -- sessions ------------------------------------------------------------------------

    async def mint_token(self, body: Mapping[str, Any]) -> Result:
        """A client token for `uid` on `device`, valid `ttl_s` seconds, signed with the
        node's first token key (what LOGIN takes): an app backend need not implement the
        token format. Rate-limited for the node (TOKEN_MINT_PER_S, bursts of
        TOKEN_MINT_BURST)."""
        uid = as_id(field(body, "uid"), "uid")
        device = as_str(field(body, "device"), "device")
        if not DEVICE_RE.fullmatch(device):
            raise ApiError(ErrorCode.BAD_REQUEST, "device must match [A-Za-z0-9_-]{1,32}")
        ttl = body.get("ttl_s", TOKEN_TTL_DEFAULT_S)
        if type(ttl) is not int or not TOKEN_TTL_MIN_S <= ttl <= TOKEN_TTL_MAX_S:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"ttl_s must be an integer in {TOKEN_TTL_MIN_S}..{TOKEN_TTL_MAX_S}",
            )
        if not self.token_budget.take(1):
            raise ApiError(ErrorCode.RATE_LIMITED, "token budget spent; slow down")
        kid, _, secret = self._node.config.token_keys[0].partition(":")
        now = int(time.time())
        token = sign_token(kid, secret, uid, device, now + ttl, iat=now)
        return 200, {
            "token": token,
            "uid": out_id(uid),
            "device": device,
            "kid": kid,
            "exp": now + ttl,
        }

    async def presence(self, query: Mapping[str, list[str]]) -> Result:
        """The online devices of each uid, on every node (no visibility rule: the
        backend sees everyone)."""
        uids = list(dict.fromkeys(query_ids(query, "uids")))
        if not uids:
            raise ApiError(ErrorCode.BAD_REQUEST, "uids=1,2,... is required")
        if len(uids) > PRESENCE_MAX_UIDS:
            raise ApiError(ErrorCode.BAD_REQUEST, f"at most {PRESENCE_MAX_UIDS} uids")
        online = await self._node.routes.online(uids)
        return 200, {
            "presence": [
                {"uid": out_id(u), "devices": sorted(r.device for r in online.get(u, ()))}
                for u in uids
            ]
        }

    def _uid_device(self, body: Mapping[str, Any]) -> tuple[int, str | None]:
        uid = as_id(field(body, "uid"), "uid")
        device = body.get("device")
        if device is not None and (type(device) is not str or not DEVICE_RE.fullmatch(device)):
            raise ApiError(ErrorCode.BAD_REQUEST, "device must match [A-Za-z0-9_-]{1,32}")
        return uid, device

    async def kick(self, body: Mapping[str, Any]) -> Result:
        """KICK the uid's sessions (or one device's), on whichever node holds them."""
        uid, device = self._uid_device(body)
        name = as_str(body.get("reason", "auth_revoked"), "reason")
        try:
            reason = KickReason[name.upper()]
        except KeyError:
            names = ", ".join(r.name.lower() for r in KickReason)
            raise ApiError(ErrorCode.BAD_REQUEST, f"reason must be one of {names}") from None
        text = as_str(body.get("text", "kicked by the server"), "text")
        if len(text.encode()) > TEXT_MAX_BYTES:
            raise ApiError(ErrorCode.BAD_REQUEST, f"text over {TEXT_MAX_BYTES} bytes")
        kicked = await self._node.kick(uid, device, reason, text)
        return 200, {"kicked": kicked}

    async def revoke(self, body: Mapping[str, Any]) -> Result:
        """What POST /revoke does, in JSON."""
        uid, device = self._uid_device(body)
        return 200, {"kicked": await self._node.revoke(uid, device)}

    async def broadcast(self, body: Mapping[str, Any]) -> Result:
        """A NOTICE (not stored) to every online device of `uids`, on every node."""
        node = self._node
        uids = list(dict.fromkeys(as_ids(field(body, "uids"), "uids")))
        if not uids:
            raise ApiError(ErrorCode.BAD_REQUEST, "uids is empty")
        if len(uids) > BROADCAST_MAX_UIDS:
            raise ApiError(ErrorCode.BAD_REQUEST, f"at most {BROADCAST_MAX_UIDS} uids a call")
        msg_type = body.get("msg_type", int(MsgType.TEXT))
        if type(msg_type) is not int or not is_client_msg_type(msg_type):
            raise ApiError(ErrorCode.BAD_MSG_TYPE, "msg_type must be 1-4 or 100-127")
        content = content_of(body)
        if len(content) > node.config.max_content:
            raise ApiError(
                ErrorCode.CONTENT_TOO_LARGE, f"content over {node.config.max_content} bytes"
            )
        if not self.broadcast_budget.take(len(uids)):
            raise ApiError(ErrorCode.RATE_LIMITED, "broadcast budget spent; slow down")
        node.deliver(uids, encode(Notice(msg_type, content, int(time.time() * 1000))))
        return 200, {"uids": len(uids)}

    # -- offline push ---------------------------------------------------------------------

    async def push_devices(self, uid: int, query: Mapping[str, list[str]]) -> Result:
        """The devices `uid` registered for push (PUSH_REGISTER), newest first."""
        found = (await self._node.store.push_devices([uid])).get(uid, [])
        found = sorted(found, key=lambda d: d.updated_ms, reverse=True)
        return 200, {
            "uid": out_id(uid),
            "devices": [
                {
                    "device": d.device,
                    "provider": d.provider,
                    "token": d.token,
                    "preview": d.preview,
                    "locale": d.locale,
                    "updated_ms": d.updated_ms,
                }
                for d in found
            ],
        }

    async def push_token_invalid(self, body: Mapping[str, Any]) -> Result:
        """The push service called this token invalid: its registration goes, whichever
        device holds it."""
        provider = as_str(field(body, "provider"), "provider")
        token = as_str(field(body, "token"), "token")
        if not PUSH_PROVIDER_RE.fullmatch(provider):
            raise ApiError(ErrorCode.BAD_REQUEST, "provider must match [a-z0-9_-]{1,16}")
        if not 0 < len(token.encode()) <= PUSH_TOKEN_MAX_BYTES:
            raise ApiError(ErrorCode.BAD_REQUEST, f"token must be 1..{PUSH_TOKEN_MAX_BYTES} bytes")
        return 200, {"deleted": await self._node.store.push_delete(provider, token)}

    async def mute(self, conv_id: int, body: Mapping[str, Any]) -> Result:
        """MUTE as `uid`: no push event for `conv_id` until `until_ms` (0 unmutes)."""
        uid = as_id(field(body, "uid"), "uid")
        until = as_count(field(body, "until_ms"), "until_ms")
        ok = await self._call(uid, Mute(RID, conv_id, until))
        assert isinstance(ok, Ok)
        return 200, {"conv_id": out_id(conv_id), "uid": out_id(uid), "until_ms": until}


def _history_cursor(raw: str) -> tuple[bool, int]:
    """(after, seq) of a history page's `next_cursor`: "a<seq>" or "b<seq>"."""
    if raw[:1] in ("a", "b") and raw[1:].isascii() and raw[1:].isdigit() and len(raw) <= 21:
        seq = int(raw[1:])
        if seq <= MAX_U64:
            return raw[0] == "a", seq
    raise ApiError(ErrorCode.BAD_REQUEST, "cursor was not issued here")


def _json_object(raw: bytes) -> dict[str, Any]:
    """The request body: a JSON object of strict JSON (no NaN or Infinity, nor a number
    too large for a float, which Python's parser would take: a stored one would come
    back as a literal NaN that strict parsers refuse), whose strings are Unicode text
    (no lone surrogate such as "\\ud800", which UTF-8 cannot encode)."""
    try:
        body = json.loads(raw or b"{}", parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(ErrorCode.BAD_REQUEST, f"the body is not JSON: {e}") from None
    except RecursionError:  # nested deeper than the parser's recursion limit
        raise ApiError(ErrorCode.BAD_REQUEST, "the body is not JSON: nested too deep") from None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    if _lone_surrogate(body):
        raise ApiError(ErrorCode.BAD_REQUEST, "the body is not JSON text: a lone surrogate")
    return body


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> bool:
    """Whether a string in a parsed JSON value (a key or a value) holds a surrogate: one
    that no pair completed, escaped ("\\ud800") or encoded as if it were a character."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a number")
    return value


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar: 0, `[]`: 1),
    level by level without recursion, counted up to DATA_DEPTH_MAX + 1 at most."""
    depth = 0
    level = [value]
    while depth <= DATA_DEPTH_MAX:
        containers = [v for v in level if isinstance(v, dict | list)]
        if not containers:
            break
        depth += 1
        level = [x for c in containers for x in (c.values() if isinstance(c, dict) else c)]
    return depth


def dumps(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"
