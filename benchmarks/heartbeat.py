"""Case 6: a drone pool's heartbeat (``lifecycle reconcile``) on PostgreSQL.

A pool of ``N`` drones, all ``available`` (the site says Running, the pool Available, so none
moves: the steady state of a large pool), and one operation: a whole heartbeat.
``lifecycle`` runs :func:`lifecycle.machines.drone.reconcile`: the live drones listed, the
site and the pool asked once each, then ``Engine.observe_many`` and ``Engine.step_many`` a
thousand drones per transaction. The floor runs the same statements through raw psycopg,
batched the same way, with no framework: the live drones' rows, then per thousand drones one
transaction that reads their rows (one statement), inserts their observations (one
``executemany``) and marks them newest (one ``executemany``), and one transaction that reads
the rows again with their newest observations, which is what deciding needs. The goal: a
heartbeat of 100,000 drones within 60 s on this machine.

The floor does all the database work lifecycle does, and no less: an observation row and a
newest mark per drone, the rows read with their newest observations; in the steady state
no drone moves, so neither writes a journal row (both would: lifecycle's step writes one
only with a transition or a refusal). What it leaves out is lifecycle's own: checking the
keys and statuses, and deciding each drone. Its statements are the chatty client's (each
statement and COMMIT waited for; the inserts, then the marks, pipelined by
``executemany``); lifecycle's are two round trips per batch (one statement that
finds the drones by key, inserts their observations and marks them newest; the read its
steps decide on, which writes nothing); both list the live drones in one read of their
keys and data (``drone.heartbeat_drones``).

Each runs on the server directly and, as ``heartbeat.lifecycle.N.1ms`` and
``heartbeat.floor.N.1ms``, through :mod:`benchmarks.netproxy` holding each message to the
server 1 ms (a network's round trip, as section 15's): a heartbeat of 100,000 drones is to
fit TARDIS's 60 s there too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import insert

from lifecycle import Engine, Store
from lifecycle.adapters.sites import AVAILABLE, RUNNING, Drone
from lifecycle.machines import drone
from lifecycle.store import resources

from . import postgres
from .harness import Bench, BenchError, Case, Settings, Workspace
from .netproxy import Proxy

UTC = dt.UTC
SIZES = (10_000, 100_000)
GOAL_SECONDS = 60.0
DELAYS_MS = (0.0, 1.0)
"""Held per message to the server by the proxy; 0: no proxy, the server directly."""


class Steady:
    """A site and a pool that say every drone runs and is available."""

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        return {d.name: RUNNING for d in drones}

    def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        return {d.name: AVAILABLE for d in drones}


def settings(rounds: int | None, quick: bool) -> Settings:
    """One heartbeat per round, after one to warm up: a round of 100,000 drones is long."""
    return Settings(rounds=rounds or (1 if quick else 3), round_seconds=0.0,
                    warmup_seconds=0.0, min_warmup_ops=1, ops=1)


_FILLED: dict[tuple[int, int], str] = {}


@contextmanager
def _pool(workspace: Workspace, size: int,
          delay_ms: float = 0.0) -> Iterator[tuple[Store, Engine]]:
    """``size`` available drones (filled once per workspace, shared by the cases), through
    the proxy when ``delay_ms``."""
    filled = _FILLED.get((id(workspace), size))
    url = filled or workspace.postgres_schema(f"heartbeat_{size}")
    if filled is None:
        Store(url, upgrade=True).dispose()
    proxy = Proxy(url, delay_ms) if delay_ms else None
    store = Store(url if proxy is None else proxy.url)
    try:
        engine = Engine(store, [drone.SPEC], guards=drone.GUARDS, strict=False)
        if filled is None:
            past = dt.datetime(2026, 1, 1, tzinfo=UTC)
            with store.begin() as db:
                db.execute(insert(resources), [
                    {"machine": "drone", "key": f"d{i:06d}", "spec_version": drone.SPEC.version,
                     "state": "available", "version": 3, "seq": 3,
                     "data": {"demand": 1, "remote_id": f"job-{i}"}, "created_at": past,
                     "updated_at": past, "last_transition_at": past}
                    for i in range(size)])
                db.exec_driver_sql("ANALYZE lifecycle_resources")
            _FILLED[id(workspace), size] = url
        yield store, engine
    finally:
        store.dispose()
        if proxy is not None:
            proxy.close()


def case_id(kind: str, size: int, delay_ms: float = 0.0) -> str:
    """``heartbeat.lifecycle.10000``, ``heartbeat.floor.100000.1ms``: ``kind`` is
    ``lifecycle`` or ``floor``."""
    suffix = "." + f"{delay_ms:g}".replace(".", "_") + "ms" if delay_ms else ""
    return f"heartbeat.{kind}.{size}{suffix}"


def _where(delay_ms: float) -> str:
    return f", +{delay_ms:g} ms/round trip" if delay_ms else ""


def _lifecycle(size: int, delay_ms: float = 0.0) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _pool(workspace, size, delay_ms) as (_store, engine):
            steady = Steady()

            def op() -> None:
                report = drone.reconcile(engine, steady, steady)
                if report["drones"] != size or report["moved"] or report["errors"]:
                    raise BenchError(f"reconcile: {report}")

            yield Bench(op)

    return Case(case_id("lifecycle", size, delay_ms),
                f"reconcile, {size:,} drones{_where(delay_ms)}", open_, needs="postgres")


def _floor(size: int, delay_ms: float = 0.0) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        import psycopg

        with _pool(workspace, size, delay_ms) as (store, _engine):
            sql = store.sql
            connection: Any = psycopg.connect(postgres.libpq(store.url))
            live = list(drone.LIVE_STATES)
            batch = drone.HEARTBEAT_BATCH

            def op() -> None:
                rows = connection.execute(
                    "SELECT key, data FROM lifecycle_resources WHERE machine = 'drone' "
                    "AND state = ANY(%s) ORDER BY key", (live,)).fetchall()
                connection.commit()
                now = dt.datetime.now(UTC)
                seen = 0
                for start in range(0, len(rows), batch):
                    keys = [key for key, _ in rows[start:start + batch]]
                    params = {"machine": "drone", "keys": keys}
                    with connection.cursor() as cursor:
                        ids = [r[0] for r in cursor.execute(
                            sql.resources_by_machine_keys, params).fetchall()]
                        status = psycopg.types.json.Jsonb(
                            {"resource_status": RUNNING, "machine_status": AVAILABLE})
                        cursor.executemany(sql.insert_observation, [
                            {"resource_id": rid, "status": status, "observed_at": now,
                             "recorded_at": now, "source": "reconcile"} for rid in ids],
                            returning=True)
                        observations = []
                        while True:
                            observations.append(cursor.fetchone()[0])
                            if not cursor.nextset():
                                break
                        cursor.executemany(sql.newest_observation, [
                            {"id_": rid, "observation_id": oid, "observed_at_": now}
                            for rid, oid in zip(ids, observations, strict=True)])
                    connection.commit()
                    with connection.cursor() as cursor:
                        seen += len(cursor.execute(sql.resources_by_machine_keys,
                                                   params).fetchall())
                    connection.commit()
                if seen != size:
                    raise BenchError(f"floor: read {seen} drones, not {size}")

            try:
                yield Bench(op)
            finally:
                connection.close()

    return Case(case_id("floor", size, delay_ms),
                f"raw psycopg, batched, {size:,} drones{_where(delay_ms)}", open_,
                needs="postgres")


CASES: list[Case] = [make(size, delay) for delay in DELAYS_MS for size in SIZES
                     for make in (_floor, _lifecycle)]
