"""The protocol package performs no I/O: importing it pulls in no event loop or socket."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_protocol_imports_no_asyncio_or_socket() -> None:
    code = (
        "import sys, protocol, protocol.codec, protocol.decoder, protocol.token;"
        "bad = {'asyncio', 'socket', 'selectors'} & set(sys.modules);"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
