"""Outcomes recorded in batches keep exactly once: a worker process killed (SIGKILL) while
the transaction that records its finished handlers' outcomes is open loses none of them and
records none twice; the handlers whose outcomes had not committed run again, once, and
their follow-ups fire once. Both drivers, both databases; every wait waits for an event."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import gated
from procs.warm import said_pid
from waiting import until

from lifecycle import Engine, Store, Worker
from lifecycle.outbox_admin import effect_records
from lifecycle.spec import load_spec

SCRIPT = str(Path(__file__).resolve().parent / "procs" / "run_gated_worker.py")
HELD = "g5"
"""The effect whose outcome's transaction the killed worker holds open."""


@pytest.fixture
def run_cmd(forkserver: Any) -> list[str]:
    """`python procs/run_gated_worker.py`, started warm (tests/zygote.py): the worker says its
    own pid, which the test kills (procs/warm.py)."""
    return forkserver.python(SCRIPT)  # type: ignore[no-any-return]


@pytest.fixture
def gated_engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    names = {"GATED_CALLS": str(tmp_path / "calls"), "GATED_HOLD": str(tmp_path / "hold"),
             "GATED_HOLD_KEY": HELD}
    os.environ.update(names)
    engine = Engine(Store(db_url, upgrade=True), [load_spec(gated.SPEC)],
                    effects=gated.effects)
    yield engine
    engine.store.dispose()
    for name in names:
        os.environ.pop(name, None)


def _lines(tmp_path: Path, what: str) -> Counter[str]:
    return Counter(key for kind, key, _ in gated.calls(tmp_path / "calls") if kind == what)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_worker_killed_before_its_batch_commits_loses_and_repeats_no_outcome(
        gated_engine: Engine, db_url: str, tmp_path: Path, kind: str,
        run_cmd: list[str]) -> None:
    """P1 (concurrency 4, batch 8) claims 8 effects and runs their handlers; the
    transaction recording g5's outcome (with the outcomes fired beside it) is held open,
    and P1 is killed there. A second worker then finishes the work: every effect is done
    once, each follow-up fired once, the handlers whose outcomes P1 had committed ran once,
    and the others at most twice (g5's, whose outcome was never committed, twice)."""
    engine = gated_engine
    hold = tmp_path / "hold"
    hold.touch()
    keys = [f"g{i}" for i in range(8)]
    for key in keys:
        engine.create("gated", key)
        engine.fire(key, "go")
    p1 = subprocess.Popen([*run_cmd, kind, db_url, "30", "4", "8"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pid = said_pid(p1)
        until(lambda: HELD in _lines(tmp_path, "writing"),
              "P1 to record g5's outcome (and hold its transaction open)")
        os.kill(pid, signal.SIGKILL)
        p1.wait(timeout=60)  # (its client dies of the same signal, once it is reaped)
    finally:
        if p1.poll() is None:
            p1.kill()
            p1.wait(timeout=60)
        assert p1.stderr is not None and p1.stdout is not None
        p1.stderr.close()
        p1.stdout.close()
    assert p1.returncode == -signal.SIGKILL
    committed = {r.key for r in effect_records(engine) if r.status == "done"}
    ran_in_p1 = _lines(tmp_path, "end")
    assert HELD in ran_in_p1 and HELD not in committed
    assert {r.status for r in effect_records(engine)} <= {"done", "running"}
    hold.unlink()
    # P1's process is gone: a worker of this host takes its claims over at once
    Worker(engine, concurrency=4, name="p2").run_until_idle()
    assert {r.status for r in effect_records(engine)} == {"done"}
    ends = _lines(tmp_path, "end")
    assert set(ends) == set(keys)
    assert all(ends[key] == 1 for key in committed), ends
    assert all(ends[key] <= 2 for key in keys), ends
    assert ends[HELD] == 2
    for key in keys:
        assert engine.get(key).state == "done"
        assert [e.trigger for e in engine.history(key)].count("finished") == 1, key
    assert engine.verify() == []
