"""The gateway's import graph has no cycle: connections call handlers, the node owns
connections and fan-out, and handlers and fan-out see a connection and the node only
through the Protocols of gateway.ports (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, Path]:
    mods = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, TYPE_CHECKING imports included
    (a cycle through annotations is still a cycle in the design)."""
    mods = _modules(package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name`
                # imports pkg (or the module of pkg that defines nothing else)
                names = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target is not None and target != mod and target != package:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_gateway_has_no_import_cycle() -> None:
    assert cycles(import_graph("gateway")) == []


@pytest.mark.parametrize("package", ["storage", "protocol", "bench"])
def test_the_other_packages_have_no_import_cycle(package: str) -> None:
    assert cycles(import_graph(package)) == []


def test_handlers_and_fanout_do_not_import_connection_or_node() -> None:
    graph = import_graph("gateway")
    users = [m for m in graph if m.startswith("gateway.handlers") or m == "gateway.fanout"]
    for mod in users:
        assert not graph[mod] & {"gateway.connection", "gateway.node"}, mod


def test_protocol_imports_nothing_of_the_other_layers() -> None:
    for path in (ROOT / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] not in {"gateway", "storage", "bench"}, path
