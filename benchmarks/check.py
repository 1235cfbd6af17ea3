"""Case 13: ``lifecycle check``'s exploration speed, per state explored.

The drone's world (one drone: the site starting and ending its job, a status cache that
lags, the demand dropping, the clock moving) explored breadth first to the bounds the test
suite uses, on the fixed machine (no violation: every state to the depth bound) and on
TARDIS's (until the shortest counterexample of each invariant), one whole exploration per
operation, timed per state explored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lifecycle.check import Bounds, check
from lifecycle.check.worlds import world_model

from .harness import Bench, BenchError, Case, Settings, Workspace

BOUNDS = Bounds(depth=10, horizon=120)


def settings(rounds: int | None, quick: bool) -> Settings:
    """One exploration per round (each is seconds long), no warm-up run."""
    return Settings(rounds=rounds or (1 if quick else 3), round_seconds=0.0,
                    warmup_seconds=0.0, min_warmup_ops=0, ops=1)


def _case(machine: str, violated: bool) -> Case:
    @contextmanager
    def open_(_workspace: Workspace) -> Iterator[Bench]:
        explored = [0.0]

        def op() -> None:
            model = world_model(machine)
            assert model is not None
            report = check(model, BOUNDS)
            if report.passed == violated:
                raise BenchError(f"check {machine}: expected "
                                 f"{'a violation' if violated else 'none'}, found "
                                 f"{sorted(report.violations) or 'none'}")
            explored[0] += report.states

        def units() -> float:
            since, explored[0] = explored[0], 0.0
            return since

        yield Bench(op, units=units)

    return Case(f"check.{machine}", f"lifecycle check {machine}, depth {BOUNDS.depth}, "
                                    f"horizon {BOUNDS.horizon:g} s (per state)", open_)


CASES = [_case("drone", violated=False), _case("drone_tardis", violated=True)]
