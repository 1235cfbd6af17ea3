"""The worker's core on its own, with no driver: what it asks for (``Start``, ``Wait``,
``Abandon``) is all a driver sees, and a handler's outcome is whatever the test hands back.
No handler runs here: the core does not run them."""

from __future__ import annotations

import pytest
from procs import gated

from lifecycle import Effect, Engine, Store, effect_records
from lifecycle.spec import load_spec
from lifecycle.worker_core import Abandon, Start, Wait, WorkerCore


def _never_called(_call: object) -> None:
    raise AssertionError("the core ran a handler itself")


def test_the_core_asks_its_driver_and_a_fast_stop_abandons_what_runs(store: Store) -> None:
    """Two slots, three effects: two starts, then a wait; one outcome handed back frees a
    slot for the third; a fast stop abandons the two running, records the finished one and
    gives the others back with their attempts returned; the heartbeat is gone."""
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(_never_called, timeout=600.0)})
    for i in range(3):
        engine.create("gated", f"c{i}")
        engine.fire(f"c{i}", "go")
    core = WorkerCore(engine, concurrency=2, seed=0)
    working = core.working()
    first, second = next(working), next(working)
    assert isinstance(first, Start) and isinstance(second, Start)
    assert isinstance(next(working), Wait)  # both slots busy, nothing ended
    assert core.handler_ended(first.call, "ok", None)
    third = next(working)
    assert isinstance(third, Start)
    assert {first.call.key, second.call.key, third.call.key} == {"c0", "c1", "c2"}
    core.stop(fast=True)
    abandon = next(working)
    assert isinstance(abandon, Abandon)
    assert {c.key for c in abandon.calls} == {second.call.key, third.call.key}
    with pytest.raises(StopIteration) as end:
        next(working)
    assert end.value.value.done == 1
    # an abandoned handler's late outcome is not wanted
    assert not core.handler_ended(second.call, "ok", None)
    records = {r.key: r for r in effect_records(engine)}
    assert (records[first.call.key].status, records[first.call.key].attempts) == ("done", 1)
    for call in (second.call, third.call):
        record = records[call.key]
        assert (record.status, record.attempts, record.claimed_by) == ("pending", 0, None)
    assert not core.heartbeat_alive() and core.held() == set()
