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

import asyncio
import datetime as dt
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from .errors import ProbeFailed
from .logs import logger
from .results import Observation
from .spec import Freshness

log = logger(__name__)


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
Probe = Callable[[ProbeRequest], ProbeAnswer | Awaitable[ProbeAnswer]]
"""A function that asks the outside world for a resource's status now. It returns the status
(a JSON object), or the status and the time it was true at the source. It must not touch the
engine's database; it is called outside any transaction. It may be a coroutine function: the
:class:`~lifecycle.aio.AsyncEngine` awaits it on its event loop; the :class:`Engine` runs it
to completion in the thread it asks probes in."""


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """What a decision needs from outside before it can go on: probe ``name``'s answer to
    ``request``. Yielded by the engine's sans-IO decisions (``Engine.firing``); its driver
    sends back the :data:`ProbeOutcome`."""

    name: str
    request: ProbeRequest


@dataclass(frozen=True, slots=True)
class ProbeBatch:
    """The probe calls a batch of decisions (``Engine.stepping_many``) needs before it can go
    on, to be asked up to ``at_once`` at a time; its driver sends back their outcomes, in
    order. An empty batch asks nothing: it marks the end of a transaction, where an event
    loop's driver lets other tasks run before the next."""

    calls: tuple[ProbeCall, ...]
    at_once: int = 1


ProbeOutcome = tuple[dict[str, Any], dt.datetime | None] | ProbeFailed
"""A probe's checked answer (status, and when it was true if it said), or why it failed."""


def is_async(probe: Callable[..., Any]) -> bool:
    """Whether calling ``probe`` gives a coroutine to await (a coroutine function, or an
    object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(probe) or inspect.iscoroutinefunction(
        type(probe).__call__)


async def await_probe(name: str, probe: Probe, request: ProbeRequest,
                      timeout: float) -> ProbeOutcome:
    """Ask ``probe`` on the running event loop: a coroutine probe is awaited under
    ``asyncio.timeout`` (and cancelled when it runs out: nothing hangs on), a plain one is
    asked as :func:`call_probe` asks it, in a thread of its own. Never raises."""
    try:
        if not is_async(probe):
            return await asyncio.to_thread(call_probe, name, probe, request, timeout)
        async with asyncio.timeout(timeout):
            answer = await cast(Awaitable[ProbeAnswer], probe(request))
        return checked_answer(name, answer)
    except ProbeFailed as failure:
        return failure
    except TimeoutError:
        return ProbeFailed(f"probe {name} timed out after {timeout:g} s")
    except Exception as exc:
        return ProbeFailed(f"probe {name} failed: {type(exc).__name__}: {exc}")


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


HUNG_PER_PROBE = 8
"""How many calls of one probe may still be running past their timeout before the next call
of that probe is refused at once (as saturated) instead of started."""

_hung: dict[str, int] = {}
_hung_lock = threading.Lock()


def call_probe(name: str, probe: Probe, request: ProbeRequest,
               timeout: float) -> tuple[dict[str, Any], dt.datetime | None]:
    """Ask ``probe`` in a thread of its own, giving up after ``timeout`` seconds. A call that
    hangs is abandoned (it cannot hold a transaction, since none is open) and costs only the
    decision that asked it: other probes, and other calls of this one, go on. Once
    :data:`HUNG_PER_PROBE` calls of one probe hang, that probe is refused as saturated until
    one of them returns."""
    with _hung_lock:
        if _hung.get(name, 0) >= HUNG_PER_PROBE:
            raise ProbeFailed(f"probe {name} is saturated: {_hung[name]} earlier calls are "
                              f"still running past their timeout; not asked")
    outcome: dict[str, Any] = {}
    finished = threading.Event()
    abandoned = threading.Event()

    def ask() -> None:
        try:
            outcome["answer"] = run_to_end(probe(request))  # here, in its thread
        except BaseException as exc:  # the failure is the caller's to report
            outcome["error"] = exc
        with _hung_lock:
            finished.set()
            if abandoned.is_set():
                _hung[name] -= 1

    threading.Thread(target=ask, name=f"lifecycle-probe-{name}", daemon=True).start()
    if not finished.wait(timeout):
        with _hung_lock:
            if not finished.is_set():
                abandoned.set()
                _hung[name] = _hung.get(name, 0) + 1
        if abandoned.is_set():
            raise ProbeFailed(f"probe {name} timed out after {timeout:g} s")
    if "error" in outcome:
        exc = outcome["error"]
        raise ProbeFailed(f"probe {name} failed: {type(exc).__name__}: {exc}") from exc
    return checked_answer(name, outcome["answer"])


def run_to_end(answer: Any) -> Any:
    """What a probe or a handler called on this thread answered: an awaitable (a coroutine
    function's call) run to its end in an event loop of its own; anything else as it is."""
    return asyncio.run(_awaited(answer)) if inspect.isawaitable(answer) else answer


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer


def checked_answer(name: str, answer: Any) -> tuple[dict[str, Any], dt.datetime | None]:
    """A probe's answer as a status and the time it was true (None: not said); ProbeFailed
    when it is neither a status mapping nor one with a timezone-aware time."""
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
