"""Prometheus metrics of one node. Each node owns a registry, so several nodes (tests,
workers) can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.connections = Gauge("imgw_connections", "Open TCP connections", registry=r)
        self.sessions = Gauge("imgw_sessions", "Logged-in connections", registry=r)
        self.logins = Counter("imgw_logins", "Login attempts", ["result"], registry=r)
        self.errors = Counter("imgw_errors", "ERROR frames sent", ["code"], registry=r)
        self.kicks = Counter("imgw_kicks", "KICK frames sent", ["reason"], registry=r)
        self.sends = Counter("imgw_sends", "SEND outcomes", ["result"], registry=r)
        self.pushes = Counter("imgw_pushes", "PUSH frames written locally", registry=r)
        self.sends_stored = self.sends.labels(result="stored")  # the hot one, bound once
        self.batch_size = Histogram(
            "imgw_send_batch_size",
            "Messages per group commit",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=r,
        )
        self.commit_seconds = Histogram(
            "imgw_send_commit_seconds", "Group commit time", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.ack_seconds = Histogram(
            "imgw_send_ack_seconds",
            "SEND received to SEND_ACK",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.storage_errors = Counter(
            "imgw_storage_errors", "Storage operations that failed", ["op"], registry=r
        )
        self.route_renewals = Counter("imgw_route_renewals", "Routes renewed", registry=r)
        self.fanout_failures = Counter(
            "imgw_fanout_failures", "Route lookups or bus publishes that failed", registry=r
        )

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.commit_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
