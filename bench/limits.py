"""Process limits shared by the bench scenarios."""

from __future__ import annotations

import contextlib
import resource


def raise_nofile() -> int:
    """Raise the soft open-file limit to the hard limit (children inherit it); returns
    the new soft limit. This machine's hard limit is 20,000 per process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
