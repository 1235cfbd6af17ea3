"""Prometheus metrics, read from the database at each scrape (a custom collector: the
database is the one place every process's work is counted), and the probe calls of the
process that serves them (a probe's failure is recorded nowhere else). README.md,
"Dashboard", lists the metrics and their labels.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..clock import Clock, SystemClock
from . import reads
from .database import ReadOnlyDatabase, Unavailable

log = logging.getLogger(__name__)

EDGE_LABELS = ["machine", "trigger", "source", "dest"]
EFFECT_STATUSES = ("pending", "running", "retrying", "failed")


class LifecycleCollector(Collector):
    """Reads the database when Prometheus scrapes: a handful of statements, each answered
    from an index (see the benchmark ``dashboard``)."""

    def __init__(self, db: ReadOnlyDatabase, clock: Clock | None = None,
                 specs: reads.Specs | None = None) -> None:
        self.db = db
        self.clock = clock or SystemClock()
        self.specs = specs or reads.Specs()

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("lifecycle_database_up", "1 when the database could be read "
                               "at lifecycle's current schema, else 0")
        try:
            with self.db.read() as db:
                families = self._families(db)
        except Unavailable as exc:
            log.warning("metrics: %s", exc)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *families]

    def _families(self, db: Any) -> list[Metric]:
        now = self.clock.now()
        resources = GaugeMetricFamily("lifecycle_resources", "Resources per machine and state",
                                      labels=["machine", "state"])
        for machine, states in sorted(reads.counts(db).items()):
            for state, count in sorted(states.items()):
                resources.add_metric([machine, state], count)
        fired = CounterMetricFamily("lifecycle_risky_transitions",
                                    "Transitions of risky edges (on a fresh observation)",
                                    labels=EDGE_LABELS)
        refused = CounterMetricFamily("lifecycle_risky_refusals",
                                      "Refusals of risky edges for want of a fresh observation",
                                      labels=EDGE_LABELS)
        for kind, *labels, count in reads.risky_edges(db):
            (refused if kind == "refusal" else fired).add_metric(labels, count)
        answers = CounterMetricFamily("lifecycle_probe_answers",
                                      "Observations recorded from each probe's answers",
                                      labels=["probe"])
        for probe, count in reads.probe_answers(db, reads.probe_names(db, self.specs)):
            answers.add_metric([probe], count)
        effects = GaugeMetricFamily("lifecycle_effects", "Open effects by name and status "
                                    "(retrying: pending after a failed attempt)",
                                    labels=["name", "status"])
        for name, status, count in sorted(reads.effect_counts(db)):
            effects.add_metric([name, status], count)
        oldest = GaugeMetricFamily("lifecycle_oldest_due_effect_age_seconds",
                                   "Seconds the longest-waiting due effect has waited since "
                                   "it fell due (0 when none waits)")
        oldest.add_metric([], reads.oldest_due_effect(db, now))
        due = GaugeMetricFamily("lifecycle_timers_due", "Pending timers whose time has come")
        due.add_metric([], reads.timers_due(db, now))
        return [resources, fired, refused, answers, effects, oldest, due]


class ProbeCalls:
    """Counts the probe calls of this process and their failures (a probe that raises)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("lifecycle_probe_calls", "Probe calls made by this process",
                             ["probe"], registry=registry)
        self.failures = Counter("lifecycle_probe_failures", "Probe calls of this process "
                                "that raised", ["probe"], registry=registry)

    def wrap(self, probes: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
        return {name: self._counted(name, probe) for name, probe in probes.items()}

    def _counted(self, name: str, probe: Callable[..., Any]) -> Callable[..., Any]:
        calls, failures = self.calls.labels(name), self.failures.labels(name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.inc()
            with failures.count_exceptions():
                return probe(*args, **kwargs)
        return counted


def serve_metrics(url: str | None, port: int, host: str = "127.0.0.1",
                  probes: Mapping[str, Callable[..., Any]] | None = None
                  ) -> tuple[dict[str, Callable[..., Any]], Callable[[], None]]:
    """/metrics of the database at ``url`` on ``host:port``, in a thread of this process,
    with the calls of ``probes`` counted: the probes to use instead (counted), and what
    stops the server."""
    registry = CollectorRegistry(auto_describe=False)
    db = ReadOnlyDatabase(url)
    registry.register(LifecycleCollector(db))
    counted = ProbeCalls(registry).wrap(probes or {})
    server, thread = start_http_server(port, addr=host, registry=registry)
    stopped = threading.Event()

    def stop() -> None:
        if not stopped.is_set():
            stopped.set()
            server.shutdown()
            server.server_close()
            thread.join()
            db.dispose()
    return counted, stop
