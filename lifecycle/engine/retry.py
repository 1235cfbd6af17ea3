"""The one retry loop, sans-IO about probes.

A write is an *attempt* (read, decide, write, in one transaction) made again until it
finishes: when the resource moved underneath, when its machine must be loaded first, or
when a risky edge needs a fresh observation, which a probe is asked for outside any
transaction. The loop is a generator (:data:`Deciding`) that yields the :class:`ProbeCall`
it needs and is sent the answer: :meth:`RetryLoop.drive` answers by calling the probe in a
thread, :class:`lifecycle.aio.AsyncEngine` by awaiting it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from ..errors import ConcurrencyError, InvalidData, ProbeFailed, StaleObservation
from ..freshness import ProbeBatch, ProbeCall, ProbeOutcome, ProbeRequest, call_probe
from ..logs import logger
from ..store import Moved
from .observing import Observing
from .outcomes import MOVED, Again, OnStale, Stale, Tries, Unsure

log = logger("lifecycle.engine")

T = TypeVar("T")
Deciding = Generator[ProbeCall | ProbeBatch, Any, T]
"""A write decided sans-IO: it yields the probe calls it needs (a :class:`ProbeCall`, sent
back its :data:`ProbeOutcome`; a :class:`ProbeBatch`, sent back the list of theirs), and
returns its result (see :meth:`RetryLoop.drive`)."""

Attempt = Callable[..., Any]
"""One attempt of a write, called with the transaction, the retry loop's ``args`` and its
:class:`Tries`: its outcome, or :class:`Again`."""


class RetryLoop(Observing):
    """The loop that makes an attempt again until it finishes, and the driver that answers
    its probe calls."""

    def drive(self, deciding: Deciding[T]) -> T:
        """Run a sans-IO decision to its end, answering each probe call it yields by calling
        the probe (:func:`~lifecycle.freshness.call_probe`: a thread, with ``probe_timeout``;
        a batch's calls ``at_once`` at a time)."""
        outcome: Any = None
        try:
            while True:
                asked = deciding.send(outcome)
                if isinstance(asked, ProbeCall):
                    outcome = self.ask(asked)
                elif len(asked.calls) > 1 and asked.at_once > 1:
                    with ThreadPoolExecutor(min(asked.at_once, len(asked.calls)),
                                            thread_name_prefix="lifecycle-probe") as pool:
                        outcome = list(pool.map(self.ask, asked.calls))
                else:
                    outcome = [self.ask(call) for call in asked.calls]
        except StopIteration as done:
            return cast(T, done.value)

    def ask(self, call: ProbeCall) -> ProbeOutcome:
        """Call a probe (in a thread, with ``probe_timeout``): its answer or its failure."""
        try:
            return call_probe(call.name, self.probes[call.name], call.request,
                              self.probe_timeout)
        except ProbeFailed as failure:
            return failure

    def retrying(self, key: str, what: str, attempt: Attempt, on_stale: OnStale = "raise",
                 args: tuple[Any, ...] = ()) -> Deciding[Any]:
        """Run ``attempt`` in a write transaction until it finishes; roll back and go again
        when it says why it cannot (see :class:`Again`), asking a probe (yielded: outside
        any transaction) when that is why. A journaled refusal (:class:`Stale`, committed)
        is raised as :class:`StaleObservation` or returned as its result, as ``on_stale``
        says. ``attempt`` is called ``attempt(tx, *args, tries)`` (a method and its
        arguments rather than a closure, which a fire would make each time)."""
        tries = Tries()
        for _ in range(self.max_attempts):
            try:
                with self.store.write() as tx:
                    outcome = attempt(tx, *args, tries)
                    if isinstance(outcome, Again):
                        tx.rollback()
            except Moved:  # a strict write's row moved: the transaction was rolled back
                outcome = MOVED
            if type(outcome) is Unsure:  # its answer is in: the transaction committed
                outcome = outcome.settled()
            if not isinstance(outcome, Again):
                if type(outcome) is not Stale:
                    return outcome
                if on_stale == "raise":
                    raise StaleObservation(outcome.result, dest=outcome.dest,
                                           probe_error=outcome.probe_error)
                return outcome.result
            if outcome.machine is not None:
                self.load(outcome.machine)  # outside the transaction: it may register
            elif outcome.probe is not None:
                name, request = outcome.probe
                if not tries.asking(request):
                    continue
                asked_at = self.clock.now()
                answer = yield ProbeCall(name, request)
                self.observed(tries, name, request, answer, asked_at)
            else:
                log.debug("%s: the resource moved during %s; deciding again", key, what)
        raise ConcurrencyError(
            f"{key}: {what} lost the race {self.max_attempts} times in a row; nothing was "
            "written. Try again, or look for a process that moves it in a loop")

    def observed(self, tries: Tries, name: str, request: ProbeRequest,
                 answer: ProbeOutcome, asked_at: dt.datetime) -> None:
        """Record a probe's answer as an observation; remember a failure."""
        if isinstance(answer, ProbeFailed):
            log.warning("%s:%s: %s", request.machine, request.key, answer)
            tries.probe_error = str(answer)
            return
        status, observed_at = answer
        try:
            self.observe(f"{request.machine}:{request.key}", status, observed_at or asked_at,
                         source=name)
        except InvalidData as exc:
            tries.probe_error = f"probe {name} answered a status that cannot be stored: {exc}"
