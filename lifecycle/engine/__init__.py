"""The Engine: create, fire, step, observe, update, history. One write is one transaction.

Every write goes the same way: read the resource (with its newest observation) on the held
connection, decide with the machine compiled once per spec, and write the new row with a
compare-and-swap on its version and sequence number, the journal row (and the effects and
timers asked for) in the same transaction. An attempt that cannot finish is rolled back and
made again by one retry loop: when the resource moved underneath, when its machine must be
loaded first, or when a risky edge needs a fresh observation, which a probe is asked for
outside any transaction.

The engine is built in layers, one module each, every one on the one below it:

- :mod:`~lifecycle.engine.machines`: the registry of machines (and the engine's state);
- :mod:`~lifecycle.engine.observing`: observations;
- :mod:`~lifecycle.engine.retry`: the retry loop, sans-IO about probes, and its driver;
- :mod:`~lifecycle.engine.transitions`: one attempt of a fire (read, decide, write);
- :mod:`~lifecycle.engine.single`: create, update, fire, step, a timer's fire;
- :mod:`~lifecycle.engine.bulk`: many resources per transaction;
- :mod:`~lifecycle.engine.reads`: the read facade;

with the functions they share beside them: :mod:`~lifecycle.engine.checks` (arguments),
:mod:`~lifecycle.engine.outcomes` (what an attempt comes back as),
:mod:`~lifecycle.engine.rows` (reading rows in a write) and
:mod:`~lifecycle.engine.entries` (the journal, effect and timer rows a write adds).

A fire, top to bottom: ``fire`` → ``drive(firing(...))`` → ``firing_checked`` →
``retrying`` (the loop: one transaction per attempt) → ``decide_and_write`` (read the row,
decide) → ``write_transition`` → ``Transaction.write`` (the statements).

The retry loop is sans-IO about probes: it is a generator that yields the :class:`ProbeCall`
it needs (a batch of resources, a :class:`ProbeBatch`) and is sent the answer.
:meth:`Engine.drive` answers by calling the probe (in a thread, with its timeout; a batch's
calls in up to ``at_once`` threads); :class:`lifecycle.aio.AsyncEngine` answers by awaiting
it on its event loop. Both run the one decision and transaction code
(``Engine.firing``, ``Engine.stepping_many``).
"""

from __future__ import annotations

from .bulk import Fire
from .checks import validated_data
from .entries import fence_for
from .machines import Guard, SpecFor
from .outcomes import OnStale
from .reads import Reads
from .retry import Deciding


class Engine(Reads):
    """Runs machine specs against a store.

    ``guards`` maps guard names to predicates over a :class:`GuardContext`; guards never do
    I/O. ``probes`` maps probe names to functions that ask the outside world for a resource's
    status (called outside any transaction, given up after ``probe_timeout`` seconds).
    ``effects`` maps effect names to handlers (or :class:`Effect` with a retry policy), which
    a :class:`~lifecycle.worker.Worker` runs after the transitions that asked for them
    committed; the engine keeps them as :attr:`handlers`. Time comes from ``clock``.

    A machine the engine was not given is loaded when first met: ``spec_for(name)`` may give
    the spec to register (an application's built-in machines, as its code declares them);
    otherwise the spec the database last registered under that name is run.

    A spec must name only guards, effects and probes the engine has. With ``strict=False``
    it may name effects and probes the engine lacks (guards it still needs, to decide): its
    resources are created, observed, updated and moved as usual, their effects wait in the
    outbox for a worker that has the handlers, and a risky edge whose probe is missing is
    refused as stale, saying which probe it lacked (how a command line without a site's
    adapters still records and inspects drones).
    """


__all__ = ["Deciding", "Engine", "Fire", "Guard", "OnStale", "SpecFor", "fence_for",
           "validated_data"]
