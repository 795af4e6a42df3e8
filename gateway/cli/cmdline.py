"""The process's own command line, as `ps` and /proc/PID/cmdline show it, without its
secrets: once `imgw serve --store mysql://imgw:PASSWORD@db/imgw --admin-token T` has
started, it shows `mysql://imgw:***@db/imgw --admin-token ***` (gateway.redact's
`redact_argv`), and so do the workers it forks.

Like the mysql client with `-pPASSWORD`, it overwrites the arguments in place, in the
memory the kernel shows as the command line (between the arg_start and arg_end of
/proc/self/stat; Linux only, elsewhere nothing happens). Each argument keeps its length
(the masked text padded with blanks), so the arguments stay where they were. Until then
(the first fraction of a second) the secrets are visible: settings given in the
environment or a config file (deploy/) are never on the command line at all.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.redact import MASK, redact_argv

Redact = Callable[[Sequence[str]], list[str]]


def masked_args(args: Sequence[bytes], redact: Redact = redact_argv) -> list[bytes]:
    """Each argument as it should be shown, at its own length: the masked text padded
    with blanks, or all MASK characters where the masked text is longer than the
    secret it replaces."""
    shown = redact([os.fsdecode(a) for a in args])
    out = []
    for old, new_text in zip(args, shown, strict=True):
        new = os.fsencode(new_text)
        if new == old:
            out.append(old)
        elif len(new) <= len(old):
            out.append(new.ljust(len(old), b" "))
        else:
            out.append(MASK[0].encode() * len(old))
    return out


def hide_secrets(redact: Redact = redact_argv) -> bool:
    """Mask the secrets of this process's command line; whether anything changed."""
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
        stat = Path("/proc/self/stat").read_text()
        # after the command name in parentheses, field 3 on; arg_start and arg_end are
        # fields 48 and 49 (proc(5))
        fields = stat.rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return False
    if end - start != len(raw) or not raw.endswith(b"\0"):
        return False  # not the layout the kernel gave: leave it alone
    if ctypes.string_at(start, len(raw)) != raw:
        return False
    args = raw[:-1].split(b"\0")
    shown = masked_args(args, redact)
    if shown == args:
        return False
    new = b"\0".join(shown) + b"\0"
    assert len(new) == len(raw)
    ctypes.memmove(start, new, len(new))
    return True
