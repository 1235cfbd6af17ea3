"""Section 15: PostgreSQL across a network, through a latency-injecting proxy.

Every case runs on PostgreSQL directly (0 ms) and through :mod:`benchmarks.netproxy`, which
holds each chunk on its way to the server for 0.25 or 1 ms: what a round trip costs on a
network (a rack, a zone) instead of loopback. The proxy counts the client's round trips, so
the table's caption says how many each operation takes (measured, not assumed), beside what
they took before writes were pipelined (:data:`BEFORE`).

- ``fire``: ``Engine.fire`` of the toggle machine on one resource (benchmarks.persisted);
  ``floor``: the same transition as raw psycopg's five statements (BEGIN, SELECT, UPDATE,
  INSERT, COMMIT; benchmarks.persisted.psycopg_floor).
- ``create``: ``Engine.create`` of a new resource of the toggle machine.
- ``observe``: ``Engine.observe`` of one resource.
- ``observe_many``: one ``Engine.observe_many`` batch of ``BATCH`` resources (one
  transaction); its time is per batch.
- ``step_many``: one ``Engine.step_many`` batch of ``BATCH`` resources that have nothing to
  do (a heartbeat's steady state): its read, and nothing written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import func, select

from lifecycle import Engine, Store
from lifecycle.store import journal, observations, resources

from . import persisted, toggle
from .harness import Bench, BenchError, Case, Measurement, Workspace
from .netproxy import Proxy

DELAYS_MS = (0.0, 0.25, 1.0)
"""Held per chunk on its way to the server; 0: no proxy, the server directly."""
BATCH = 100
"""Resources per ``observe_many`` batch."""
GOAL_1MS = 0.5
"""The goal: at 1 ms per round trip, a fire in at most half the floor's time (two round trips
instead of five)."""
BEFORE = {"fire": 5, "create": 4, "observe": 5, "observe_many": 6}
"""Round trips per operation before a write was pipelined into two (lifecycle 1b2e314, counted
by this section): BEGIN, SELECT, UPDATE, INSERT and COMMIT each waited for. (A step_many
that writes nothing cost two once pipelined, its read with the BEGIN and the COMMIT, until
a transaction that writes nothing sent nothing more: one.)"""
PRIMING = 10
"""Operations run before the proxy's count starts."""
ROUND_TRIPS: dict[str, float] = {}
"""Round trips per operation, by case, as the proxy counted them (filled by each case's
verify)."""


def _engine_op(kind: str, url: str) -> AbstractContextManager[Bench]:
    if kind == "fire":
        return persisted.lifecycle_fire(url, guarded=False)
    if kind == "floor":
        return persisted.psycopg_floor(url)
    return _lifecycle_op(kind, url)


@contextmanager
def _lifecycle_op(kind: str, url: str) -> Iterator[Bench]:
    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [toggle.spec(guarded=False)])
        keys = [f"{toggle.MACHINE}:k{i:04d}" for i in range(BATCH)]
        for key in keys:
            engine.create(toggle.MACHINE, key.split(":", 1)[1])
        counter = iter(range(10**9))
        op: Callable[[], Any]
        if kind == "create":
            def op() -> None:
                engine.create(toggle.MACHINE, f"new{next(counter)}")
        elif kind == "observe":
            def op() -> None:
                engine.observe(keys[0], {"n": next(counter)})
        elif kind == "step_many":
            def op() -> None:
                results = engine.step_many(keys)
                if len(results) != BATCH or any(isinstance(r, Exception) or r.fired
                                                for r in results):
                    raise BenchError(f"step_many: {results[:3]}")
        else:
            def op() -> None:
                n = next(counter)
                results = engine.observe_many([(key, {"n": n}) for key in keys])
                if len(results) != BATCH or any(isinstance(r, Exception) for r in results):
                    raise BenchError(f"observe_many: {results[:3]}")

        def verify(n: int) -> None:
            with store.read() as db:
                if kind == "step_many":
                    table, expected = journal, BATCH  # their creations, and nothing else
                elif kind == "create":
                    table, expected = resources, BATCH + n
                else:
                    table, expected = observations, n * (BATCH if kind == "observe_many" else 1)
                found = db.execute(select(func.count()).select_from(table)).scalar_one()
            if found != expected:
                raise BenchError(f"{kind}: expected {expected} rows in {table.name}, found {found}")

        yield Bench(op, verify)
    finally:
        store.dispose()


def _name(delay_ms: float) -> str:
    return f"{delay_ms:g}".replace(".", "_") + "ms"


def case_id(kind: str, delay_ms: float) -> str:
    return f"net.{kind}.{_name(delay_ms)}"


LABELS = {"fire": "lifecycle Engine.fire", "floor": "raw psycopg, 5 statements",
          "create": "lifecycle Engine.create", "observe": "lifecycle Engine.observe",
          "observe_many": f"lifecycle Engine.observe_many, {BATCH} resources",
          "step_many": f"lifecycle Engine.step_many, {BATCH} resources, none moving"}


def _case(kind: str, delay_ms: float) -> Case:
    this = case_id(kind, delay_ms)

    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        url = workspace.postgres_schema(f"net_{kind}_{_name(delay_ms)}")
        if not delay_ms:
            with _engine_op(kind, url) as bench:
                yield bench
            return
        try:
            proxy = Proxy(url, delay_ms)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None
        try:
            with _engine_op(kind, proxy.url) as bench:
                # counted from the steady state: a statement's first runs cost psycopg
                # round trips of their own (it prepares one on its fifth run)
                for _ in range(PRIMING):
                    bench.op()
                start = proxy.round_trips()

                def verify(n: int) -> None:
                    ROUND_TRIPS[this] = (proxy.round_trips() - start) / n
                    if bench.verify is not None:
                        bench.verify(n + PRIMING)

                yield Bench(bench.op, verify)
        finally:
            proxy.close()

    where = "direct" if not delay_ms else f"+{delay_ms:g} ms/round trip"
    return Case(this, f"{LABELS[kind]}, {where}", open_, needs="postgres")


KINDS = ("floor", "fire", "create", "observe", "observe_many", "step_many")
CASES: list[Case] = [_case(kind, delay) for delay in DELAYS_MS for kind in KINDS]


def note(results: dict[str, Measurement]) -> str | None:
    """The round trips the proxy counted per operation, for the table's caption."""
    counted = {kind: [ROUND_TRIPS[case_id(kind, d)] for d in DELAYS_MS
                      if case_id(kind, d) in ROUND_TRIPS and case_id(kind, d) in results]
               for kind in KINDS}
    shown = [f"{LABELS[kind].removeprefix('lifecycle ')} {_span(counts)}"
             + (f" (before pipelining: {BEFORE[kind]})" if kind in BEFORE else "")
             for kind, counts in counted.items() if counts]
    if not shown:
        return None
    costs = []
    direct = results.get(case_id("floor", 0))
    for d in DELAYS_MS:
        proxied, trips = results.get(case_id("floor", d)), ROUND_TRIPS.get(case_id("floor", d))
        if d and direct is not None and proxied is not None and trips:
            costs.append(f"{(proxied.median - direct.median) / trips / 1000:.2f} ms at "
                         f"+{d:g} ms")
    return ("Section 15: round trips per operation, as the proxy counted them (a burst of "
            "the client's messages after the server's answer is one): " + "; ".join(shown)
            + ". The proxy holds each chunk to the server for the stated delay; direct: no "
            "proxy." + (" What a round trip cost the floor over direct (the delay and the "
                        "proxy's own hop): " + ", ".join(costs) + "." if costs else ""))


def _span(counts: list[float]) -> str:
    low, high = min(counts), max(counts)
    return f"{low:.2f}" if round(low, 2) == round(high, 2) else f"{low:.2f}-{high:.2f}"


__all__ = ["BEFORE", "CASES", "DELAYS_MS", "ROUND_TRIPS", "note"]
