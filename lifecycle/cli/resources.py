"""Commands on resources: ``create``, ``fire``, ``observe``, ``step``, ``update``, ``list``,
``history`` and ``verify`` (``show`` is :mod:`lifecycle.cli.show`)."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from typing import Any

import click

from ..results import FireResult
from .common import (
    PLUGINS_VARIABLE,
    db_option,
    escape,
    json_arg,
    json_option,
    say,
)
from .context import make_engine, resolve

# (rich, the layout of tables and the telling of a history are imported by the commands
# that print them: create, fire, observe, step and update print a line or two, with
# common.say, and on a pipe import no rich)


@click.command()
@click.argument("machine")
@click.argument("key")
@click.option("--data", metavar="JSON", help="The resource's data, a JSON object.")
@click.option("--state", help="Adopt the resource in this state instead of the initial one.")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def create(machine: str, key: str, data: str | None, state: str | None, actor: str | None,
           db_url: str | None, as_json: bool) -> None:
    """Create resource KEY of MACHINE (a built-in name or a spec file)."""
    document = json_arg(data, "--data")
    engine = make_engine(db_url, as_met=True)
    spec = resolve(machine, lambda: engine)
    resource = engine.create(spec.name, key, document, state=state, actor=actor)
    if as_json:
        print(json.dumps(resource.to_json(), indent=2))
    else:
        say(f"created {escape(resource.machine)}:{escape(resource.key)} in "
            f"[bold]{resource.state}[/] (version {resource.version})")


@click.command()
@click.argument("key")
@click.argument("trigger")
@click.option("--payload", metavar="JSON", help="The event's payload, a JSON object.")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def fire(key: str, trigger: str, payload: str | None, actor: str | None, db_url: str | None,
         as_json: bool) -> None:
    """Fire TRIGGER on resource KEY (MACHINE:KEY when the key is in several machines).
    Exits 3 when the transition was refused."""
    document = json_arg(payload, "--payload")
    result = make_engine(db_url, as_met=True).fire(key, trigger, document, actor=actor,
                                                   on_stale="return")
    print_result(result, as_json)


@click.command()
@click.argument("key")
@click.argument("status")
@click.option("--at", "observed_at", metavar="TIME",
              help="When the status was true at its source (ISO 8601; default: now). A time "
                   "without a zone is UTC.")
@click.option("--source", default="cli", show_default=True, help="Who reported it.")
@db_option
@json_option
def observe(key: str, status: str, observed_at: str | None, source: str, db_url: str | None,
            as_json: bool) -> None:
    """Record STATUS (a JSON object) as an observation of resource KEY."""
    document = json_arg(status, "STATUS")
    when = None
    if observed_at is not None:
        try:
            when = dt.datetime.fromisoformat(observed_at.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(f"not an ISO 8601 time: {observed_at!r}",
                                     param_hint="--at") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
    observation = make_engine(db_url, as_met=True).observe(key, document, when, source=source)
    if as_json:
        print(json.dumps(observation.to_json(), indent=2))
    else:
        from ..story import time_text

        say(f"{key}: observed {escape(json.dumps(observation.status, sort_keys=True))} "
            f"at {time_text(observation.observed_at)} (observation {observation.id})")


@click.command()
@click.argument("key")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def step(key: str, actor: str | None, db_url: str | None, as_json: bool) -> None:
    """Take the first eventless transition of KEY whose guards hold. Exits 3 when none did."""
    print_result(make_engine(db_url, as_met=True).step(key, actor=actor, on_stale="return"),
                 as_json)


@click.command()
@click.argument("key")
@click.argument("data")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def update(key: str, data: str, actor: str | None, db_url: str | None, as_json: bool) -> None:
    """Merge DATA (a JSON object) into resource KEY's data: a new version and a journal row,
    no change of state."""
    document = json_arg(data, "DATA")
    resource = make_engine(db_url, as_met=True).update(key, document, actor=actor)
    if as_json:
        print(json.dumps(resource.to_json(), indent=2))
    else:
        from ..story import key_values

        say(f"{escape(resource.machine)}:{escape(resource.key)}: data updated (version "
            f"{resource.version}):")
        say(escape("\n".join(f"  {line}" for line in key_values(document))))


def print_result(result: FireResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    elif result.fired:
        say(f"{escape(result.machine)}:{escape(result.key)}: {result.trigger}: "
            f"{result.source} -> [bold]{result.dest}[/] (version {result.version})")
    else:
        why = f"{result.error}: {result.reason}" if result.error else (result.reason or "")
        say(f"{escape(result.machine)}:{escape(result.key)}: [yellow]not fired[/]: "
            f"{escape(why)}")
        if "is not registered with this engine" in why:
            say(f"hint: a module named in {PLUGINS_VARIABLE} provides probes "
                "(`probes`, or the settings its machine's configure reads); "
                "or record a fresh status with `lifecycle observe` first")
    if not result.fired:
        sys.exit(3)


PAGE = 100
"""Resources ``lifecycle list`` shows unless told otherwise."""


@click.command("list")
@click.argument("machine", required=False)
@click.option("--state", help="Only resources in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=PAGE, show_default=True,
              help="Resources on the page.")
@click.option("--after", metavar="MACHINE:KEY",
              help="Start past this resource (the last of the page before; it need not "
                   "exist any more).")
@click.option("--all", "every", is_flag=True, help="Every resource, not one page.")
@db_option
@json_option
def list_(machine: str | None, state: str | None, limit: int, after: str | None, every: bool,
          db_url: str | None, as_json: bool) -> None:
    """List resources, of one MACHINE or of all, in (machine, key) order, a page at a time.
    The last line says how to ask for the next page."""
    from rich.text import Text

    from ..story import plural, time_text
    from . import layout
    from .common import out

    engine = make_engine(db_url, as_met=True)
    if every:
        items, more = list(engine.iter_resources(machine, state, after=after)), False
    else:
        items = engine.resources(machine, state, limit=limit + 1, after=after)
        more = len(items) > limit
        del items[limit:]
    if as_json:
        print(json.dumps([r.to_json() for r in items], indent=2))
        if more:
            click.echo(f"more: {_next_page(machine, state, limit, items[-1])}", err=True)
        return
    table = layout.table("resource", "state", "version", "updated")
    blocks = []
    for r in items:
        table.add_row(Text(f"{r.machine}:{r.key}"), r.state, str(r.version),
                      time_text(r.updated_at))
        blocks.append(layout.block(Text(f"{r.machine}:{r.key}", style="bold"), [
            f"{r.state}, version {r.version}, updated {time_text(r.updated_at)}"]))
    out.print(layout.fitted(out, table, blocks), soft_wrap=False)
    if more:
        out.print(Text(f"{plural(len(items), 'resource')} shown; the next page: "
                       f"{_next_page(machine, state, limit, items[-1])}"))
    else:
        out.print(plural(len(items), "resource"))


def _next_page(machine: str | None, state: str | None, limit: int, last: Any) -> str:
    """The command that shows the page after ``last``."""
    words = ["lifecycle", "list", *([machine] if machine else []),
             *(["--state", state] if state else []),
             *(["--limit", str(limit)] if limit != PAGE else []),
             "--after", f"{last.machine}:{last.key}"]
    return shlex.join(words)


@click.command()
@click.argument("key")
@db_option
@json_option
def history(key: str, db_url: str | None, as_json: bool) -> None:
    """Show the journal of resource KEY, oldest first, with the observations of it in the
    order they were recorded and the outcome of each effect under the row that asked for
    it."""
    from rich.table import Table
    from rich.text import Text

    from .. import story
    from ..queries import resource_id
    from ..store.statements import effects as effect_rows
    from . import layout
    from .common import out

    engine = make_engine(db_url, as_met=True)
    entries = engine.history(key)
    if as_json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
        return
    with engine.store.read() as db:
        rid, resource = resource_id(db, key)
        effects = effect_rows.of_resource(db, rid)
    full_key = f"{resource.machine}:{resource.key}"
    telling = story.tell(entries, engine.observations(full_key), effects)
    title = Text(full_key, style="bold")
    if telling.day is not None:
        title.append(f", {telling.day.isoformat()}, times UTC", style="not bold")
    out.print(title, soft_wrap=False)
    table = Table("seq", "at", "what", box=None, pad_edge=False, header_style="dim")
    table.columns[0].justify = "right"
    table.columns[0].no_wrap = table.columns[1].no_wrap = True
    table.columns[2].overflow = "fold"
    for row in telling.rows:
        table.add_row("" if row.seq is None else str(row.seq), telling.time(row.at),
                      layout.told(row))
    out.print(table)
    out.print("[dim]in full, with versions and fences: --json[/]")


@click.command()
@db_option
@json_option
def verify(db_url: str | None, as_json: bool) -> None:
    """Replay every resource's journal; exit 1 if any does not end where its resource is."""
    from ..story import plural

    engine = make_engine(db_url, as_met=True)
    mismatches = engine.verify()
    total = sum(sum(c.values()) for c in engine.counts().values())
    if as_json:
        print(json.dumps({"resources": total, "mismatches": [
            {"machine": m.machine, "key": m.key, "problem": m.problem} for m in mismatches]},
            indent=2))
    else:
        for m in mismatches:
            say(f"[red]mismatch[/] {escape(str(m))}")
        if mismatches:
            say(f"{plural(len(mismatches), 'mismatch', 'mismatches')} in "
                f"{plural(total, 'resource')}")
        else:
            say(f"{plural(total, 'resource')} verified: every journal replays to its "
                "resource")
    if mismatches:
        sys.exit(1)


