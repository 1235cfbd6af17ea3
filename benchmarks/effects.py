"""Case 4: effects drained from the outbox on PostgreSQL, in 1, 2 and 4 worker processes.

lifecycle: each process holds ``Engine(Store(url), [spec], effects={"noop": handler})`` and
runs ``Worker(engine, concurrency=1).run_until_idle()`` in a loop until the outbox has
nothing pending or running. The handler does nothing (it notes the effect's id), so the
figure is the framework's claim-run-mark overhead.

The floor: the same claim-run-mark statements through raw psycopg, one connection per
process, no framework. Claim a batch (as many as the Worker claims) with the Worker's query
shape (due pending effects, or running ones whose lease expired, that head their resource's
queue, of the names it serves, ``ORDER BY next_attempt_at, id LIMIT n FOR UPDATE OF e SKIP
LOCKED``), mark them running with ``UPDATE ... RETURNING`` the columns a handler needs,
COMMIT; then for each effect call the no-op, ``UPDATE`` it done, fenced by the claim as the
Worker does, and pass its queue's head to the next effect under the resource's lock, in a
transaction of its own. What else the
Worker reads or writes (the resource and journal row it hands the handler, the timers it
looks for every cycle, threads) counts as lifecycle's cost.

Both drain the same effects from the same tables: one schema, filled once through the
engine (``RESOURCES`` resources, each taking ``COUNT / RESOURCES`` transitions that ask for
one effect, interleaved, so an effect's predecessor on its resource is ``RESOURCES`` ids
before it); before every drain the effects are put back to pending (and the table vacuumed),
untimed. The worker processes start once, connect, and wait for the word; a drain is timed
from the word to the last process reporting the outbox empty. Afterwards every effect must be
done with exactly one attempt, every id must have been handled exactly once across the
processes, and each resource's effects must have finished in order.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import gc
import multiprocessing
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psycopg

from lifecycle import Engine, Store, Worker

from . import postgres
from .harness import Bench, BenchError, Case, Measurement, Settings, Workspace

UTC = dt.UTC
MACHINE = "outbox"
EFFECT = "noop"
TRIGGER = "tick"
PROCESSES = (1, 2, 4)
CONCURRENCY = 1
"""Handler threads per lifecycle Worker; the floor runs one handler at a time as well."""
COUNT, RESOURCES = 1_000, 100
QUICK_COUNT, QUICK_RESOURCES = 100, 20
QUICK_ROUNDS = 1
MIN_ROUNDS, BUDGET = 3, 30.0
"""By default the group runs as many rounds as the others (7), but starts no new round after
``BUDGET`` seconds of rounds once it has ``MIN_ROUNDS``: a round drains the outbox six times,
and lifecycle's one-process drain alone takes seconds."""
IDLE_SLEEP = 0.001
"""When a process found nothing to claim but others still hold effects, it waits this long
before it looks again, lifecycle and floor alike (no busy loop on two cores)."""
LEASE = dt.timedelta(seconds=30)  # the Worker's default lease


def spec() -> dict[str, Any]:
    """Two states and ``tick`` between them; every tick asks for the no-op effect."""
    return {
        "name": MACHINE,
        "states": ["a", "b"],
        "initial": "a",
        "transitions": [
            {"trigger": TRIGGER, "source": "a", "dest": "b", "effects": [EFFECT]},
            {"trigger": TRIGGER, "source": "b", "dest": "a", "effects": [EFFECT]},
        ],
    }


# -- the floor's statements -----------------------------------------------------------------

# The shape of WorkerCore.claim's query, written by hand.
CLAIM = """
SELECT e.id FROM lifecycle_effects AS e
WHERE e.head = 1 AND e.status IN ('pending', 'running') AND e.next_attempt_at <= %(now)s
  AND (e.status = 'pending' OR e.lease_until < %(now)s)
  AND e.name IN (%(name)s)
ORDER BY e.next_attempt_at, e.id
LIMIT %(limit)s FOR UPDATE OF e SKIP LOCKED
"""
MARK_RUNNING = """
UPDATE lifecycle_effects SET status = 'running', claimed_by = %(worker)s,
       lease_until = %(lease_until)s, attempts = attempts + 1
WHERE id = ANY(%(ids)s)
RETURNING id, name, args, attempts
"""
MARK_DONE = """
UPDATE lifecycle_effects SET status = 'done', finished_at = %(now)s, last_error = NULL,
       lease_until = NULL
WHERE id = %(id)s AND claimed_by = %(worker)s AND attempts = %(attempts)s
  AND status = 'running'
"""
LOCK_RESOURCE = """
SELECT id FROM lifecycle_resources
WHERE id = (SELECT resource_id FROM lifecycle_effects WHERE id = %(id)s) FOR UPDATE
"""
PASS_HEAD = """
UPDATE lifecycle_effects SET head = CASE WHEN id = %(id)s THEN NULL ELSE 1 END
WHERE id = %(id)s OR id = (
  SELECT min(n.id) FROM lifecycle_effects AS n
  WHERE n.resource_id = (SELECT resource_id FROM lifecycle_effects WHERE id = %(id)s)
    AND n.id > %(id)s AND n.status = 'pending')
"""
OUTSTANDING = ("SELECT EXISTS (SELECT 1 FROM lifecycle_effects "
               "WHERE status IN ('pending', 'running'))")
RESET = """
UPDATE lifecycle_effects SET status = 'pending', attempts = 0, claimed_by = NULL,
       claimant = NULL, lease_until = NULL, finished_at = NULL, last_error = NULL,
       next_attempt_at = created_at, progress = NULL,
       head = CASE WHEN id IN (SELECT min(id) FROM lifecycle_effects GROUP BY resource_id)
                   THEN 1 END
"""
OUTCOMES = "SELECT status, attempts, count(*) FROM lifecycle_effects GROUP BY 1, 2"
OUT_OF_ORDER = """
SELECT count(*) FROM (
  SELECT finished_at < lag(finished_at) OVER (PARTITION BY resource_id ORDER BY id) AS early
  FROM lifecycle_effects) AS finished
WHERE early
"""


# -- one worker process ---------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    """What one process did in one drain."""

    ids: list[int]
    seconds: float
    cpu: float
    idle: int
    """How often it found nothing to claim while other processes still held effects."""
    stats: dict[str, int] = field(default_factory=dict)


class Drainer:
    """One worker process's means: a lifecycle Engine with the no-op handler, and a raw
    psycopg connection for the floor; an autocommit connection asks both loops whether the
    outbox is empty yet."""

    def __init__(self, url: str) -> None:
        self.ran: list[int] = []
        ran = self.ran

        def noop(call: Any) -> None:
            ran.append(call.id)

        self.store = Store(url)
        self.engine = Engine(self.store, [spec()], effects={EFFECT: noop})
        self.batch = Worker(self.engine, concurrency=CONCURRENCY).batch
        self.floor = psycopg.connect(postgres.libpq(url))
        self.check = psycopg.connect(postgres.libpq(url), autocommit=True)

    def close(self) -> None:
        self.floor.close()
        self.check.close()
        self.store.dispose()

    def outstanding(self) -> bool:
        row = self.check.execute(OUTSTANDING).fetchone()
        return bool(row and row[0])

    def drain(self, kind: str) -> Report:
        self.ran.clear()
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        idle, stats = self.lifecycle() if kind == "lifecycle" else (self.raw(), {})
        return Report(list(self.ran), time.perf_counter() - start,
                      time.process_time() - cpu, idle, stats)

    def lifecycle(self) -> tuple[int, dict[str, int]]:
        worker = Worker(self.engine, concurrency=CONCURRENCY)
        idle = 0
        while True:
            done = worker.stats.done
            worker.run_until_idle()
            if not self.outstanding():
                return idle, worker.stats.to_json()
            if worker.stats.done == done:
                idle += 1
                time.sleep(IDLE_SLEEP)

    def raw(self) -> int:
        """The floor: claim a batch, run and mark each effect, until the outbox is empty."""
        import os

        connection, ran = self.floor, self.ran
        cursor = connection.cursor()
        worker = f"floor:{os.getpid()}"
        claim = {"name": EFFECT, "limit": self.batch}
        idle = 0

        def noop(effect_id: int, name: str, args: dict[str, Any]) -> None:
            ran.append(effect_id)

        while True:
            now = dt.datetime.now(UTC)
            claim["now"] = now
            cursor.execute(CLAIM, claim)
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                connection.commit()
                if not self.outstanding():
                    return idle
                idle += 1
                time.sleep(IDLE_SLEEP)
                continue
            cursor.execute(MARK_RUNNING, {"worker": worker, "lease_until": now + LEASE,
                                          "ids": ids})
            claimed = sorted(cursor.fetchall())
            connection.commit()
            for effect_id, name, args, attempts in claimed:
                noop(effect_id, name, args)
                cursor.execute(MARK_DONE, {"now": dt.datetime.now(UTC), "id": effect_id,
                                           "worker": worker, "attempts": attempts})
                if cursor.rowcount != 1:
                    connection.rollback()
                    raise BenchError(f"floor: effect {effect_id} lost its claim")
                cursor.execute(LOCK_RESOURCE, {"id": effect_id})
                cursor.execute(PASS_HEAD, {"id": effect_id})
                connection.commit()


def serve(make: Callable[[Any], Any], setting: Any, pipe: Connection) -> None:
    """A worker process: set up a drainer (``make(setting)``), say ready, then drain on every
    word until told to stop."""
    try:
        drainer = make(setting)
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        return
    pipe.send(("ready", None))
    try:
        while True:
            kind = pipe.recv()
            if kind is None:
                break
            try:
                pipe.send(("report", drainer.drain(kind)))
            except BaseException:
                pipe.send(("error", traceback.format_exc()))
    finally:
        drainer.close()


class Pool:
    """Worker processes, started once and kept for every drain."""

    def __init__(self, url: Any, size: int, drainer: Callable[[Any], Any] | None = None) -> None:
        """``size`` processes, each serving a drainer (default: a :class:`Drainer` of
        ``url``; else ``drainer(url)``): it says ready, then answers each word with a
        report."""
        context = multiprocessing.get_context("forkserver")
        # the fork server imports lifecycle once; every worker is forked from it
        context.set_forkserver_preload([__name__])
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        for i in range(size):
            mine, theirs = context.Pipe()
            process = context.Process(target=serve, args=(drainer or Drainer, url, theirs),
                                      name=f"effects-worker-{i}", daemon=True)
            process.start()
            theirs.close()
            self.pipes.append(mine)
            self.processes.append(process)

    def wait_ready(self) -> None:
        for i, pipe in enumerate(self.pipes):
            kind, value = self._receive(i, pipe, timeout=120)
            if kind != "ready":
                raise BenchError(f"effects worker {i} did not start:\n{value}")

    def _receive(self, i: int, pipe: Connection, timeout: float) -> tuple[str, Any]:
        if not pipe.poll(timeout):
            raise BenchError(f"effects worker {i} did not answer within {timeout:g} s")
        try:
            message: tuple[str, Any] = pipe.recv()
        except EOFError:
            raise BenchError(f"effects worker {i} died (exit code "
                             f"{self.processes[i].exitcode})") from None
        return message

    def start(self, kind: str, processes: int) -> None:
        for pipe in self.pipes[:processes]:
            pipe.send(kind)

    def collect(self, processes: int) -> list[Report]:
        reports: list[Report] = []
        errors: list[str] = []
        for i, pipe in enumerate(self.pipes[:processes]):
            kind, value = self._receive(i, pipe, timeout=600)
            if kind == "report":
                reports.append(value)
            else:
                errors.append(f"effects worker {i}:\n{value}")
        if errors:
            raise BenchError("\n".join(errors))
        return reports

    def close(self) -> None:
        for pipe in self.pipes:
            with suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for pipe in self.pipes:
            pipe.close()


# -- the outbox -----------------------------------------------------------------------------


class Outbox:
    """The schema both drain: filled once, put back to pending before every drain, checked
    after it."""

    def __init__(self, url: str, count: int, resources: int) -> None:
        if count % resources:
            raise ValueError(f"{count} effects do not divide over {resources} resources")
        self.url, self.count, self.resources = url, count, resources
        store = Store(url, upgrade=True)
        try:
            engine = Engine(store, [spec()], effects={EFFECT: lambda call: None})
            keys = [f"r{i:04d}" for i in range(resources)]
            for key in keys:
                engine.create(MACHINE, key)
            for _ in range(count // resources):
                for key in keys:
                    if not engine.fire(f"{MACHINE}:{key}", TRIGGER):
                        raise BenchError(f"prefill: {TRIGGER} on {key} did not fire")
        finally:
            store.dispose()
        self.connection = psycopg.connect(postgres.libpq(url), autocommit=True)
        self.ids = [row[0] for row in self.connection.execute(
            "SELECT id FROM lifecycle_effects ORDER BY id").fetchall()]
        if len(self.ids) != count:
            raise BenchError(f"prefill: expected {count} effects, found {len(self.ids)}")

    def close(self) -> None:
        self.connection.close()

    def reset(self) -> None:
        moved = self.connection.execute(RESET).rowcount
        if moved != self.count:
            raise BenchError(f"reset: expected {self.count} effects, moved {moved}")
        self.connection.execute("VACUUM ANALYZE lifecycle_effects")

    def verify(self, who: str, reports: list[Report]) -> None:
        """Every effect done with one attempt, each id handled exactly once, in order per
        resource."""
        outcomes = {(status, attempts): n for status, attempts, n in
                    self.connection.execute(OUTCOMES).fetchall()}
        if outcomes != {("done", 1): self.count}:
            shown = ", ".join(f"{n} {status} after {attempts} attempts"
                              for (status, attempts), n in sorted(outcomes.items()))
            raise BenchError(f"{who}: expected {self.count} effects done after 1 attempt, "
                             f"found {shown}")
        handled = sorted(i for report in reports for i in report.ids)
        if handled != self.ids:
            twice = sorted(i for i, n in Counter(handled).items() if n > 1)
            missing = sorted(set(self.ids) - set(handled))
            raise BenchError(f"{who}: {len(handled)} handler calls for {self.count} effects "
                             f"({len(twice)} ran twice, e.g. {twice[:5]}; {len(missing)} "
                             f"never ran, e.g. {missing[:5]})")
        for report in reports:
            extra = {k: v for k, v in report.stats.items()
                     if k in ("retried", "failed") and v}
            if extra:
                raise BenchError(f"{who}: the worker reported {extra}")
        row = self.connection.execute(OUT_OF_ORDER).fetchone()
        if row and row[0]:
            raise BenchError(f"{who}: {row[0]} effects finished before their predecessor "
                             "on the same resource")


# -- running the group ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str  # "lifecycle" or "floor"
    processes: int


def _not_timed_per_op(_workspace: Workspace) -> AbstractContextManager[Bench]:
    raise TypeError("effects cases drain an outbox: benchmarks.effects.run_group runs them")


def _case(kind: str, processes: int) -> Case:
    plural = "process" if processes == 1 else "processes"
    label = (f"lifecycle Worker, {processes} {plural}" if kind == "lifecycle"
             else f"raw psycopg, {processes} {plural}")
    return Case(f"effects.{kind}.{processes}p", label, _not_timed_per_op, "postgres")


SPECS: dict[str, Spec] = {}
CASES: list[Case] = []
for _processes in PROCESSES:
    for _kind in ("floor", "lifecycle"):
        _c = _case(_kind, _processes)
        CASES.append(_c)
        SPECS[_c.id] = Spec(_kind, _processes)


@dataclass(slots=True)
class Summary:
    """What the table says about the group besides the per-case medians."""

    count: int
    resources: int
    rounds: int
    throughput: dict[str, float] = field(default_factory=dict)
    """Effects per second, from the median time per effect."""
    idle: dict[str, float] = field(default_factory=dict)
    """Median over rounds of the empty claims per drain (all processes together)."""

    def scaling(self, kind: str) -> dict[int, float]:
        """Throughput with N processes over throughput with one."""
        one = self.throughput.get(f"effects.{kind}.1p")
        return {n: self.throughput[f"effects.{kind}.{n}p"] / one for n in PROCESSES
                if one and f"effects.{kind}.{n}p" in self.throughput}

    def to_json(self) -> dict[str, Any]:
        return {
            "effects": self.count, "resources": self.resources, "rounds": self.rounds,
            "effects_per_second": {k: round(v, 1) for k, v in self.throughput.items()},
            "scaling": {kind: {str(n): round(s, 3) for n, s in self.scaling(kind).items()}
                        for kind in ("lifecycle", "floor")},
            "empty_claims_per_drain": self.idle,
        }


def sizes(quick: bool, count: int | None) -> tuple[int, int]:
    """Effects and resources: ``count`` effects (ten per resource), else the defaults (five
    per resource when quick, so four processes still find enough to claim)."""
    if count is not None:
        return count, max(1, count // 10)
    return (QUICK_COUNT, QUICK_RESOURCES) if quick else (COUNT, RESOURCES)


@contextmanager
def _prepared(workspace: Workspace, count: int, resources: int, pool_size: int,
              progress: Callable[[str], None]) -> Iterator[tuple[Outbox, Pool | None]]:
    url = workspace.postgres_schema("effects")
    progress(f"effects: filling the outbox with {count:,} effects over {resources} resources")
    outbox = Outbox(url, count, resources)
    pool = None
    try:
        if pool_size:
            progress(f"effects: starting {pool_size} worker processes")
            pool = Pool(url, pool_size)
            pool.wait_ready()
        yield outbox, pool
    finally:
        if pool is not None:
            pool.close()
        outbox.close()


def _drain(outbox: Outbox, pool: Pool, spec: Spec, who: str) -> tuple[float, list[Report]]:
    outbox.reset()
    start = time.perf_counter()
    pool.start(spec.kind, spec.processes)
    reports = pool.collect(spec.processes)
    seconds = time.perf_counter() - start
    outbox.verify(who, reports)
    return seconds, reports


def run_group(cases: list[Case], workspace: Workspace, settings: Settings,
              progress: Callable[[str], None] = lambda _message: None, *,
              rounds: int, budget: float | None, count: int, resources: int
              ) -> tuple[dict[str, Measurement], Summary]:
    """Warm every process up with one drain of each kind, then drain the outbox once per
    case and round, the cases' order rotating from round to round; with a ``budget``, start
    no new round after ``budget`` seconds once ``MIN_ROUNDS`` ran."""
    results: dict[str, Measurement] = {}
    summary = Summary(count, resources, rounds)
    if not cases:
        return results, summary
    size = max(SPECS[c.id].processes for c in cases)
    idle: dict[str, list[int]] = {c.id: [] for c in cases}
    with _prepared(workspace, count, resources, size, progress) as (outbox, pool):
        assert pool is not None
        for kind in sorted({SPECS[c.id].kind for c in cases}):
            progress(f"effects: warming up ({kind}, {size} processes)")
            _drain(outbox, pool, Spec(kind, size), f"{kind} warm-up")
        for case in cases:
            results[case.id] = Measurement(case, count, warmup_ops=0)
        started = time.perf_counter()
        for r in range(rounds):
            if (budget is not None and r >= MIN_ROUNDS
                    and time.perf_counter() - started > budget):
                break
            summary.rounds = r + 1
            order = cases[r % len(cases):] + cases[:r % len(cases)]
            for case in order:
                progress(f"round {r + 1}/{rounds}: {case.label}")
                seconds, reports = _drain(outbox, pool, SPECS[case.id], case.label)
                m = results[case.id]
                m.samples_us.append(seconds / count * 1e6)
                m.cpu_samples_us.append(sum(rep.cpu for rep in reports) / count * 1e6)
                idle[case.id].append(sum(rep.idle for rep in reports))
    for case_id, m in results.items():
        summary.throughput[case_id] = 1e6 / m.median
        summary.idle[case_id] = statistics.median(idle[case_id])
    return results, summary


def profile(case: Case, workspace: Workspace, count: int, resources: int,
            profiler: cProfile.Profile,
            progress: Callable[[str], None] = lambda _message: None
            ) -> tuple[cProfile.Profile, str]:
    """One drain of ``case`` with this process as one of its worker processes, under
    cProfile (after a warm-up drain of the same case); the others run unprofiled."""
    spec = SPECS[case.id]
    with _prepared(workspace, count, resources, spec.processes - 1, progress) as (
            outbox, pool):
        drainer = Drainer(outbox.url)
        try:
            def drain(profiling: cProfile.Profile | None) -> tuple[float, Report]:
                outbox.reset()
                start = time.perf_counter()
                if pool is not None:
                    pool.start(spec.kind, spec.processes - 1)
                if profiling is not None:
                    profiling.enable()
                mine = drainer.drain(spec.kind)
                if profiling is not None:
                    profiling.disable()
                others = pool.collect(spec.processes - 1) if pool is not None else []
                seconds = time.perf_counter() - start
                outbox.verify(case.label, [mine, *others])
                return seconds, mine

            progress("effects: warm-up drain")
            warm_seconds, warm = drain(None)
            progress("effects: profiled drain")
            seconds, mine = drain(profiler)
        finally:
            drainer.close()
    handled = len(mine.ids)
    header = (
        f"{case.id} ({case.label}): {count:,} effects over {resources} resources; this "
        f"process handled {handled:,} of them.\n"
        f"Drain without the profiler: {warm_seconds / count * 1e6:.1f} µs per effect "
        f"(this process {warm.seconds / max(len(warm.ids), 1) * 1e6:.1f} µs and "
        f"{warm.cpu / max(len(warm.ids), 1) * 1e6:.1f} µs CPU per effect it handled); under "
        f"it: {seconds / count * 1e6:.1f} µs per effect.\n"
        f"Times in the listing are totals for this process; divide by {handled:,} for one "
        "effect.\n")
    return profiler, header
