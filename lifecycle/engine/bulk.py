"""Writes of many resources per transaction: :meth:`BulkWrites.observe_many`,
:meth:`~BulkWrites.step_many`, :meth:`~BulkWrites.fire_many`. Each resource keeps its own
compare-and-swap and journal row, as one write would make them; a conflict on one loses none
of the others (it goes again in a later transaction). The loop of many
(:meth:`~BulkWrites.retrying_many`) is sans-IO as the one of one is: it yields a
:class:`ProbeBatch` of the probe calls its risky edges need, and an empty one after each
transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from .. import storable
from ..errors import ConcurrencyError, LifecycleError, StaleObservation
from ..freshness import ProbeBatch, ProbeCall
from ..graph import EVENTLESS
from ..results import FireResult, Observation
from ..store import Transaction
from ..within import Within
from .checks import KEY_MAX, key_document, looked_up
from .observing import Checked
from .outcomes import MOVED, UNTRIED, Again, OnStale, Row, Stale, Tries, Unsure
from .retry import Deciding
from .rows import read_rows, row_of
from .single import SingleWrites

T = TypeVar("T")
Fire = tuple[str, str, Mapping[str, Any] | None, str | None, Within | None]
"""One fire of :meth:`BulkWrites.fire_many`: key, trigger, payload, actor, ``within`` hooks."""
BatchAttempt = Callable[[Transaction, Row, int, Tries], Any]
"""One resource's attempt in a batch's transaction (its row read, its index, its tries)."""
Outcomes = list[FireResult | LifecycleError]


class BulkWrites(SingleWrites):
    """Many resources per transaction, ``batch`` at a time."""

    def observe_many(self, statuses: Iterable[tuple[str, Mapping[str, Any]]],
                     observed_at: dt.datetime | None = None, *, source: str = "api",
                     batch: int = 500) -> list[Observation | LifecycleError]:
        """:meth:`observe` of many resources (``(key, status)`` pairs), up to ``batch`` of
        them in one transaction. The result of each, in order: its :class:`Observation`, or
        the :class:`LifecycleError` that refused it (an unknown key, a status that cannot be
        stored); a refusal writes nothing for that resource and loses none of the others."""
        items = list(statuses)
        checked: dict[int, Checked] = {}
        results: dict[int, Observation | LifecycleError] = {}
        for i, one in enumerate(self.checked_observations(items, observed_at, source)):
            if isinstance(one, LifecycleError):
                results[i] = one
            else:
                checked[i] = one
        if batch < 1:
            raise ValueError("batch: at least 1")
        todo = list(checked)
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            with self.store.write() as tx:
                targets = self.targets(tx, [items[i][0] for i in chunk])
                found = []
                for i in chunk:
                    target = targets[items[i][0]]
                    if isinstance(target, LifecycleError):
                        results[i] = target
                    else:
                        found.append(i)
                recorded = self.record_observations(
                    tx, [(targets[items[i][0]], *checked[i]) for i in found], source)
            results.update(zip(found, recorded(), strict=True))
        return [results[i] for i in range(len(items))]

    def targets(self, tx: Transaction, keys: list[str]) -> dict[str, Any]:
        """:meth:`target` of each of ``keys``, or why not (a ``LifecycleError``): on
        PostgreSQL the ``MACHINE:KEY`` ones as they are (the write finds them), the others
        read (:func:`read_rows`)."""
        keyed = tx.dialect == "postgresql"
        found = {key: (None, *named) for key in keys
                 if keyed and (named := storable.split_key(key))[0] is not None}
        rest = [key for key in keys if key not in found]
        return {**found, **(read_rows(self.store, tx, rest, whole=False) if rest else {})}

    def step_many(self, keys: Iterable[str], *, actor: str | None = None,
                  on_stale: OnStale = "return", batch: int = 500, probes: int = 8,
                  retry_conflicts: bool = True) -> Outcomes:
        """:meth:`step` of many resources, up to ``batch`` in one transaction, each with its
        own compare-and-swap and journal row, as one ``step`` would write them. The result of
        each, in order: its :class:`FireResult`, or the :class:`LifecycleError` that refused
        it (with ``on_stale="raise"``, a :class:`StaleObservation` in its place).

        A resource that another writer moved between the batch's read and its write (a
        conflict) is decided again on what was written, in a later transaction, with the
        others that must go again; with ``retry_conflicts=False`` its result is a
        :class:`ConcurrencyError` instead, and nothing was written for it. A risky edge that
        needs a fresh observation has its probe asked outside any transaction, up to
        ``probes`` probes at once (threads), and its resource decided again."""
        return self.drive(self.stepping_many(keys, actor=actor, on_stale=on_stale,
                                             batch=batch, probes=probes,
                                             retry_conflicts=retry_conflicts))

    def stepping_many(self, keys: Iterable[str], *, actor: str | None = None,
                      on_stale: OnStale = "return", batch: int = 500, probes: int = 8,
                      retry_conflicts: bool = True) -> Deciding[Outcomes]:
        """:meth:`step_many`, sans-IO (see :meth:`firing`): it yields a :class:`ProbeBatch`
        of the probe calls its risky edges need between its transactions, and an empty one
        after each transaction."""
        order = list(keys)
        refused: dict[int, LifecycleError] = {}
        # the actor is checked once (it is every key's), then each key alone
        each = key_document if actor is not None and storable.text_problem(
            actor, KEY_MAX) is not None else None
        for i, key in enumerate(order):
            try:
                if each is None:
                    looked_up(key)
                else:
                    each(key, None, "payload", actor)
            except LifecycleError as exc:
                refused[i] = exc

        def attempt(tx: Transaction, row: Row, _i: int, tries: Tries) -> Any:
            outcome = self.decide_and_write(tx, row.key, EVENTLESS, {}, actor, None, tries,
                                            row)
            unsure = outcome if type(outcome) is Unsure else None
            if unsure is not None:  # settled once the batch committed
                outcome = unsure.value
            moved = MOVED if retry_conflicts else ConcurrencyError(
                f"{row.machine}:{row.key}: another writer moved it between the batch's read "
                "and its write; nothing was written for it")
            if outcome is MOVED:
                return moved
            outcome = settled_stale(outcome, on_stale)
            return outcome if unsure is None else Unsure(unsure.pending, outcome, moved)

        done = yield from self.retrying_many(order, "step", attempt, batch, skip=refused,
                                             probes=probes)
        return [refused[i] if i in refused else cast(FireResult | LifecycleError, done[i])
                for i in range(len(order))]

    def fire_many(self, fires: Iterable[Fire], *, on_stale: OnStale = "return",
                  batch: int = 500, probes: int = 8) -> Outcomes:
        """:meth:`fire` of many triggers, each ``(key, trigger, payload, actor, within)``,
        up to ``batch`` in one transaction, each with its own compare-and-swap, journal row
        and ``within`` hooks, as one ``fire`` would write it. The result of each, in order:
        its :class:`FireResult`, or the :class:`LifecycleError` that refused it (raised by
        its ``within`` hook too: the transaction is rolled back and made again without it;
        with ``on_stale="raise"``, a :class:`StaleObservation` in its place). Conflicts and
        probes are handled as :meth:`step_many` handles them."""
        return self.drive(self.firing_many(fires, on_stale=on_stale, batch=batch,
                                           probes=probes))

    def firing_many(self, fires: Iterable[Fire], *, on_stale: OnStale = "return",
                    batch: int = 500, probes: int = 8) -> Deciding[Outcomes]:
        """:meth:`fire_many`, sans-IO (see :meth:`stepping_many`)."""
        order = list(fires)
        refused: dict[int, LifecycleError] = {}
        payloads: dict[int, dict[str, Any]] = {}
        for i, (key, trigger, payload, actor, _within) in enumerate(order):
            try:
                if trigger == EVENTLESS:
                    raise LifecycleError(f"{key}: eventless edges are taken by step(), not "
                                         "fired")
                payloads[i] = key_document(key, payload, "payload", actor)
            except LifecycleError as exc:
                refused[i] = exc

        def attempt(tx: Transaction, row: Row, i: int, tries: Tries) -> Any:
            _key, trigger, _payload, actor, within = order[i]
            return settled_stale(self.decide_and_write(
                tx, row.key, trigger, payloads[i], actor, within, tries, row), on_stale)

        done = yield from self.retrying_many([fire[0] for fire in order], "fire", attempt,
                                             batch, skip=refused, probes=probes)
        return [refused[i] if i in refused else cast(FireResult | LifecycleError, done[i])
                for i in range(len(order))]

    def retrying_many(self, keys: list[str], what: str, attempt: BatchAttempt, batch: int, *,
                      skip: Mapping[int, Any] | None = None,
                      probes: int = 1) -> Deciding[dict[int, Any]]:
        """The retry loop of many resources, sans-IO: ``attempt`` each (by index into
        ``keys``) in transactions of ``batch``, yielding an empty :class:`ProbeBatch` after
        each; those that must go again (see :class:`Again`) go again together after the
        machines were loaded and the probes asked (one batch of calls)."""
        if batch < 1 or probes < 1:
            raise ValueError("batch and probes: at least 1")
        results: dict[int, Any] = {}
        tries: dict[int, Tries] = {}
        pending = [i for i in range(len(keys)) if i not in (skip or {})]
        for _ in range(self.max_attempts):
            again: list[tuple[int, Again]] = []
            for start in range(0, len(pending), batch):
                again += self.one_batch(keys, pending[start:start + batch], attempt, tries,
                                        results)
                yield ProbeBatch(())
            pending = [i for i, _ in again]
            if not pending:
                return results
            for machine in {a.machine for _, a in again if a.machine is not None}:
                self.load(machine)
            asked = [(tried, *a.probe) for i, a in again if a.probe is not None and (
                tried := tries.setdefault(i, Tries())).asking(a.probe[1])]
            if asked:
                asked_at = self.clock.now()
                answers = yield ProbeBatch(tuple(ProbeCall(name, request)
                                                 for _, name, request in asked), probes)
                for (tried, name, request), answer in zip(asked, answers, strict=True):
                    self.observed(tried, name, request, answer, asked_at)
        for i in pending:
            results[i] = ConcurrencyError(
                f"{keys[i]}: {what} lost the race {self.max_attempts} times in a row; "
                "nothing was written")
        return results

    def one_batch(self, keys: list[str], chunk: list[int], attempt: BatchAttempt,
                  tries: dict[int, Tries], results: dict[int, Any]) -> list[tuple[int, Again]]:
        """One transaction of a batch. A resource whose attempt raised is reported, the
        transaction rolled back, and the batch made again without it."""
        while True:
            done: dict[int, Any] = {}
            again: list[tuple[int, Again]] = []
            failed: tuple[int, LifecycleError] | None = None
            with self.store.write() as tx:
                rows = read_rows(self.store, tx, [keys[i] for i in chunk])
                for i in chunk:
                    fetched = rows[keys[i]]
                    if isinstance(fetched, LifecycleError):
                        done[i] = fetched
                        continue
                    try:
                        # a Tries of its own only once a probe was asked for it
                        outcome = attempt(tx, row_of(self.store, fetched), i,
                                          tries.get(i, UNTRIED))
                    except LifecycleError as exc:
                        failed = (i, exc)
                        tx.rollback()
                        break
                    if isinstance(outcome, Again):
                        again.append((i, outcome))
                    else:
                        done[i] = outcome
            if failed is None:  # committed: each write's answer is in
                for i, answer in done.items():
                    settled: Any = answer.settled() if type(answer) is Unsure else answer
                    if isinstance(settled, Again):
                        again.append((i, settled))
                    else:
                        results[i] = settled
                return again
            results[failed[0]] = failed[1]
            chunk = [i for i in chunk if i != failed[0]]


def settled_stale(outcome: Any, on_stale: OnStale) -> Any:
    """A journaled refusal (:class:`Stale`) as a batch reports it: a
    :class:`StaleObservation`, or its result (``on_stale="return"``); others as they are."""
    if not isinstance(outcome, Stale):
        return outcome
    if on_stale == "raise":
        return StaleObservation(outcome.result, dest=outcome.dest,
                                probe_error=outcome.probe_error)
    return outcome.result
