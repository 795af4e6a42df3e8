"""Prometheus metrics of one node. Each node owns a registry, so several nodes (tests,
workers) can live in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.hooks.notify import NotifyStage
from gateway.hooks.push import PushStage
from gateway.redact import redact_text
from storage.ports import Bus

if TYPE_CHECKING:
    from gateway.hooks.queue import HookQueue

_BUS_COUNTERS: Final = (
    ("published", "Bus envelopes handed to the broker"),
    ("lost", "Bus publishes that failed (link down, timeout)"),
    ("unroutable", "Bus publishes returned by the broker (target node gone)"),
    ("dead_lettered", "Bus envelopes this node could not handle"),
    ("outages", "Times the bus link went down"),
)


class HandshakeCounts(Protocol):
    """TLS handshakes (gateway.net.tls.HandshakeStats): completed, and failed by reason."""

    completed: int
    failed: dict[str, int]


_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.connections = Gauge("imgw_connections", "Open TCP connections", registry=r)
        self.sessions = Gauge("imgw_sessions", "Logged-in connections", registry=r)
        self.refused = Counter(
            "imgw_connections_refused",
            "Connections refused: too many from one IP (per_ip), or LOGINs of a uid with "
            "too many connections (per_uid)",
            ["why"],
            registry=r,
        )
        # set from the node by watch_admission (gateway.admin, beside /readyz)
        self.ready = Gauge(
            "imgw_ready", "1 while /readyz answers 200 (taking clients), 0 draining", registry=r
        )
        self.max_connections = Gauge(
            "imgw_max_connections",
            "Connections the node takes: --max-connections, or fewer when the open-file "
            "limit leaves room for fewer",
            registry=r,
        )
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
        self.api_calls = Counter(
            "imgw_api_calls",
            "Server API calls answered, by call, outcome (ok or the error code) and caller "
            "(admin, or an API key's name)",
            ["call", "code", "key"],
            registry=r,
        )
        self.storage_errors = Counter(
            "imgw_storage_errors", "Storage operations that failed", ["op"], registry=r
        )
        self.ops_limited = Counter(
            "imgw_ops_limited",
            "Requests refused or dropped: over the uid's op budget, or TYPING over its own",
            ["why"],
            registry=r,
        )
        self.media = Counter(
            "imgw_media",
            "Media requests by op (upload, get, send) and outcome (ok or the error code)",
            ["op", "result"],
            registry=r,
        )
        self.media_swept = Counter(
            "imgw_media_swept", "Orphaned uploads deleted by the sweep", registry=r
        )
        self.route_renewals = Counter("imgw_route_renewals", "Routes renewed", registry=r)
        self.kicks_to_dead_nodes = Counter(
            "imgw_kicks_to_dead_nodes",
            "Duplicate-login kicks not published: the old connection's process is gone",
            registry=r,
        )
        self.send_holds = Counter(
            "imgw_send_holds",
            "Connections no longer read while the queued SENDs were over send_backpressure",
            registry=r,
        )
        self.sync_hints = Counter(
            "imgw_sync_hints",
            "SYNC_HINT sent to every session after an outage, by cause",
            ["why"],
            registry=r,
        )
        self.route_losses = Counter(
            "imgw_route_losses",
            "Times the route store was found without this node's routes (re-registered)",
            registry=r,
        )
        self.fanout_failures = Counter(
            "imgw_fanout_failures",
            "Fan-out route lookups that failed (bus losses: imgw_bus_*)",
            registry=r,
        )

    def watch_admission(
        self, accepting: Callable[[], bool], max_connections: Callable[[], int]
    ) -> None:
        """Read imgw_ready and imgw_max_connections from the node at each scrape."""
        self.ready.set_function(lambda: float(accepting()))
        self.max_connections.set_function(lambda: float(max_connections()))

    def watch_bus(self, bus: Bus) -> None:
        """Expose the bus adapter's counters as imgw_bus_*_total."""
        self.registry.register(_BusCollector(bus))

    def watch_store(self, store: object) -> None:
        """Expose the store's recent-cache counters (when it has them) as
        imgw_recent_cache_{hits,misses,skipped}_total."""
        if hasattr(store, "recent_hits"):
            self.registry.register(_RecentCollector(store))

    def watch_hooks(self, hooks: HookQueue) -> None:
        """Expose the hook queue: with the notify webhook, imgw_notify_{delivered,dropped,
        deferred,failures}_total, imgw_notify_queued and imgw_notify_oldest_age_seconds;
        with push sinks, imgw_push_{events,recipients}_total,
        imgw_push_failures_total{sink}, imgw_push_pending and
        imgw_push_oldest_age_seconds."""
        self.registry.register(_HooksCollector(hooks))

    def watch_tls(self, handshakes: HandshakeCounts, not_after: float | None) -> None:
        """With --tls-cert (gateway/net/tls.py): the handshake counters, and when the served
        certificate expires (only a node with TLS has them, so an alert on the expiry
        never fires for one without)."""
        self.registry.register(_TlsCollector(handshakes))
        if not_after is not None:
            Gauge(
                "imgw_tls_certificate_expiry_timestamp_seconds",
                "When the served TLS certificate expires (Unix time)",
                registry=self.registry,
            ).set(not_after)

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.commit_seconds.observe(seconds)

    def render(self) -> bytes:
        """The exposition, with any secret masked (gateway.redact: labels are built from
        names and error texts, never meant to carry one)."""
        return redact_text(generate_latest(self.registry).decode()).encode()


class _BusCollector:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    def collect(self) -> Iterator[Metric]:
        for name, text in _BUS_COUNTERS:
            family = CounterMetricFamily(f"imgw_bus_{name}", text)
            family.add_metric([], getattr(self._bus, name))
            yield family


class _HooksCollector:
    def __init__(self, hooks: HookQueue) -> None:
        self._hooks = hooks

    def collect(self) -> Iterator[Metric]:
        hooks = self._hooks
        for stage in hooks.stages:
            if isinstance(stage, NotifyStage):
                yield from self._notify(stage)
            elif isinstance(stage, PushStage):
                yield from self._push(stage)

    def _notify(self, stage: NotifyStage) -> Iterator[Metric]:
        hooks = self._hooks
        for name, text, value in (
            ("delivered", "Messages the notify webhook acknowledged", hooks.delivered),
            (
                "dropped",
                "Committed messages never to be notified (none with a store's hook rows)",
                hooks.dropped,
            ),
            (
                "deferred", "Committed messages past the notify queue, read back from the store",
                hooks.deferred,
            ),
            ("failures", "Notify webhook posts that failed (each retried)", stage.post.failures),
        ):  # fmt: skip
            family = CounterMetricFamily(f"imgw_notify_{name}", text)
            family.add_metric([], value)
            yield family
        queued = GaugeMetricFamily(
            "imgw_notify_queued", "Messages waiting for the webhook (queued, or owed in the store)"
        )
        queued.add_metric([], hooks.queued)
        yield queued
        oldest = GaugeMetricFamily(
            "imgw_notify_oldest_age_seconds",
            "Since the oldest message waiting for the webhook was committed (0: none waits)",
        )
        oldest.add_metric([], hooks.oldest_age_s)
        yield oldest

    def _push(self, stage: PushStage) -> Iterator[Metric]:
        hooks = self._hooks
        events = CounterMetricFamily("imgw_push_events", "Push events every push sink acknowledged")
        events.add_metric([], stage.events)
        yield events
        recipients = CounterMetricFamily(
            "imgw_push_recipients", "Offline devices in the acknowledged push events"
        )
        recipients.add_metric([], stage.recipients)
        yield recipients
        failures = CounterMetricFamily(
            "imgw_push_failures", "Deliveries to a push sink that failed (each retried)",
            labels=["sink"],
        )  # fmt: skip
        for sink in stage.sinks:
            failures.add_metric([sink.name], sink.failures)
        yield failures
        pending = GaugeMetricFamily(
            "imgw_push_pending",
            "Committed messages whose push events are not yet delivered (queued, or owed in "
            "the store)",
        )
        pending.add_metric([], hooks.queued)
        yield pending
        oldest = GaugeMetricFamily(
            "imgw_push_oldest_age_seconds",
            "Since the oldest message whose push events wait was committed (0: none waits)",
        )
        oldest.add_metric([], hooks.oldest_age_s)
        yield oldest


class _TlsCollector:
    def __init__(self, handshakes: HandshakeCounts) -> None:
        self._handshakes = handshakes

    def collect(self) -> Iterator[Metric]:
        done = CounterMetricFamily(
            "imgw_tls_handshakes", "TLS handshakes completed on the client ports"
        )
        done.add_metric([], self._handshakes.completed)
        yield done
        failed = CounterMetricFamily(
            "imgw_tls_handshake_failures",
            "TLS handshakes that failed, by the TLS library's reason (wrong_version_number: "
            "plain text on the TLS port; tlsv1_alert_unknown_ca: the client does not trust "
            "the certificate; sslv3_alert_bad_certificate: it names another host) or "
            "abandoned (the peer started one and closed or went silent)",
            labels=["reason"],
        )
        for reason, n in sorted(self._handshakes.failed.items()):
            failed.add_metric([reason], n)
        yield failed


class _RecentCollector:
    def __init__(self, store: object) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        for name, text in (
            ("hits", "PULL/HISTORY pages answered from the Redis recent-message cache"),
            ("misses", "Pages the recent-message cache could not prove complete (MySQL)"),
            ("skipped", "Recent-cache writes skipped: too many in flight"),
        ):
            family = CounterMetricFamily(f"imgw_recent_cache_{name}", text)
            family.add_metric([], getattr(self._store, f"recent_{name}"))
            yield family
