"""Section 14: draining no-op jobs, against the PostgreSQL job queues users would pick instead.

Three systems drain ``N`` jobs whose handler does nothing (it notes the job's number), each
from a fresh PostgreSQL database of its own on the same server, by the same worker processes
(1, then 2), in the same run, in interleaved rounds (the order rotates from round to round):

- ``lifecycle``: the effects of a trivial machine (``benchmarks.effects.spec``: ``tick``
  asks for the no-op effect), one effect on each of ``N`` resources so that no queue order
  holds any back, drained by ``Worker(engine, concurrency=1).run_until_idle()``
  (benchmarks.effects.Drainer). The worker holds 10 effects at first (its default batch),
  up to 100 once its handlers prove short (what they start in 50 ms), hands them to its
  handler thread in one run, and records them done in one transaction with its next claim (each
  fenced by claim and attempt, each passing its resource's queue head on; one round trip,
  every answer read after the COMMIT); the machine asks
  for no follow-up, so none is fired. Its enqueue was a
  transition: the resource's compare-and-swap, a journal row and the effect row, in one
  transaction (done once, untimed; before every drain the effects are put back to pending).
- ``pgqueuer``: ``Queries.enqueue`` of ``N`` jobs (untimed, one statement), drained by a
  ``QueueManager`` with one entrypoint, ``run(mode=drain)``, its defaults otherwise: it
  dequeues 10 at a time, runs the handlers as asyncio tasks (it has no per-process limit
  below twice its batch) and records completions in batches (the job row deleted, a log row
  written). It runs on asyncpg, the driver its documentation starts with (through its
  psycopg driver it drained 500 jobs 4x slower on this machine, a second of that waiting for
  a notification).
- ``procrastinate``: ``batch_defer_async`` of ``N`` jobs (untimed), drained by
  ``App.run_worker_async(wait=False, concurrency=1)``: one job fetched, run and recorded at a
  time (its status updated, an event row written by its trigger).

The handlers of pgqueuer and procrastinate are coroutines (their native kind); lifecycle's
is a function (the Worker runs functions). A drain is timed from the word to the worker
processes until the last one reports its queue empty; CPU is the workers' own (all
processes), without the server's. Afterwards every job must have been handled exactly once
across the processes, and each system's tables must say every job finished once.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
from sqlalchemy.engine import make_url

from . import effects, postgres
from .harness import Bench, BenchError, Case, Measurement, Workspace

SYSTEMS = ("lifecycle", "pgqueuer", "procrastinate")
PROCESSES = (1, 2)
COUNT, QUICK_COUNT = 1_000, 100
"""Jobs per drain (``--effects N`` sets it): the section takes a minute or two."""
ROUNDS, QUICK_ROUNDS = 5, 1
ENTRYPOINT = "noop"
QUEUE = "bench"
CONCURRENCY = 1
WATCH = 0.005
"""How often a pgqueuer process looks whether its queue table is empty yet (seconds)."""
"""Handlers at once per process, where the library has such a limit (lifecycle, procrastinate:
both their defaults)."""


# -- the databases --------------------------------------------------------------------------


def _database_url(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@contextmanager
def fresh_database(url: str, name: str) -> Iterator[str]:
    """A new database on ``url``'s server, dropped (its connections ended) afterwards;
    yields its SQLAlchemy URL."""
    database = f"{postgres.SCHEMA_PREFIX}{uuid.uuid4().hex[:8]}_{name}"
    with psycopg.connect(postgres.libpq(url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        yield _database_url(url, database)
    finally:
        with psycopg.connect(postgres.libpq(url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


# -- one worker process ---------------------------------------------------------------------


class Drainer:
    """One worker process's means for all three: lifecycle's (benchmarks.effects.Drainer),
    and an event loop holding pgqueuer's connection and procrastinate's open App."""

    def __init__(self, urls: dict[str, str]) -> None:
        import procrastinate

        self.lifecycle = effects.Drainer(urls["lifecycle"])
        self.ran: list[int] = []
        ran = self.ran
        self.loop = asyncio.new_event_loop()
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=postgres.libpq(urls["procrastinate"]), min_size=1, max_size=2))

        @self.app.task(name=ENTRYPOINT, queue=QUEUE)
        async def noop(i: int) -> None:
            ran.append(i)

        import asyncpg

        self.loop.run_until_complete(self.app.open_async())
        self.pgqueuer_connection = self.loop.run_until_complete(
            asyncpg.connect(postgres.libpq(urls["pgqueuer"])))
        self.pgqueuer_watch = self.loop.run_until_complete(psycopg.AsyncConnection.connect(
            postgres.libpq(urls["pgqueuer"]), autocommit=True))
        self.manager: asyncio.Task[None] | None = None
        self.shutdown: asyncio.Event | None = None

    def close(self) -> None:
        async def close_() -> None:
            if self.manager is not None and self.shutdown is not None:
                self.shutdown.set()
                await self.manager
            await self.pgqueuer_connection.close()
            await self.pgqueuer_watch.close()
            await self.app.close_async()

        self.loop.run_until_complete(close_())
        self.loop.close()
        self.lifecycle.close()

    def drain(self, kind: str) -> effects.Report:
        if kind == "lifecycle":
            return self.lifecycle.drain("lifecycle")
        self.ran.clear()
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        self.loop.run_until_complete(
            self._pgqueuer() if kind == "pgqueuer" else self._procrastinate())
        return effects.Report(list(self.ran), time.perf_counter() - start,
                              time.process_time() - cpu, 0)

    async def _pgqueuer(self) -> None:
        """Wait until the queue table is empty (a job leaves it when its completion is
        written), the QueueManager running meanwhile."""
        if self.manager is None:
            self.manager = self._start_manager()
        while True:
            await asyncio.sleep(WATCH)
            if self.manager.done():
                await self.manager  # its error
                raise BenchError("pgqueuer's QueueManager stopped")
            cursor = await self.pgqueuer_watch.execute("SELECT EXISTS (SELECT 1 FROM pgqueuer)")
            row = await cursor.fetchone()
            if not (row and row[0]):
                return

    def _start_manager(self) -> asyncio.Task[None]:
        """pgqueuer's QueueManager in its production mode, for as long as the process lives
        (its event loop runs only while the process drains): ``run(mode=drain)`` waits
        seconds for a wake-up after its last handler, and stopping one takes seconds more,
        neither of which is throughput."""
        from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

        ran = self.ran
        manager = QueueManager(Queries(AsyncpgDriver(self.pgqueuer_connection)))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            ran.append(int(job.payload or b"-1"))

        self.shutdown = manager.shutdown
        return self.loop.create_task(manager.run())

    async def _procrastinate(self) -> None:
        await self.app.run_worker_async(queues=[QUEUE], wait=False, concurrency=CONCURRENCY,
                                        install_signal_handlers=False)


# -- the queues, filled before every drain and checked after it -----------------------------


class Queues:
    """Each system's database: lifecycle's outbox filled once and put back to pending before
    each drain, the others' jobs enqueued anew (after their tables were emptied)."""

    def __init__(self, urls: dict[str, str], count: int) -> None:
        self.urls, self.count = urls, count
        self.outbox = effects.Outbox(urls["lifecycle"], count, count)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._install())
        self.checks = {name: psycopg.connect(postgres.libpq(urls[name]), autocommit=True)
                       for name in ("pgqueuer", "procrastinate")}

    async def _install(self) -> None:
        import procrastinate
        from pgqueuer import PsycopgDriver, Queries

        async with await psycopg.AsyncConnection.connect(
                postgres.libpq(self.urls["pgqueuer"]), autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=postgres.libpq(self.urls["procrastinate"])))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    def close(self) -> None:
        for conn in self.checks.values():
            conn.close()
        self.loop.close()
        self.outbox.close()

    def fill(self, kind: str) -> None:
        """``count`` jobs waiting (untimed), the tables otherwise as after their install."""
        if kind == "lifecycle":
            self.outbox.reset()
            return
        self.loop.run_until_complete(
            self._enqueue_pgqueuer() if kind == "pgqueuer" else self._defer_procrastinate())
        conn = self.checks[kind]
        for table in (("pgqueuer", "pgqueuer_log") if kind == "pgqueuer"
                      else ("procrastinate_jobs", "procrastinate_events")):
            conn.execute(f"VACUUM ANALYZE {table}")

    async def _enqueue_pgqueuer(self) -> None:
        from pgqueuer import PsycopgDriver, Queries

        async with await psycopg.AsyncConnection.connect(
                postgres.libpq(self.urls["pgqueuer"]), autocommit=True) as conn:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            n = self.count
            await Queries(PsycopgDriver(conn)).enqueue(
                [ENTRYPOINT] * n, [str(i).encode() for i in range(n)], [0] * n)

    async def _defer_procrastinate(self) -> None:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=postgres.libpq(self.urls["procrastinate"])))

        @app.task(name=ENTRYPOINT, queue=QUEUE)
        async def noop(i: int) -> None:
            raise AssertionError("the parent never runs a job")

        async with app.open_async():
            await app.connector.execute_query_async(
                "TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
            await noop.batch_defer_async(*({"i": i} for i in range(self.count)))

    def verify(self, kind: str, who: str, reports: list[effects.Report]) -> None:
        if kind == "lifecycle":
            self.outbox.verify(who, reports)
            return
        handled = sorted(i for report in reports for i in report.ids)
        if handled != list(range(self.count)):
            twice = sorted(i for i, n in Counter(handled).items() if n > 1)
            missing = sorted(set(range(self.count)) - set(handled))
            raise BenchError(f"{who}: {len(handled)} handler calls for {self.count} jobs "
                             f"({len(twice)} ran twice, e.g. {twice[:5]}; {len(missing)} "
                             f"never ran, e.g. {missing[:5]})")
        conn = self.checks[kind]
        if kind == "pgqueuer":
            left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
            done = dict(conn.execute(
                "SELECT status::text, count(*) FROM pgqueuer_log "
                "WHERE status <> 'picked' AND status <> 'queued' GROUP BY 1").fetchall())
            if (left and left[0]) or done != {"successful": self.count}:
                raise BenchError(f"{who}: {left} jobs left in the queue; logged {done}")
        else:
            done = dict(conn.execute(
                "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1").fetchall())
            if done != {"succeeded": self.count}:
                raise BenchError(f"{who}: expected {self.count} jobs succeeded, found {done}")


# -- running the group ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str
    processes: int


def _not_timed_per_op(_workspace: Workspace) -> AbstractContextManager[Bench]:
    raise TypeError("queue cases drain jobs: benchmarks.queues.run_group runs them")


SPECS: dict[str, Spec] = {}
CASES: list[Case] = []
for _processes in PROCESSES:
    for _kind in SYSTEMS:
        _plural = "process" if _processes == 1 else "processes"
        _label = {"lifecycle": "lifecycle Worker", "pgqueuer": "pgqueuer",
                  "procrastinate": "procrastinate"}[_kind]
        _c = Case(f"queues.{_kind}.{_processes}p", f"{_label}, {_processes} {_plural}",
                  _not_timed_per_op, "postgres")
        CASES.append(_c)
        SPECS[_c.id] = Spec(_kind, _processes)


def run_group(cases: list[Case], workspace: Workspace,
              progress: Callable[[str], None] = lambda _message: None, *,
              quick: bool = False, rounds: int | None = None, count: int | None = None
              ) -> dict[str, Measurement]:
    """Warm every process up with one drain of each system, then drain once per case and
    round, the cases' order rotating from round to round."""
    results: dict[str, Measurement] = {}
    if not cases:
        return results
    assert workspace.postgres_url is not None
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
        import procrastinate  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"queues: {exc.name} is not installed: pip install -e '.[bench]'"
                         ) from None
    count = count or (QUICK_COUNT if quick else COUNT)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    size = max(SPECS[c.id].processes for c in cases)
    with ExitStack() as stack:
        progress("queues: a fresh database for each system")
        urls = {kind: stack.enter_context(fresh_database(workspace.postgres_url, kind))
                for kind in SYSTEMS}
        progress(f"queues: lifecycle's outbox: {count:,} effects, one per resource")
        queues = Queues(urls, count)
        stack.callback(queues.close)
        progress(f"queues: starting {size} worker processes")
        pool = effects.Pool(urls, size, drainer=Drainer)
        stack.callback(pool.close)
        pool.wait_ready()

        def drain(spec: Spec, who: str) -> tuple[float, list[effects.Report]]:
            queues.fill(spec.kind)
            start = time.perf_counter()
            pool.start(spec.kind, spec.processes)
            reports = pool.collect(spec.processes)
            seconds = time.perf_counter() - start
            queues.verify(spec.kind, who, reports)
            return seconds, reports

        for kind in sorted({SPECS[c.id].kind for c in cases}):
            progress(f"queues: warming up ({kind}, {size} processes)")
            drain(Spec(kind, size), f"{kind} warm-up")
        for case in cases:
            results[case.id] = Measurement(case, count, warmup_ops=0)
        for r in range(rounds):
            order = cases[r % len(cases):] + cases[:r % len(cases)]
            for case in order:
                progress(f"round {r + 1}/{rounds}: {case.label}")
                seconds, reports = drain(SPECS[case.id], case.label)
                m = results[case.id]
                m.samples_us.append(seconds / count * 1e6)
                m.cpu_samples_us.append(sum(rep.cpu for rep in reports) / count * 1e6)
    return results


def note(results: dict[str, Measurement]) -> str | None:
    """Section 14 in jobs per second, for the table's caption."""
    lines = []
    for n in PROCESSES:
        ours = results.get(f"queues.lifecycle.{n}p")
        steps = []
        for kind in SYSTEMS:
            m = results.get(f"queues.{kind}.{n}p")
            if m is None:
                continue
            cpu = statistics.median(m.cpu_samples_us)
            text = f"{kind} {1e6 / m.median:,.0f} jobs/s, {cpu:,.0f} µs CPU"
            if ours is not None and kind != "lifecycle":
                text += (f" (lifecycle's wall {ours.ratio_to(m):.2f}x, "
                         f"CPU {ours.cpu_ratio_to(m):.2f}x)")
            steps.append(text)
        if steps:
            lines.append(f"{n}p: " + "; ".join(steps))
    if not lines:
        return None
    some = next(m for m in results.values() if m.case.id in SPECS)
    return (f"Section 14: {some.ops_per_round:,} no-op jobs drained per round, each system "
            f"in a fresh database of its own, median of {len(some.samples_us)} rounds; per "
            "job: lifecycle claims 10 at a time, up to 100 as its handlers prove short, "
            "runs them on one thread in one hand-off and records the done ones together "
            "with its next claim, in one round trip (no follow-up asked for; its enqueue, "
            "untimed, was a "
            "transition with "
            "its journal row), pgqueuer (asyncpg) dequeues 10 at a time and records "
            "completions in batches, procrastinate takes one at a time. "
            + " · ".join(lines) + ".")


__all__ = ["CASES", "SPECS", "note", "run_group"]
