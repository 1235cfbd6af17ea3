"""The Engine: create, fire, step, history. One fire is one database transaction.

The hot path reads the resource, decides with the ``transitions`` machine compiled once per
spec, and writes the new state with a compare-and-swap on the version, the journal row in the
same transaction. If the version moved underneath, it re-reads and decides again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select

from .clock import Clock, SystemClock
from .errors import (
    AmbiguousKey,
    ConcurrencyError,
    InvalidData,
    LifecycleError,
    Problem,
    ResourceExists,
    SpecError,
    StrandedResources,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)
from .runner import Decision, GuardContext, Runner
from .spec import EVENTLESS, MachineSpec, SpecSource, load_spec
from .store import Store, journal, machines, resources, specs

log = logging.getLogger(__name__)

Guard = Callable[[GuardContext], bool]

_KEY_MAX = 255


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource as it is in the database now."""

    machine: str
    key: str
    state: str
    version: int
    seq: int
    data: dict[str, Any]
    spec_version: str
    created_at: dt.datetime
    updated_at: dt.datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine, "key": self.key, "state": self.state,
            "version": self.version, "seq": self.seq, "data": self.data,
            "spec_version": self.spec_version, "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One row of a resource's history."""

    seq: int
    kind: str
    trigger: str | None
    source: str | None
    dest: str
    version: int
    spec_version: str
    actor: str | None
    at: dt.datetime
    payload: dict[str, Any] | None
    guards: dict[str, bool] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "kind": self.kind, "trigger": self.trigger, "source": self.source,
            "dest": self.dest, "version": self.version, "spec_version": self.spec_version,
            "actor": self.actor, "at": self.at.isoformat(), "payload": self.payload,
            "guards": self.guards,
        }


@dataclass(frozen=True, slots=True)
class FireResult:
    """What a fire (or a step) did. When ``fired`` is false, ``reason`` says why and nothing
    was written."""

    fired: bool
    machine: str
    key: str
    trigger: str
    source: str
    dest: str | None
    version: int
    reason: str | None = None
    guards: dict[str, bool] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.fired

    def to_json(self) -> dict[str, Any]:
        return {
            "fired": self.fired, "machine": self.machine, "key": self.key,
            "trigger": self.trigger, "source": self.source, "dest": self.dest,
            "version": self.version, "reason": self.reason, "guards": self.guards,
        }


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A resource whose journal does not replay to its current row."""

    machine: str
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.machine}:{self.key}: {self.problem}"


class _Conflict(Exception):
    """The compare-and-swap lost: somebody else moved the resource first."""


class _NeedMachine(Exception):
    """The resource's machine must be loaded first, outside the write transaction (loading
    may register a spec, which takes a transaction of its own)."""


class Engine:
    """Runs machine specs against a store.

    ``guards`` maps guard names to predicates over a :class:`GuardContext`; guards never do
    I/O. ``effects`` names the effect handlers this process provides (only their names are
    checked here). Time comes from ``clock``.
    """

    def __init__(
        self,
        store: Store,
        machines: Iterable[SpecSource] = (),
        *,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Any] | None = None,
        probes: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        max_attempts: int = 50,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.guards: dict[str, Guard] = dict(guards or {})
        self.effects: dict[str, Any] = dict(effects or {})
        self.probes: dict[str, Any] = dict(probes or {})
        self.max_attempts = max_attempts
        self._runners: dict[str, Runner] = {}
        for spec in machines:
            self.register(spec)

    # -- machines ----------------------------------------------------------------------

    @property
    def machines(self) -> dict[str, MachineSpec]:
        return {name: runner.spec for name, runner in self._runners.items()}

    def register(self, source: SpecSource) -> MachineSpec:
        """Validate a spec, store it if it is new, and make it the machine's current version.

        A changed spec is refused when live resources are in states it no longer has."""
        spec = load_spec(source)
        self._check_names(spec)
        now = self.clock.now()
        with self.store.begin() as db:
            known = db.execute(
                select(specs.c.version).where(
                    specs.c.machine == spec.name, specs.c.version == spec.version
                )
            ).first()
            current = db.execute(
                select(machines.c.spec_version).where(machines.c.name == spec.name)
            ).scalar()
            if current != spec.version:
                stranded = self._stranded(db, spec)
                if stranded:
                    raise StrandedResources(spec.name, spec.version, stranded)
            if known is None:
                db.execute(specs.insert().values(
                    machine=spec.name, version=spec.version, spec=spec.to_json(), created_at=now))
            if current is None:
                db.execute(machines.insert().values(
                    name=spec.name, spec_version=spec.version, updated_at=now))
            elif current != spec.version:
                db.execute(machines.update().where(machines.c.name == spec.name).values(
                    spec_version=spec.version, updated_at=now))
                log.info("machine %s: spec version %s replaces %s", spec.name, spec.version,
                         current)
        self._runners[spec.name] = Runner(spec, self.guards)
        return spec

    def _check_names(self, spec: MachineSpec) -> None:
        problems = []
        for kind, names, registered in (
            ("guard", spec.guard_names(), self.guards),
            ("effect", spec.effect_names(), self.effects),
            ("probe", spec.probe_names(), self.probes),
        ):
            for name in sorted(names - set(registered)):
                where = [f"transitions[{i}]" for i, t in enumerate(spec.transitions)
                         if name in (*t.guards, *t.unless, *t.effects)
                         or (t.fresh and t.fresh.probe == name)]
                where += [f"eventless[{i}]" for i, e in enumerate(spec.eventless)
                          if name in (*e.guards, *e.unless, *e.effects)
                          or (e.fresh and e.fresh.probe == name)]
                problems.append(Problem(
                    ", ".join(where), f"{kind} {name!r} is not registered with this engine",
                    f"pass it in Engine({kind}s={{{name!r}: ...}})"))
        if problems:
            raise SpecError(spec.name, problems)

    def _stranded(self, db: Any, spec: MachineSpec) -> list[tuple[str, str]]:
        """Live resources (not in a final state of the spec they run under) whose state the
        new spec does not have."""
        states = set(spec.graph.names)
        finals_of: dict[str, set[str]] = {}
        rows = db.execute(
            select(resources.c.key, resources.c.state, resources.c.spec_version)
            .where(resources.c.machine == spec.name, resources.c.state.not_in(states))
            .order_by(resources.c.key)
        ).all()
        stranded = []
        for key, state, version in rows:
            if version not in finals_of:
                stored = db.execute(select(specs.c.spec).where(
                    specs.c.machine == spec.name, specs.c.version == version)).scalar_one()
                old = MachineSpec.model_validate(stored)
                finals_of[version] = {n for n in old.graph.leaves
                                      if old.graph.is_final(n, old.final)}
            if state not in finals_of[version]:
                stranded.append((key, state))
        return stranded

    def _runner(self, machine: str) -> Runner:
        runner = self._runners.get(machine)
        if runner is None:
            runner = self._load_stored(machine)
        return runner

    def _load_stored(self, machine: str) -> Runner:
        """A machine this engine was not given, as the database last registered it."""
        with self.store.read() as db:
            stored = db.execute(
                select(specs.c.spec).join(machines, (machines.c.name == specs.c.machine)
                                          & (machines.c.spec_version == specs.c.version))
                .where(machines.c.name == machine)
            ).scalar()
            if stored is None:
                names = db.execute(select(machines.c.name)).scalars().all()
                raise UnknownMachine(machine, [*self._runners, *names])
        spec = MachineSpec.model_validate(stored)
        self._check_names(spec)
        runner = self._runners[machine] = Runner(spec, self.guards)
        return runner

    def machine_names(self) -> list[str]:
        """Every machine registered with this engine or stored in the database."""
        with self.store.read() as db:
            stored = db.execute(select(machines.c.name)).scalars().all()
        return sorted({*self._runners, *stored})

    def spec(self, machine: str) -> MachineSpec:
        return self._runner(machine).spec

    # -- keys --------------------------------------------------------------------------

    def _split(self, key: str) -> tuple[str | None, str]:
        """``MACHINE:KEY`` or a plain key."""
        machine, sep, rest = key.partition(":")
        if sep and machine and rest:
            return machine, rest
        return None, key

    def _locate(self, cursor: Any, key: str) -> tuple[Any, ...]:
        machine, plain = self._split(key)
        sql = self.store.sql
        if machine is not None:
            cursor.execute(sql.resource_by_machine_key, {"machine": machine, "key": plain})
            rows = cursor.fetchall()
        else:
            cursor.execute(sql.resource_by_key, {"key": plain})
            rows = cursor.fetchall()
        if not rows:
            raise UnknownResource(plain, machine)
        if len(rows) > 1:
            raise AmbiguousKey(plain, [row[1] for row in rows])
        return tuple(rows[0])

    # -- the unit of work --------------------------------------------------------------

    def create(
        self,
        machine: str,
        key: str,
        data: Mapping[str, Any] | None = None,
        *,
        state: str | None = None,
        actor: str | None = None,
    ) -> Resource:
        """A new resource in the machine's initial state, or adopted in ``state``: how a
        resource that already exists outside is brought under management."""
        runner = self._runner(machine)
        spec = runner.spec
        _check_key(key)
        if state is None:
            dest, kind = spec.graph.enter(spec.initial), "create"
        elif state in spec.graph.parent:
            dest, kind = spec.graph.enter(state), "adopt"
        else:
            raise UnknownState(machine, state, spec.graph.names)
        document = self._validated(spec, key, dict(data or {}))
        now = self.clock.now()
        store = self.store
        try:
            with store.write() as cursor:
                cursor.execute(store.sql.insert_resource, {
                    "machine": machine, "key": key, "spec_version": spec.version,
                    "state": dest, "version": 1, "seq": 1, "data": store.json_param(document),
                    "now": store.time_param(now),
                })
                resource_id = cursor.fetchone()[0]
                cursor.execute(store.sql.insert_journal, {
                    "resource_id": resource_id, "seq": 1, "kind": kind, "trigger": None,
                    "source": None, "dest": dest, "version": 1, "spec_version": spec.version,
                    "actor": actor, "at": store.time_param(now),
                    "payload": store.json_param(document) if document else None,
                    "guards": None,
                })
        except store.integrity_error:
            raise ResourceExists(machine, key) from None
        except (TypeError, ValueError) as exc:
            raise InvalidData(machine, key, f"data is not JSON: {exc}") from None
        return Resource(machine, key, dest, 1, 1, document, spec.version, now, now)

    def fire(
        self,
        key: str,
        trigger: str,
        payload: Mapping[str, Any] | None = None,
        *,
        actor: str | None = None,
    ) -> FireResult:
        """Fire ``trigger`` on the resource ``key`` (``MACHINE:KEY`` or a plain key).

        Returns whether it fired, from and to which state, and the new version; when it did
        not fire, why (and nothing was written). A trigger the machine does not have at all
        raises :class:`UnknownTrigger`."""
        return self._decide_and_commit(key, trigger, dict(payload or {}), actor)

    def step(self, key: str, *, actor: str | None = None) -> FireResult:
        """Take the first eventless transition from the resource's state whose guards hold."""
        return self._decide_and_commit(key, EVENTLESS, {}, actor)

    def _decide_and_commit(
        self, key: str, trigger: str, payload: dict[str, Any], actor: str | None
    ) -> FireResult:
        store = self.store
        sql = store.sql
        for _attempt in range(self.max_attempts):
            try:
                with store.write() as cursor:
                    rid, machine, rkey, state, version, seq, raw_data, _ = (
                        self._locate(cursor, key))
                    runner = self._runners.get(machine)
                    if runner is None:
                        raise _NeedMachine(machine)
                    if trigger != EVENTLESS and trigger not in runner.triggers:
                        raise UnknownTrigger(machine, trigger, sorted(runner.triggers))
                    data = store.json_value(raw_data)
                    now = self.clock.now()
                    context = GuardContext(machine, rkey, state, version, data, payload, now)
                    decision = runner.decide(state, trigger, context)
                    if not decision.fired:
                        return _refused(machine, rkey, trigger, state, version, decision)
                    params = {
                        "id_": rid, "version_": version, "seq_": seq,
                        "new_state": decision.dest, "new_version": version + 1,
                        "new_seq": seq + 1, "new_spec_version": runner.spec.version,
                        "now": store.time_param(now),
                    }
                    statement = sql.move
                    if payload and decision.edge is not None and decision.edge.merge_payload:
                        merged = self._validated(runner.spec, rkey, {**data, **payload})
                        params["new_data"] = store.json_param(merged)
                        statement = sql.move_with_data
                    cursor.execute(statement, params)
                    if cursor.rowcount != 1:
                        raise _Conflict
                    cursor.execute(sql.insert_journal, {
                        "resource_id": rid, "seq": seq + 1, "kind": "transition",
                        "trigger": None if trigger == EVENTLESS else trigger,
                        "source": state, "dest": decision.dest, "version": version + 1,
                        "spec_version": runner.spec.version, "actor": actor,
                        "at": params["now"],
                        "payload": store.json_param(payload) if payload else None,
                        "guards": store.json_param(decision.guards) if decision.guards else None,
                    })
            except _NeedMachine as need:
                self._runner(str(need))
                continue
            except _Conflict:
                log.debug("%s: version %s moved while firing %s; deciding again", key,
                          version, trigger)
                continue
            except (TypeError, ValueError) as exc:  # a payload that JSON cannot hold
                raise InvalidData(machine, rkey, f"payload is not JSON: {exc}") from None
            return FireResult(True, machine, rkey, _shown(trigger), state, decision.dest,
                              version + 1, None, decision.guards)
        raise ConcurrencyError(
            f"{key}: {trigger} lost the race {self.max_attempts} times in a row; nothing "
            "was written. Try again, or look for a process that moves it in a loop"
        )

    def _validated(self, spec: MachineSpec, key: str, data: dict[str, Any]) -> dict[str, Any]:
        if spec.data_model is None:
            return data
        try:
            return spec.data_model.model_validate(data).model_dump(mode="json")
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidData(spec.name, key, detail) from None

    # -- reading -----------------------------------------------------------------------

    def get(self, key: str) -> Resource:
        with self.store.read() as db:
            return self._get(db, key)

    def _get(self, db: Any, key: str) -> Resource:
        machine, plain = self._split(key)
        query = select(resources).where(resources.c.key == plain)
        if machine is not None:
            query = query.where(resources.c.machine == machine)
        rows = db.execute(query).all()
        if not rows:
            raise UnknownResource(plain, machine)
        if len(rows) > 1:
            raise AmbiguousKey(plain, [r.machine for r in rows])
        r = rows[0]
        return Resource(r.machine, r.key, r.state, r.version, r.seq, r.data, r.spec_version,
                        r.created_at, r.updated_at)

    def available_triggers(self, key: str) -> list[str]:
        """The triggers that have a transition from the resource's current state (guards,
        which may depend on the payload, are not evaluated)."""
        resource = self.get(key)
        return sorted(self._runner(resource.machine).triggers_from(resource.state))

    def history(self, key: str) -> list[JournalEntry]:
        with self.store.read() as db:
            resource = self._get(db, key)
            rows = db.execute(
                select(journal).join(resources, resources.c.id == journal.c.resource_id)
                .where(resources.c.machine == resource.machine, resources.c.key == resource.key)
                .order_by(journal.c.seq)
            ).all()
        return [_entry(r) for r in rows]

    def resources(self, machine: str | None = None, state: str | None = None) -> list[Resource]:
        query = select(resources).order_by(resources.c.machine, resources.c.key)
        if machine is not None:
            query = query.where(resources.c.machine == machine)
        if state is not None:
            query = query.where(resources.c.state == state)
        with self.store.read() as db:
            return [Resource(r.machine, r.key, r.state, r.version, r.seq, r.data,
                             r.spec_version, r.created_at, r.updated_at)
                    for r in db.execute(query)]

    def counts(self, machine: str | None = None) -> dict[str, dict[str, int]]:
        """How many resources each machine has in each state."""
        query = select(resources.c.machine, resources.c.state, func.count()).group_by(
            resources.c.machine, resources.c.state)
        if machine is not None:
            query = query.where(resources.c.machine == machine)
        out: dict[str, dict[str, int]] = {}
        with self.store.read() as db:
            for name, state, count in db.execute(query):
                out.setdefault(name, {})[state] = count
        return out

    def verify(self) -> list[Mismatch]:
        """Replay every resource's journal and compare it with the resource's row."""
        from .verify import verify

        return verify(self.store)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or key != key.strip():
        raise LifecycleError(f"invalid key {key!r}: a key is a non-empty string without "
                             "surrounding spaces")
    if ":" in key:
        raise LifecycleError(f"invalid key {key!r}: ':' separates MACHINE:KEY, so a key "
                             "cannot contain it")
    if len(key) > _KEY_MAX:
        raise LifecycleError(f"invalid key {key[:40]!r}...: longer than {_KEY_MAX} characters")


def _shown(trigger: str) -> str:
    return "(step)" if trigger == EVENTLESS else trigger


def _refused(machine: str, key: str, trigger: str, state: str, version: int,
             decision: Decision) -> FireResult:
    return FireResult(False, machine, key, _shown(trigger), state, None, version,
                      decision.reason, decision.guards)


def _entry(r: Any) -> JournalEntry:
    return JournalEntry(r.seq, r.kind, r.trigger, r.source, r.dest, r.version, r.spec_version,
                        r.actor, r.at, r.payload, r.guards)
