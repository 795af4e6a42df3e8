"""deploy/prometheus-rules.yml: the alerting rules beside the Grafana dashboard. Each
risk an operator must hear about has an alert; every metric the rules read is one a
gateway exports; Prometheus loads the file as compose.yaml and prometheus.yml wire it;
and `promtool` (Debian's `prometheus` package) checks the rules and fires each alert on
series shaped like a gateway's /metrics. Without promtool those checks are skipped,
except under CI=true, where they fail (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gateway.hooks.notify import NotifyStage
from gateway.hooks.post import JsonPost
from gateway.hooks.push import PushStage
from gateway.hooks.queue import HookQueue
from gateway.metrics import Metrics
from tests.conftest import StartGateway
from tests.support.proc import free_port
from tests.test_packaging import DEPLOY, exposition_names, http_get, read_compose

RULES = DEPLOY / "prometheus-rules.yml"
INSTALL_PROMTOOL = "apt-get install -y prometheus"

# The risks, and the alerts that cover them.
RISKS = {
    "a node down": {"ImgwNodeDown"},
    "/readyz failing": {"ImgwNotReady"},
    "the store or cache unavailable": {
        "ImgwStoreUnavailable", "ImgwUnavailableAnswers", "ImgwRouteLookupsFailing",
        "ImgwRoutesLost", "ImgwBusLosingPublishes",
    },
    "backlog age": {
        "ImgwSendAckSlow", "ImgwNotifyBacklog", "ImgwNotifyDropping", "ImgwPushBacklog",
    },
    "slow-consumer kicks": {"ImgwSlowConsumerKicks"},
    "open-file headroom": {"ImgwOpenFileHeadroomLow"},
}  # fmt: skip


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        problem = f"promtool is missing: as root, {INSTALL_PROMTOOL}"
        if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
            pytest.fail(f"{problem} (CI=true: the alert rules must be checked)", pytrace=False)
        pytest.skip(problem)
    return found


def run_promtool(*args: str) -> None:
    out = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_risk_has_an_alert_and_every_alert_says_what_to_do() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)), "alert names must be unique"
    for risk, wanted in RISKS.items():
        assert wanted <= set(names), f"{risk}: no alert {sorted(wanted - set(names))}"
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_rules_read_only_metrics_a_gateway_exports() -> None:
    """The node's registry, with every watcher it can have (a bus, a recent-message
    cache, the notify webhook and push sinks, the admin port's admission gauges)."""
    metrics = Metrics()
    metrics.watch_bus(
        SimpleNamespace(published=0, lost=0, unroutable=0, dead_lettered=0, outages=0)
    )  # type: ignore[arg-type]
    metrics.watch_store(SimpleNamespace(recent_hits=0, recent_misses=0, recent_skipped=0))
    notify = NotifyStage(JsonPost("http://127.0.0.1:9/", what="notify", log=None), node_id="n")
    push = PushStage([], store=None, routes=None, log=None)  # type: ignore[arg-type]
    metrics.watch_hooks(HookQueue([notify, push], log=None))
    metrics.watch_admission(lambda: True, lambda: 1000)
    exported = exposition_names(metrics.render().decode()) | {"up"}  # up: Prometheus's own
    used = {name for rule in rules() for name in re.findall(r"\bimgw_\w+|\bup\b", rule["expr"])}
    assert {"up", "imgw_ready", "imgw_max_connections"} <= used
    missing = used - exported
    assert not missing, f"the rules use metrics that imgw does not export: {missing}"


def test_prometheus_loads_the_rules_where_compose_mounts_them() -> None:
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    service = read_compose()["services"]["prometheus"]
    mounts = dict(v.split(":")[:2] for v in service["volumes"])
    assert mounts["./prometheus-rules.yml"] in prometheus["rule_files"]
    jobs = {job["job_name"] for job in prometheus["scrape_configs"]}
    for rule in rules():
        for job in re.findall(r'job="([^"]*)"', rule["expr"]):
            assert job in jobs, f"{rule['alert']}: no scrape job {job!r} in prometheus.yml"


def test_promtool_checks_the_rules_and_the_config(tmp_path: Path) -> None:
    run_promtool("check", "rules", str(RULES))
    # the config as the container sees it: the rule file where compose mounts it
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["rule_files"] = [str(RULES)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    run_promtool("check", "config", str(tmp_path / "prometheus.yml"))


# -- each alert fires on a gateway's series (promtool test rules) ------------------------

GW = {"job": "imgw", "instance": "gw1:9100"}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    every = {**GW, **labels}
    inside = ", ".join(f'{k}="{v}"' for k, v in every.items())
    return {"series": f"{name}{{{inside}}}", "values": values}


# (alert, evaluated at, the series that make it fire, the labels it fires with)
FIRING: list[tuple[str, str, list[dict[str, str]], dict[str, str]]] = [
    ("ImgwNodeDown", "2m", [series("up", "0x10")], GW),
    ("ImgwNotReady", "6m", [series("imgw_ready", "0x10")], GW),
    (
        "ImgwStoreUnavailable", "5m",
        [series("imgw_storage_errors_total", "0+60x10", op="send")],
        {"instance": GW["instance"]},
    ),
    (
        "ImgwUnavailableAnswers", "10m",
        [series("imgw_errors_total", "0+120x15", code="unavailable")],
        {"instance": GW["instance"]},
    ),
    (
        "ImgwRouteLookupsFailing", "5m",
        [series("imgw_fanout_failures_total", "0+10x10")],
        {"instance": GW["instance"]},
    ),
    ("ImgwRoutesLost", "3m", [series("imgw_route_losses_total", "0 0 1 1 1")], GW),
    (
        "ImgwBusLosingPublishes", "5m",
        [series("imgw_bus_lost_total", "0+5x10")],
        {"instance": GW["instance"]},
    ),
    (
        "ImgwSendAckSlow", "10m",
        [
            series("imgw_send_ack_seconds_bucket", "0x15", le="1.0"),
            series("imgw_send_ack_seconds_bucket", "0+100x15", le="2.5"),
            series("imgw_send_ack_seconds_bucket", "0+100x15", le="+Inf"),
        ],
        {"instance": GW["instance"]},
    ),
    ("ImgwNotifyBacklog", "10m", [series("imgw_notify_oldest_age_seconds", "600x15")], GW),
    ("ImgwPushBacklog", "10m", [series("imgw_push_oldest_age_seconds", "600x15")], GW),
    ("ImgwNotifyDropping", "3m", [series("imgw_notify_dropped_total", "0 0 5 5")], GW),
    (
        "ImgwSlowConsumerKicks", "15m",
        [series("imgw_kicks_total", "0+60x20", reason="slow_consumer")],
        {"instance": GW["instance"]},
    ),
    (
        "ImgwOpenFileHeadroomLow", "6m",
        [series("imgw_connections", "950x10"), series("imgw_max_connections", "1000x10")],
        GW,
    ),
]  # fmt: skip

# A healthy node: every alert quiet.
HEALTHY = [
    series("up", "1x20"),
    series("imgw_ready", "1x20"),
    series("imgw_storage_errors_total", "0x20", op="send"),
    series("imgw_errors_total", "0+1x20", code="unavailable"),  # one a minute: noise
    series("imgw_fanout_failures_total", "0x20"),
    series("imgw_route_losses_total", "0x20"),
    series("imgw_bus_lost_total", "0x20"),
    series("imgw_send_ack_seconds_bucket", "0+100x20", le="0.01"),
    series("imgw_send_ack_seconds_bucket", "0+100x20", le="+Inf"),
    series("imgw_notify_oldest_age_seconds", "0x20"),
    series("imgw_notify_dropped_total", "0x20"),
    series("imgw_kicks_total", "0+1x20", reason="slow_consumer"),  # one a minute
    series("imgw_kicks_total", "0+600x20", reason="draining"),
    series("imgw_connections", "500x20"),
    series("imgw_max_connections", "1000x20"),
]


def test_each_alert_fires_on_a_gateways_series_and_not_on_a_healthy_one(
    tmp_path: Path,
) -> None:
    """promtool compares annotations too: the rules are tested without theirs
    (`check rules` above renders their templates)."""
    groups = yaml.safe_load(RULES.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    bare = tmp_path / "rules.yml"
    bare.write_text(yaml.safe_dump(groups))
    names = {r["alert"] for r in rules()}
    assert {alert for alert, *_ in FIRING} == names, "a FIRING case for every alert"
    severity = {r["alert"]: r["labels"]["severity"] for r in rules()}
    tests: list[dict[str, Any]] = [
        {
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": alert,
                    "exp_alerts": [{"exp_labels": {**labels, "severity": severity[alert]}}],
                }
            ],
        }
        for alert, at, inputs, labels in FIRING
    ]
    tests.append(
        {
            "interval": "1m",
            "input_series": HEALTHY,
            "alert_rule_test": [
                {"eval_time": "19m", "alertname": name, "exp_alerts": []} for name in names
            ],
        }
    )
    spec = tmp_path / "rules-test.yml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [str(bare)], "evaluation_interval": "1m", "tests": tests})
    )
    run_promtool("test", "rules", str(spec))


@pytest.mark.backends("embedded")
async def test_the_rules_metrics_are_on_a_running_gateways_metrics(
    start_gateway: StartGateway,
) -> None:
    """Slow tier: what a running gateway's admin listener serves (with a notify URL and
    a push URL, so that the hooks' metrics are there)."""
    admin = free_port()
    unused = f"http://127.0.0.1:{free_port()}/"
    await start_gateway(admin_port=admin, notify_url=unused, push_url=unused)
    status, body = await http_get(admin, "/metrics")
    assert status == 200
    used = {name for rule in rules() for name in re.findall(r"\bimgw_\w+", rule["expr"])}
    missing = used - exposition_names(body)
    assert not missing, f"the rules use metrics that /metrics does not have: {missing}"
    values = dict(
        line.split(" ", 1) for line in body.splitlines() if line and not line.startswith("#")
    )
    assert float(values["imgw_ready"]) == 1.0
    assert float(values["imgw_max_connections"]) > 0
