"""Case 13: ``lifecycle check``'s exploration speed, per state explored.

The drone's world (one drone: the site starting and ending its job, a status cache that
lags, the demand dropping, the clock moving) explored breadth first to the bounds the test
suite uses, on the fixed machine (no violation: every state to the depth bound) and on
TARDIS's (until the shortest counterexample of each invariant); and the other built-in
fixed machines' worlds at the test suite's bounds (the startd's slot, the dispatcher's
container with its rate limit, its scancel flood with its pool of commands run at once, the
job exit's queue and mail server). One whole
exploration per operation, timed per state explored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lifecycle.check import Bounds, check
from lifecycle.check.worlds import world_model

from .harness import Bench, BenchError, Case, Settings, Workspace

BOUNDS = Bounds(depth=10, horizon=120)
OTHERS = {"startd": Bounds(depth=20), "slurm_dispatch": Bounds(depth=8, horizon=3),
          "slurm_dispatch_in_flight": Bounds(depth=6, horizon=2),
          "job_exit": Bounds(depth=8, horizon=60)}
"""The other fixed machines, at the bounds their tests use."""


def settings(rounds: int | None, quick: bool) -> Settings:
    """One exploration per round (each is seconds long), no warm-up run."""
    return Settings(rounds=rounds or (1 if quick else 3), round_seconds=0.0,
                    warmup_seconds=0.0, min_warmup_ops=0, ops=1)


def _case(machine: str, violated: bool, bounds: Bounds = BOUNDS) -> Case:
    @contextmanager
    def open_(_workspace: Workspace) -> Iterator[Bench]:
        explored = [0.0]

        def op() -> None:
            model = world_model(machine)
            assert model is not None
            report = check(model, bounds)
            if report.passed == violated:
                raise BenchError(f"check {machine}: expected "
                                 f"{'a violation' if violated else 'none'}, found "
                                 f"{sorted(report.violations) or 'none'}")
            explored[0] += report.states

        def units() -> float:
            since, explored[0] = explored[0], 0.0
            return since

        yield Bench(op, units=units)

    return Case(f"check.{machine}", f"lifecycle check {machine}, depth {bounds.depth}, "
                                    f"horizon {bounds.horizon:g} s (per state)", open_)


CASES = [_case("drone", violated=False), _case("drone_tardis", violated=True),
         *(_case(name, violated=False, bounds=b) for name, b in OTHERS.items())]
