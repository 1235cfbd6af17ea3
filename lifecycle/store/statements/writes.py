"""A resource's write as one statement on PostgreSQL: its compare-and-swap (or its insert)
with the rows that go with it, in data-modifying CTEs that each read the compare-and-swap's
``RETURNING id``: the journal row, the effects, the timers cancelled and set. A
compare-and-swap that finds the row moved returns no id, so none of them writes anything;
the others of a batch are untouched. A *strict* write takes its journal row's
``resource_id`` as a scalar subquery of that id instead, so that a moved row makes the
journal insert fail (``NOT NULL``) and the whole transaction with it: what a caller wrote
before it in the transaction (``Within``) is then undone too.

The queue head of the effects is set by a statement of its own after it
(:attr:`WriteStatements.head_effect`): a statement's snapshot is taken when it starts, and
the CTE's may predate the commit of the worker whose lock on the resource its
compare-and-swap waited for; the next statement's sees it. (SQLite runs the same rows as
separate statements, :meth:`lifecycle.store.Transaction.write`: it has no round trips.)
"""

from __future__ import annotations

from ...results import CANCELLED, OPEN, PENDING
from ..schema import journal, observations, outbox, resources, timers
from .compiling import Compiling

_JOURNAL = ("seq", "kind", "trigger", "source", "dest", "version", "spec_version", "actor",
            "at", "payload", "guards", "observation_id", "fence")


class WriteStatements(Compiling):
    """The PostgreSQL hot path's writes of a resource, each one statement."""

    def _writes(self) -> None:
        self._written: dict[tuple[str, bool, bool, bool, bool, bool], str] = {}
        if self.dialect.name != "postgresql":
            self.head_effect = self.observed = ""
            return
        open_ = ", ".join(f"'{status}'" for status in OPEN)
        effects = outbox.name
        self.head_effect = (
            f"UPDATE {effects} SET head = 1 WHERE id = (SELECT min(id) FROM {effects} "
            f"WHERE resource_id = %(resource_id)s AND status IN ({open_})) "
            "AND head IS NULL AND seq = %(seq)s")
        self.observed = (
            # one JSON document of [machine, key, status, observed_at, recorded_at] rows
            # (a parameter encoded once, not arrays of values dumped one by one), each
            # resource found by its (machine, key) here: no read of the ids before it; the
            # sequence looked up once (an InitPlan), not once per row; ids drawn in the
            # order given, whatever join the plan picks (PostgreSQL evaluates a volatile
            # target such as nextval after the ORDER BY)
            "WITH given AS (SELECT nextval((SELECT pg_get_serial_sequence("
            f"'{observations.name}', 'id')::regclass)) AS id, r.id AS resource_id, "
            "g.o->2 AS status, (g.o->>3)::timestamptz AS observed_at, "
            "(g.o->>4)::timestamptz AS recorded_at, g.n "
            "FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS g(o, n) "
            f"JOIN {resources.name} AS r ON r.machine = g.o->>0 AND r.key = g.o->>1 "
            "ORDER BY g.n), "
            f"recorded AS (INSERT INTO {observations.name} (id, resource_id, status, "
            "observed_at, recorded_at, source) SELECT id, resource_id, status, observed_at, "
            "recorded_at, %(source)s FROM given), "
            # the newest by observed_at (of two at one time, the later given), if newer
            f"newest AS (UPDATE {resources.name} AS r SET observation_id = g.id, "
            "observed_at = g.observed_at FROM (SELECT DISTINCT ON (resource_id) id, "
            "resource_id, observed_at FROM given ORDER BY resource_id, observed_at DESC, "
            "n DESC) AS g WHERE r.id = g.resource_id AND (r.observed_at IS NULL "
            "OR r.observed_at <= g.observed_at)) "
            # the rows given (from 1) whose resource was found, with their ids
            "SELECT n, id FROM given ORDER BY n")

    def written(self, change: str, create: bool, effects: bool, exited: bool, timers_: bool,
                strict: bool) -> str:
        """The statement of one write: ``change`` (a compare-and-swap of the catalogue, or
        ``insert_resource`` when ``create``) with its journal row, and its effects, timers
        cancelled and timers set when asked; compiled on first use."""
        shape = (change, create, effects, exited, timers_, strict)
        found = self._written.get(shape)
        if found is None:
            found = self._written[shape] = self._compose(*shape)
        return found

    def _compose(self, change: str, create: bool, effects: bool, exited: bool,
                 timers_: bool, strict: bool) -> str:
        parts = [f"moved AS ({change}{'' if create else ' RETURNING id'})"]
        columns = ", ".join(_JOURNAL)
        given = ", ".join(f"%(j_{name})s" for name in _JOURNAL)
        parts.append(
            f"journaled AS (INSERT INTO {journal.name} (resource_id, {columns}) "
            + (f"SELECT (SELECT id FROM moved), {given})" if strict
               else f"SELECT moved.id, {given} FROM moved)"))
        if effects:
            parts.append(
                f"effected AS (INSERT INTO {outbox.name} (resource_id, seq, position, name, "
                "args, status, attempts, next_attempt_at, idempotency_key, fence, "
                "on_failure, created_at, head) SELECT moved.id, %(e_seq)s, e.n - 1, e.name, "
                f"e.args, '{PENDING}', 0, %(e_at)s, e.key, %(e_fence)s, e.on_failure, "
                f"%(e_at)s, {'CASE WHEN e.n = 1 THEN 1 END' if create else 'NULL::integer'} "
                "FROM moved, unnest(%(e_names)s::text[], %(e_args)s::jsonb[], "
                "%(e_keys)s::text[], %(e_on_failure)s::text[]) WITH ORDINALITY "
                "AS e(name, args, key, on_failure, n))")
        if exited:
            parts.append(
                f"cancelled AS (UPDATE {timers.name} SET status = '{CANCELLED}', "
                "finished_at = %(x_now)s FROM moved WHERE "
                f"{timers.name}.resource_id = moved.id AND "
                f"{timers.name}.state = ANY(%(x_states)s::text[]) AND "
                f"{timers.name}.status = '{PENDING}')")
        if timers_:
            parts.append(
                f"timed AS (INSERT INTO {timers.name} (resource_id, seq, state, trigger, "
                f"due_at, status, created_at) SELECT moved.id, %(t_seq)s, t.state, t.trigger, "
                f"t.due_at, '{PENDING}', %(t_at)s FROM moved, unnest(%(t_states)s::text[], "
                "%(t_triggers)s::text[], %(t_due)s::timestamptz[]) AS t(state, trigger, due_at))")
        return "WITH " + ", ".join(parts) + " SELECT id FROM moved"


__all__ = ["WriteStatements"]
