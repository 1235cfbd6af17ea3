"""Observations, freshness rules and probes: no risky edge fires on a stale picture.

A risky edge carries ``fresh: {max_age, probe}``. It fires only when the resource's newest
observation was observed (a) no earlier than the resource's last transition committed and (b)
at most ``max_age`` seconds before now. Condition (a) is what makes a status cached from
before the last action useless, as Kubernetes' observed generation does. (An observation at
the very instant of the transition counts: with the wall clock a tie is a microsecond
coincidence; with a simulated clock, events at one instant are ordered by cause, and a status
made at that instant describes it.) When the held observation is not fresh and the rule names
a probe, the engine asks the probe, outside any transaction and with a timeout, records the
answer as an observation, and decides again on it.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ProbeFailed
from .records import Observation
from .spec import Freshness

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """What a probe is asked about: the resource as the engine last read it."""

    machine: str
    key: str
    state: str
    version: int
    data: Mapping[str, Any]
    observation: Observation | None


ProbeAnswer = Mapping[str, Any] | tuple[Mapping[str, Any], dt.datetime]
Probe = Callable[[ProbeRequest], ProbeAnswer]
"""A function that asks the outside world for a resource's status now. It returns the status
(a JSON object), or the status and the time it was true at the source. It must not touch the
engine's database; it is called outside any transaction."""


def staleness(rule: Freshness, observation: Observation | None,
              last_transition_at: dt.datetime, now: dt.datetime) -> str | None:
    """Why ``observation`` does not satisfy ``rule`` (None when it does)."""
    if observation is None:
        return "there is no observation"
    when = observation.observed_at
    if when < last_transition_at:
        return (f"the newest observation is from {clock_time(when)}, before the last "
                f"transition at {clock_time(last_transition_at)}")
    age = (now - when).total_seconds()
    if age > rule.max_age:
        return f"the newest observation is from {clock_time(when)}, {age:g} s old"
    return None


def clock_time(value: dt.datetime) -> str:
    text = value.strftime("%H:%M:%S")
    return f"{text}.{value.microsecond // 1000:03d}" if value.microsecond else text


def rule_text(rule: Freshness) -> str:
    probe = f", probe {rule.probe}" if rule.probe else ""
    return f"fresh {rule.max_age:g} s{probe}"


_pool: concurrent.futures.ThreadPoolExecutor | None = None


def call_probe(name: str, probe: Probe, request: ProbeRequest,
               timeout: float) -> tuple[dict[str, Any], dt.datetime | None]:
    """Ask ``probe``, giving up after ``timeout`` seconds (a probe that hangs is abandoned in
    its thread; it cannot hold a transaction, since none is open)."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=8,
                                                      thread_name_prefix="lifecycle-probe")
    future = _pool.submit(probe, request)
    try:
        answer = future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise ProbeFailed(f"probe {name} timed out after {timeout:g} s") from None
    except Exception as exc:
        raise ProbeFailed(f"probe {name} failed: {type(exc).__name__}: {exc}") from exc
    observed_at: dt.datetime | None = None
    if isinstance(answer, tuple) and len(answer) == 2:
        answer, observed_at = answer
        if not isinstance(observed_at, dt.datetime) or observed_at.tzinfo is None:
            raise ProbeFailed(f"probe {name} answered a time that is not timezone-aware: "
                              f"{observed_at!r}")
    if not isinstance(answer, Mapping):
        raise ProbeFailed(f"probe {name} answered {type(answer).__name__}, not a status "
                          "mapping")
    return dict(answer), observed_at
