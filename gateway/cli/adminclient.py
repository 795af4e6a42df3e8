"""`imgw drain`: ask a node to drain, by signal or over its admin port, and wait for it
to exit; `imgw revoke`: ask a node's admin port to revoke a uid's tokens.

The commands are synchronous; each admin request runs its own event loop
(`asyncio.run`) around one aiohttp request. An error answer's text is the `message` of
a JSON body `{"error": {"code": ..., "message": ...}}`, or else the body as it came.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from typing import Final

import aiohttp
from yarl import URL

from gateway.net.hostport import split_host_port

POLL_S = 0.2
REQUEST_TIMEOUT_S: Final = 10.0


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
    params = {k: str(v) for k, v in (("rate", rate), ("hint", hint)) if v is not None}
    status, body = _request(host, port, "/drain", params, token)
    if status != 202:
        raise DrainError(f"{admin} answered {status}: {_error_text(body)}")
    print(f"imgw drain: {admin} is draining", file=sys.stderr)
    if wait:
        _wait_until(lambda: not _listening(host, port), timeout, f"node at {admin}")


def revoke_by_admin(admin: str, uid: int, device: str | None, *, token: str = "") -> str:
    """POST /revoke to a node's admin port; its answer."""
    host, port = _split(admin)
    params = {"uid": str(uid)}
    if device is not None:
        params["device"] = device
    status, body = _request(host, port, "/revoke", params, token)
    if status != 200:
        raise DrainError(f"{admin} answered {status}: {_error_text(body)}")
    return body.strip()


def _split(addr: str) -> tuple[str, int]:
    try:
        return split_host_port(addr, default_host="127.0.0.1")
    except ValueError as e:
        raise DrainError(str(e)) from None


def _request(
    host: str, port: int, path: str, params: dict[str, str], token: str
) -> tuple[int, str]:
    """POST `path?params` to the admin port at host:port; the status and the body."""
    url = URL.build(scheme="http", host=host, port=port, path=path, query=params)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return asyncio.run(_post(url, headers, f"{host}:{port}"))


async def _post(url: URL, headers: dict[str, str], where: str) -> tuple[int, str]:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as http,
            http.post(url, headers=headers, allow_redirects=False) as reply,
        ):
            return reply.status, (await reply.read()).decode("utf-8", "replace")
    except TimeoutError as e:  # aiohttp's timeouts are TimeoutErrors too
        raise DrainError(
            f"cannot reach the admin port {where}: no answer in {REQUEST_TIMEOUT_S:g} s"
        ) from e
    except aiohttp.ClientConnectorError as e:  # its OSError says why, without the URL
        raise DrainError(f"cannot reach the admin port {where}: {e.os_error}") from e
    except aiohttp.ClientResponseError as e:  # an answer that is not HTTP
        raise DrainError(f"not an imgw admin port: {where} did not answer in HTTP") from e
    except (aiohttp.ClientError, OSError) as e:
        raise DrainError(f"cannot reach the admin port {where}: {str(e) or repr(e)}") from e


def _error_text(body: str) -> str:
    """The message of a JSON error body ({"error": {"message": ...}}), else the body."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, TypeError, KeyError):
        return body.strip()
    return message if isinstance(message, str) else body.strip()


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
