"""An independent client written from docs/protocol.md alone.

This module talks to a gateway subprocess with a blocking `socket` and `msgpack`
only, or over WebSocket with the `websockets` library's blocking client (each test
runs on both, unless it is about the TCP framing itself: `tcp_only`). It deliberately
imports nothing from this project: frames, tokens and codes are built from the
normative spec, so a mistake shared by the project's own codec and its server cannot
hide here.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

# --- Settings the fixture starts the gateway with --------------------------------

KID = "raw"
SECRET = "rawsecret"
LOGIN_TIMEOUT = 2
IDLE = 4
HB = 2
RECALL_WINDOW = 2
# Defaults from the spec (the fixture does not override them).
MAX_FRAME = 65536
MAX_CONTENT = 2048
DEFAULT_MSG_LIMIT = 50
MAX_MSG_LIMIT = 200
DEFAULT_CONV_LIMIT = 100
RATE_BURST = 200

READ_TIMEOUT = 5.0

# --- Op codes (section 3) -------------------------------------------------------

LOGIN, LOGIN_OK, PING, PONG = 1, 2, 3, 4
SEND, SEND_ACK, PUSH, DELIVERED, READ, READ_NOTIFY = 10, 11, 20, 21, 22, 23
TYPING, TYPING_NOTIFY, PRESENCE, PRESENCE_RESULT = 24, 25, 26, 27
SYNC, SYNC_RESULT, PULL, PULL_RESULT = 30, 31, 32, 33
HISTORY, HISTORY_RESULT, SYNC_HINT = 34, 35, 36
RECALL, RECALL_OK = 40, 41
OPEN_P2P, CONV_OK, GROUP_CREATE, GROUP_MEMBERS = 50, 51, 52, 54
OK, GROUP_INFO, GROUP_INFO_RESULT = 55, 56, 57
KICK, LOGOUT, ERROR = 60, 62, 127

# Server frames that answer a request (element 1 is the echoed rid).
REPLY_OPS = frozenset(
    {
        LOGIN_OK,
        SEND_ACK,
        PRESENCE_RESULT,
        SYNC_RESULT,
        PULL_RESULT,
        HISTORY_RESULT,
        RECALL_OK,
        CONV_OK,
        OK,
        GROUP_INFO_RESULT,
        ERROR,
    }
)

# --- ERROR codes and KICK reasons (section 5) -----------------------------------

BAD_FRAME, FRAME_TOO_LARGE, UNKNOWN_OP, BAD_REQUEST = 1, 2, 3, 4
NOT_LOGGED_IN, AUTH_FAILED, VERSION_UNSUPPORTED = 10, 11, 12
NOT_MEMBER, NO_SUCH_CONVERSATION, CONTENT_TOO_LARGE, BAD_MSG_TYPE = 20, 21, 22, 23
RATE_LIMITED, RECALL_DENIED, IDEMPOTENCY_CONFLICT = 24, 25, 26
FORBIDDEN, NO_SUCH_MESSAGE = 27, 28

KICK_DUPLICATE_LOGIN, KICK_AUTH_REVOKED = 1, 3

MT_TEXT, MT_IMAGE, MT_VOICE, MT_FILE, MT_RECALL, MT_SYSTEM = 1, 2, 3, 4, 5, 6

# Only the frame's own timing matters; uids are unique per test so tests that share
# the module's gateway never see each other's conversations.
_uids = itertools.count(10_000)
_cmids = itertools.count(1)


def new_uid() -> int:
    return next(_uids)


def new_cmid() -> str:
    return f"raw-{os.getpid()}-{next(_cmids)}"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def now_ms() -> int:
    return int(time.time() * 1000)


# --- Tokens (section 2, "Tokens") -------------------------------------------------


def make_token(
    uid: int | str,
    device: str,
    *,
    kid: str = KID,
    secret: str = SECRET,
    exp: int | None = None,
) -> str:
    if exp is None:
        exp = int(time.time()) + 3600
    signed = f"v1.{kid}.{uid}.{device}.{exp}"
    mac = hmac.new(secret.encode("utf-8"), signed.encode("utf-8"), hashlib.sha256).digest()
    sig = base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")
    return f"{signed}.{sig}"


def login_map(uid: int, device: str, **token_kw: Any) -> dict[str, Any]:
    return {"v": 1, "uid": uid, "device": device, "token": make_token(uid, device, **token_kw)}


# --- Framing ---------------------------------------------------------------------


def encode(frame: Any) -> bytes:
    body = msgpack.packb(frame, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def decode_body(body: bytes) -> Any:
    # unpackb raises on trailing bytes: the server must obey the framing rules too.
    return msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)


class Closed(Exception):
    """The server closed the connection."""


class Conn:
    """One client connection: TCP (frames are LEN + body), or WebSocket (`ws_port`:
    one binary message per frame body, docs/protocol.md "WebSocket")."""

    def __init__(self, port: int, ws_port: int | None = None) -> None:
        self.ws: ClientConnection | None = None
        self._stack = contextlib.ExitStack()
        if ws_port is not None:
            self.ws = self._stack.enter_context(
                ws_connect(
                    f"ws://127.0.0.1:{ws_port}/ws",
                    compression=None,
                    ping_interval=None,
                    max_size=None,
                    open_timeout=READ_TIMEOUT,
                )
            )
        else:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT)
        self.buf = bytearray()
        self.stash: list[list[Any]] = []
        self._rids = itertools.count(1)
        self.uid: int | None = None
        self.device: str | None = None
        self.login_ok: dict[str, Any] | None = None

    def rid(self) -> int:
        return next(self._rids)

    def close(self) -> None:
        if self.ws is not None:
            self._stack.close()
        else:
            self.sock.close()

    # -- writing
    def send_raw(self, data: bytes) -> None:
        """Bytes as TCP carries them. On WebSocket each whole frame of `data` goes as one
        message (a tcp_only test is one that sends part of a frame)."""
        if self.ws is None:
            self.sock.sendall(data)
            return
        while data:
            assert len(data) >= 4, "part of a LEN: a TCP-only test"
            (n,) = struct.unpack(">I", data[:4])
            assert len(data) >= 4 + n, "part of a frame: a TCP-only test"
            self.ws.send(data[4 : 4 + n])
            data = data[4 + n :]

    def send(self, *frames: Any) -> None:
        if self.ws is not None:
            for f in frames:
                self.ws.send(msgpack.packb(f, use_bin_type=True))
            return
        self.sock.sendall(b"".join(encode(f) for f in frames))

    # -- reading
    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete frame (have {len(self.buf)} of {n} bytes)")
            if self.ws is not None:
                try:
                    message = self.ws.recv(timeout=remaining)
                except ConnectionClosed:
                    raise Closed from None
                assert isinstance(message, bytes), f"server sent a text message: {message!r}"
                assert message, "server sent an empty message"
                self.buf += struct.pack(">I", len(message)) + message  # one frame
                continue
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                assert not self.buf, f"connection closed inside a frame: {bytes(self.buf)!r}"
                raise Closed
            self.buf += chunk

    def read_frame(self, timeout: float = READ_TIMEOUT) -> list[Any]:
        deadline = time.monotonic() + timeout
        self._fill(4, deadline)
        (n,) = struct.unpack(">I", self.buf[:4])
        assert n > 0, "server sent LEN 0"
        self._fill(4 + n, deadline)
        body = bytes(self.buf[4 : 4 + n])
        del self.buf[: 4 + n]
        frame = decode_body(body)
        assert isinstance(frame, list) and frame, f"server frame is not an array: {frame!r}"
        assert is_int(frame[0]) and frame[0] > 0, f"bad server op: {frame!r}"
        return frame

    def expect(self, pred: Callable[[list[Any]], bool], timeout: float = READ_TIMEOUT) -> list[Any]:
        """The first frame (stashed or new) matching pred; others are stashed."""
        for i, f in enumerate(self.stash):
            if pred(f):
                return self.stash.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"expected frame not received; stashed: {self.stash!r}")
            try:
                f = self.read_frame(remaining)
            except TimeoutError:
                raise AssertionError(
                    f"expected frame not received; stashed: {self.stash!r}"
                ) from None
            if pred(f):
                return f
            self.stash.append(f)

    def expect_op(self, op: int, timeout: float = READ_TIMEOUT) -> list[Any]:
        return self.expect(lambda f: f[0] == op, timeout)

    def reply(self, rid: int, timeout: float = READ_TIMEOUT) -> list[Any]:
        return self.expect(lambda f: f[0] in REPLY_OPS and f[1] == rid, timeout)

    def call(self, op: int, *args: Any) -> list[Any]:
        rid = self.rid()
        self.send([op, rid, *args])
        f = self.reply(rid)
        return f

    def drain(self) -> list[list[Any]]:
        """PING, read up to the PONG; returns every frame received before it."""
        self.send([PING])
        self.expect_op(PONG)
        out, self.stash = self.stash, []
        return out

    def expect_closed(self, timeout: float = READ_TIMEOUT) -> list[list[Any]]:
        """Read until the server closes; returns the frames seen before the close."""
        frames = list(self.stash)
        self.stash = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"connection not closed in {timeout}s; got {frames!r}")
            try:
                frames.append(self.read_frame(remaining))
            except Closed:
                return frames
            except TimeoutError:
                raise AssertionError(
                    f"connection not closed in {timeout}s; got {frames!r}"
                ) from None


def assert_error(frame: list[Any], code: int, rid: int | None = None) -> None:
    assert frame[0] == ERROR, f"expected ERROR {code}, got {frame!r}"
    assert len(frame) == 4, frame
    assert is_int(frame[1]) and is_int(frame[2]) and isinstance(frame[3], str), frame
    assert frame[2] == code, f"expected ERROR code {code}, got {frame!r}"
    if rid is not None:
        assert frame[1] == rid, f"ERROR should echo rid {rid}: {frame!r}"


def assert_error_then_close(c: Conn, code: int, rid: int | None = None) -> list[Any]:
    frames = c.expect_closed()
    assert frames, f"connection closed without ERROR {code}"
    assert len(frames) == 1, f"expected exactly one ERROR before close, got {frames!r}"
    assert_error(frames[0], code, rid)
    return frames[0]


def push_of(conv_id: int, seq: int | None = None) -> Callable[[list[Any]], bool]:
    return lambda f: f[0] == PUSH and f[1] == conv_id and (seq is None or f[2] == seq)


def assert_msg_record(m: list[Any]) -> None:
    assert isinstance(m, list) and len(m) == 7, m
    seq, msg_id, sender, msg_type, content, server_ms, cmid = m
    assert is_int(seq) and seq > 0
    assert is_int(msg_id)
    assert is_int(sender)
    assert is_int(msg_type)
    assert isinstance(content, bytes), f"content must be bin: {m!r}"
    assert is_int(server_ms)
    assert isinstance(cmid, str), f"client_msg_id must be str: {m!r}"


def assert_conv_row(row: list[Any]) -> None:
    assert isinstance(row, list) and len(row) == 8, row
    conv_id, kind, max_seq, read_seq, delivered_seq, unread, last_active, is_member = row
    assert is_int(conv_id) and conv_id > 0
    assert kind in (1, 2) and is_int(kind)
    for v in (max_seq, read_seq, delivered_seq, unread, last_active):
        assert is_int(v) and v >= 0, row
    assert type(is_member) is bool, row


# --- The gateway -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self, port: int, ws_port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.port = port
        self.ws_port = ws_port  # the same gateway's WebSocket listener
        self.proc = proc
        self.log = log


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test runs over TCP and over WebSocket, but those about the TCP framing."""
    if "transport" in metafunc.fixturenames:
        tcp_only = metafunc.definition.get_closest_marker("tcp_only") is not None
        metafunc.parametrize("transport", ["tcp"] if tcp_only else ["tcp", "ws"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("rawgw")
    port, ws_port = _free_port(), _free_port()
    log = tmp / "gateway.log"
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--port",
        str(port),
        "--ws-listen",
        f"127.0.0.1:{ws_port}",
        "--data-dir",
        str(tmp / "data"),
        "--token-key",
        f"{KID}:{SECRET}",
        "--login-timeout",
        str(LOGIN_TIMEOUT),
        "--idle",
        str(IDLE),
        "--hb",
        str(HB),
        "--recall-window",
        str(RECALL_WINDOW),
    ]
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited {proc.returncode}:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", ws_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not listen:\n{log.read_text()}") from None
                time.sleep(0.05)
        yield Gateway(port, ws_port, proc, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("gateway did not exit within 15 s of SIGTERM") from None
        else:
            rc = proc.returncode
        assert rc == 0, f"gateway exit status {rc}:\n{log.read_text()[-4000:]}"


@pytest.fixture
def connect(gateway: Gateway, transport: str) -> Iterator[Callable[[], Conn]]:
    conns: list[Conn] = []

    def _connect() -> Conn:
        c = Conn(gateway.port, gateway.ws_port if transport == "ws" else None)
        conns.append(c)
        return c

    yield _connect
    for c in conns:
        c.close()


@pytest.fixture
def login(connect: Callable[[], Conn]) -> Callable[..., Conn]:
    def _login(uid: int | None = None, device: str = "d1") -> Conn:
        uid = new_uid() if uid is None else uid
        c = connect()
        rid = c.rid()
        c.send([LOGIN, rid, login_map(uid, device)])
        f = c.reply(rid)
        assert f[0] == LOGIN_OK, f"login failed: {f!r}"
        c.uid, c.device, c.login_ok = uid, device, f[2]
        return c

    return _login


def open_p2p(c: Conn, peer: int) -> int:
    f = c.call(OPEN_P2P, peer)
    assert f[0] == CONV_OK, f
    assert len(f) == 3 and is_int(f[2]) and f[2] > 0, f
    return int(f[2])


def send_ok(
    c: Conn, conv: int, content: bytes = b"hi", msg_type: int = MT_TEXT, cmid: str | None = None
) -> list[Any]:
    cmid = new_cmid() if cmid is None else cmid
    f = c.call(SEND, conv, cmid, msg_type, content)
    assert f[0] == SEND_ACK, f
    return f


def pull(c: Conn, conv: int, after: int = 0, limit: int = 0) -> tuple[bool, list[list[Any]]]:
    f = c.call(PULL, conv, after, limit)
    assert f[0] == PULL_RESULT, f
    assert len(f) == 5 and f[2] == conv, f
    assert type(f[3]) is bool, f"has_more must be a msgpack bool: {f!r}"
    for m in f[4]:
        assert_msg_record(m)
    return f[3], f[4]


def history(c: Conn, conv: int, before: int = 0, limit: int = 0) -> tuple[bool, list[list[Any]]]:
    f = c.call(HISTORY, conv, before, limit)
    assert f[0] == HISTORY_RESULT, f
    assert len(f) == 5 and f[2] == conv, f
    assert type(f[3]) is bool, f"has_more must be a msgpack bool: {f!r}"
    for m in f[4]:
        assert_msg_record(m)
    return f[3], f[4]


def sync_all(c: Conn, since: Any = 0, limit: int = 0) -> tuple[Any, list[list[Any]]]:
    """One full SYNC pass; returns (next_since, rows of every page)."""
    cursor: Any = 0
    rows: list[list[Any]] = []
    next_since_seen: list[Any] = []
    for _ in range(100):
        f = c.call(SYNC, since, cursor, limit)
        assert f[0] == SYNC_RESULT, f
        assert len(f) == 6, f
        _, _, next_since, next_cursor, has_more, page = f
        assert type(has_more) is bool, f
        assert isinstance(next_since, int | str | bytes), f
        for row in page:
            assert_conv_row(row)
        actives = [r[6] for r in page]
        assert actives == sorted(actives, reverse=True), f"rows not by last_active desc: {page}"
        rows.extend(page)
        next_since_seen.append(next_since)
        if not has_more:
            assert next_cursor == 0, f"next_cursor must be 0 when has_more is false: {f!r}"
            assert all(s == next_since for s in next_since_seen), next_since_seen
            return next_since, rows
        assert next_cursor != 0, f
        cursor = next_cursor
    raise AssertionError("SYNC never finished")


def rows_by_conv(rows: list[list[Any]]) -> dict[int, list[Any]]:
    # The server may list a conversation again; the later listing wins.
    return {r[0]: r for r in rows}


def group_create(c: Conn, title: str, uids: list[int]) -> int:
    f = c.call(GROUP_CREATE, title, uids)
    assert f[0] == CONV_OK, f
    assert len(f) == 3 and is_int(f[2]), f
    return int(f[2])


def sys_push(conv_id: int, event: str) -> Callable[[list[Any]], bool]:
    def pred(f: list[Any]) -> bool:
        if f[0] != PUSH or f[1] != conv_id or f[5] != MT_SYSTEM:
            return False
        ev = msgpack.unpackb(f[6], raw=False)
        return isinstance(ev, dict) and ev.get("event") == event

    return pred


def system_event(m: list[Any]) -> dict[str, Any]:
    assert m[3] == MT_SYSTEM and m[2] == 0 and m[6] == "", m
    ev = msgpack.unpackb(m[4], raw=False)
    assert isinstance(ev, dict), ev
    return ev


# ================================================================================
# Login and session
# ================================================================================


def test_login_ok_fields(connect: Callable[[], Conn]) -> None:
    c = connect()
    uid = new_uid()
    c.send([LOGIN, 7, login_map(uid, "phone")])
    f = c.read_frame()
    assert f[0] == LOGIN_OK and f[1] == 7, f
    assert len(f) == 3 and isinstance(f[2], dict), f
    m = f[2]
    for key in ("node", "hb", "idle", "max_frame", "max_content", "ts"):
        assert key in m, f"LOGIN_OK lacks {key}: {m!r}"
    assert isinstance(m["node"], str) and m["node"]
    for key in ("hb", "idle", "max_frame", "max_content", "ts"):
        assert is_int(m[key]), f"LOGIN_OK {key} must be int: {m!r}"
    assert m["hb"] == HB
    assert m["idle"] == IDLE
    assert m["max_frame"] == MAX_FRAME
    assert m["max_content"] == MAX_CONTENT
    assert abs(m["ts"] - now_ms()) < 60_000, "ts is milliseconds since the epoch"


def test_login_ignores_unknown_map_keys(connect: Callable[[], Conn]) -> None:
    c = connect()
    m = login_map(new_uid(), "d1")
    m["future_key"] = [1, 2, 3]
    c.send([LOGIN, 1, m])
    assert c.read_frame()[0] == LOGIN_OK


def test_login_and_ping_in_one_write(connect: Callable[[], Conn]) -> None:
    c = connect()
    c.send([LOGIN, 1, login_map(new_uid(), "d1")], [PING])
    assert c.read_frame()[0] == LOGIN_OK
    assert c.read_frame() == [PONG]


@pytest.mark.tcp_only
def test_frame_split_across_writes(connect: Callable[[], Conn]) -> None:
    c = connect()
    data = encode([LOGIN, 1, login_map(new_uid(), "d1")])
    for i in (1, 3, 7, len(data) // 2):
        c.send_raw(data[:i])
        data = data[i:]
        time.sleep(0.05)  # let each piece arrive as its own segment
    c.send_raw(data)
    assert c.read_frame()[0] == LOGIN_OK


def test_ping_pong(login: Callable[..., Conn]) -> None:
    c = login()
    c.send([PING])
    assert c.read_frame() == [PONG]


@pytest.mark.tcp_only
def test_ping_bytes_that_complete_a_partial_frame_are_not_a_heartbeat(
    login: Callable[..., Conn],
) -> None:
    """A read that is exactly a PING frame's bytes is answered PONG without decoding,
    but only when no partial frame is waiting: here the same 6 bytes end a SEND's
    content, so they complete that SEND and no PONG comes."""
    c = login()
    conv = open_p2p(c, new_uid())
    ping = encode([PING])
    rid = c.rid()
    data = encode([SEND, rid, conv, new_cmid(), MT_TEXT, b"x" * 10 + ping])
    assert data[-len(ping) :] == ping
    c.send_raw(data[: -len(ping)])
    time.sleep(0.05)  # the rest arrives as its own read
    c.send_raw(ping)
    assert c.reply(rid)[0] == SEND_ACK
    assert [PONG] not in c.stash  # frames that came before the ACK
    assert [PONG] not in c.drain()  # (drain: PING, everything up to its PONG)


def test_extra_array_elements_ignored(login: Callable[..., Conn]) -> None:
    c = login()
    c.send([PING, "future", 1])
    assert c.read_frame() == [PONG]
    peer = new_uid()
    conv = open_p2p(c, peer)
    rid = c.rid()
    c.send([SEND, rid, conv, new_cmid(), MT_TEXT, b"x", "future-element"])
    assert c.reply(rid)[0] == SEND_ACK


@pytest.mark.parametrize(
    "frame",
    [
        [PING],
        [OPEN_P2P, 5, 123],
        [SEND, 9, 1, "c", 1, b"x"],
        [LOGOUT],
        [99, 11],
        [SEND_ACK, 12, 1, 1, 1, 1],
    ],
    ids=["ping", "open_p2p", "send", "logout", "unknown_op", "server_op"],
)
def test_first_frame_not_login(connect: Callable[[], Conn], frame: list[Any]) -> None:
    c = connect()
    c.send(frame)
    rid = frame[1] if len(frame) > 1 else 0
    assert_error_then_close(c, NOT_LOGGED_IN, rid)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x93\x01",  # truncated array
        msgpack.packb(3),  # not an array
        msgpack.packb({"op": 1}),
        msgpack.packb([]),
        msgpack.packb(["login"]),
        msgpack.packb([0]),
        msgpack.packb([-1]),
        msgpack.packb([PING]) + b"\x00",  # trailing bytes
        b"GET / HTTP/1.1\r\n\r\n",
    ],
    ids=[
        "c1",
        "truncated",
        "int",
        "map",
        "empty_array",
        "str_op",
        "op0",
        "op_neg",
        "trailing",
        "http",
    ],
)
def test_garbage_first_frame_is_bad_frame(connect: Callable[[], Conn], body: bytes) -> None:
    c = connect()
    c.send_raw(struct.pack(">I", len(body)) + body)
    assert_error_then_close(c, BAD_FRAME, 0)


def test_garbage_after_login_is_bad_frame_and_closes(login: Callable[..., Conn]) -> None:
    c = login()
    body = b"\xc1\xc1"
    c.send_raw(struct.pack(">I", len(body)) + body)
    assert_error_then_close(c, BAD_FRAME, 0)


def test_len_zero_is_bad_frame(connect: Callable[[], Conn]) -> None:
    c = connect()
    c.send_raw(struct.pack(">I", 0))
    assert_error_then_close(c, BAD_FRAME, 0)


@pytest.mark.tcp_only
@pytest.mark.parametrize("length", [MAX_FRAME + 1, 0xFFFFFFFF])
def test_len_over_max_frame_refused_before_body(connect: Callable[[], Conn], length: int) -> None:
    c = connect()
    # Only the LEN is written: the ERROR must come without any body byte.
    c.send_raw(struct.pack(">I", length))
    assert_error_then_close(c, FRAME_TOO_LARGE)


@pytest.mark.tcp_only
def test_len_over_max_frame_after_login(login: Callable[..., Conn]) -> None:
    c = login()
    c.send_raw(struct.pack(">I", MAX_FRAME + 1))
    assert_error_then_close(c, FRAME_TOO_LARGE)


def test_body_of_exactly_max_frame_accepted(login: Callable[..., Conn]) -> None:
    c = login()
    pad = MAX_FRAME - len(msgpack.packb([PING, b""], use_bin_type=True))
    body = msgpack.packb([PING, b"\x00" * pad], use_bin_type=True)
    # bin16 header is 3 bytes for any size < 65536; adjust if it grew.
    body = msgpack.packb([PING, b"\x00" * (pad - (len(body) - MAX_FRAME))], use_bin_type=True)
    assert len(body) == MAX_FRAME
    c.send_raw(struct.pack(">I", len(body)) + body)
    assert c.read_frame() == [PONG]


@pytest.mark.parametrize(
    "variant", ["bad_sig", "wrong_secret", "wrong_uid", "wrong_device", "unknown_kid", "expired"]
)
def test_auth_failed(connect: Callable[[], Conn], variant: str) -> None:
    uid = new_uid()
    device = "d1"
    m = login_map(uid, device)
    if variant == "bad_sig":
        tok = m["token"]
        m["token"] = tok[:-2] + ("AA" if not tok.endswith("AA") else "BB")
    elif variant == "wrong_secret":
        m["token"] = make_token(uid, device, secret="not-the-secret")
    elif variant == "wrong_uid":
        m["token"] = make_token(uid + 1, device)
    elif variant == "wrong_device":
        m["token"] = make_token(uid, "other")
    elif variant == "unknown_kid":
        m["token"] = make_token(uid, device, kid="nokid")
    elif variant == "expired":
        m["token"] = make_token(uid, device, exp=int(time.time()) - 3600)
    c = connect()
    c.send([LOGIN, 3, m])
    assert_error_then_close(c, AUTH_FAILED, 3)


def test_version_unsupported(connect: Callable[[], Conn]) -> None:
    c = connect()
    m = login_map(new_uid(), "d1")
    m["v"] = 2
    c.send([LOGIN, 4, m])
    assert_error_then_close(c, VERSION_UNSUPPORTED, 4)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.pop("token"),
        lambda m: m.pop("uid"),
        lambda m: m.pop("device"),
        lambda m: m.pop("v"),
        lambda m: m.__setitem__("uid", str(m["uid"])),
        lambda m: m.__setitem__("token", b"bytes-token"),
        lambda m: m.__setitem__("device", 5),
    ],
    ids=["no_token", "no_uid", "no_device", "no_v", "uid_str", "token_bin", "device_int"],
)
def test_login_missing_or_ill_typed_field(
    connect: Callable[[], Conn], mutate: Callable[[dict[str, Any]], Any]
) -> None:
    c = connect()
    m = login_map(new_uid(), "d1")
    mutate(m)
    c.send([LOGIN, 6, m])
    assert_error_then_close(c, BAD_REQUEST, 6)


def test_login_device_outside_pattern_is_bad_request(connect: Callable[[], Conn]) -> None:
    uid = new_uid()
    device = "bad device!"
    c = connect()
    c.send([LOGIN, 8, {"v": 1, "uid": uid, "device": device, "token": make_token(uid, device)}])
    assert_error_then_close(c, BAD_REQUEST, 8)


def test_login_not_a_map_is_bad_request(connect: Callable[[], Conn]) -> None:
    c = connect()
    c.send([LOGIN, 9, [1, 2, 3]])
    assert_error_then_close(c, BAD_REQUEST, 9)


def test_second_login_is_bad_request_connection_kept(login: Callable[..., Conn]) -> None:
    c = login()
    assert c.uid is not None
    rid = c.rid()
    c.send([LOGIN, rid, login_map(c.uid, "d1")])
    assert_error(c.reply(rid), BAD_REQUEST, rid)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


def test_login_timeout(connect: Callable[[], Conn]) -> None:
    c = connect()
    t0 = time.monotonic()
    frames = c.expect_closed(LOGIN_TIMEOUT + 3)
    elapsed = time.monotonic() - t0
    assert len(frames) == 1, frames
    assert_error(frames[0], NOT_LOGGED_IN, 0)
    assert elapsed >= LOGIN_TIMEOUT - 0.25, elapsed


def test_idle_timeout_closes_without_frame(login: Callable[..., Conn]) -> None:
    c = login()
    t0 = time.monotonic()
    frames = c.expect_closed(IDLE + 2)
    elapsed = time.monotonic() - t0
    assert frames == [], f"idle close must send no frame: {frames!r}"
    assert elapsed >= IDLE - 0.5, f"closed after {elapsed:.2f}s, before idle={IDLE}s"


def test_pings_keep_connection_alive(login: Callable[..., Conn]) -> None:
    c = login()
    end = time.monotonic() + IDLE + 2
    while time.monotonic() < end:
        c.send([PING])
        assert c.expect_op(PONG) == [PONG]
        time.sleep(1)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


def test_duplicate_login_kicks_older(login: Callable[..., Conn]) -> None:
    uid = new_uid()
    old = login(uid, "tab")
    new = login(uid, "tab")
    frames = old.expect_closed()
    assert frames, "older connection closed without KICK"
    kick = frames[0]
    assert kick[0] == KICK, frames
    assert len(kick) == 4, kick
    assert kick[1] == KICK_DUPLICATE_LOGIN, kick
    assert isinstance(kick[2], str) and isinstance(kick[3], str), kick
    assert len(frames) == 1, frames
    new.send([PING])
    assert new.expect_op(PONG) == [PONG]
    # The newer connection is the one online. (Presence shows those who have shown up
    # in a conversation shared with the asker: here, the owner of a group it is in.)
    asker_uid = new_uid()
    asker = login(asker_uid)
    group_create(new, "g", [asker_uid])
    f = asker.call(PRESENCE, [uid])
    assert f[2] == [[uid, ["tab"]]], f


def test_logout_closes_and_removes_route(login: Callable[..., Conn]) -> None:
    a = login()
    b = login(device="laptop")
    assert a.uid is not None and b.uid is not None
    group_create(b, "g", [a.uid])  # b owns a group a is in: a sees b's presence
    assert a.call(PRESENCE, [b.uid])[2] == [[b.uid, ["laptop"]]]
    b.send([LOGOUT])
    frames = b.expect_closed()
    assert all(f[0] != ERROR for f in frames), frames
    f = a.call(PRESENCE, [b.uid])
    assert f[0] == PRESENCE_RESULT and f[2] == [[b.uid, []]], f


def test_token_expiry_kicks_auth_revoked(connect: Callable[[], Conn]) -> None:
    # exp 57 s in the past: accepted only if the leeway is at least 57 s (the spec
    # allows at most 60). If accepted, KICK auth_revoked must follow once
    # now > exp + leeway, i.e. within about 3 s.
    uid = new_uid()
    exp = int(time.time()) - 57
    c = connect()
    c.send([LOGIN, 1, login_map(uid, "d1", exp=exp)])
    f = c.read_frame()
    if f[0] == ERROR:
        assert_error(f, AUTH_FAILED, 1)
        assert c.expect_closed() == []
        return
    assert f[0] == LOGIN_OK, f
    frames = c.expect_closed(timeout=max(1.0, exp + 60 - time.time()) + 3)
    assert frames, "connection closed without KICK auth_revoked"
    assert frames[-1][0] == KICK and frames[-1][1] == KICK_AUTH_REVOKED, frames
    assert time.time() > exp + 57, "kicked before now > exp + leeway"


# ================================================================================
# Unknown ops and malformed requests after login
# ================================================================================


def test_unknown_op_echoes_rid_and_keeps_connection(login: Callable[..., Conn]) -> None:
    c = login()
    c.send([99, 4242, "x"])
    assert_error(c.expect_op(ERROR), UNKNOWN_OP, 4242)
    c.send([99, "not-an-int"])
    assert_error(c.expect_op(ERROR), UNKNOWN_OP, 0)
    c.send([98])
    assert_error(c.expect_op(ERROR), UNKNOWN_OP, 0)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


@pytest.mark.parametrize(
    ("frame", "rid"),
    [
        ([SEND_ACK, 5, 1, 1, 1, 1], 5),
        ([LOGIN_OK, 6, {}], 6),
        ([PUSH, 7, 1, 1, 1, 1, b"", 1, ""], 7),
        ([ERROR, 8, 1, "x"], 8),
        ([PONG], 0),
        ([SYNC_HINT], 0),
        ([KICK, 1, "", ""], 1),
    ],
    ids=["send_ack", "login_ok", "push", "error", "pong", "sync_hint", "kick"],
)
def test_server_op_from_client_is_unknown_op(
    login: Callable[..., Conn], frame: list[Any], rid: int
) -> None:
    c = login()
    c.send(frame)
    assert_error(c.expect_op(ERROR), UNKNOWN_OP, rid)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


@pytest.mark.parametrize(
    "frame",
    [
        [DELIVERED, "x", "y"],
        [DELIVERED, 1],
        [DELIVERED, 1, b"\x01"],
        [READ, "x", 1],
        [READ, 1, -1],
        [TYPING, "x"],
        [TYPING],
    ],
    ids=[
        "delivered_str",
        "delivered_short",
        "delivered_bin",
        "read_str",
        "read_neg",
        "typing",
        "typing_short",
    ],
)
def test_ridless_frame_with_wrong_types_is_bad_request_rid0(
    login: Callable[..., Conn], frame: list[Any]
) -> None:
    c = login()
    c.send(frame)
    assert_error(c.expect_op(ERROR), BAD_REQUEST, 0)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


@pytest.mark.parametrize(
    "args",
    [
        [OPEN_P2P, "peer"],
        [OPEN_P2P, 0],
        [SEND, "conv", "c", 1, b"x"],
        [SEND, 1, 5, 1, b"x"],
        [SEND, 1, "c", 1, "content-as-str"],
        [SEND, 1, "c", 1],
        [PULL, 1, "a", 0],
        [HISTORY, 1, 0],
        [PRESENCE, 5],
        [GROUP_CREATE, 5, []],
        [GROUP_INFO, "x"],
        [RECALL, 1],
    ],
    ids=[
        "p2p_str",
        "p2p_zero",
        "send_conv_str",
        "send_cmid_int",
        "send_content_str",
        "send_short",
        "pull_after_str",
        "history_short",
        "presence_int",
        "group_title_int",
        "group_info_str",
        "recall_short",
    ],
)
def test_request_with_wrong_types_is_bad_request(
    login: Callable[..., Conn], args: list[Any]
) -> None:
    c = login()
    rid = c.rid()
    c.send([args[0], rid, *args[1:]])
    assert_error(c.reply(rid), BAD_REQUEST, rid)
    c.send([PING])
    assert c.expect_op(PONG) == [PONG]


# ================================================================================
# Conversations and messaging
# ================================================================================


def test_open_p2p_idempotent_and_self_is_bad_request(login: Callable[..., Conn]) -> None:
    a = login()
    b = login()
    assert a.uid is not None and b.uid is not None
    conv = open_p2p(a, b.uid)
    assert open_p2p(a, b.uid) == conv
    assert open_p2p(b, a.uid) == conv
    other = open_p2p(a, new_uid())
    assert other != conv
    f = a.call(OPEN_P2P, a.uid)
    assert_error(f, BAD_REQUEST)


def test_send_ack_push_and_fanout(login: Callable[..., Conn]) -> None:
    alice_uid, bob_uid = new_uid(), new_uid()
    a1 = login(alice_uid, "phone")
    a2 = login(alice_uid, "laptop")
    b = login(bob_uid, "phone")
    conv = open_p2p(a1, bob_uid)
    cmid = new_cmid()
    rid = a1.rid()
    before = now_ms()
    a1.send([SEND, rid, conv, cmid, MT_TEXT, b"hello bob"])
    ack = a1.reply(rid)
    assert ack[0] == SEND_ACK, ack
    assert len(ack) == 6, ack
    _, arid, aconv, seq, msg_id, server_ms = ack
    assert arid == rid and aconv == conv
    assert is_int(seq) and seq > 0
    assert is_int(msg_id) and msg_id > 0
    assert is_int(server_ms) and before - 60_000 < server_ms < now_ms() + 60_000

    expected = [PUSH, conv, seq, msg_id, alice_uid, MT_TEXT, b"hello bob", server_ms, cmid]
    push = b.expect(push_of(conv, seq))
    assert len(push) == 9, push
    assert push == expected
    # The sender's other device sees its own message too.
    assert a2.expect(push_of(conv, seq)) == expected
    # The sending connection does not.
    assert not [f for f in a1.drain() if f[0] == PUSH], "sending connection got its own PUSH"


def test_pipelined_sends_get_increasing_seqs(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    rids = [a.rid() for _ in range(30)]
    a.send(*[[SEND, r, conv, new_cmid(), MT_TEXT, f"m{i}".encode()] for i, r in enumerate(rids)])
    acks = [a.reply(r) for r in rids]
    assert all(f[0] == SEND_ACK for f in acks), acks
    seqs = [f[3] for f in acks]
    assert all(x < y for x, y in itertools.pairwise(seqs)), seqs
    _, msgs = pull(a, conv, 0, 200)
    assert [m[4] for m in msgs] == [f"m{i}".encode() for i in range(30)]


def test_idempotent_resend_and_conflict(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    conv2 = open_p2p(a, new_uid())
    cmid = new_cmid()
    ack = send_ok(a, conv, b"once", cmid=cmid)
    again = send_ok(a, conv, b"once", cmid=cmid)
    assert again[2:] == ack[2:], (ack, again)
    # Another connection of the same user, same answer.
    assert a.uid is not None
    a2 = login(a.uid, "other")
    again2 = send_ok(a2, conv, b"once", cmid=cmid)
    assert again2[2:] == ack[2:]
    _, msgs = pull(a, conv)
    assert len([m for m in msgs if m[6] == cmid]) == 1

    for args in (
        [conv, cmid, MT_TEXT, b"twice"],
        [conv, cmid, MT_IMAGE, b"once"],
        [conv2, cmid, MT_TEXT, b"once"],
    ):
        assert_error(a.call(SEND, *args), IDEMPOTENCY_CONFLICT)
    a.send([PING])
    assert a.expect_op(PONG) == [PONG]


@pytest.mark.parametrize("cmid", ["", "x" * 65], ids=["empty", "65_bytes"])
def test_client_msg_id_length(login: Callable[..., Conn], cmid: str) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    assert_error(a.call(SEND, conv, cmid, MT_TEXT, b"x"), BAD_REQUEST)
    send_ok(a, conv, cmid="y" * 64)


def test_msg_types(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    for mt in (MT_RECALL, MT_SYSTEM, 0, 7, 50, 99, 128, 255):
        assert_error(a.call(SEND, conv, new_cmid(), mt, b"x"), BAD_MSG_TYPE)
    for mt in (MT_TEXT, MT_IMAGE, MT_VOICE, MT_FILE, 100, 127):
        send_ok(a, conv, b"ok", msg_type=mt)


def test_content_size(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    assert_error(
        a.call(SEND, conv, new_cmid(), MT_TEXT, b"x" * (MAX_CONTENT + 1)), CONTENT_TOO_LARGE
    )
    ack = send_ok(a, conv, b"y" * MAX_CONTENT)
    _, msgs = pull(a, conv)
    assert [m[4] for m in msgs if m[0] == ack[3]] == [b"y" * MAX_CONTENT]


def test_membership_checks(login: Callable[..., Conn]) -> None:
    a = login()
    stranger = login()
    conv = open_p2p(a, new_uid())
    seq = send_ok(a, conv)[3]
    for op, args in (
        (SEND, [conv, new_cmid(), MT_TEXT, b"x"]),
        (PULL, [conv, 0, 0]),
        (HISTORY, [conv, 0, 0]),
        (RECALL, [conv, seq]),
    ):
        assert_error(stranger.call(op, *args), NOT_MEMBER)
    for frame in ([READ, conv, seq], [DELIVERED, conv, seq], [TYPING, conv]):
        stranger.send(frame)
        assert_error(stranger.expect_op(ERROR), NOT_MEMBER, 0)


@pytest.mark.parametrize("missing", [2**40 + 12_345, 2**64 - 1], ids=["2^40", "u64_max"])
def test_unknown_conversation(login: Callable[..., Conn], missing: int) -> None:
    a = login()
    for op, args in (
        (SEND, [missing, new_cmid(), MT_TEXT, b"x"]),
        (PULL, [missing, 0, 0]),
        (HISTORY, [missing, 0, 0]),
        (GROUP_INFO, [missing]),
    ):
        assert_error(a.call(op, *args), NO_SUCH_CONVERSATION)
    a.send([READ, missing, 1])
    assert_error(a.expect_op(ERROR), NO_SUCH_CONVERSATION, 0)


def test_rate_limit_and_idempotency_first(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    n = 2 * RATE_BURST
    rids = [a.rid() for _ in range(n)]
    cmids = [new_cmid() for _ in range(n)]
    t0 = time.monotonic()
    a.send(*[[SEND, r, conv, m, MT_TEXT, b"r"] for r, m in zip(rids, cmids, strict=True)])
    replies = [a.reply(r, timeout=30) for r in rids]
    elapsed = time.monotonic() - t0
    acked = [(m, f) for m, f in zip(cmids, replies, strict=True) if f[0] == SEND_ACK]
    refused = [f for f in replies if f[0] == ERROR]
    for f in refused:
        assert_error(f, RATE_LIMITED)
    assert len(acked) + len(refused) == n
    assert len(acked) <= RATE_BURST + 100 * elapsed + 2, (len(acked), elapsed)
    if elapsed < 1.5:
        assert refused, "no rate_limited after twice the burst"
    # Refused sends store nothing.
    stored = 0
    after = 0
    while True:
        more, msgs = pull(a, conv, after, 200)
        stored += len(msgs)
        if not more:
            break
        after = msgs[-1][0]
    assert stored == len(acked)
    # A resend of an acked id returns the ack even with the bucket drained.
    cmid, first = acked[0]
    rids2 = [a.rid() for _ in range(5)]
    a.send(*[[SEND, r, conv, cmid, MT_TEXT, b"r"] for r in rids2])
    for r in rids2:
        f = a.reply(r)
        assert f[0] == SEND_ACK and f[2:] == first[2:], f


# ================================================================================
# PULL, HISTORY, SYNC
# ================================================================================


def test_pull_history_paging(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    seqs = [send_ok(a, conv, f"p{i}".encode())[3] for i in range(5)]

    more, msgs = pull(a, conv, 0, 2)
    assert more is True and [m[0] for m in msgs] == seqs[:2]
    more, msgs = pull(a, conv, seqs[1], 2)
    assert more is True and [m[0] for m in msgs] == seqs[2:4]
    more, msgs = pull(a, conv, seqs[3], 2)
    assert more is False and [m[0] for m in msgs] == seqs[4:]
    more, msgs = pull(a, conv, seqs[4], 2)
    assert more is False and msgs == []
    m = pull(a, conv, 0, 1)[1][0]
    assert m[2] == a.uid and m[3] == MT_TEXT and m[4] == b"p0"

    more, msgs = history(a, conv, 0, 2)
    assert more is True and [m[0] for m in msgs] == seqs[3:]
    more, msgs = history(a, conv, seqs[3], 2)
    assert more is True and [m[0] for m in msgs] == seqs[1:3]
    more, msgs = history(a, conv, seqs[1], 2)
    assert more is False and [m[0] for m in msgs] == seqs[:1]
    more, msgs = history(a, conv, 0, 10)
    assert more is False and [m[0] for m in msgs] == seqs


def test_pull_limits_default_and_cap(login: Callable[..., Conn]) -> None:
    a = login()
    b = login()
    assert b.uid is not None
    conv = open_p2p(a, b.uid)
    total = 0
    for c in (a, b):
        rids = [c.rid() for _ in range(110)]
        c.send(*[[SEND, r, conv, new_cmid(), MT_TEXT, b"l"] for r in rids])
        for r in rids:
            assert c.reply(r, timeout=30)[0] == SEND_ACK
        total += 110
    more, msgs = pull(a, conv, 0, 0)
    assert more is True and len(msgs) == DEFAULT_MSG_LIMIT
    more, msgs = pull(a, conv, 0, 100_000)
    assert more is True and len(msgs) == MAX_MSG_LIMIT
    more, rest = pull(a, conv, msgs[-1][0], 100_000)
    assert more is False and len(rest) == total - MAX_MSG_LIMIT
    more, msgs = history(a, conv, 0, 0)
    assert more is True and len(msgs) == DEFAULT_MSG_LIMIT
    assert [m[0] for m in msgs] == sorted(m[0] for m in msgs)
    assert msgs[-1][0] == rest[-1][0]


def test_sync_pages_and_incremental(login: Callable[..., Conn]) -> None:
    a = login()
    n = DEFAULT_CONV_LIMIT + 5
    peers = [new_uid() for _ in range(n)]
    rids = [a.rid() for _ in peers]
    a.send(*[[OPEN_P2P, r, p] for r, p in zip(rids, peers, strict=True)])
    convs = [a.reply(r)[2] for r in rids]
    rids = [a.rid() for _ in convs]
    a.send(*[[SEND, r, c, new_cmid(), MT_TEXT, b"s"] for r, c in zip(rids, convs, strict=True)])
    seq_of = {}
    for r, c in zip(rids, convs, strict=True):
        ack = a.reply(r)
        assert ack[0] == SEND_ACK, ack
        seq_of[c] = ack[3]

    # First page of a pass from since=0 uses the default limit.
    f = a.call(SYNC, 0, 0, 0)
    assert f[0] == SYNC_RESULT and len(f) == 6, f
    assert f[4] is True and len(f[5]) == DEFAULT_CONV_LIMIT, f[:5]
    since1, rows = sync_all(a, 0)
    by = rows_by_conv(rows)
    assert set(convs) <= set(by)
    for c in convs:
        row = by[c]
        assert row[1] == 1 and row[2] == seq_of[c] and row[7] is True, row
        assert row[5] == 0, f"own messages are not unread: {row}"
    # Small pages walk the same set.
    _, rows_small = sync_all(a, 0, limit=7)
    assert set(rows_by_conv(rows_small)) == set(by)

    # Incremental: only conversations that changed since then.
    changed = convs[3]
    new_seq = send_ok(a, changed)[3]
    since2, rows2 = sync_all(a, since1)
    by2 = rows_by_conv(rows2)
    assert changed in by2 and by2[changed][2] == new_seq, rows2
    for c, row in by2.items():
        if c != changed:
            # The server may list a conversation again, but nothing else changed.
            assert row == by[c], (row, by[c])
    _, rows3 = sync_all(a, since2)
    for c, row in rows_by_conv(rows3).items():
        assert row == (by2.get(c) or by[c])


@pytest.mark.parametrize(
    ("since", "cursor"),
    [("nope", 0), (b"\x00garbage", 0), (0, "nope"), (0, 987654321), (-5, 0)],
    ids=["since_str", "since_bin", "cursor_str", "cursor_int", "since_negative"],
)
def test_sync_bogus_since_or_cursor(login: Callable[..., Conn], since: Any, cursor: Any) -> None:
    a = login()
    open_p2p(a, new_uid())
    assert_error(a.call(SYNC, since, cursor, 0), BAD_REQUEST)
    a.send([PING])
    assert a.expect_op(PONG) == [PONG]


def test_read_delivered_unread(login: Callable[..., Conn]) -> None:
    alice_uid, bob_uid = new_uid(), new_uid()
    a1 = login(alice_uid, "phone")
    a2 = login(alice_uid, "laptop")
    b = login(bob_uid)
    conv = open_p2p(b, alice_uid)
    seqs = [send_ok(b, conv, f"u{i}".encode())[3] for i in range(3)]
    send_ok(a1, conv, b"mine")
    _, rows = sync_all(a1)
    row = rows_by_conv(rows)[conv]
    assert row[5] == 3, f"unread counts the peer's 3 messages: {row}"
    max_seq = row[2]

    a1.send([READ, conv, seqs[0]])
    notify = b.expect_op(READ_NOTIFY)
    assert notify == [READ_NOTIFY, conv, alice_uid, seqs[0]], notify
    assert a2.expect_op(READ_NOTIFY) == notify, "reader's other device gets READ_NOTIFY"
    # A lower READ is ignored; a READ above max_seq is clamped.
    a1.send([READ, conv, 0])
    a1.send([READ, conv, max_seq + 1000])
    notify = b.expect_op(READ_NOTIFY)
    assert notify == [READ_NOTIFY, conv, alice_uid, max_seq], notify
    assert not [f for f in b.drain() if f[0] == READ_NOTIFY]
    assert not [f for f in a1.drain() if f[0] == READ_NOTIFY], "no READ_NOTIFY to the reader"
    _, rows = sync_all(a1)
    row = rows_by_conv(rows)[conv]
    assert row[3] == max_seq and row[5] == 0, row
    # Bob's own read position did not move.
    _, rows = sync_all(b)
    assert rows_by_conv(rows)[conv][3] < max_seq

    # DELIVERED: per device, cumulative, clamped.
    a1.send([DELIVERED, conv, seqs[1]])
    a1.send([DELIVERED, conv, seqs[0]])
    a1.drain()
    _, rows = sync_all(a1)
    assert rows_by_conv(rows)[conv][4] == seqs[1]
    _, rows = sync_all(a2)
    assert rows_by_conv(rows)[conv][4] == 0, "delivered_seq is per device"
    a1.send([DELIVERED, conv, max_seq + 50])
    a1.drain()
    _, rows = sync_all(a1)
    assert rows_by_conv(rows)[conv][4] == max_seq


def test_typing(login: Callable[..., Conn]) -> None:
    alice_uid = new_uid()
    a1 = login(alice_uid, "phone")
    a2 = login(alice_uid, "laptop")
    b = login()
    assert b.uid is not None
    conv = open_p2p(a1, b.uid)
    a1.send([TYPING, conv])
    assert b.expect_op(TYPING_NOTIFY) == [TYPING_NOTIFY, conv, alice_uid]
    assert not [f for f in a1.drain() if f[0] == TYPING_NOTIFY]
    assert not [f for f in a2.drain() if f[0] == TYPING_NOTIFY]


def test_presence(login: Callable[..., Conn]) -> None:
    a = login()
    bob_uid = new_uid()
    bob = login(bob_uid, "phone")
    login(bob_uid, "laptop")
    stranger = login()
    offline_contact = new_uid()
    assert a.uid is not None and stranger.uid is not None
    group_create(bob, "bob's", [a.uid])  # bob shows up: he owns a group a is in
    open_p2p(a, stranger.uid)  # opening a p2p with a stranger shows nothing of them
    open_p2p(a, offline_contact)
    f = a.call(PRESENCE, [bob_uid, stranger.uid, offline_contact, bob_uid, a.uid])
    assert f[0] == PRESENCE_RESULT and len(f) == 3, f
    res = f[2]
    assert all(isinstance(e, list) and len(e) == 2 for e in res), res
    uids = [e[0] for e in res]
    assert sorted(uids) == sorted({bob_uid, stranger.uid, offline_contact, a.uid}), res
    got = {e[0]: e[1] for e in res}
    assert sorted(got[bob_uid]) == ["laptop", "phone"]
    assert got[stranger.uid] == [], "strangers are reported offline"
    assert got[offline_contact] == []
    assert got[a.uid] == ["d1"], "asking about yourself is allowed"
    assert a.call(PRESENCE, [])[2] == []


# ================================================================================
# Groups
# ================================================================================


def test_groups(login: Callable[..., Conn]) -> None:
    owner = login()
    m1 = login()
    m2 = login()
    joiner = login()
    outsider = login()
    assert None not in (owner.uid, m1.uid, m2.uid, joiner.uid, outsider.uid)
    o_uid, m1_uid, m2_uid, j_uid = owner.uid, m1.uid, m2.uid, joiner.uid
    conv = group_create(owner, "team", [m1_uid, m2_uid])

    f = m1.call(GROUP_INFO, conv)
    assert f == [GROUP_INFO_RESULT, f[1], conv, "team", o_uid, f[5]], f
    assert sorted(f[5]) == sorted([o_uid, m1_uid, m2_uid])

    _, msgs = pull(m1, conv)
    assert len(msgs) == 1
    created_seq = msgs[0][0]
    ev = system_event(msgs[0])
    assert ev["event"] == "created" and ev["by"] == o_uid and ev["title"] == "team"
    assert ev["uids"] == [o_uid, m1_uid, m2_uid], "created lists every member, owner first"
    _, rows = sync_all(m1)
    row = rows_by_conv(rows)[conv]
    assert row[1] == 2 and row[7] is True, row

    s1 = send_ok(m2, conv, b"before join", cmid=(m2_cmid := new_cmid()))[3]
    assert m1.expect(push_of(conv, s1))[4] == m2_uid

    # Only the owner may add.
    assert_error(m1.call(GROUP_MEMBERS, conv, [j_uid], []), FORBIDDEN)
    assert_error(m1.call(GROUP_MEMBERS, conv, [], [m2_uid]), FORBIDDEN)
    assert_error(outsider.call(GROUP_MEMBERS, conv, [outsider.uid], []), NOT_MEMBER)
    assert_error(outsider.call(GROUP_INFO, conv), NOT_MEMBER)
    assert_error(owner.call(GROUP_MEMBERS, conv, [j_uid], [j_uid]), BAD_REQUEST)

    # Add the joiner and remove m2 in one request: "added" then "removed".
    f = owner.call(GROUP_MEMBERS, conv, [j_uid], [m2_uid])
    assert f[0] == OK and len(f) == 2, f
    added = m1.expect(sys_push(conv, "added"))
    removed = m1.expect(sys_push(conv, "removed"))
    assert added[2] < removed[2]
    assert added[4] == 0 and added[8] == ""
    ev = msgpack.unpackb(added[6], raw=False)
    assert ev == {"event": "added", "by": o_uid, "uids": [j_uid]}, ev
    ev = msgpack.unpackb(removed[6], raw=False)
    assert ev == {"event": "removed", "by": o_uid, "uids": [m2_uid]}, ev
    # The removed member receives its removal as PUSH.
    m2_removed = m2.expect(push_of(conv, removed[2]))
    assert msgpack.unpackb(m2_removed[6], raw=False)["event"] == "removed"
    # The joiner gets pushes as a member.
    joiner.expect(push_of(conv, added[2]))

    # The joiner sees the group from its "added" message onward.
    _, msgs = pull(joiner, conv)
    assert msgs[0][0] == added[2], msgs
    assert system_event(msgs[0])["event"] == "added"
    assert all(m[0] >= added[2] for m in msgs)
    _, msgs = history(joiner, conv)
    assert msgs[0][0] == added[2]
    _, rows = sync_all(joiner)
    jrow = rows_by_conv(rows)[conv]
    assert jrow[3] == added[2] - 1, f"joiner's read position starts before 'added': {jrow}"
    assert jrow[5] == 0, f"system messages are not unread: {jrow}"
    # A seq before the joiner joined is no_such_message.
    assert_error(joiner.call(RECALL, conv, s1), NO_SUCH_MESSAGE)
    assert_error(joiner.call(RECALL, conv, created_seq), NO_SUCH_MESSAGE)

    # The removed member: not_member for requests, but the idempotent resend still acks.
    assert_error(m2.call(SEND, conv, new_cmid(), MT_TEXT, b"x"), NOT_MEMBER)
    f = m2.call(SEND, conv, m2_cmid, MT_TEXT, b"before join")
    assert f[0] == SEND_ACK and f[3] == s1, f
    _, rows = sync_all(m2)
    row = rows_by_conv(rows)[conv]
    assert row[7] is False and row[2] == removed[2], row
    # Presence counts only current memberships, and only members who have shown up
    # (read in the group): the joiner is seen once it has read its "added" message.
    assert m1.call(PRESENCE, [m2_uid])[2] == [[m2_uid, []]]
    assert m1.call(PRESENCE, [j_uid])[2] == [[j_uid, []]]
    joiner.send([READ, conv, added[2]])
    sync_all(joiner)  # a request after it: the READ has been handled
    assert m1.call(PRESENCE, [j_uid])[2] == [[j_uid, ["d1"]]]

    # GROUP_MEMBERS / GROUP_INFO on a p2p conversation.
    p2p = open_p2p(owner, m1_uid)
    assert_error(owner.call(GROUP_INFO, p2p), BAD_REQUEST)
    assert_error(owner.call(GROUP_MEMBERS, p2p, [j_uid], []), BAD_REQUEST)

    # The owner leaves: the earliest remaining member becomes owner.
    f = owner.call(GROUP_MEMBERS, conv, [], [o_uid])
    assert f[0] == OK, f
    left = m1.expect(sys_push(conv, "left"))
    assert msgpack.unpackb(left[6], raw=False) == {"event": "left", "by": o_uid, "uids": [o_uid]}
    f = m1.call(GROUP_INFO, conv)
    assert f[4] == m1_uid and sorted(f[5]) == sorted([m1_uid, j_uid]), f
    # Any member may leave.
    f = joiner.call(GROUP_MEMBERS, conv, [], [j_uid])
    assert f[0] == OK, f


def test_group_read_and_typing_notify(login: Callable[..., Conn]) -> None:
    owner = login()
    m1 = login()
    m2 = login()
    assert m1.uid is not None and m2.uid is not None
    conv = group_create(owner, "small", [m1.uid, m2.uid])
    seq = send_ok(owner, conv, b"hello all")[3]
    m1.send([READ, conv, seq])
    expected = [READ_NOTIFY, conv, m1.uid, seq]
    assert owner.expect_op(READ_NOTIFY) == expected
    assert m2.expect_op(READ_NOTIFY) == expected
    m2.send([TYPING, conv])
    assert owner.expect_op(TYPING_NOTIFY) == [TYPING_NOTIFY, conv, m2.uid]
    assert m1.expect_op(TYPING_NOTIFY) == [TYPING_NOTIFY, conv, m2.uid]
    assert not [f for f in m2.drain() if f[0] == TYPING_NOTIFY]


def test_large_group_no_read_or_typing_notify(login: Callable[..., Conn]) -> None:
    # 101 members: above the 100-member limit for READ_NOTIFY and TYPING_NOTIFY to
    # other members; the reader's own other devices still get READ_NOTIFY.
    owner_uid = new_uid()
    owner = login(owner_uid, "phone")
    owner2 = login(owner_uid, "laptop")
    member = login()
    assert member.uid is not None
    base = 60_000_000 + new_uid() * 2000
    conv = group_create(owner, "large", [member.uid, *range(base, base + 99)])
    info = owner.call(GROUP_INFO, conv)
    assert len(info[5]) == 101
    seq = send_ok(member, conv, b"x")[3]
    owner.send([READ, conv, seq])
    assert owner2.expect_op(READ_NOTIFY) == [READ_NOTIFY, conv, owner_uid, seq]
    owner.send([TYPING, conv])
    owner.drain()
    frames = member.drain()
    assert not [f for f in frames if f[0] in (READ_NOTIFY, TYPING_NOTIFY)], frames


def test_group_size_limit(login: Callable[..., Conn]) -> None:
    owner = login()
    base = 50_000_000 + new_uid() * 2000
    assert_error(owner.call(GROUP_CREATE, "big", list(range(base, base + 1000))), BAD_REQUEST)


# ================================================================================
# Recall
# ================================================================================


def test_recall(login: Callable[..., Conn]) -> None:
    a = login()
    b = login()
    assert a.uid is not None and b.uid is not None
    conv = open_p2p(a, b.uid)
    seq = send_ok(a, conv, b"oops")[3]
    b.expect(push_of(conv, seq))
    other = send_ok(b, conv, b"bob's")[3]

    f = a.call(RECALL, conv, seq)
    assert f[0] == RECALL_OK and len(f) == 4 and f[2] == conv, f
    recall_seq = f[3]
    assert is_int(recall_seq) and recall_seq > other
    push = b.expect(push_of(conv, recall_seq))
    assert push[4] == a.uid and push[5] == MT_RECALL
    assert msgpack.unpackb(push[6]) == [seq]

    _, msgs = pull(b, conv)
    by_seq = {m[0]: m for m in msgs}
    orig = by_seq[seq]
    assert orig[3] == MT_RECALL and orig[4] == b"", orig
    rec = by_seq[recall_seq]
    assert rec[2] == a.uid and rec[3] == MT_RECALL and rec[6] == ""
    assert msgpack.unpackb(rec[4]) == [seq]

    # Again: the first RECALL_OK.
    f2 = a.call(RECALL, conv, seq)
    assert f2[0] == RECALL_OK and f2[2:] == f[2:], f2
    # Only the sender.
    assert_error(b.call(RECALL, conv, seq), RECALL_DENIED)
    assert_error(a.call(RECALL, conv, other), RECALL_DENIED)
    # A recall message is not recallable.
    assert_error(a.call(RECALL, conv, recall_seq), RECALL_DENIED)
    # Unknown seq.
    assert_error(a.call(RECALL, conv, recall_seq + 1000), NO_SUCH_MESSAGE)


def test_recall_window(login: Callable[..., Conn]) -> None:
    a = login()
    conv = open_p2p(a, new_uid())
    seq = send_ok(a, conv, b"late")[3]
    seq2 = send_ok(a, conv, b"early")[3]
    first = a.call(RECALL, conv, seq2)
    assert first[0] == RECALL_OK
    time.sleep(RECALL_WINDOW + 0.5)
    assert_error(a.call(RECALL, conv, seq), RECALL_DENIED)
    # A repeated RECALL returns the first RECALL_OK even after the window.
    again = a.call(RECALL, conv, seq2)
    assert again[0] == RECALL_OK and again[2:] == first[2:], again


# ================================================================================
# Ids are unsigned 64-bit
# ================================================================================


def test_u64_ids_above_2_63(login: Callable[..., Conn]) -> None:
    big_uid = 2**64 - 1 - new_uid()
    a = login()
    conv = open_p2p(a, new_uid())
    send_ok(a, conv)
    # A uid above 2^63 is a valid peer (ids are u64, never 0).
    big_conv = open_p2p(a, big_uid)
    assert open_p2p(a, big_uid) == big_conv
    f = a.call(PRESENCE, [big_uid])
    assert f[0] == PRESENCE_RESULT and f[2] == [[big_uid, []]], f
    more, msgs = pull(a, conv, 2**64 - 1, 0)
    assert more is False and msgs == []
    more, msgs = history(a, conv, 2**64 - 1, 0)
    assert more is False and len(msgs) == 1
    assert_error(a.call(RECALL, conv, 2**64 - 1), NO_SUCH_MESSAGE)
    # A user whose uid exceeds 2^63 logs in and converses.
    b = login(big_uid)
    assert open_p2p(b, a.uid) == big_conv
    ack = send_ok(b, big_conv, b"from a big uid")
    push = a.expect(push_of(big_conv, ack[3]))
    assert push[4] == big_uid
