"""``lifecycle show``: one resource, its triggers, timers and open effects.

It is read on the database's own driver (:mod:`lifecycle.bare_read`), the triggers from the
spec the database stores (:func:`lifecycle.graph.stored_triggers`): the command then
imports neither SQLAlchemy nor pydantic nor ``transitions``. Where that read cannot answer
as the engine would, the engine answers (its imports are made then):

- the read is :class:`~lifecycle.bare_read.Unsure` (the database is missing, at another schema
  revision, cannot be opened read-only, or its URL is not one it reads);
- $LIFECYCLE_PLUGINS names modules (their guards and handlers are known only by importing
  them);
- the database does not run the machine under the spec the engine would: a built-in
  machine whose current spec there is not the code's (the engine registers the code's), a
  machine the database does not know, or one whose spec names guards (the engine, which has
  none of them, refuses it).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

import click
from rich.table import Table
from rich.text import Text

from .. import machines
from ..bare_read import Unsure, peek
from ..graph import stored_guards, stored_triggers
from ..results import FAILED, PENDING, RUNNING, EffectRecord, Resource, TimerRecord
from ..story import time_text
from . import layout
from .common import (
    PLUGINS_VARIABLE,
    db_option,
    escape,
    json_option,
    out,
    plugin_names,
)

TIMERS = (PENDING,)
EFFECTS = (PENDING, RUNNING, FAILED)
"""The statuses of the timers and effects shown."""


@dataclass(frozen=True, slots=True)
class Shown:
    """What ``show`` prints."""

    resource: Resource
    triggers: list[str]
    timers: list[TimerRecord]
    effects: list[EffectRecord]
    handlers: Collection[str]
    """The effects this process has handlers for."""


@click.command()
@click.argument("key")
@db_option
@json_option
def show(key: str, db_url: str | None, as_json: bool) -> None:
    """Show resource KEY: its state, version, data and the triggers it can take."""
    shown = peeked(db_url, key) or by_engine(db_url, key)
    if as_json:
        print(json.dumps({**shown.resource.to_json(), "triggers": shown.triggers,
                          "timers": [t.to_json() for t in shown.timers],
                          "effects": [e.to_json() for e in shown.effects]}, indent=2))
    else:
        out.print(_table(shown))


def peeked(db_url: str | None, key: str) -> Shown | None:
    """The resource read on the database's driver; None where the engine must answer."""
    if plugin_names():
        return None
    try:
        found = peek(db_url, key, TIMERS, EFFECTS)
    except Unsure:
        return None
    resource, spec = found.resource, found.spec
    shipped = machines.shipped().get(resource.machine)
    if spec is None or (found.spec_version != shipped[0] if shipped is not None
                        else bool(stored_guards(spec))):
        return None
    return Shown(resource, stored_triggers(spec, resource.state), found.timers, found.effects,
                 shipped[1] if shipped is not None else ())


def by_engine(db_url: str | None, key: str) -> Shown:
    """The resource as the engine reads it: its machine loaded (the built-in one's module
    alone, and the modules of $LIFECYCLE_PLUGINS)."""
    from ..outbox_admin import effect_records, timer_records
    from ..queries import get
    from .context import make_engine, open_store

    store = open_store(db_url)
    resource = get(store, key)  # first: the engine loads this resource's machine alone
    engine = make_engine(db_url, machines=[resource.machine], store=store)
    full_key = f"{resource.machine}:{resource.key}"
    return Shown(resource, engine.available_triggers(full_key),
                 timer_records(engine, full_key, statuses=TIMERS),
                 effect_records(engine, full_key, statuses=EFFECTS), frozenset(engine.handlers))


def _table(shown: Shown) -> Table:
    resource = shown.resource
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("resource", Text(f"{resource.machine}:{resource.key}"))
    table.add_row("state", f"[bold]{resource.state}[/]")
    table.add_row("version", str(resource.version))
    table.add_row("spec version", resource.spec_version)
    table.add_row("created", time_text(resource.created_at))
    table.add_row("updated", time_text(resource.updated_at))
    table.add_row("triggers", ", ".join(shown.triggers) or "none")
    table.add_row("data", Text("\n".join(layout.key_values(resource.data)) or "none"))
    if resource.observation is not None:
        seen = resource.observation
        table.add_row("observed", Text("\n".join([
            f"by {seen.source} (#{seen.id}), true at {time_text(seen.observed_at)}",
            *layout.key_values(seen.status)])))
    for timer in shown.timers:
        table.add_row("timer", f"{timer.trigger} at {time_text(timer.due_at)} (set on entering "
                               f"{timer.state})")
    for effect in shown.effects:
        line = f"{effect.name} {effect.status}, attempt {effect.attempts}"
        if effect.status == PENDING:
            line += f", due {time_text(effect.next_attempt_at)}"
        if effect.status == RUNNING and effect.lease_until is not None:
            line += (f", held by worker {effect.claimed_by} until "
                     f"{time_text(effect.lease_until)} (renewed while it lives)")
        if effect.last_error:
            line += f": {effect.last_error}"
        if effect.status == PENDING and effect.name not in shown.handlers:
            line += (f"; no handler {effect.name!r} in this process: a worker with a module "
                     f"in {PLUGINS_VARIABLE} that provides it carries it out")
        table.add_row("[red]stuck[/]" if effect.status == FAILED else "effect", escape(line))
    return table
