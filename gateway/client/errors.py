"""The client's exceptions (the tree is in the package docstring)."""

from __future__ import annotations

from protocol.frames import Kick
from protocol.ops import ErrorCode, KickReason


def code_name(code: int) -> str:
    """ "auth_failed" for ERROR code 11 and so on."""
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return f"error {code}"


def kick_name(reason: int) -> str:
    """ "shutdown" for KICK reason 5 and so on."""
    try:
        return KickReason(reason).name.lower()
    except ValueError:
        return f"reason {reason}"


class ClientError(Exception):
    """The server answered ERROR `code` (or, with code 0, the request failed locally)."""

    code: int
    text: str

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code_name(code)}: {text}" if code else text)
        self.code = code
        self.text = text


class ConnectionLost(ClientError):
    """The connection dropped, or is down, before the reply came."""

    def __init__(self, text: str) -> None:
        super().__init__(0, text)


class SessionEnded(ConnectionLost):
    """The session is over: closed, logged out, or ended by a KICK (`kick`)."""

    kick: Kick | None

    def __init__(self, text: str, kick: Kick | None = None) -> None:
        super().__init__(text)
        self.kick = kick


class RequestTimeout(ClientError, TimeoutError):
    """No reply within the client's request_timeout."""

    def __init__(self, text: str) -> None:
        ClientError.__init__(self, 0, text)
