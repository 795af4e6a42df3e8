"""The page's files ship as they should: the SDK bundle gateway/web/imgw-client.js was
built from the sources in clients/js/src as they are now (its first line names their
hash, computed here exactly as clients/js/scripts/sources-hash.mjs does), and every
file of the page is package data, so `pip install .` alone ships the page. No node, no
browser, no gateway: fast."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from fnmatch import fnmatch
from html.parser import HTMLParser
from pathlib import Path

from gateway.net.websocket import load_pages

REPO = Path(__file__).resolve().parents[2]
JS = REPO / "clients" / "js"
WEB = REPO / "gateway" / "web"
BUNDLE = WEB / "imgw-client.js"
REBUILD = "cd clients/js && npm ci && npm run build:web"
PAGE = ("index.html", "app.js", "style.css", "imgw-client.js")
FIRST_LINE = re.compile(r"// imgw-client (\S+) sources-sha256:([0-9a-f]{64})")


def source_files(root: Path) -> list[str]:
    """Every regular file under root/src, at any depth, symlinks not followed, as its
    path relative to `root` with "/" between the parts, in the order of their UTF-8
    bytes (sources-hash.mjs: `sourceFiles`)."""
    out: list[str] = []

    def walk(rel: str) -> None:
        with os.scandir(root / rel) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    walk(path)
                elif entry.is_file(follow_symlinks=False):
                    out.append(path)

    walk("src")
    return sorted(out, key=lambda p: p.encode())


def sources_hash(root: Path) -> str:
    """SHA-256 over each file's path, a NUL byte and its bytes (`sourcesHash`)."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(path.encode() + b"\0")
        h.update((root / path).read_bytes())
    return h.hexdigest()


def test_the_shipped_bundle_is_built_from_the_sources_as_they_are() -> None:
    first = BUNDLE.read_text(encoding="utf-8").split("\n", 1)[0]
    named = FIRST_LINE.fullmatch(first)
    assert named is not None, (
        f"{BUNDLE.relative_to(REPO)} does not start with the build's banner "
        f"(// imgw-client <version> sources-sha256:<hex>): rebuild it with `{REBUILD}`"
    )
    version = json.loads((JS / "package.json").read_text())["version"]
    built_from, now = named.group(2), sources_hash(JS)
    assert (named.group(1), built_from) == (version, now), (
        f"{BUNDLE.relative_to(REPO)} was built from other sources than clients/js/src "
        f"holds now (bundle: {named.group(1)} sources-sha256:{built_from}; sources: "
        f"{version} sources-sha256:{now}): rebuild it with `{REBUILD}` and commit it "
        "with the sources"
    )


def test_the_hash_follows_the_definition(tmp_path: Path) -> None:
    """Nested folders, names whose UTF-8 order is not their code-point order, and a
    symlink, which is not followed."""
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "a.ts").write_bytes(b"one")
    (src / "b" / "z.ts").write_bytes(b"two")
    (src / "\uff41.ts").write_bytes(b"three")  # fullwidth a: 3 UTF-8 bytes
    (src / "\U0001f600.ts").write_bytes(b"four")  # 4 UTF-8 bytes, sorts after it
    (src / "link.ts").symlink_to(src / "a.ts")
    assert source_files(tmp_path) == [
        "src/a.ts", "src/b/z.ts", "src/\uff41.ts", "src/\U0001f600.ts",
    ]  # fmt: skip
    expected = hashlib.sha256(
        b"src/a.ts\0one" + b"src/b/z.ts\0two"
        + "src/\uff41.ts".encode() + b"\0three" + "src/\U0001f600.ts".encode() + b"\0four"
    ).hexdigest()  # fmt: skip
    assert sources_hash(tmp_path) == expected


def test_every_file_of_the_page_is_package_data() -> None:
    """`pip install .` ships gateway/web/ only as far as these patterns reach."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gateway"]
    files = sorted(p.name for p in WEB.iterdir() if p.is_file())
    assert set(PAGE) <= set(files), f"the page is {PAGE}; gateway/web holds {files}"
    missing = [f for f in files if not any(fnmatch(f"web/{f}", p) for p in patterns)]
    assert missing == [], (
        f"not package data, so `pip install .` would not ship them: {missing}; add a "
        f"pattern to [tool.setuptools.package-data] gateway in pyproject.toml ({patterns})"
    )
    pages = load_pages()
    for name in PAGE:
        assert pages[f"/{name}"][1] == (WEB / name).read_bytes()
    assert pages["/"] == pages["/index.html"]
    assert pages["/style.css"][0] == "text/css"  # a stylesheet the browser will apply


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []  # what the Content-Security-Policy would refuse

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script":
            if not values.get("src"):
                self.inline.append("<script> without src")
            else:
                self.refs.append(values["src"] or "")
        if tag == "style":
            self.inline.append("<style>")
        if tag == "link" and values.get("rel") == "stylesheet":
            self.refs.append(values.get("href") or "")
        for name, _ in attrs:
            if name == "style" or name.startswith("on"):
                self.inline.append(f"{name}= on <{tag}>")


def test_the_page_runs_only_its_own_files() -> None:
    """The gateway serves the page with `script-src 'self'; style-src 'self'`: no
    inline script or style, every file from the page's own folder, no other host."""
    page = _Page()
    page.feed((WEB / "index.html").read_text())
    assert page.inline == []
    assert sorted(page.refs) == ["app.js", "style.css"]
    app = (WEB / "app.js").read_text()
    imports = re.findall(r"""^\s*(?:import|export)\b[^;]*?from\s*["']([^"']+)["']""", app, re.M)
    assert imports == ["./imgw-client.js"]
    assert not re.search(r"\bimport\s*\(", app), "no dynamic import"
    for name in ("index.html", "app.js", "style.css"):
        text = (WEB / name).read_text()
        assert not re.search(r"(?:https?:|wss?:)?//[A-Za-z0-9.-]+[:/]", _code(text)), (
            f"{name} names another host"
        )


def _code(text: str) -> str:
    """`text` less its comments, where URLs may be mentioned."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"(?m)^\s*//.*$", "", text)
