"""The browser chat page (gateway/web/, served by `imgw serve --ws-listen` at /) in a
real browser: headless Chromium driven by Playwright, against a real `imgw serve`
process. Two tabs chat as uids 1 and 2, with read receipts and a typing indicator;
then the gateway is killed and started again on the same ports and data, and what each
side typed while it was down arrives on the other exactly once, while both pages say
the connection was lost and is back. A group: created on the page, opened from the
news of it and by its conv_id, with its history.

Chromium is Debian's (`apt-get install chromium`). Where it or Playwright is missing
the tests are skipped, except under CI=true, where that fails them. Screenshots of
every tab stay in the test's tmp dir and are copied to $IMGW_ARTIFACTS when that is
set, pass or fail."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.browser.chromium import chromium_problem, in_ci
from tests.support.proc import GatewayProcess, free_port

if TYPE_CHECKING:
    from tests.browser.chatpage import ChatPage

DEV_KEY = "dev:imgw-dev-secret"  # the page mints its tokens with it


def need_chromium() -> None:
    problem = chromium_problem()
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"{problem} (CI=true: the browser tests must run)", pytrace=False)
    pytest.skip(problem)


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[list[Path]]:
    """The screenshots a test took (in its tmp dir), copied to $IMGW_ARTIFACTS
    afterwards when that is set."""
    taken: list[Path] = []
    yield taken
    target = os.environ.get("IMGW_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for shot in taken:
            shutil.copy2(shot, Path(target) / shot.name)


def page_args(ws_port: int) -> tuple[str, ...]:
    """`imgw serve` flags for the page: its listener, and the key it mints tokens with.
    (Tests start their GatewayProcess themselves: that marks them slow, tiers.py.)"""
    return ("--ws-listen", f"127.0.0.1:{ws_port}", "--token-key", DEV_KEY)


@contextlib.contextmanager
def tabs(
    url: str, tmp_path: Path, shots: list[Path], name: str
) -> Iterator[Callable[[], ChatPage]]:
    """A headless Chromium; yields a function that opens the page in a new tab (a
    context of its own). At the end every tab is photographed (tmp_path /
    `name`-uid<N>.png), and, if all went well, none may have logged an error or
    thrown."""
    from playwright.sync_api import sync_playwright

    from tests.browser.chatpage import ChatPage, launch

    opened: list[ChatPage] = []
    with sync_playwright() as pw:
        browser = launch(pw)

        def open_tab() -> ChatPage:
            opened.append(ChatPage(browser, url))
            return opened[-1]

        try:
            yield open_tab
        finally:
            for i, page in enumerate(opened, 1):
                who = f"uid{page.uid}" if page.uid is not None else f"tab{i}"
                try:
                    shots.append(page.screenshot(tmp_path / f"{name}-{who}.png"))
                except Exception as e:  # the test's own failure says more
                    print(f"no screenshot of {who}: {e}")
            browser.close()
    problems = {page.uid: page.problems for page in opened if page.problems}
    assert problems == {}, f"errors in the pages (by uid): {problems}"


def test_two_tabs_chat_through_a_gateway_restart(tmp_path: Path, shots: list[Path]) -> None:
    need_chromium()
    from playwright.sync_api import expect

    from tests.browser.chatpage import RECONNECT_MS

    ws_port = free_port()
    gw = GatewayProcess(tmp_path / "data", None, *page_args(ws_port)).start()
    url = f"http://127.0.0.1:{ws_port}/"
    try:
        with tabs(url, tmp_path, shots, "chat-page") as open_tab:
            one, two = open_tab(), open_tab()
            one.sign_in(1)
            two.sign_in(2)
            conv = one.open_p2p(2)
            assert two.open_p2p(1) == conv, "OPEN_P2P: both sides land in one conversation"

            # 1 -> 2; 2 shows it, so it reads it: "read by 2" under 1's message.
            one.send("hello from 1")
            two.expect_message("hello from 1")
            expect(one.receipt("hello from 1")).to_have_text("read by 2")

            # 2 types: 1 sees it. 2 sends: the message comes and the indicator goes.
            two.type("hi 1, ")
            expect(one.by("typing")).to_have_text("2 is typing…")
            two.send("hi 1, this is 2")
            one.expect_message("hi 1, this is 2")
            expect(one.by("typing")).to_have_text("")
            expect(two.receipt("hi 1, this is 2")).to_have_text("read by 1")

            # The gateway dies: both pages say so, and what each types meanwhile waits.
            gw.kill()
            one.expect_state("lost")
            two.expect_state("lost")
            one.send("typed by 1 while the gateway was down")
            two.send("typed by 2 while the gateway was down")
            expect(one.receipt("typed by 1 while the gateway was down")).to_contain_text("pending")

            # Started again on the same ports and data: both pages reconnect, catch up
            # and send what waited; each message arrives on the other side and is read.
            gw.start()
            for page in (one, two):
                page.expect_state("back", RECONNECT_MS)
                expect(page.by("status")).to_contain_text("caught up")
            two.expect_message("typed by 1 while the gateway was down", RECONNECT_MS)
            one.expect_message("typed by 2 while the gateway was down", RECONNECT_MS)
            for page, text, reader in (
                (one, "typed by 1 while the gateway was down", 2),
                (two, "typed by 2 while the gateway was down", 1),
            ):
                expect(page.receipt(text)).to_have_text(f"read by {reader}", timeout=RECONNECT_MS)

            everything = [
                "hello from 1",
                "hi 1, this is 2",
                "typed by 1 while the gateway was down",
                "typed by 2 while the gateway was down",
            ]
            for page in (one, two):
                texts = page.texts()
                assert sorted(texts) == sorted(everything), f"each message once: {texts}"
                seqs = page.seqs()
                assert seqs == sorted(set(seqs)), f"in the gateway's order, once each: {seqs}"
                notes = page.notes()
                assert any("connection to the gateway lost" in n for n in notes), notes
                assert any("missed message" in n and "caught up" in n for n in notes), notes
    finally:
        gw.kill()


def test_a_group_from_creation_to_history(tmp_path: Path, shots: list[Path]) -> None:
    """1 creates a group with 2 and 3; 2 opens it from the page's news of it, 3 by its
    conv_id after the first message, and sees the history; receipts and typing name
    every member."""
    need_chromium()
    from playwright.sync_api import expect

    ws_port = free_port()
    gw = GatewayProcess(tmp_path / "data", None, *page_args(ws_port)).start()
    url = f"http://127.0.0.1:{ws_port}/"
    try:
        with tabs(url, tmp_path, shots, "group-page") as open_tab:
            one, two = open_tab(), open_tab()
            one.sign_in(1)
            two.sign_in(2, "laptop")
            conv = one.create_group("team", "2, 3")
            created = '1 created "team" with 2 and 3'
            one.expect_message(created)

            news = two.by("elsewhere-open")
            expect(news).to_have_text(f'group "team" ({conv}): {created}')
            news.click()
            expect(two.by("conv-id")).to_have_text(str(conv))
            two.expect_message(created)

            one.send("hello team")
            two.expect_message("hello team")
            expect(one.receipt("hello team")).to_have_text("read by 2")

            three = open_tab()
            three.sign_in(3)
            three.open_group(conv, "team")
            assert three.texts() == [created, "hello team"], "the history, in order"
            expect(one.receipt("hello team")).to_have_text("read by 2, 3")

            two.type("a")
            three.type("b")
            expect(one.by("typing")).to_have_text("2 and 3 are typing…")
            three.send("hi all, 3 here")
            one.expect_message("hi all, 3 here")
            two.expect_message("hi all, 3 here")
            expect(one.by("typing")).not_to_contain_text("3")  # its message ended it
    finally:
        gw.kill()
