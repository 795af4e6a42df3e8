"""The browser chat page (gateway/web/) driven in headless Chromium by Playwright: what
tests/browser/test_chat_page.py and the README's screenshot (tests/browser/shoot.py)
share. Chromium is Debian's (`/usr/bin/chromium`), never one Playwright downloads.

Every wait here is bounded: Playwright's waits by `timeout`, in milliseconds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, ConsoleMessage, Locator, Playwright, expect

from tests.browser.chromium import CHROMIUM, CHROMIUM_ARGS

DEV_KEY = "dev:imgw-dev-secret"  # what the page mints its tokens with
WAIT_MS = 15_000  # a page's answer to an action
RECONNECT_MS = 30_000  # a reconnect: the SDK's backoff is capped at 10 s a try
# Chromium reports each failed WebSocket connect on the console: expected while the
# gateway is down, and nothing the page did wrong.
_EXPECTED_CONSOLE = re.compile(r"WebSocket connection to '.*' failed")

expect.set_options(timeout=WAIT_MS)  # Playwright's own default is 5 s


def launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS), timeout=WAIT_MS
    )


class ChatPage:
    """One tab of the chat page, in a browser context of its own (its own
    sessionStorage: a device of its own)."""

    def __init__(self, browser: Browser, url: str, *, width: int = 1000, height: int = 680) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.set_default_timeout(WAIT_MS)
        self.page = self.context.new_page()
        self.problems: list[str] = []  # uncaught exceptions and console errors
        self.uid: int | None = None  # once signed in
        self.page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        self.page.on("console", self._console)
        self.page.goto(url, timeout=WAIT_MS)
        expect(self.page.locator("body")).to_have_attribute("data-ready", "true")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not _EXPECTED_CONSOLE.search(message.text):
            self.problems.append(f"console: {message.text}")

    def by(self, testid: str) -> Locator:
        return self.page.get_by_test_id(testid)

    # -- actions ------------------------------------------------------------------------

    def sign_in(self, uid: int, device: str = "") -> None:
        self.by("uid").fill(str(uid))
        if device:
            self.by("device").fill(device)
        self.by("connect").click()
        expect(self.by("status")).to_have_attribute("data-state", "online")
        expect(self.by("open-p2p")).to_be_visible()
        self.uid = uid

    def open_p2p(self, peer: int) -> int:
        self.by("peer").fill(str(peer))
        self.by("open-p2p").click()
        expect(self.by("conv-title")).to_contain_text(f"chat with {peer}")
        return self.conv_id()

    def create_group(self, title: str, members: str) -> int:
        self.by("group-title").fill(title)
        self.by("group-members").fill(members)
        self.by("create-group").click()
        expect(self.by("conv-title")).to_contain_text(f'group "{title}"')
        return self.conv_id()

    def open_group(self, conv_id: int, title: str) -> None:
        self.by("group-id").fill(str(conv_id))
        self.by("open-group").click()
        expect(self.by("conv-title")).to_contain_text(f'group "{title}"')
        expect(self.by("conv-id")).to_have_text(str(conv_id))

    def conv_id(self) -> int:
        expect(self.by("conv-id")).to_have_text(re.compile(r"^[0-9]+$"))
        return int(self.by("conv-id").inner_text())

    def send(self, text: str) -> None:
        self.by("compose").fill(text)
        self.by("compose").press("Enter")
        expect(self.by("compose")).to_have_value("")

    def type(self, text: str) -> None:
        """Type into the message box without sending."""
        self.by("compose").fill(text)

    # -- what the page shows ------------------------------------------------------------

    def message(self, text: str) -> Locator:
        """The rows of the conversation whose text is exactly `text`."""
        return self.by("message").filter(has=self.by("message-text").get_by_text(text, exact=True))

    def receipt(self, text: str) -> Locator:
        """What the page says under your message `text`: sent, read by..."""
        return self.message(text).get_by_test_id("receipt")

    def expect_message(self, text: str, timeout: int = WAIT_MS) -> Locator:
        row = self.message(text)
        expect(row).to_have_count(1, timeout=timeout)
        return row

    def expect_state(self, state: str, timeout: int = WAIT_MS) -> None:
        expect(self.by("status")).to_have_attribute("data-state", state, timeout=timeout)

    def texts(self) -> list[str]:
        """The text of every message row, in order."""
        return [t.strip() for t in self.by("message-text").all_inner_texts()]

    def seqs(self) -> list[int]:
        """The seq of every message row, in order (all of them acked)."""
        seqs = self.by("message").evaluate_all("rows => rows.map(r => r.dataset.seq ?? '')")
        return [int(s) for s in seqs]

    def notes(self) -> list[str]:
        return [" ".join(t.split()) for t in self.by("note").all_inner_texts()]

    def screenshot(self, path: Path, **options: Any) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), timeout=WAIT_MS, **options)
        return path

    def close(self) -> None:
        self.context.close()
