"""deploy/: what cannot be built here (container images need a registry, systemd a host)
is read and held to the code. Every `imgw` command line in the files parses with the real
argparse parser, flag for flag (a renamed flag fails; abbreviations do not count); every
IMGW_* variable is a setting the gateway reads; the resulting configurations validate;
ports agree between the Dockerfile, compose, HAProxy, Prometheus and the systemd unit;
the stop timeouts cover a drain; the dashboard is valid JSON with unique panel ids over
metric names that a gateway exports (in-process registry here; a running gateway's
/metrics in the slow tier)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import yaml

from gateway.cli import build_parser, config_from_args
from gateway.config import ENV_PREFIX, Config, load
from gateway.hooks.notify import NotifyStage
from gateway.hooks.post import JsonPost
from gateway.hooks.push import PushStage
from gateway.hooks.queue import HookQueue
from gateway.metrics import Metrics
from gateway.supervisor import drain_grace_s
from tests.conftest import StartGateway
from tests.support.proc import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "imgw-dashboard.json"

ENV_NAMES = frozenset(
    {ENV_PREFIX + "CONFIG"} | {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Config)}
)
"""The IMGW_* variables the gateway reads (gateway.config.load)."""

# Exported only with a mysql:// store and a redis:// cache (gateway.metrics.watch_store).
PRODUCTION_ONLY = frozenset(
    f"imgw_recent_cache_{n}_total" for n in ("hits", "misses", "skipped")
)  # fmt: skip


# -- reading the files ------------------------------------------------------------------


def logical_lines(text: str) -> Iterator[str]:
    """Lines with backslash continuations joined; comments and blank lines dropped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    assert not pending, f"dangling continuation: {pending!r}"


@dataclasses.dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]
    env: dict[str, str]
    expose: set[int]


DOCKER_INSTRUCTIONS = frozenset(
    {
        "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
        "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
    }
)  # fmt: skip


def read_dockerfile() -> Dockerfile:
    instructions: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    expose: set[int] = set()
    for line in logical_lines((DEPLOY / "Dockerfile").read_text()):
        word, _, rest = line.partition(" ")
        assert word in DOCKER_INSTRUCTIONS, f"Dockerfile: unknown instruction {word!r}"
        instructions.append((word, rest.strip()))
        if word == "ENV":
            for pair in shlex.split(rest):
                key, eq, value = pair.partition("=")
                assert eq, f"Dockerfile: ENV {pair!r} is not KEY=VALUE"
                env[key] = value
        elif word == "EXPOSE":
            expose |= {int(p.split("/")[0]) for p in rest.split()}
    return Dockerfile(instructions, env, expose)


def exec_form(docker: Dockerfile, word: str) -> list[str]:
    """The JSON (exec) form of the last `word` instruction."""
    values = [rest for w, rest in docker.instructions if w == word]
    assert values, f"Dockerfile: no {word}"
    argv = json.loads(values[-1])
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


def read_unit() -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in logical_lines((DEPLOY / "imgw.service").read_text()):
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None, f"imgw.service: not Key=Value in a section: {line!r}"
        assert key not in current, f"imgw.service: {key} twice"
        current[key] = value
    return sections


def read_env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in logical_lines(path.read_text()):
        key, eq, value = line.partition("=")
        assert eq and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}: {line!r}"
        out[key] = value
    return out


def read_compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:?message}, ${VAR:-default} with the example .env."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in env and (env[name] or not op.startswith(":")):
            return env[name]
        assert "-" in op, f"compose.yaml: ${{{name}}} is not in compose.env.example"
        return arg

    return re.sub(r"\$\{(\w+)(:?[-?])?([^}]*)\}", one, value)


def gateway_services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the imgw image (built from deploy/Dockerfile)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if isinstance(svc.get("build"), dict)
        and svc["build"].get("dockerfile") == "deploy/Dockerfile"
    }


def duration_s(text: str) -> float:
    """Seconds of `90s`, `1m30s`, `2h` (compose, systemd) or a bare number (systemd)."""
    if str(text).isdigit():
        return float(text)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", str(text))
    assert parts and any(parts.groups()), f"not a duration: {text!r}"
    h, m, s = (int(g or 0) for g in parts.groups())
    return h * 3600 + m * 60 + s


# -- the checks -------------------------------------------------------------------------


def _subparser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)parser that reads the options of `argv` (`serve`, `db migrate`, ...)."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def imgw_args(argv: Sequence[str], where: str) -> argparse.Namespace:
    """`imgw ARGV` parsed by the real CLI parser; fails unless it parses and every
    --flag is spelled as the parser defines it (argparse would take an abbreviation, so a
    renamed `--foo` to `--foo-s` would still pass without this)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit:
        pytest.fail(f"{where}: `imgw {shlex.join(argv)}` does not parse", pytrace=False)
    options = {s for a in _subparser(parser, argv)._actions for s in a.option_strings}
    for word in argv:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in options, f"{where}: imgw {argv[0]} has no flag {flag}"
    return args


def serve_config(args: argparse.Namespace, env: Mapping[str, str], where: str) -> Config:
    """The configuration `imgw serve ARGS` gets in environment `env` (the fixture below
    clears every other IMGW_* variable)."""
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in ENV_NAMES)
    assert not unknown, f"{where}: the gateway reads no {unknown}"
    with mock.patch.dict(os.environ, env):
        return config_from_args(args)


@pytest.fixture(autouse=True)
def _no_imgw_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configurations below come from the files only."""
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


def test_flag_check_is_strict() -> None:
    """What keeps the files in step with the CLI: a renamed or abbreviated flag fails."""
    imgw_args(["serve", "--shutdown-timeout", "10"], "ok")
    for argv in (["serve", "--shutdown-timeout-s", "10"], ["serve", "--shutdown-time", "10"]):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            imgw_args(argv, "renamed")


def documented_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of each `imgw COMMAND ...` in deploy/: the README's code blocks, and
    `inline code` in every file."""
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".json"):
        text = path.read_text()
        snippets = re.findall(r"`([^`\n]+)`", text)
        if path.suffix == ".md":
            for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
                snippets += logical_lines(block)
        for snippet in snippets:
            words = shlex.split(snippet, comments=True)
            for i, word in enumerate(words):
                rest = words[i + 1 :]
                if (word == "imgw" or word.endswith("/imgw")) and rest and rest[0] in COMMANDS:
                    yield f"{path.relative_to(ROOT)}: {snippet}", rest


COMMANDS = frozenset({"serve", "db", "drain", "revoke", "token", "chat"})


def test_documented_commands_parse() -> None:
    seen = set()
    for where, argv in documented_commands():
        imgw_args(argv, where)
        seen.add(argv[0])
    assert {"serve", "db", "drain", "token"} <= seen, seen


def test_every_imgw_variable_is_a_setting() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".png"]
    files.append(ROOT / ".dockerignore")
    seen: set[str] = set()
    for path in files:
        for name in re.findall(r"\bIMGW_[A-Z0-9_]+\b", path.read_text()):
            assert name in ENV_NAMES, f"{path.relative_to(ROOT)}: the gateway reads no {name}"
            seen.add(name)
    assert {"IMGW_TOKEN_KEYS", "IMGW_ADMIN_TOKEN", "IMGW_STORE"} <= seen


def test_dockerfile() -> None:
    docker = read_dockerfile()
    froms = [rest for word, rest in docker.instructions if word == "FROM"]
    assert froms and all(f.split()[0] == "python:3.11-slim" for f in froms), froms
    users = [rest for word, rest in docker.instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0"), "the gateway must not run as root"
    cfg = serve_config(imgw_args(exec_form(docker, "CMD"), "Dockerfile CMD"), docker.env, "ENV")
    assert exec_form(docker, "ENTRYPOINT") == ["imgw"]
    assert docker.expose == {cfg.port, cfg.admin_port}, "EXPOSE the client and admin ports"
    health = next(rest for word, rest in docker.instructions if word == "HEALTHCHECK")
    probe = json.loads(health[health.index("CMD") + 3 :])
    assert "/readyz" in " ".join(probe) and f"'{cfg.admin_port}'" in " ".join(probe)
    assert next(rest for word, rest in docker.instructions if word == "STOPSIGNAL") == "SIGTERM"
    # The build copies what `pip install .` needs: the packages pyproject.toml names and
    # the files it refers to; .dockerignore keeps none of them out.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {
        src.rstrip("/")
        for word, rest in docker.instructions
        if word == "COPY" and not rest.startswith("--from")
        for src in rest.split()[:-1]
    }
    needed = {"pyproject.toml", project["project"]["readme"], "LICENSE", *packages}
    assert needed <= copied, f"Dockerfile does not COPY {sorted(needed - copied)}"
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()} - {""}
    assert not (needed & ignored), f".dockerignore excludes {sorted(needed & ignored)}"
    for src in copied:
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"


def test_systemd_unit() -> None:
    unit = read_unit()
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert service["User"] not in ("root", "0") and service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["KillMode"] == "mixed", "SIGTERM to the supervisor only; it drains"
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM"
    exe, *argv = shlex.split(service["ExecStart"])
    assert exe.endswith("/imgw"), exe
    env_file = service["EnvironmentFile"].lstrip("-")
    assert Path(env_file).name == "imgw.env", "imgw.env.example is its template"
    env = read_env_file(DEPLOY / "imgw.env.example")
    cfg = serve_config(imgw_args(argv, "imgw.service"), env, "imgw.env.example")
    cfg.validate()
    docker = read_dockerfile()
    assert (cfg.port, cfg.admin_port) == (
        int(docker.env["IMGW_PORT"]),
        int(docker.env["IMGW_ADMIN_PORT"]),
    ), "the unit and the image use the same ports"
    grace = drain_grace_s(cfg)
    stop = duration_s(service["TimeoutStopSec"])
    assert stop > grace, f"TimeoutStopSec={stop}s does not cover a drain ({grace:.0f}s)"
    if shutil.which("systemd-analyze"):
        out = subprocess.run(
            ["systemd-analyze", "verify", str(DEPLOY / "imgw.service")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # Only what it says about the unit itself (the host may add its own notes);
        # the executable is not installed here.
        problems = [
            line
            for line in (out.stdout + out.stderr).splitlines()
            if "imgw.service" in line and "is not executable" not in line
        ]
        assert not problems, problems


def test_compose() -> None:
    compose = read_compose()
    services: dict[str, dict[str, Any]] = compose["services"]
    example = read_env_file(DEPLOY / "compose.env.example")
    docker = read_dockerfile()
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        deps = svc.get("depends_on", {})
        for dep in deps:
            assert dep in services, f"{name} depends on unknown service {dep}"
            if isinstance(deps, dict):
                assert deps[dep]["condition"] in conditions
        for volume in svc.get("volumes", []):
            src = volume.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"{name} mounts {src}, which does not exist"
    gateways = gateway_services(compose)
    servers = {n: s for n, s in gateways.items() if s["command"][0] == "serve"}
    assert len(servers) >= 2, "two gateways"
    migrate = [n for n, s in gateways.items() if s["command"][:2] == ["db", "migrate"]]
    assert migrate, "a one-shot `imgw db migrate`"
    for name, svc in gateways.items():
        env = {
            **docker.env,
            **{k: interpolate(str(v), example) for k, v in svc["environment"].items()},
        }
        args = imgw_args(svc["command"], f"compose.yaml {name}")
        if name in migrate:
            assert load(env=env).store_url().startswith("mysql://")
            assert svc.get("restart") == "no"
            continue
        cfg = serve_config(args, env, f"compose.yaml {name}")
        cfg.validate()
        assert (cfg.store_url().split(":")[0], cfg.cache.split(":")[0], cfg.bus.split(":")[0]) == (
            "mysql",
            "redis",
            "amqp",
        )
        assert svc["depends_on"][migrate[0]]["condition"] == "service_completed_successfully"
        for port in svc.get("ports", []):
            inside = int(str(port).rsplit(":", 1)[1].split("/")[0])
            assert inside in docker.expose and inside in (cfg.port, cfg.admin_port), port
        grace = drain_grace_s(cfg)
        stop = duration_s(svc["stop_grace_period"])
        assert stop > grace, f"{name}: stop_grace_period {stop}s < a drain ({grace:.0f}s)"
        assert svc["ulimits"]["nofile"]["soft"] >= 65536
    node_ids = [s["command"][s["command"].index("--node-id") + 1] for s in servers.values()]
    assert len(set(node_ids)) == len(node_ids), "every gateway its own node id"


def test_load_balancer_and_prometheus_reach_the_gateways() -> None:
    compose = read_compose()
    docker = read_dockerfile()
    port, admin = int(docker.env["IMGW_PORT"]), int(docker.env["IMGW_ADMIN_PORT"])
    servers = {n for n, s in gateway_services(compose).items() if s["command"][0] == "serve"}
    haproxy = list(logical_lines((DEPLOY / "haproxy.cfg").read_text()))
    backends = {}
    for line in haproxy:
        words = line.split()
        if words[0] == "server":
            host, _, p = words[2].rpartition(":")
            backends[words[1]] = (host, int(p))
    assert backends == {n: (n, port) for n in servers}, backends
    defaults = next(line.split() for line in haproxy if line.startswith("default-server"))
    assert "check" in defaults and int(defaults[defaults.index("port") + 1]) == admin
    assert any("uri /readyz" in line for line in haproxy)
    assert not any("send-proxy" in line for line in haproxy), "imgw speaks no PROXY protocol"
    binds = {int(line.split()[1].rsplit(":", 1)[1]) for line in haproxy if line.startswith("bind")}
    published = {int(str(p).rsplit(":", 1)[1]) for p in compose["services"]["haproxy"]["ports"]}
    assert binds == published, (binds, published)
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    assert targets == {f"{n}:{admin}" for n in servers}


def dashboard_metrics() -> set[str]:
    """The imgw metric names the dashboard's queries use; checks the JSON on the way."""
    dash = json.loads(DASHBOARD.read_text())
    panels = list(dash["panels"])
    panels += [p for row in dash["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names: set[str] = set()
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names |= set(re.findall(r"\bimgw_[a-z0-9_]+\b", target["expr"]))
    for var in dash["templating"]["list"]:
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        names |= set(re.findall(r"\bimgw_[a-z0-9_]+\b", text))
    assert names
    return names


def exposition_names(text: str) -> set[str]:
    """Sample and family names of a Prometheus text exposition (a family with labels and
    no samples yet still has its # TYPE line)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_dashboard_names_are_in_the_registry() -> None:
    """Fast tier: the node's registry, with a bus and a recent-message cache to watch."""
    metrics = Metrics()
    metrics.watch_bus(
        SimpleNamespace(published=0, lost=0, unroutable=0, dead_lettered=0, outages=0)
    )  # type: ignore[arg-type]
    metrics.watch_store(SimpleNamespace(recent_hits=0, recent_misses=0, recent_skipped=0))
    notify = NotifyStage(JsonPost("http://127.0.0.1:9/", what="notify", log=None), node_id="n")
    push = PushStage([], store=None, routes=None, log=None)  # type: ignore[arg-type]
    metrics.watch_hooks(HookQueue([notify, push], log=None))
    exported = exposition_names(metrics.render().decode())
    missing = dashboard_metrics() - exported
    assert not missing, f"the dashboard uses metrics that imgw does not export: {missing}"


async def http_get(port: int, target: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.0\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.backends("embedded", "production")
async def test_dashboard_names_are_on_a_running_gateways_metrics(
    start_gateway: StartGateway, backend: str
) -> None:
    """Slow tier: what a running gateway's admin listener serves (with the hooks on)."""
    admin = free_port()
    unused = f"http://127.0.0.1:{free_port()}/"
    await start_gateway(admin_port=admin, notify_url=unused, push_url=unused)
    status, body = await http_get(admin, "/metrics")
    assert status == 200
    wanted = dashboard_metrics()
    if backend == "embedded":
        wanted -= PRODUCTION_ONLY
    missing = wanted - exposition_names(body)
    assert not missing, f"the dashboard uses metrics that /metrics does not have: {missing}"
