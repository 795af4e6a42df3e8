"""Which Chromium the browser tests drive, with which flags, and whether it is here.
Standard library only: the tests ask it before they import Playwright."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

CHROMIUM = Path(os.environ.get("IMGW_CHROMIUM", "/usr/bin/chromium"))
# Headless, and none of Chromium's own connections: the network here is closed, and
# they only slow the start down and fill the log.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
INSTALL_CHROMIUM = "apt-get install -y --no-install-recommends chromium"


def chromium_problem() -> str | None:
    """Why the browser tests cannot run here, or None. Debian's Chromium, never one
    Playwright downloads (`playwright install` needs the network)."""
    if find_spec("playwright") is None:
        return "Playwright for Python is missing: .venv/bin/pip install -e '.[dev]'"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM}: as root, {INSTALL_CHROMIUM}"
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}
