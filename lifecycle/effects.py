"""Effects: the side effects a transition asks for, and what their handlers are given.

A transition's effects are written in the transition's own transaction, one row each in the
outbox; a :class:`~lifecycle.worker.Worker` claims them after the commit and runs their
handlers outside any transaction. This module holds only the definitions: a handler, its
retry policy and timeout (:class:`Effect`, :class:`Retry`), what it is called with
(:class:`EffectCall`) and what it may answer (:class:`FollowUp`). The worker is in
``lifecycle.worker``, the outbox's listings and repairs in ``lifecycle.outbox_admin``.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .results import DONE, FAILED, GAVE_UP, PENDING, RUNNING

if TYPE_CHECKING:
    from .store import Transaction


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how patiently an effect is retried: exponential backoff from ``base``
    seconds, capped at ``cap``, with up to ``jitter`` of each delay taken off at random;
    at most ``max_attempts`` attempts (None: forever)."""

    max_attempts: int | None = 5
    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        raw = min(self.cap, self.base * 2.0 ** max(0, attempt - 1))
        return float(raw * (1 - self.jitter * rng.random()))


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Returned by a handler: fire ``trigger`` on the effect's resource in the transaction
    that marks the effect done."""

    trigger: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    writes: Callable[[Transaction], None] | None = None
    """Database writes of the handler's own, given the transaction
    (:class:`lifecycle.store.Transaction`) that marks the effect done (after the worker's
    claim was checked) and fires ``trigger``: they commit exactly once, with the effect's
    completion (a job-queue update). No I/O in them; if they raise, the attempt failed."""


Handler = Callable[["EffectCall"], FollowUp | None]


@dataclass(frozen=True, slots=True)
class Effect:
    """A handler with its retry policy and its timeout (seconds of real time; a handler
    that takes longer is abandoned and the attempt counts as failed)."""

    handler: Handler
    retry: Retry = Retry()
    timeout: float | None = 300.0


def as_effect(value: Handler | Effect) -> Effect:
    return value if isinstance(value, Effect) else Effect(value)


@dataclass(slots=True)
class EffectCall:
    """What a handler receives: the effect, the transition that asked for it, the resource's
    data as the effect was claimed, and the fence when the transition rested on an
    observation. ``idempotency_key`` is the same on every attempt."""

    id: int
    name: str
    machine: str
    key: str
    args: dict[str, Any]
    idempotency_key: str
    fence: dict[str, Any] | None
    attempt: int
    seq: int
    trigger: str | None
    payload: dict[str, Any]
    data: dict[str, Any]
    progress: dict[str, Any]
    now: dt.datetime
    """When the effect was claimed, by the engine's clock (handlers never read the wall
    clock, so simulations stay reproducible)."""
    saver: Callable[[EffectCall], None] | None = field(default=None, repr=False)
    """How :meth:`save_progress` commits (the worker's; None keeps progress in memory)."""

    def save_progress(self, values: Mapping[str, Any]) -> None:
        """Keep ``values`` for later attempts of this effect (committed at once)."""
        self.progress.update(values)
        if self.saver is not None:
            self.saver(self)


__all__ = ["DONE", "FAILED", "GAVE_UP", "PENDING", "RUNNING", "Effect", "EffectCall", "FollowUp",
           "Handler", "Retry", "as_effect"]
