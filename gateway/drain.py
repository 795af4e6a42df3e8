"""`imgw drain`: ask a node to drain, by signal or over its admin port, and wait for it
to exit."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from urllib.parse import urlencode

from gateway.hostport import split_host_port

POLL_S = 0.2


class DrainError(Exception):
    """The drain could not be started or did not finish; the message says why."""


def drain_by_pid(pid: int, *, wait: bool, timeout: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError as e:
        raise DrainError(f"no process {pid}") from e
    except PermissionError as e:
        raise DrainError(f"not allowed to signal process {pid}") from e
    print(f"imgw drain: sent SIGTERM to {pid}", file=sys.stderr)
    if wait:
        _wait_until(lambda: not _alive(pid), timeout, f"process {pid}")


def drain_by_admin(
    admin: str,
    *,
    rate: float | None,
    hint: str | None,
    wait: bool,
    timeout: float,
    token: str = "",
) -> None:
    host, port = _split(admin)
    params = {k: v for k, v in (("rate", rate), ("hint", hint)) if v is not None}
    target = "/drain" + (f"?{urlencode(params)}" if params else "")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    status, body = _request(host, port, f"POST {target} HTTP/1.0\r\n{auth}\r\n")
    if status != 202:
        raise DrainError(f"{admin} answered {status}: {body.strip()}")
    print(f"imgw drain: {admin} is draining", file=sys.stderr)
    if wait:
        _wait_until(lambda: not _listening(host, port), timeout, f"node at {admin}")


def revoke_by_admin(admin: str, uid: int, device: str | None, *, token: str = "") -> str:
    """POST /revoke to a node's admin port; its answer."""
    host, port = _split(admin)
    params: dict[str, str | int] = {"uid": uid}
    if device is not None:
        params["device"] = device
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    status, body = _request(host, port, f"POST /revoke?{urlencode(params)} HTTP/1.0\r\n{auth}\r\n")
    if status != 200:
        raise DrainError(f"{admin} answered {status}: {body.strip()}")
    return body.strip()


def _split(addr: str) -> tuple[str, int]:
    try:
        return split_host_port(addr, default_host="127.0.0.1")
    except ValueError as e:
        raise DrainError(str(e)) from None


def _request(host: str, port: int, text: str) -> tuple[int, str]:
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(text.encode())
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
    except OSError as e:
        raise DrainError(f"cannot reach the admin port {host}:{port}: {e}") from e
    head, _, body = b"".join(chunks).decode("latin-1").partition("\r\n\r\n")
    try:
        return int(head.split()[1]), body
    except (IndexError, ValueError) as e:
        raise DrainError(f"not an imgw admin port: {head[:80]!r}") from e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process that its parent has not reaped yet is a zombie: gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def _wait_until(done: object, timeout: float, what: str) -> None:
    assert callable(done)
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise DrainError(f"{what} still running after {timeout:g} s")
        time.sleep(POLL_S)
    print(f"imgw drain: {what} has exited", file=sys.stderr)
