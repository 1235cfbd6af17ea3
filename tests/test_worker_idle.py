"""What a ``run_until_idle`` with little to do costs: the simulations call it thousands of
times, each with an effect or two to do. It claims until a claim (made after recording what
finished, in the same transaction) and a look for timers find nothing, and no more; it looks
for dead workers of its host at most once per ``DEAD_LOOK``; and it starts no heartbeat
thread for claims it finishes within a heartbeat. The statements are SQLite's own trace; the
worker's monotonic clock is the test's, so that nothing depends on how fast the machine is."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from procs import gated
from sqlalchemy import event

from lifecycle import Effect, EffectCall, Engine, Store, Worker
from lifecycle.spec import load_spec
from lifecycle.worker_core import DEAD_LOOK

KINDS = {
    "claim": "UPDATE lifecycle_effects SET status='running'",
    "timer look": "FROM lifecycle_timers JOIN",
    "dead look": "SELECT DISTINCT lifecycle_effects.claimant",
}


class _Clock:
    """The worker's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.integration  # (a database of its own, to trace its statements)
def test_a_run_until_idle_claims_and_looks_only_until_it_finds_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idle.db'}"
    Store(url, upgrade=True).dispose()
    statements: list[str] = []
    heartbeats: list[bool] = []

    def work(_call: EffectCall) -> None:
        heartbeats.append(any(t.name.startswith("lifecycle-heartbeat-")
                              for t in threading.enumerate()))

    with Store(url) as store:
        event.listen(store.engine, "checkout",
                     lambda dbapi, _record, _proxy: dbapi.set_trace_callback(statements.append))
        engine = Engine(store, [load_spec(gated.SPEC)], effects={"work": Effect(work)})
        worker = Worker(engine, seed=0)
        clock = worker.core.monotonic = _Clock()

        def run_until_idle() -> Counter[str]:
            statements.clear()
            worker.run_until_idle()
            return Counter(kind for text in statements for kind, mark in KINDS.items()
                           if mark in text)

        engine.create("gated", "a")
        engine.fire("a", "go")
        first = run_until_idle()
        # the effect; then its outcome recorded with a claim that finds nothing, and the
        # look for timers after it: idle
        assert first["claim"] == 2, first
        assert first["dead look"] == 1, first  # a worker's first idle round looks
        assert heartbeats == [False], "a heartbeat started for a claim held a moment"
        assert engine.get("a").state == "working"  # (the effect asks for no follow-up)

        nothing: dict[str, Any] = dict(run_until_idle())
        assert nothing == {"claim": 1, "timer look": 1}, "nothing to do costs one round"

        clock.now += DEAD_LOOK
        assert run_until_idle()["dead look"] == 1, "the next look once DEAD_LOOK has passed"
