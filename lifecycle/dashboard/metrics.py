"""Prometheus metrics, read from the database at each scrape (a custom collector: the
database is the one place every process's work is counted), and the probe calls of the
process that serves them (a probe's failure is recorded nowhere else). docs/dashboard.md,
"Metrics", lists the metrics and their labels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..clock import Clock, SystemClock
from ..logs import logger
from ..store.readonly import ReadOnlyDatabase, Unavailable
from ..store.statements import dashboard as reads

log = logger(__name__)

EDGE_LABELS = ["machine", "trigger", "source", "dest"]
HISTORY_EVERY = 10.0
"""Seconds between two readings of the counters that add up the whole history."""

Edges = list[tuple[str, str, str, str, str, int]]
Answers = list[tuple[str, int]]


class History:
    """The counters that add up the whole history (risky edges' transitions and refusals,
    probe answers): their cost grows with the journal, so once :meth:`start` ran they are
    read in a thread of their own every ``every`` seconds, and a scrape takes the last
    reading (at most that old); before (or without) it, each scrape reads them."""

    def __init__(self, db: ReadOnlyDatabase, specs: reads.Specs,
                 every: float = HISTORY_EVERY) -> None:
        self.db, self.specs, self.every = db, specs, every
        self._latest: tuple[Edges, Answers] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> tuple[Edges, Answers]:
        """The counters now (:class:`Unavailable` when the database cannot be read)."""
        with self.db.read() as db:
            return (reads.risky_edges(db),
                    reads.probe_answers(db, reads.probe_names(db, self.specs)))

    def latest(self) -> tuple[Edges, Answers]:
        with self._lock:
            if self._latest is None or self._thread is None:
                self._latest = self.read()
            return self._latest

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lifecycle-metrics-history",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                fresh = self.read()
            except Unavailable as exc:  # said by the scrape's lifecycle_database_up
                log.debug("metrics history: %s", exc)
                continue
            except Exception:  # the thread goes on: the next reading may succeed
                log.exception("metrics history: reading failed")
                continue
            with self._lock:
                self._latest = fresh


class LifecycleCollector(Collector):
    """Reads the database when Prometheus scrapes: a handful of statements, each answered
    from an index (see the benchmark ``dashboard``); the counters of the whole history from
    :class:`History`."""

    def __init__(self, db: ReadOnlyDatabase, clock: Clock | None = None,
                 specs: reads.Specs | None = None, history: History | None = None) -> None:
        self.db = db
        self.clock = clock or SystemClock()
        self.specs = specs or reads.Specs()
        self.history = history or History(db, self.specs)

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("lifecycle_database_up", "1 when the database could be read "
                               "at lifecycle's current schema, else 0")
        try:
            with self.db.read() as db:
                families = self._families(db)
            families[1:1] = self._history()
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
        return [resources, effects, oldest, due]

    def _history(self) -> list[Metric]:
        edges, probes = self.history.latest()
        fired = CounterMetricFamily("lifecycle_risky_transitions",
                                    "Transitions of risky edges (on a fresh observation)",
                                    labels=EDGE_LABELS)
        refused = CounterMetricFamily("lifecycle_risky_refusals",
                                      "Refusals of risky edges for want of a fresh observation",
                                      labels=EDGE_LABELS)
        for kind, *labels, count in edges:
            (refused if kind == "refusal" else fired).add_metric(labels, count)
        answers = CounterMetricFamily("lifecycle_probe_answers",
                                      "Observations recorded from each probe's answers",
                                      labels=["probe"])
        for probe, count in probes:
            answers.add_metric([probe], count)
        return [fired, refused, answers]


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
    collector = LifecycleCollector(db)
    registry.register(collector)
    counted = ProbeCalls(registry).wrap(probes or {})
    server, thread = start_http_server(port, addr=host, registry=registry)
    collector.history.start()
    stopped = threading.Event()

    def stop() -> None:
        if not stopped.is_set():
            stopped.set()
            server.shutdown()
            server.server_close()
            thread.join()
            collector.history.stop()
            db.dispose()
    return counted, stop
