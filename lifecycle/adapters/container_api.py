"""The container API a Slurm dispatcher answers to (the ``slurm_dispatch`` machine): what it
must be told when a container's job has left Slurm's queue.

Arvados' dispatcher, when a job leaves squeue, reads its container's state: one still
``Running`` lost its job, so it is marked ``Cancelled``; one still ``Locked`` never
started, so it is unlocked (back to ``Queued``, for any dispatcher to take); any other
(``Complete``, ``Cancelled``, ``Queued``) is left alone. The machine runs that rule as a
durable effect (its outbox), so it is done once the transition that saw the job leave has
committed, even across a crash, and retried while the API fails. An application plugs in
its own API with an object of the three methods of :class:`ContainerAPI`; for Arvados,
``state`` reads ``containers().get(uuid=...)["state"]``, ``cancel`` updates the container
to ``{"state": "Cancelled"}`` and ``unlock`` calls ``containers().unlock(uuid=...)``.
:class:`MemoryContainerAPI` keeps containers in memory (tests, simulations, scenarios).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

QUEUED, LOCKED, RUNNING, COMPLETE, CANCELLED = (
    "Queued", "Locked", "Running", "Complete", "Cancelled")


class ContainerAPI(Protocol):
    """What the dispatcher needs of the container API. Each call may be repeated (the effect
    is retried after a failure): the rule reads the state again each time."""

    def state(self, uuid: str) -> str:
        """The container's state: ``Queued``, ``Locked``, ``Running``, ``Complete`` or
        ``Cancelled``."""
        ...

    def cancel(self, uuid: str) -> None:
        """Mark a ``Running`` container ``Cancelled``."""
        ...

    def unlock(self, uuid: str) -> None:
        """Give a ``Locked`` container back to the queue (``Queued``)."""
        ...


def job_left(api: ContainerAPI, uuid: str) -> str | None:
    """What the container's job leaving squeue means for it, done through ``api``:
    ``"cancelled"`` (it was Running), ``"unlocked"`` (it was Locked), or None."""
    state = api.state(uuid)
    if state == RUNNING:
        api.cancel(uuid)
        return "cancelled"
    if state == LOCKED:
        api.unlock(uuid)
        return "unlocked"
    return None


class MemoryContainerAPI:
    """Containers in memory: ``states`` by uuid (an unknown one is ``Complete``), and every
    change made through this API in ``changes`` (uuid, old state, new state)."""

    def __init__(self, states: Mapping[str, str] | None = None) -> None:
        self.states: dict[str, str] = dict(states or {})
        self.changes: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def state(self, uuid: str) -> str:
        with self._lock:
            return self.states.get(uuid, COMPLETE)

    def set(self, uuid: str, state: str) -> None:
        """The container's state changed elsewhere (crunch-run, a user)."""
        with self._lock:
            self.states[uuid] = state

    def cancel(self, uuid: str) -> None:
        self._change(uuid, RUNNING, CANCELLED)

    def unlock(self, uuid: str) -> None:
        self._change(uuid, LOCKED, QUEUED)

    def _change(self, uuid: str, old: str, new: str) -> None:
        with self._lock:
            if self.states.get(uuid, COMPLETE) == old:
                self.states[uuid] = new
                self.changes.append((uuid, old, new))
