"""Many OS processes fire at the same resources at once: nothing is lost, nothing is doubled.

Each worker process opens its own ``Store`` and ``Engine`` and fires triggers at random at a
few shared resources of a two-state toggle machine. Afterwards every fire a worker saw succeed
must be exactly one journal row, every resource's journal must be contiguous and replay to its
row, and every resource must sit in its initial state flipped once per transition.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from databases import round_trips
from procs.race import GUARDS, OTHER, RESOURCES, RUN_TIMEOUT_S, TOGGLE_SPEC
from procs.race import keys as _keys
from sqlalchemy import func, select

from lifecycle import Engine, GuardContext, Store
from lifecycle.store import journal, machines, resources, specs

RACE = str(Path(__file__).resolve().parent / "procs" / "race.py")


@dataclass
class _Outcome:
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _run_workers(forkserver: Any, kind: str, url: str, processes: int, fires: int,
                 seed: int) -> _Outcome:
    """``processes`` racers of ``kind`` (procs/race.py), released together once all are
    ready; one report (or traceback) from each.

    They are forked from one process of the session's fork server (tests/zygote.py), which
    imported lifecycle and its drivers once: a racer starts in milliseconds instead of a
    Python start (a third of a second of CPU each), and is still a process of its own with
    connections of its own."""
    done = forkserver.run([sys.executable, RACE, kind, url, str(processes), str(fires),
                           str(seed)], cwd=os.getcwd(), env=dict(os.environ),
                          timeout=2 * RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-5000:]
    said = json.loads(done.stdout.splitlines()[-1])
    reports = {int(index): report for index, report in said["reports"].items()}
    for report in reports.values():  # (JSON made the tuples lists)
        report["fired"] = [tuple(fire) for fire in report.get("fired", ())]
    return _Outcome(reports, said["errors"], said["seconds"])


def _race(forkserver: Any, url: str, processes: int, fires: int, seed: int) -> None:
    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [TOGGLE_SPEC], guards=GUARDS)
        rng = random.Random(seed)
        initial: dict[str, str] = {}
        initial_data: dict[str, dict[str, Any]] = {}
        for key in _keys():
            data = {"label": key}
            if rng.random() < 0.5:
                resource = engine.create("toggle", key, data)
            else:
                resource = engine.create("toggle", key, data, state="b")
            initial[key], initial_data[key] = resource.state, data

        outcome = _run_workers(forkserver, "fire", url, processes, fires, seed)
        assert not outcome.errors, "\n\n".join(outcome.errors)
        _check(engine, store, outcome, initial, initial_data, processes, fires)
    finally:
        store.dispose()


def _check(engine: Engine, store: Store, outcome: _Outcome, initial: dict[str, str],
           initial_data: dict[str, dict[str, Any]], processes: int, fires: int) -> None:
    reported: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for report in outcome.reports.values():
        for key, version, source, dest, trigger, payload in report["fired"]:
            reported[key].append((version, source, dest, trigger, payload))
    fired_total = sum(len(r["fired"]) for r in outcome.reports.values())
    refused_total = sum(r["refused"] for r in outcome.reports.values())
    retries = [r["retries"] for _, r in sorted(outcome.reports.items())]
    seconds = [round(r["seconds"], 1) for _, r in sorted(outcome.reports.items())]
    summary = (f"{processes} processes x {fires} fires on {store.dialect} in "
               f"{outcome.seconds:.1f} s: {fired_total} fired, {refused_total} refused; per "
               f"worker: seconds {seconds}, compare-and-swap retries {retries}")
    print(summary)
    assert fired_total + refused_total == processes * fires, summary

    problems: list[str] = []
    for index, report in sorted(outcome.reports.items()):
        problems += [f"worker {index}: {a}" for a in report["anomalies"][:10]]
    mismatches = engine.verify()
    problems += [f"verify(): {m}" for m in mismatches]

    transitions_total = 0
    handovers = 0  # consecutive transitions of one resource by different workers
    table = []
    for key in _keys():
        row = engine.get(f"toggle:{key}")
        history = engine.history(f"toggle:{key}")
        seqs = [entry.seq for entry in history]
        if seqs != list(range(1, len(seqs) + 1)):
            problems.append(f"{key}: journal seq is not 1..{len(seqs)}: {seqs}")
        if row.seq != len(history) or row.version != len(history):
            problems.append(f"{key}: row has seq {row.seq}, version {row.version} but the "
                            f"journal has {len(history)} rows")
        if history and history[0].kind not in ("create", "adopt"):
            problems.append(f"{key}: journal starts with {history[0].kind!r}")
        moves = [e for e in history if e.kind == "transition"]
        transitions_total += len(moves)
        handovers += sum(1 for x, y in itertools.pairwise(moves) if x.actor != y.actor)
        expected_state = initial[key] if len(moves) % 2 == 0 else OTHER[initial[key]]
        if row.state != expected_state:
            problems.append(f"{key}: started in {initial[key]!r}, took {len(moves)} "
                            f"transitions, so should be in {expected_state!r}, is in "
                            f"{row.state!r}")
        # replay the journal: each row starts where the previous one ended, and the data is
        # the creation data with every fired payload merged in order
        state, data = history[0].dest, dict(initial_data[key])
        for entry in moves:
            if entry.source != state or entry.dest != OTHER[state]:
                problems.append(f"{key}: seq {entry.seq} goes {entry.source!r} -> "
                                f"{entry.dest!r} but the journal had reached {state!r}")
            state = entry.dest
            data.update(entry.payload or {})
        if row.data != data:
            problems.append(f"{key}: data {row.data} is not the replayed {data} (lost update)")
        # every fire a worker saw succeed is exactly one journal row, with the same version
        in_journal = sorted((e.version, e.source, e.dest, e.trigger, e.payload) for e in moves)
        seen = sorted(reported[key], key=lambda item: item[0])
        if in_journal != seen:
            versions = Counter(v for v, *_ in seen)
            doubled = sorted(v for v, n in versions.items() if n > 1)
            journal_versions = {v for v, *_ in in_journal}
            seen_versions = set(versions)
            problems.append(
                f"{key}: workers saw {len(seen)} fires, the journal has {len(in_journal)} "
                f"transitions; versions reported twice: {doubled[:10]}; only in the journal: "
                f"{sorted(journal_versions - seen_versions)[:10]}; only reported: "
                f"{sorted(seen_versions - journal_versions)[:10]}")
        table.append(f"  {key}: {initial[key]} -> {row.state}, {len(moves)} transitions "
                     f"(reported {len(seen)}), version {row.version}")

    with store.read() as db:
        counted = db.execute(
            select(func.count()).select_from(journal).where(journal.c.kind == "transition")
        ).scalar_one()
        rows = db.execute(select(func.count()).select_from(resources)).scalar_one()
    print(f"  {handovers} hand-overs between workers on the same resource")
    if counted != fired_total or transitions_total != fired_total:
        problems.append(f"workers reported {fired_total} fires that fired; the journal has "
                        f"{counted} transition rows ({transitions_total} via history())")
    creators = sorted(i for i, r in outcome.reports.items() if r["created"])
    if len(creators) != 1:
        problems.append(f"workers {creators} all created 'contended'; exactly one should have")
    if rows != RESOURCES + 1:
        problems.append(f"{rows} resources in the database, expected {RESOURCES + 1}")
    assert not problems, "\n".join([summary, *problems[:50], "resources:", *table])


def test_sixteen_processes_race_on_postgresql(postgres_url: str, slow: bool,
                                             forkserver: Any) -> None:
    """Each write pipelined (two round trips): a compare-and-swap lost to another process
    still writes nothing and goes again. Sixteen writers on twenty resources lose some
    seventy races in 240 fires: a compare-and-swap left out, or its answer not read, fails
    the check in every run at this size; ``--slow`` fires 4,000 times. (An eight-process
    race beside it proved the same, losing fewer races a fire.)"""
    _race(forkserver, postgres_url, processes=16, fires=250 if slow else 15, seed=16)


def test_four_processes_race_on_sqlite(sqlite_url: str, slow: bool, forkserver: Any) -> None:
    """SQLite's writers take turns (``BEGIN IMMEDIATE``, waiting on a busy lock): a write
    that began deferred, or gave up on a lock at once, fails a racer within 15 fires."""
    _race(forkserver, sqlite_url, processes=4, fires=500 if slow else 40, seed=4)


def test_processes_starting_together_register_the_same_new_spec(db_url: str, slow: bool,
                                                                forkserver: Any) -> None:
    """Many processes deploying the same new machine at once (a restart of every worker
    after an upgrade) all start, and the spec is stored once. Four are enough: without
    registration's lock and its insert that tolerates a spec stored meanwhile (PostgreSQL),
    or with a deferred write transaction (SQLite), some fail in every run."""
    url = db_url
    processes = 8 if slow and url.startswith("postgresql") else 4
    Store(url, upgrade=True).dispose()
    outcome = _run_workers(forkserver, "register", url, processes, 0, 0)
    failures = [" ".join(e.splitlines()[:2]) for e in outcome.errors]
    assert not outcome.errors, (
        f"{len(outcome.errors)} of {processes} processes could not start an Engine with a new "
        f"spec while the others did the same:\n  " + "\n  ".join(failures)
        + "\n\nfirst traceback:\n" + outcome.errors[0])
    store = Store(url)
    try:
        with store.read() as db:
            stored = db.execute(select(specs.c.machine, specs.c.version)).all()
            current = db.execute(select(machines.c.name, machines.c.spec_version)).all()
        engine = Engine(store, [TOGGLE_SPEC], guards=GUARDS)
        version = engine.spec("toggle").version
        assert stored == [("toggle", version)]
        assert current == [("toggle", version)]
        assert sorted(r.key for r in engine.resources()) == [f"w{i}" for i in range(processes)]
    finally:
        store.dispose()


# A batch's writes are sent together on PostgreSQL (pipelined): a conflict on one resource in
# the middle of them must write nothing for it, and lose none of the others.
WORKS: dict[str, Any] = {
    "name": "works",
    "initial": "idle",
    "final": ["elsewhere", "done"],
    "states": ["idle", {"name": "busy", "timeout": {"after": 60, "trigger": "expire"}},
               "elsewhere", "done"],
    "transitions": [
        {"trigger": "poke", "source": "idle", "dest": "elsewhere"},
        {"trigger": "expire", "source": "busy", "dest": "done", "guards": ["go"],
         "effects": ["tidy"]},
    ],
    "eventless": [{"source": "idle", "dest": "busy", "guards": ["go"], "effects": ["ping"]}],
}


def _written(store: Store, key: str) -> tuple[list[str | None], int, int]:
    """The journal's triggers of ``key``, its effects and its timers."""
    from lifecycle.store import outbox, timers

    with store.read() as db:
        rid = db.execute(select(resources.c.id).where(resources.c.key == key)).scalar_one()
        triggers = list(db.execute(select(journal.c.trigger).where(
            journal.c.resource_id == rid).order_by(journal.c.seq)).scalars())
        effects = db.execute(select(func.count()).select_from(outbox).where(
            outbox.c.resource_id == rid)).scalar_one()
        timed = db.execute(select(func.count()).select_from(timers).where(
            timers.c.resource_id == rid)).scalar_one()
    return triggers, effects, timed


def test_a_conflict_in_the_middle_of_a_pipelined_batch_writes_nothing_for_it(
        postgres_url: str) -> None:
    with Store(postgres_url, upgrade=True) as store, Store(postgres_url) as elsewhere:
        other = Engine(elsewhere, [WORKS], guards={"go": lambda c: True},
                       effects={"ping": lambda call: None, "tidy": lambda call: None})

        def go(context: GuardContext) -> bool:
            if context.key == "b" and context.state == "idle":  # after the batch's read
                other.fire("works:b", "poke")
            return True

        engine = Engine(store, [WORKS], guards={"go": go},
                        effects={"ping": lambda call: None, "tidy": lambda call: None})
        for key in "abc":
            engine.create("works", key)
        results = engine.step_many(["works:a", "works:b", "works:c"], retry_conflicts=False)
        assert [type(r).__name__ for r in results] == ["FireResult", "ConcurrencyError",
                                                       "FireResult"]
        assert _written(store, "a") == ([None, None], 1, 1)
        assert _written(store, "c") == ([None, None], 1, 1)
        # b: its creation and the other writer's poke; no transition, effect or timer of the
        # batch's (a busy state would have set one)
        assert _written(store, "b") == ([None, "poke"], 0, 0)
        assert engine.get("works:b").state == "elsewhere"
        assert engine.verify() == []


def test_a_timer_fire_whose_row_moved_undoes_the_timer_mark_and_goes_again(
        db_url: str) -> None:
    """A timer's fire marks the timer fired with its read, then writes the transition: when
    the row moved in between, the write is strict, so the mark is undone with it, and the
    fire decided again finds the timer still pending."""
    from lifecycle.store import timers

    with Store(db_url, upgrade=True) as store, Store(db_url) as elsewhere:
        handlers = {"ping": lambda call: None, "tidy": lambda call: None}
        other = Engine(elsewhere, [WORKS], guards={"go": lambda c: True}, effects=handlers)
        decided: list[int] = []

        def go(context: GuardContext) -> bool:
            if context.state == "busy":
                decided.append(context.version)
                if len(decided) == 1 and store.dialect == "postgresql":
                    other.update("works:t", {"moved": True})  # between read and write
            return True

        engine = Engine(store, [WORKS], guards={"go": go}, effects=handlers)
        engine.create("works", "t")
        engine.step("works:t")
        with store.read() as db:
            [timer_id] = db.execute(select(timers.c.id)).scalars()
        result = engine.fire_timer(timer_id, "works:t", "expire")
        assert result is not None and result.fired and result.dest == "done"
        if store.dialect == "postgresql":  # SQLite's writer holds the lock: nobody moves it
            assert decided == [2, 3]
        triggers, effects, _ = _written(store, "t")
        assert triggers.count("expire") == 1
        assert effects == 2  # ping, then tidy once
        with store.read() as db:
            assert db.execute(select(timers.c.status)).scalars().all() == ["fired"]
        assert engine.verify() == []


# -- what a write sends on PostgreSQL: what it must, and no more ------------------------------

GUARDED: dict[str, Any] = {
    "name": "guarded",
    "initial": "idle",
    "final": ["done"],
    "states": ["idle", "done"],
    "transitions": [{"trigger": "finish", "source": "idle", "dest": "done", "guards": ["go"]}],
    "eventless": [{"source": "idle", "dest": "done", "guards": ["go"]}],
}




def test_a_write_that_writes_nothing_sends_nothing_after_its_read(counted: Any) -> None:
    """A batch whose resources have nothing to do, a fire its guard refuses: their reads, one
    round trip, and nothing more (no BEGIN, no COMMIT: nothing was written)."""
    with Store(counted.url) as store:
        engine = Engine(store, [GUARDED], guards={"go": lambda c: bool(c.data.get("go"))})
        keys = [f"guarded:g{i}" for i in range(8)]
        for key in keys:
            engine.create("guarded", key.split(":")[1])
        for _ in range(6):  # psycopg prepares a statement on its sixth run (a round trip)
            engine.step_many(keys)
            engine.fire(keys[0], "finish")
        assert [round_trips(counted, lambda: engine.step_many(keys)) for _ in range(3)] == [1] * 3
        assert [round_trips(counted, lambda: engine.fire(keys[0], "finish"))
                for _ in range(3)] == [1] * 3
        assert not engine.fire(keys[0], "finish").fired
        # and what writes, writes: the read, then the writes with their commit
        engine.update(keys[1], {"go": True})
        assert round_trips(counted, lambda: engine.step(keys[1])) == 2
        assert engine.get(keys[1]).state == "done"
        assert [e.kind for e in engine.history(keys[1])] == ["create", "update", "transition"]
        assert [engine.get(k).state for k in keys].count("idle") == 7
        assert engine.verify() == []


def test_a_single_write_sent_alone_whose_row_moved_writes_nothing_and_goes_again(
        postgres_url: str) -> None:
    """A write with nothing else in its transaction is sent alone at the commit, without
    BEGIN and COMMIT (one statement: atomic by itself). A strict one (a ``Within`` hook's,
    here writing nothing) whose row another writer moved after the read fails whole, and the
    fire is decided again on what was written; a plain one writes nothing and goes again."""
    from lifecycle.within import Within

    with Store(postgres_url, upgrade=True) as store, Store(postgres_url) as elsewhere:
        other = Engine(elsewhere, [TOGGLE_SPEC], guards=GUARDS)
        engine = Engine(store, [TOGGLE_SPEC], guards=GUARDS)
        engine.create("toggle", "s")
        engine.create("toggle", "p")
        seen: list[str] = []

        class Meddler(Within):
            def after(self, tx: Any, result: Any) -> None:
                seen.append(result.source)
                if len(seen) == 1:  # between this fire's read and its write
                    other.update("toggle:s", {"moved": 1})

        result = engine.fire("toggle:s", "flip", within=Meddler())
        assert result.fired and seen == ["a", "a"]
        history = engine.history("toggle:s")
        assert [(e.kind, e.trigger) for e in history] == [
            ("create", None), ("update", None), ("transition", "flip")]
        assert engine.get("toggle:s").data == {"moved": 1}

        decided: list[int] = []

        def ok(context: GuardContext) -> bool:
            decided.append(context.version)
            if len(decided) == 1:
                other.update("toggle:p", {"moved": 2})
            return True

        plain = Engine(store, [TOGGLE_SPEC], guards={"ok": ok})
        assert plain.fire("toggle:p", "set_b").fired
        assert decided == [1, 2]
        assert [(e.kind, e.trigger) for e in plain.history("toggle:p")] == [
            ("create", None), ("update", None), ("transition", "set_b")]
        assert engine.verify() == []
