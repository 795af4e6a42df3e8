"""The README's picture of the chat page (docs/images/chat-page.png): two tabs chat
through a fresh `imgw serve --ws-listen` in a temporary directory, and uid 1's tab is
photographed mid-conversation, while 2 is typing.

    .venv/bin/python -m tests.browser.shoot [OUT.png]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from tests.browser.chatpage import DEV_KEY, ChatPage, launch
from tests.browser.chromium import chromium_problem
from tests.support.proc import GatewayProcess, free_port

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "images" / "chat-page.png"


def shoot(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="imgw-shot-") as tmp:
        ws_port = free_port()
        gw = GatewayProcess(
            Path(tmp) / "data", None, "--ws-listen", f"127.0.0.1:{ws_port}", "--token-key", DEV_KEY
        ).start()
        try:
            with sync_playwright() as pw:
                browser = launch(pw)
                try:
                    url = f"http://127.0.0.1:{ws_port}/"
                    one = ChatPage(browser, url, width=960, height=640)
                    two = ChatPage(browser, url, width=960, height=640)
                    one.sign_in(1, "web-laptop")
                    two.sign_in(2, "web-phone")
                    one.open_p2p(2)
                    two.open_p2p(1)
                    one.send("Hi! This is the browser page, on the SDK bundle.")
                    two.expect_message("Hi! This is the browser page, on the SDK bundle.")
                    two.send("Hello from the other tab. Same gateway, over WebSocket.")
                    one.expect_message("Hello from the other tab. Same gateway, over WebSocket.")
                    one.send("Read receipts and typing work too.")
                    receipt = one.message("Read receipts and typing work too.")
                    expect(receipt.get_by_test_id("receipt")).to_have_text("read by 2")
                    two.type("Nice, and")
                    expect(one.by("typing")).to_have_text("2 is typing…")
                    one.page.get_by_test_id("compose").blur()
                    one.screenshot(out)
                finally:
                    browser.close()
        finally:
            gw.kill()


def main() -> int:
    problem = chromium_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    shoot(out)
    print(f"{out}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
