"""The exception tree, grouped by cause. Every error names what was wrong, where, and what
to do.

- :class:`NotFound` (also a ``LookupError``): a machine, resource, trigger or state that
  does not exist;
- :class:`InvalidInput` (also a ``ValueError``): a spec, data, a payload, a key, a page, a
  setting or a scenario that is not what lifecycle accepts;
- :class:`Conflict`: the request met a state that refuses it: the resource exists already,
  another writer kept winning, the observation was not fresh, the effect's claim was lost
  (and the startd's ``ClaimRefused``);
- :class:`StorageError`: the database could not be reached, refused, or is at another
  revision;
- :class:`EffectError`: raised by an effect handler (retry, or give up);
- :class:`OutsideError`: the world outside could not be asked, or answered badly (a probe,
  and the adapters' ``SiteError``);
- :class:`SetupError`: something this process was not given, or cannot find or use (a
  guard, a renderer, mail settings, a plugin module, a port, a file to write).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .results import FireResult


class LifecycleError(Exception):
    """Base class of every error lifecycle raises on purpose.

    Its message ends with what a Python caller can do about it; :meth:`for_command_line`
    gives the same error with the remedy of a command-line user, which ``lifecycle`` prints.
    """

    def for_command_line(self) -> str:
        return str(self)


def raise_first(outcomes: Iterable[object]) -> None:
    """Raise the first refusal among a batch's outcomes (``Engine.observe_many``,
    ``step_many`` and ``fire_many`` give each resource's result, or the
    :class:`LifecycleError` that refused it), as writing that one alone would have."""
    for outcome in outcomes:
        if isinstance(outcome, LifecycleError):
            raise outcome


class NotFound(LifecycleError, LookupError):
    """What was asked for does not exist."""


class InvalidInput(LifecycleError, ValueError):
    """An argument, document or file that lifecycle does not accept."""


class Conflict(LifecycleError):
    """The request is refused by the state it met (of the database or of the world)."""


class StorageError(LifecycleError):
    """The database could not be used."""


class OutsideError(LifecycleError):
    """The world outside could not be asked, or answered badly."""


class SetupError(LifecycleError):
    """Something this process was not given, or cannot find or use."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a machine spec: where it is, what is wrong, and a hint."""

    location: str
    message: str
    suggestion: str | None = None
    command_line: str | None = None
    """The suggestion for a command-line user, where it differs (a module named in
    LIFECYCLE_PLUGINS instead of ``Engine(guards=...)``)."""

    def __str__(self) -> str:
        return self.text(self.suggestion)

    def text(self, suggestion: str | None) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        return f"{text}; {suggestion}" if suggestion else text


class SpecError(InvalidInput):
    """A machine spec is invalid. ``problems`` lists every problem found, not just the first."""

    def __init__(self, machine: str, problems: Sequence[Problem]) -> None:
        self.machine = machine
        self.problems = list(problems)
        super().__init__(self._listed(command_line=False))

    def _listed(self, *, command_line: bool) -> str:
        lines = "\n".join(
            f"  - {p.text(p.command_line or p.suggestion) if command_line else p}"
            for p in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        return f"machine {self.machine!r} has {len(self.problems)} {noun}:\n{lines}"

    def for_command_line(self) -> str:
        return self._listed(command_line=True)


class UnknownMachine(NotFound):
    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = sorted(set(known))
        hint = f"known machines: {', '.join(self.known)}" if self.known else "no machine is known"
        super().__init__(f"unknown machine {name!r} ({hint}); give a built-in name or a spec file")


class UnknownResource(NotFound):
    def __init__(self, key: str, machine: str | None = None) -> None:
        self.key = key
        self.machine = machine
        where = f"of machine {machine!r} " if machine else ""
        super().__init__(f"no resource {where}with key {key!r}; `lifecycle create` makes one")


class AmbiguousKey(InvalidInput):
    def __init__(self, key: str, machines: Sequence[str]) -> None:
        self.key = key
        self.machines = sorted(machines)
        options = ", ".join(f"{m}:{key}" for m in self.machines)
        super().__init__(f"key {key!r} exists in several machines; say which: {options}")


class ResourceExists(Conflict):
    def __init__(self, machine: str, key: str) -> None:
        self.machine = machine
        self.key = key
        super().__init__(f"machine {machine!r} already has a resource with key {key!r}")


class UnknownTrigger(NotFound):
    def __init__(self, machine: str, trigger: str, known: Sequence[str],
                 hint: str | None = None) -> None:
        self.machine = machine
        self.trigger = trigger
        self.known = sorted(known)
        super().__init__(
            f"machine {machine!r} has no trigger {trigger!r}"
            + (f" ({hint})" if hint else "") + f"; its triggers: {', '.join(self.known)}"
        )


class UnknownState(NotFound):
    def __init__(self, machine: str, state: str, known: Sequence[str]) -> None:
        self.machine = machine
        self.state = state
        super().__init__(
            f"machine {machine!r} has no state {state!r}; its states: {', '.join(sorted(known))}"
        )


class InvalidData(InvalidInput):
    """A resource's data or an event payload does not fit the machine's declared schema."""

    def __init__(self, machine: str, key: str, detail: str) -> None:
        self.machine = machine
        self.key = key
        self.detail = detail
        where = key if machine == "?" else f"{machine}:{key}"  # "?": not looked up yet
        super().__init__(f"resource {where}: invalid data: {detail}")


class StrandedResources(Conflict):
    """A changed spec would leave live resources in states it no longer has."""

    def __init__(self, machine: str, version: str, stranded: Sequence[tuple[str, str]]) -> None:
        self.machine = machine
        self.version = version
        self.stranded = list(stranded)
        shown = ", ".join(f"{key} (in {state!r})" for key, state in self.stranded[:20])
        more = f" and {len(self.stranded) - 20} more" if len(self.stranded) > 20 else ""
        super().__init__(
            f"cannot register machine {machine!r} version {version}: "
            f"{len(self.stranded)} live resources are in states it no longer has: {shown}{more}; "
            "keep those states, or move the resources out of them first"
        )


class SchemaOutOfDate(StorageError):
    """The database schema is not the one this code needs."""

    def __init__(self, url: str, current: str | None, head: str) -> None:
        self.url = url
        self.current = current
        self.head = head
        if current is None:
            what = "has no lifecycle schema yet"
        else:
            what = f"is at schema revision {current}, this code needs {head}"
        self.what = what
        super().__init__(f"database {url} {what}; run `lifecycle db upgrade`, or open it "
                         "with Store(url, upgrade=True)")

    def for_command_line(self) -> str:
        return f"database {self.url} {self.what}; run `lifecycle db upgrade`"


class ConcurrencyError(Conflict):
    """A transition kept losing the compare-and-swap race; nothing was written."""


class DatabaseError(StorageError):
    """The database could not be reached or refused the operation."""


class StaleObservation(Conflict):
    """A risky edge was refused: the resource's newest observation was not fresh enough, and
    no probe (or a failed one) could give a fresher one. The refusal is journaled.

    ``result`` is the refusal as a :class:`FireResult` (what ``fire(..., on_stale="return")``
    returns); its ``reason`` is this exception's message."""

    def __init__(self, result: FireResult, *, dest: str, probe_error: str | None = None) -> None:
        self.result = result
        self.machine = result.machine
        self.key = result.key
        self.trigger = result.trigger
        self.source = result.source
        self.dest = dest
        self.probe_error = probe_error
        super().__init__(result.reason)


class GuardError(SetupError):
    """A guard raised instead of answering, or is not registered in this process."""


class ProbeFailed(OutsideError):
    """A probe raised, timed out, or answered something that is not a status."""


class LostClaim(Conflict):
    """The worker's claim on an effect expired and another worker took it over."""


# -- raised by effect handlers ---------------------------------------------------------------


class EffectError(LifecycleError):
    """Raised by a handler: the effect did not happen this time."""


class RetryableError(EffectError):
    """Try again later, with backoff. Any exception a handler raises that is not a
    :class:`PermanentError` counts as retryable."""


class PermanentError(EffectError):
    """Trying again cannot help: the effect fails for good now."""


# -- tools around the engine -----------------------------------------------------------------


class ScenarioError(InvalidInput):
    """A scenario file that cannot be read: it names the file and the line."""


class RendererMissing(SetupError):
    """A program a renderer needs is not installed."""

    def __init__(self, program: str, hint: str) -> None:
        self.program = program
        self.hint = hint
        super().__init__(f"cannot draw SVG: Graphviz's {program!r} is not on PATH; {hint}")


class RenderFailed(SetupError):
    """A renderer program ran and failed."""
