"""What the dashboard's pages and /metrics read: plain JSON-ready dicts, from the store's
tables, each page a few statements that use an index (the benchmark ``dashboard`` times them
with 100,000 resources and 1,000,000 journal rows).

Resources are listed by key, a page at a time, continuing after (or before) the last key
shown: the cost of a page does not grow with how far the reader went (keyset pagination).
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, false, func, select, text

from ...graph import SEPARATOR
from ...results import FAILED, PENDING, RUNNING, JournalEntry, Observation
from ...spec import MachineSpec
from ..schema import (
    FENCED_WHERE,
    HEADS_WHERE,
    REFUSALS_WHERE,
    journal,
    machines,
    observations,
    outbox,
    resources,
    specs,
    state_counts,
    timers,
)
from .resources import OBSERVED

PAGE = 50
"""Resources on one page of a machine's listing."""
JOURNAL_SHOWN = 500
OBSERVATIONS_SHOWN = 200
EFFECTS_SHOWN = 200
TROUBLE_SHOWN = 100
OVERDUE_AFTER = dt.timedelta(minutes=1)
"""An effect due longer ago than this, that no worker has taken, is overdue."""
EVENTLESS = "(eventless)"


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class Specs:
    """Machine specs by version, read once each (a version's spec never changes)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], MachineSpec] = {}
        self._lock = threading.Lock()

    def get(self, db: Connection, machine: str, version: str) -> MachineSpec | None:
        with self._lock:
            found = self._known.get((machine, version))
        if found is None:
            stored = db.execute(select(specs.c.spec).where(
                specs.c.machine == machine, specs.c.version == version)).scalar()
            if stored is None:
                return None
            found = MachineSpec.model_validate(stored)
            with self._lock:
                self._known[machine, version] = found
        return found


# -- machines ------------------------------------------------------------------------------


COUNT_ROWS_READ = 5000
"""The most rows of ``lifecycle_state_counts`` the dashboard adds up itself: beyond that (no
reader folded them lately), it counts the resources' index instead."""


def counts(db: Connection, machine: str | None = None) -> dict[str, dict[str, int]]:
    """Resources per machine and state: the sums of the rows the database's triggers keep in
    ``lifecycle_state_counts`` while they are few (a reader that may write, such as
    ``lifecycle machines``, folds them), else a count over the index on machine and
    state. Either way a bounded read, and nothing written."""
    c, r = state_counts.c, resources.c
    few = select(c.id).limit(COUNT_ROWS_READ + 1).subquery()
    if db.execute(select(func.count()).select_from(few)).scalar_one() <= COUNT_ROWS_READ:
        query = select(c.machine, c.state, func.sum(c.n)).group_by(c.machine, c.state)
        if machine is not None:
            query = query.where(c.machine == machine)
    else:
        query = select(r.machine, r.state, func.count()).group_by(r.machine, r.state)
        if machine is not None:
            query = query.where(r.machine == machine)
    found: dict[str, dict[str, int]] = {}
    for name, state, count in db.execute(query):
        if count:
            found.setdefault(name, {})[state] = int(count)
    return found


def machine_rows(db: Connection, cache: Specs, name: str | None = None) -> list[dict[str, Any]]:
    """Each machine (or the one named) with its spec and its resources per state: every
    state of its spec, then any state a resource is in that the spec no longer has."""
    query = select(machines).order_by(machines.c.name)
    if name is not None:
        query = query.where(machines.c.name == name)
    rows = db.execute(query).all()
    per_machine = counts(db, name)
    out = []
    for row in rows:
        spec = cache.get(db, row.name, row.spec_version)
        held = per_machine.get(row.name, {})
        states = list(spec.graph.leaves) if spec is not None else []
        states += sorted(s for s in held if s not in states)
        out.append({"name": row.name, "spec_version": row.spec_version,
                    "updated_at": iso(row.updated_at),
                    "description": spec.description if spec is not None else None,
                    "states": [{"state": s, "count": held.get(s, 0)} for s in states],
                    "total": sum(held.values())})
    return out


# -- a machine's resources ------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """What a page of a machine's resources asks for."""

    machine: str
    state: str | None = None
    search: str | None = None
    after: str | None = None
    before: str | None = None
    limit: int = PAGE
    inside: tuple[str, ...] = ()
    """The states inside ``state`` (a composite's leaves), listed with it."""


def _key_contains(db: Connection, needle: str) -> Any:
    """The key holds ``needle``, case and all, on both databases (no LIKE patterns)."""
    if db.dialect.name == "sqlite":
        return func.instr(resources.c.key, needle) > 0
    return func.strpos(resources.c.key, needle) > 0


def inside(state: str, states: list[str]) -> tuple[str, ...]:
    """The states of ``states`` inside ``state`` (``state.child``...)."""
    return tuple(s for s in states if s.startswith(state + SEPARATOR))


def resource_page(db: Connection, asked: Listing) -> dict[str, Any]:
    """One page of resources by key, after ``asked.after`` or before ``asked.before``."""
    r = resources.c
    query = select(r.key, r.state, r.version, r.updated_at).where(r.machine == asked.machine)
    if asked.state:  # a composite state takes in the states inside it
        query = query.where(r.state.in_([asked.state, *asked.inside]))
    if asked.search:
        query = query.where(_key_contains(db, asked.search))
    backwards = asked.before is not None and asked.after is None
    if backwards:
        query = query.where(r.key < asked.before).order_by(r.key.desc())
    else:
        if asked.after is not None:
            query = query.where(r.key > asked.after)
        query = query.order_by(r.key)
    rows = list(db.execute(query.limit(asked.limit + 1)))
    more = len(rows) > asked.limit
    rows = rows[:asked.limit]
    if backwards:
        rows.reverse()
    items = [{"key": row.key, "state": row.state, "version": row.version,
              "updated_at": iso(row.updated_at)} for row in rows]
    first = items[0]["key"] if items else None
    last = items[-1]["key"] if items else None
    return {"machine": asked.machine, "state": asked.state, "search": asked.search,
            "resources": items,
            "next_after": last if (more or backwards) and last is not None else None,
            "previous_before": first if (more or not backwards) and first is not None
            and (asked.after is not None or backwards) else None}


# -- one resource ---------------------------------------------------------------------------


def _observation(row: Any) -> dict[str, Any]:
    return {"id": row.id, "status": row.status, "observed_at": iso(row.observed_at),
            "recorded_at": iso(row.recorded_at), "source": row.source}


def state_of(db: Connection, machine: str, key: str) -> str | None:
    """The state of one resource; None if there is no such resource."""
    r = resources.c
    return db.execute(select(r.state).where(r.machine == machine, r.key == key)).scalar()


@dataclass(frozen=True)
class Detail:
    """One resource as its page shows it: ``page``, JSON-ready, and the records its history
    is told from (:func:`lifecycle.story.tell`): the newest journal rows shown, oldest
    first, each with the observation it rested on; the newest observations; its effects."""

    page: dict[str, Any]
    entries: list[JournalEntry]
    observations: list[Observation]
    effects: list[Any]


def resource_detail(db: Connection, machine: str, key: str) -> Detail | None:
    """The resource, its newest observations, its journal (refusals marked) and its
    effects and pending timers; None if there is no such resource."""
    r = resources.c
    row = db.execute(select(resources).where(r.machine == machine, r.key == key)).first()
    if row is None:
        return None
    o, j, f, t = observations.c, journal.c, outbox.c, timers.c
    seen = db.execute(select(observations).where(o.resource_id == row.id)
                      .order_by(o.id.desc()).limit(OBSERVATIONS_SHOWN)).all()[::-1]
    rows = db.execute(select(journal, *OBSERVED)
                      .select_from(journal.outerjoin(observations, o.id == j.observation_id))
                      .where(j.resource_id == row.id)
                      .order_by(j.seq.desc()).limit(JOURNAL_SHOWN)).all()[::-1]
    effects = db.execute(select(outbox).where(f.resource_id == row.id)
                         .order_by(f.id.desc()).limit(EFFECTS_SHOWN)).all()[::-1]
    pending = db.execute(select(timers).where(t.resource_id == row.id, t.status == PENDING)
                         .order_by(t.due_at)).all()
    newest = next((s for s in seen if s.id == row.observation_id), None)
    if newest is None and row.observation_id is not None:
        newest = db.execute(select(observations).where(o.id == row.observation_id)).first()
    page = {
        "machine": row.machine, "key": row.key, "state": row.state, "version": row.version,
        "seq": row.seq, "data": row.data, "spec_version": row.spec_version,
        "created_at": iso(row.created_at), "updated_at": iso(row.updated_at),
        "last_transition_at": iso(row.last_transition_at),
        "observation": _observation(newest) if newest is not None else None,
        "observations": [_observation(s) for s in seen],
        "observations_total": _count(db, o.resource_id == row.id, observations)
        if len(seen) == OBSERVATIONS_SHOWN else len(seen),
        "journal": [_journal_row(e) for e in rows],
        "journal_total": row.seq,
        "effects": [_effect(e) for e in effects],
        "timers": [{"id": tm.id, "state": tm.state, "trigger": tm.trigger,
                    "due_at": iso(tm.due_at), "seq": tm.seq} for tm in pending],
    }
    return Detail(page, [_entry(e) for e in rows],
                  [Observation(s.id, s.status, s.observed_at, s.recorded_at, s.source)
                   for s in seen], list(effects))


def _entry(e: Any) -> JournalEntry:
    seen = None if e.o_id is None else Observation(e.o_id, e.o_status, e.o_observed_at,
                                                    e.o_recorded_at, e.o_source)
    return JournalEntry(e.seq, e.kind, e.trigger, e.source, e.dest, e.version, e.spec_version,
                        e.actor, e.at, e.payload, e.guards, seen, e.fence)


def _count(db: Connection, where: Any, table: Any) -> int:
    return int(db.execute(select(func.count()).select_from(table).where(where)).scalar_one())


def _journal_row(e: Any) -> dict[str, Any]:
    return {"seq": e.seq, "kind": e.kind, "refused": e.kind == "refusal",
            "trigger": e.trigger, "source": e.source, "dest": e.dest, "version": e.version,
            "actor": e.actor, "at": iso(e.at), "payload": e.payload, "guards": e.guards,
            "observation_id": e.observation_id, "fence": e.fence}


def _effect(e: Any) -> dict[str, Any]:
    return {"id": e.id, "seq": e.seq, "name": e.name, "args": e.args, "status": e.status,
            "attempts": e.attempts, "next_attempt_at": iso(e.next_attempt_at),
            "last_error": e.last_error, "claimed_by": e.claimed_by,
            "lease_until": iso(e.lease_until), "created_at": iso(e.created_at),
            "finished_at": iso(e.finished_at), "on_failure": e.on_failure,
            "progress": e.progress, "fence": e.fence}


# -- across machines ------------------------------------------------------------------------


def _ordered(columns: Any, order: tuple[str, ...]) -> list[Any]:
    """``order``'s column names (``-name``: descending) as ``columns``' columns."""
    return [columns[n[1:]].desc() if n.startswith("-") else columns[n] for n in order]


def _trouble_query(where: Any, order: tuple[str, ...]) -> Any:
    """The first effects in ``order`` of those ``where`` says, then their resources' keys
    (joined after the limit: only the rows shown)."""
    f, r = outbox.c, resources.c
    first = (select(f.id, f.name, f.status, f.attempts, f.next_attempt_at, f.last_error,
                    f.claimed_by, f.lease_until, f.created_at, f.finished_at, f.resource_id)
             .where(where).order_by(*_ordered(f, order)).limit(TROUBLE_SHOWN).subquery())
    e = first.c
    return (select(e.id, e.name, e.status, e.attempts, e.next_attempt_at, e.last_error,
                   e.claimed_by, e.lease_until, e.created_at, r.machine, r.key)
            .join(resources, r.id == e.resource_id).order_by(*_ordered(e, order)))


def trouble(db: Connection, now: dt.datetime) -> dict[str, Any]:
    """Effects that need a look: failed for good (stuck until `lifecycle retry`); failing
    and to be tried again; running on a claim whose lease ran out (its worker is gone);
    due for over a minute with no worker taking them."""
    f = outbox.c
    heads = text(HEADS_WHERE)  # the heads' partial index, in due order
    kinds = {
        "failed": (f.status == FAILED, ("-finished_at", "-id")),
        "retrying": (and_(f.status == PENDING, f.attempts > 0), ("next_attempt_at", "id")),
        "lease_expired": (and_(f.status == RUNNING, f.lease_until < now),
                          ("lease_until", "id")),
        "overdue": (and_(heads, f.status == PENDING, f.next_attempt_at < now - OVERDUE_AFTER),
                    ("next_attempt_at", "id")),
    }
    found: dict[str, Any] = {}
    for kind, (where, order) in kinds.items():
        rows = db.execute(_trouble_query(where, order)).all()
        found[kind] = [{"id": e.id, "machine": e.machine, "key": e.key, "name": e.name,
                        "status": e.status, "attempts": e.attempts,
                        "next_attempt_at": iso(e.next_attempt_at),
                        "last_error": e.last_error, "claimed_by": e.claimed_by,
                        "lease_until": iso(e.lease_until), "created_at": iso(e.created_at)}
                       for e in rows]
    return found


def refusals(db: Connection, since: dt.datetime, limit: int = TROUBLE_SHOWN) -> dict[str, Any]:
    """Refusals of risky edges since ``since``, newest first, and how many per edge."""
    j, r = journal.c, resources.c
    risky = and_(text(REFUSALS_WHERE), j.at >= since)  # the refusals' partial index
    by_edge = db.execute(
        select(j.spec_version, j.trigger, j.source, j.dest, func.count())
        .where(risky).group_by(j.spec_version, j.trigger, j.source, j.dest)).all()
    names = spec_machines(db)
    edges = sorted(({"machine": names.get(v, "?"), "trigger": t or EVENTLESS, "source": s,
                     "dest": d, "count": int(n)} for v, t, s, d, n in by_edge),
                   key=lambda e: (-e["count"], e["machine"], e["trigger"], e["source"]))
    rows = db.execute(
        select(j.seq, j.at, j.trigger, j.source, j.dest, j.actor, j.observation_id,
               r.machine, r.key)
        .join(resources, r.id == j.resource_id).where(risky)
        .order_by(j.at.desc()).limit(limit)).all()
    earlier, newest = db.execute(select(func.count(), func.max(j.at)).where(
        text(REFUSALS_WHERE), j.at < since)).one()
    alone = left_alone(db, since, limit)
    newest = max((t for t in (newest, alone.pop("newest_earlier")) if t is not None),
                 default=None)
    return {"since": iso(since), "total": sum(e["count"] for e in edges), "edges": edges,
            "earlier": int(earlier or 0) + alone.pop("earlier"),
            "newest_earlier": iso(newest) if newest else None,
            "refusals": [{"machine": e.machine, "key": e.key, "seq": e.seq, "at": iso(e.at),
                          "trigger": e.trigger or EVENTLESS, "source": e.source,
                          "dest": e.dest, "actor": e.actor,
                          "observation_id": e.observation_id} for e in rows],
            "left_alone": alone}


LEFT_ALONE_WHERE = and_(outbox.c.fence.is_not(None),
                        outbox.c.progress["acted"].as_boolean() == false())
"""The effects of risky edges that their fence kept from acting: their handler found the
world no longer as the decision observed it, left it alone and saved ``acted: false`` (the
drone's terminate does)."""


LEFT_ALONE_SCANNED = 20_000
"""How many of the newest effects :func:`left_alone` looks through (no index serves its
terms, so its cost is bounded by this, not by the outbox's length)."""


def left_alone(db: Connection, since: dt.datetime, limit: int = TROUBLE_SHOWN
               ) -> dict[str, Any]:
    """Of the newest :data:`LEFT_ALONE_SCANNED` effects, those :data:`LEFT_ALONE_WHERE` says
    that finished since ``since``, newest first; how many per machine and effect; how many
    finished before, and the newest of those."""
    f, r = outbox.c, resources.c
    last = db.execute(select(func.max(f.id))).scalar() or 0
    scanned = and_(f.id > last - LEFT_ALONE_SCANNED, f.finished_at.is_not(None),
                   LEFT_ALONE_WHERE)
    recent = (f.finished_at >= since).label("recent")
    counted = db.execute(
        select(r.machine, f.name, recent, func.count(), func.max(f.finished_at))
        .join(resources, r.id == f.resource_id).where(scanned)
        .group_by(r.machine, f.name, recent).order_by(r.machine, f.name)).all()
    rows = db.execute(
        select(f.name, f.seq, f.finished_at, f.fence, f.progress, r.machine, r.key)
        .join(resources, r.id == f.resource_id).where(scanned, f.finished_at >= since)
        .order_by(f.finished_at.desc(), f.id.desc()).limit(limit)).all()
    by_effect = [{"machine": m, "effect": name, "count": int(n)}
                 for m, name, now, n, _ in counted if now]
    before = [(int(n), at) for _, _, now, n, at in counted if not now]
    return {"total": sum(e["count"] for e in by_effect), "by_effect": by_effect,
            "scanned": LEFT_ALONE_SCANNED,
            "effects": [{"machine": e.machine, "key": e.key, "seq": e.seq, "effect": e.name,
                         "at": iso(e.finished_at), "fence": e.fence,
                         "progress": e.progress} for e in rows],
            "earlier": sum(n for n, _ in before),
            "newest_earlier": max((at for _, at in before), default=None)}


def spec_machines(db: Connection) -> dict[str, str]:
    """The machine of each spec version (a version is a hash of its machine's spec)."""
    return {version: machine for machine, version in
            db.execute(select(specs.c.machine, specs.c.version))}


# -- what /metrics says ---------------------------------------------------------------------


def risky_edges(db: Connection) -> list[tuple[str, str, str, str, str, int]]:
    """(kind, machine, trigger, source, dest, count) of the journal's risky rows ever: the
    transitions that kept a fence, and the refusals (each read from its partial index)."""
    j = journal.c
    edge = (j.spec_version, j.trigger, j.source, j.dest)
    names = spec_machines(db)
    merged: dict[tuple[str, str, str, str, str], int] = {}
    for kind, where in (("transition", FENCED_WHERE), ("refusal", REFUSALS_WHERE)):
        rows = db.execute(select(*edge, func.count()).where(text(where)).group_by(*edge))
        for version, trigger, source, dest, count in rows:
            labels = (kind, names.get(version, "?"), trigger or EVENTLESS, source or "", dest)
            merged[labels] = merged.get(labels, 0) + int(count)
    return [(*labels, count) for labels, count in sorted(merged.items())]


def effect_counts(db: Connection) -> list[tuple[str, str, int]]:
    """(name, status, count) of the open effects; a pending effect tried before counts as
    ``retrying``."""
    f = outbox.c
    retrying = and_(f.status == PENDING, f.attempts > 0)
    rows = db.execute(
        select(f.name, f.status, retrying.label("retrying"), func.count())
        .where(f.status.in_((PENDING, RUNNING, FAILED)))
        .group_by(f.name, f.status, retrying)).all()
    return [(name, "retrying" if again else state, int(count))
            for name, state, again, count in rows]


def oldest_due_effect(db: Connection, now: dt.datetime) -> float:
    """Seconds the effect waiting longest since it fell due has waited (0 when none)."""
    f = outbox.c
    due = db.execute(select(func.min(f.next_attempt_at)).where(
        f.status == PENDING, f.next_attempt_at <= now)).scalar()
    if due is None:
        return 0.0
    if isinstance(due, str):
        due = dt.datetime.fromisoformat(due)
    moment: dt.datetime = due if due.tzinfo else due.replace(tzinfo=dt.UTC)
    return max(0.0, (now - moment).total_seconds())


def timers_due(db: Connection, now: dt.datetime) -> int:
    t = timers.c
    return _count(db, and_(t.status == PENDING, t.due_at <= now), timers)


def probe_answers(db: Connection, probes: set[str]) -> list[tuple[str, int]]:
    """Observations recorded from each probe's answers."""
    if not probes:
        return []
    o = observations.c
    rows = db.execute(select(o.source, func.count()).where(o.source.in_(sorted(probes)))
                      .group_by(o.source)).all()
    return [(source, int(count)) for source, count in rows]


def probe_names(db: Connection, cache: Specs) -> set[str]:
    """The probes the machines' current specs name."""
    names: set[str] = set()
    for machine, version in db.execute(select(machines.c.name, machines.c.spec_version)):
        spec = cache.get(db, machine, version)
        if spec is not None:
            names |= spec.probe_names()
    return names
