"""What the checker explores: a machine's resources and its world, as hashable values.

A state holds everything a later decision could read, and nothing it could not: each
resource's state, version, data, newest observation, last transition, open effects (with
their attempts and saved progress) and pending timers; the world's status per key (what
probes and effect handlers see) and the world model's own values (``extra``: a status
cache, say); and the clock. Two paths that reach equal states are one state. Journal
sequence numbers and observation ids are left out: no decision reads them, and they would
make every path its own state; so would the version, which is kept for guards but not
compared.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

_LIST = "\x00list"
"""The first item of a frozen list, so that a list of pairs never equals a frozen object."""


class Frozen(tuple):  # type: ignore[type-arg]
    """A JSON object, frozen: its ``(key, value)`` pairs in key order."""

    __slots__ = ()


_PLAIN = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any) -> Any:
    """A JSON value as a hashable one (objects: :class:`Frozen`; lists: tuples)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:  # (lists rather than generators: this runs at nearly every move)
        return Frozen(sorted([(k if type(k) is str else str(k), freeze(v))
                              for k, v in value.items()]))
    if kind is list or kind is tuple:
        return (_LIST, *[freeze(v) for v in value])
    if isinstance(value, Mapping):
        return Frozen(sorted([(str(k), freeze(v)) for k, v in value.items()]))
    if isinstance(value, list | tuple):
        return (_LIST, *[freeze(v) for v in value])
    return value


def thaw(value: Any) -> Any:
    """A frozen value as JSON again (a new copy: the caller may change it)."""
    kind = type(value)
    if kind is Frozen:
        return {k: thaw(v) for k, v in value}
    if kind is tuple and value and value[0] == _LIST:
        return [thaw(v) for v in value[1:]]
    return value


EMPTY = freeze({})


@dataclass(frozen=True, slots=True)
class Pending:
    """An open effect: as the outbox holds it. ``failed``: it failed for good and holds its
    resource's queue until retried; ``due``: when its next attempt may start (seconds)."""

    name: str
    args: Frozen
    fence: Frozen | None
    seq: int = field(compare=False)
    """The journal row that asked for it (its idempotency key names it): not compared, as a
    resource's version is not, so that an effect asked for again is the same state."""
    position: int
    trigger: str | None
    payload: Frozen
    on_failure: str | None
    attempts: int = 0
    progress: Frozen = EMPTY
    due: float = 0.0
    failed: bool = False
    begun: tuple[Any, ...] | None = None
    """Its run has begun and not finished (a model whose worker runs several effects at
    once, ``Model.overlap``): what its handler's call was, by which the checker finds the
    outcome it records when the run finishes."""


@dataclass(frozen=True, slots=True)
class Timer:
    state: str
    trigger: str
    due: float


@dataclass(frozen=True, slots=True)
class Seen:
    """The newest observation: its status, when it was true (seconds), its source."""

    status: Frozen
    at: float
    source: str


@dataclass(frozen=True, slots=True)
class Res:
    """One resource, as its row, its newest observation and its outbox and timers hold it."""

    key: str
    state: str
    version: int = field(compare=False)
    """Counted as the engine counts it (guards may read it), but not compared: a
    transition back to the same state and data is the same state."""
    data: Frozen = field(default=EMPTY)
    since: float = 0.0
    """When its last transition (or its creation) was, in seconds from the start."""
    seen: Seen | None = None
    effects: tuple[Pending, ...] = ()
    timers: tuple[Timer, ...] = ()

    # (``dataclasses.replace`` is slow for what every move does)
    def with_effects(self, effects: tuple[Pending, ...]) -> Res:
        return Res(self.key, self.state, self.version, self.data, self.since, self.seen,
                   effects, self.timers)

    def with_timers(self, timers: tuple[Timer, ...]) -> Res:
        return Res(self.key, self.state, self.version, self.data, self.since, self.seen,
                   self.effects, timers)

    def with_seen(self, seen: Seen) -> Res:
        return Res(self.key, self.state, self.version, self.data, self.since, seen,
                   self.effects, self.timers)

    def head(self) -> Pending | None:
        """The first open effect (the queue's head), if any."""
        return self.effects[0] if self.effects else None


@dataclass(frozen=True, slots=True)
class State:
    """One point of the exploration: the clock (seconds from the start), the resources in
    key order, the world's status per key, and the world model's own values."""

    now: float
    resources: tuple[Res, ...]
    world: Frozen
    extra: Frozen = EMPTY
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    """The hash, computed once: a state is looked up many times (each explored move's state
    in the graph's maps), and hashing one walks every nested value."""
    _where: dict[str, int] | None = field(default=None, init=False, repr=False,
                                          compare=False)
    """Each resource's index by key, made at the first :meth:`find`: the world's actions,
    the invariants and the moves look resources up by key many times in one state."""

    _worlds: dict[str, Any] | None = field(default=None, init=False, repr=False,
                                           compare=False)
    _extras: dict[str, Any] | None = field(default=None, init=False, repr=False,
                                           compare=False)
    """The world's status and the extra values as dicts of frozen values, made at the first
    look-up: invariants and world actions read them at every move."""

    def world_of(self, key: str) -> Any:
        """The world's frozen status of ``key`` (:data:`EMPTY` when it has none)."""
        found = self._worlds
        if found is None:
            found = dict(self.world)
            object.__setattr__(self, "_worlds", found)
        return found.get(key, EMPTY)

    def extras(self) -> dict[str, Any]:
        """The extra values, frozen, by name (not to be changed)."""
        found = self._extras
        if found is None:
            found = dict(self.extra)
            object.__setattr__(self, "_extras", found)
        return found

    def __hash__(self) -> int:
        found = self._hash
        if found is None:
            found = hash((self.now, self.resources, self.world, self.extra))
            object.__setattr__(self, "_hash", found)
        return found

    def find(self, key: str) -> tuple[int, Res]:
        where = self._where
        if where is None:
            where = {r.key: i for i, r in enumerate(self.resources)}
            object.__setattr__(self, "_where", where)
        index = where[key]
        return index, self.resources[index]

    def but(self, *, now: float | None = None, world: Frozen | None = None,
            extra: Frozen | None = None) -> State:
        """This state with another time, world or extra values, its resources as they are
        (and their index kept): ``dataclasses.replace`` is slow for a move made this often."""
        changed = State(self.now if now is None else now, self.resources,
                        self.world if world is None else world,
                        self.extra if extra is None else extra)
        object.__setattr__(changed, "_where", self._where)
        return changed

    def put(self, resource: Res) -> State:
        """This state with ``resource`` written (added in key order when it is new)."""
        resources = self.resources
        index = None if self._where is None else self._where.get(resource.key)
        if index is not None:  # in its place: the keys and their order stay
            written = (*resources[:index], resource, *resources[index + 1:])
        else:
            others = [r for r in resources if r.key != resource.key]
            written = tuple(sorted([*others, resource], key=lambda r: r.key))
        return State(self.now, written, self.world, self.extra)


@dataclass(frozen=True)
class View:
    """A state as world actions and invariants read it: plain values, the times as seconds
    from the start, and ``start`` to turn them into times."""

    state: State
    start: dt.datetime
    previous: View | None = None
    """The state before the move, when a scenario's last expectation is written."""
    behind: bool = False
    """After a move of the clock: a fair move (the engine's step, the worker's run, a due
    timer, a fair action of the world's) would have changed the state, and the clock moved
    first: the run lagged. A bound on how long something takes counts the time in which
    nothing fair was left to do at once (the machine's own waiting), not a worker's lag."""

    @property
    def now(self) -> float:
        return self.state.now

    @property
    def keys(self) -> list[str]:
        return [r.key for r in self.state.resources]

    def resource(self, key: str) -> Res:
        return self.state.find(key)[1]

    def machine_state(self, key: str) -> str:
        return self.resource(key).state

    def data(self, key: str) -> dict[str, Any]:
        return thaw(self.resource(key).data)  # type: ignore[no-any-return]

    def believed(self, key: str) -> dict[str, Any] | None:
        """The status of the resource's newest observation: what the controller believes."""
        seen = self.resource(key).seen
        return None if seen is None else thaw(seen.status)

    def world(self, key: str) -> dict[str, Any]:
        """What the world says of ``key`` (what its probe and effect handlers see)."""
        return thaw(self.state.world_of(key))  # type: ignore[no-any-return]

    def extra(self, name: str, default: Any = None) -> Any:
        extras = self.state.extras()
        return thaw(extras[name] if name in extras else freeze(default))

    def __iter__(self) -> Iterator[Res]:
        return iter(self.state.resources)
