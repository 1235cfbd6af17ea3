"""The worker of a simulation: the worker's core driven on the simulation's own thread."""

from __future__ import annotations

import time
from typing import Any

from ..effects import EffectCall
from ..engine import Engine
from ..freshness import run_to_end
from ..worker_core import DEFAULT_LEASE, Pause, Start, Wait, WorkerCore, Working


class InlineWorker:
    """Carries out the effects and timers due, one handler at a time, on the thread that
    asks. A simulation's handlers act on its simulated world and return at once: the
    :class:`~lifecycle.Worker`'s handler threads would only add two hand-offs between
    threads to every effect (most of a run's time on a busy machine) and nothing a run
    measures. The core is :attr:`core`, the same as the thread worker's; its heartbeat
    starts, as the thread worker's, only once a claim has been held for a heartbeat (10 s of
    the default lease), which the core sees between two handlers: a handler that itself runs
    longer than that is not renewed while it runs."""

    def __init__(self, engine: Engine, *, seed: int, lease: float = DEFAULT_LEASE) -> None:
        self.core = WorkerCore(engine, lease=lease, seed=seed, lazy_heartbeat=True)

    def run_until_idle(self) -> None:
        """Every effect and timer due now, and those their completion makes due."""
        working = self.core.working(until_idle=True)
        for need in working:
            if isinstance(need, Start):
                if not self.carry_out(need.call, working):
                    return
            elif isinstance(need, Wait | Pause):  # (a database outage: nothing else runs)
                time.sleep(need.seconds)

    def carry_out(self, call: EffectCall, working: Working) -> bool:
        """Run ``call``'s handler and hand its outcome to the core; whether to go on."""
        outcome: tuple[str, Any]
        try:
            outcome = ("ok", run_to_end(self.core.engine.handlers[call.name].handler(call)))
        except Exception as exc:  # the handler's failure is recorded
            outcome = ("error", exc)
        self.core.handler_ended(call, *outcome)
        return True
