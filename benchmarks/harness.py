"""Timing: warm up, calibrate, then time every case of a group in interleaved rounds.

A case is a context manager that sets itself up and yields a :class:`Bench`: ``op`` does one
operation (and raises if it did not do what it should); ``verify`` checks afterwards, from
the database, that every operation really happened. Cases of one group are open together
and timed round-robin, so drift of the machine (other load, WAL growth, CPU frequency)
spreads over all of them instead of biasing whichever ran last.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import postgres


class BenchError(AssertionError):
    """An operation under test did not do what it should: the numbers would be meaningless."""


@dataclass(slots=True)
class Bench:
    op: Callable[[], Any]
    verify: Callable[[int], None] | None = None
    """Called with the number of operations run; raises :class:`BenchError` on a mismatch."""
    units: Callable[[], float] | None = None
    """The units of work the operations did since it was last called, when an operation's
    work varies (a simulation's drone-hours): the times are then per unit, not per op."""


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    label: str
    open: Callable[[Workspace], AbstractContextManager[Bench]]
    needs: str | None = None
    """``"postgres"`` when the case needs the PostgreSQL server."""


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int = 7
    round_seconds: float = 0.6
    warmup_seconds: float = 0.25
    min_warmup_ops: int = 30
    ops: int | None = None
    """A fixed number of operations per round; by default calibrated to ``round_seconds``."""

    @classmethod
    def quick(cls) -> Settings:
        return cls(rounds=2, round_seconds=0.04, warmup_seconds=0.02, min_warmup_ops=5)


@dataclass(slots=True)
class Measurement:
    case: Case
    ops_per_round: int
    samples_us: list[float] = field(default_factory=list)
    """Wall-clock microseconds per operation, one sample per round."""
    cpu_samples_us: list[float] = field(default_factory=list)
    """This process's CPU microseconds per operation (without the database server's)."""
    warmup_ops: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.samples_us)

    def ratio_to(self, reference: Measurement) -> float:
        """The median of the per-round ratios when both ran in the same interleaved rounds
        (slow phases of the machine then cancel out), else the ratio of the medians."""
        if len(self.samples_us) == len(reference.samples_us) and self.samples_us:
            return statistics.median(
                s / r for s, r in zip(self.samples_us, reference.samples_us, strict=True))
        return self.median / reference.median

    def cpu_ratio_to(self, reference: Measurement) -> float:
        """As :meth:`ratio_to`, of this process's CPU time (the database server's left out:
        on PostgreSQL, what the client library costs)."""
        if len(self.cpu_samples_us) == len(reference.cpu_samples_us) and self.cpu_samples_us:
            return statistics.median(
                s / max(r, 1e-9)
                for s, r in zip(self.cpu_samples_us, reference.cpu_samples_us, strict=True))
        return statistics.median(self.cpu_samples_us) / statistics.median(
            reference.cpu_samples_us)

    @property
    def spread(self) -> float:
        """Half the range of the rounds, relative to the median."""
        return (max(self.samples_us) - min(self.samples_us)) / 2 / self.median

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.case.label, "us_per_op": round(self.median, 3),
            "min_us": round(min(self.samples_us), 3), "max_us": round(max(self.samples_us), 3),
            "samples_us": [round(s, 3) for s in self.samples_us],
            "cpu_us_per_op": round(statistics.median(self.cpu_samples_us), 3),
            "ops_per_round": self.ops_per_round, "rounds": len(self.samples_us),
            "warmup_ops": self.warmup_ops,
        }


class Workspace:
    """Where cases put their databases: a temporary directory for SQLite files and, when
    the server is reachable, PostgreSQL schemas of their own. Everything is removed on
    close."""

    def __init__(self, directory: Path, postgres_url: str | None, stack: ExitStack):
        self.directory = directory
        self.postgres_url = postgres_url
        self.stack = stack

    def sqlite_path(self, name: str) -> Path:
        return self.directory / f"{name}.db"

    def postgres_schema(self, name: str) -> str:
        """A fresh schema, dropped when the workspace closes; returns a SQLAlchemy URL whose
        search_path is that schema."""
        assert self.postgres_url is not None, "case needs PostgreSQL but it is unreachable"
        schema = postgres.create_schema(self.postgres_url, name)
        self.stack.callback(postgres.drop_schema, self.postgres_url, schema)
        return postgres.with_search_path(self.postgres_url, schema)


def _timed(op: Callable[[], Any], n: int) -> float:
    """Seconds for ``n`` operations."""
    start = time.perf_counter()
    for _ in range(n):
        op()
    return time.perf_counter() - start


def _timed_with_cpu(op: Callable[[], Any], n: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds for ``n`` operations."""
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(n):
        op()
    return time.perf_counter() - start, time.process_time() - cpu


def warm_up(bench: Bench, settings: Settings) -> tuple[int, float]:
    """Run operations until ``warmup_seconds`` passed and at least ``min_warmup_ops`` ran, in
    growing batches; returns how many ran and the cost of one (in seconds): the fastest
    batch of the warm second half, so that a moment of other load on the machine does not
    shrink the rounds."""
    op = bench.op
    n, elapsed, batch = 0, 0.0, 1
    batches: list[float] = []
    while n < settings.min_warmup_ops or elapsed < settings.warmup_seconds:
        spent = _timed(op, batch)
        n += batch
        elapsed += spent
        per_op = max(spent / batch, 1e-9)
        batches.append(per_op)
        # a batch takes at most a quarter of the warm-up, so the estimate is recent
        batch = max(1, min(batch * 2, int(settings.warmup_seconds / 4 / per_op)))
    return n, min(batches[len(batches) // 2:]) if batches else 0.0


def run_group(
    cases: list[Case],
    workspace: Workspace,
    settings: Settings,
    skipped: dict[str, str],
    progress: Callable[[str], None] = lambda _message: None,
) -> dict[str, Measurement]:
    """Open every case, warm each up, then time them in interleaved rounds. A case whose
    library is not installed is left out, with the reason in ``skipped``."""
    results: dict[str, Measurement] = {}
    with ExitStack() as stack:
        benches: dict[str, Bench] = {}
        for case in cases:
            progress(f"setting up {case.label}")
            try:
                benches[case.id] = stack.enter_context(case.open(workspace))
            except ImportError as exc:
                skipped[case.id] = (f"{exc.name or exc} is not installed: "
                                    "pip install -e '.[bench]'")
        cases = [case for case in cases if case.id in benches]
        if not cases:
            return results
        for case in cases:
            progress(f"warming up {case.label}")
            warm, per_op = warm_up(benches[case.id], settings)
            ops = settings.ops or max(5, round(settings.round_seconds / max(per_op, 1e-9)))
            results[case.id] = Measurement(case, ops, warmup_ops=warm)
        for r in range(settings.rounds):
            # rotate the order so no case always runs first or last
            order = cases[r % len(cases):] + cases[:r % len(cases)]
            for case in order:
                progress(f"round {r + 1}/{settings.rounds}: {case.label}")
                m = results[case.id]
                gc.collect()
                bench = benches[case.id]
                if bench.units is not None:
                    bench.units()  # (what the warm-up did is not this round's)
                seconds, cpu = _timed_with_cpu(bench.op, m.ops_per_round)
                done = bench.units() if bench.units is not None else m.ops_per_round
                m.samples_us.append(seconds / done * 1e6)
                m.cpu_samples_us.append(cpu / done * 1e6)
        for case in cases:
            verify = benches[case.id].verify
            if verify is not None:
                m = results[case.id]
                verify(m.warmup_ops + m.ops_per_round * settings.rounds)
    return results
