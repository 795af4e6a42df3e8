"""Volume mode: the same scenario on an empty store and on a preloaded one, compared
figure by figure (ratio = preloaded / empty; 1.0 means volume costs nothing)."""

from __future__ import annotations

from typing import Any, Final

# The figures compared, per scenario; for chat and group also per rate step.
SEND_FIGURES: Final = (
    "acked_per_s", "ack_p50_ms", "ack_p99_ms", "push_p99_ms", "gateway_cpu_us_per_msg",
    "mariadb_cpu_us_per_msg", "redis_cpu_us_per_msg",
)  # fmt: skip
OFFLINE_FIGURES: Final = (
    "send_s", "catch_up_p50_ms", "catch_up_p99_ms", "pulled_per_s", "gateway_cpu_us_per_sync",
    "gateway_cpu_us_per_catch_up",
)  # fmt: skip

STORM_FIGURES: Final = (
    "recovery_s", "gateway_cpu_us_per_sync", "told_unavailable_max",
    "clients_told_unavailable_over_2",
)  # fmt: skip


def ratio(empty: Any, preloaded: Any) -> float | None:
    if not isinstance(empty, int | float) or not isinstance(preloaded, int | float) or not empty:
        return None
    return round(preloaded / empty, 3)


def _figures(names: tuple[str, ...], empty: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {
            "empty": empty.get(k),
            "preloaded": full.get(k),
            "ratio": ratio(empty.get(k), full.get(k)),
        }
        for k in names
    }


def compare(scenario: str, empty: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    if scenario in ("chat", "group"):
        by_rate = {s["rate_target"]: s for s in empty.get("steps", [])}
        return {
            "max_rate_p99_le_50ms": {
                "empty": empty.get("max_rate_p99_le_50ms"),
                "preloaded": full.get("max_rate_p99_le_50ms"),
                "ratio": ratio(empty.get("max_rate_p99_le_50ms"), full.get("max_rate_p99_le_50ms")),
            },
            "steps": [
                {"rate_target": s["rate_target"],
                 **_figures(SEND_FIGURES, by_rate.get(s["rate_target"], {}), s)}
                for s in full.get("steps", [])
            ],
        }  # fmt: skip
    return _figures(STORM_FIGURES if scenario == "storm" else OFFLINE_FIGURES, empty, full)


def lines(cmp: dict[str, Any]) -> list[str]:
    """The comparison as report lines."""

    def cell(name: str, f: dict[str, Any]) -> str:
        r = f.get("ratio")
        return f"{name} {f.get('empty')} → {f.get('preloaded')} (ratio {'-' if r is None else r})"

    out = ["- volume: empty store → preloaded store (ratio preloaded/empty)"]
    if "steps" in cmp:
        out.append("  - " + cell("highest rate with p99 ≤ 50 ms", cmp["max_rate_p99_le_50ms"]))
        for st in cmp["steps"]:
            cells = [
                cell(k, v)
                for k, v in st.items()
                if k != "rate_target" and v.get("empty") is not None
            ]
            out.append(f"  - {st['rate_target']:g} msg/s: " + "; ".join(cells))
    else:
        out.extend("  - " + cell(k, v) for k, v in cmp.items())
    return out
