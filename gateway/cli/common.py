"""What several commands share: the development key and how a usage error is said."""

from __future__ import annotations

import sys
from typing import Final

from gateway.net.hostport import split_host_port

DEV_KEY: Final = "dev:imgw-dev-secret"
"""Used by `imgw serve` on a loopback address when no key is configured, and by `imgw
chat` and `imgw token` by default, so a first try needs no setup. Never for production:
the gateway refuses to use it on a non-loopback address."""


def usage_error(command: str, problem: str | None) -> int:
    """Print `problem` (if any) as the command's usage error; 2 when there was one."""
    if problem is None:
        return 0
    print(f"imgw {command}: {problem}", file=sys.stderr)
    return 2


def bad_address(option: str, spec: str | None) -> str | None:
    if spec is None:
        return None
    try:
        split_host_port(spec, default_host="127.0.0.1")
    except ValueError as e:
        return f"{option}: {e}"
    return None
