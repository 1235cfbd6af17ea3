"""Commands on resources: ``create``, ``fire``, ``observe``, ``step``, ``update``, ``show``,
``list``, ``history`` and ``verify``."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import click
from rich.table import Table

from ..effects import FAILED, PENDING, RUNNING
from ..outbox import effect_records, timer_records
from ..records import FireResult, JournalEntry
from .common import db_option, escape, json_arg, json_option, out, plural, time_text
from .context import PLUGINS_VARIABLE, make_engine, resolve


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
    engine = make_engine(db_url)
    spec = resolve(machine, lambda: engine)
    resource = engine.create(spec.name, key, document, state=state, actor=actor)
    if as_json:
        print(json.dumps(resource.to_json(), indent=2))
    else:
        out.print(f"created {resource.machine}:{resource.key} in [bold]{resource.state}[/] "
                  f"(version {resource.version})")


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
    result = make_engine(db_url).fire(key, trigger, document, actor=actor, on_stale="return")
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
    observation = make_engine(db_url).observe(key, document, when, source=source)
    if as_json:
        print(json.dumps(observation.to_json(), indent=2))
    else:
        out.print(f"{key}: observed {escape(json.dumps(observation.status, sort_keys=True))} "
                  f"at {time_text(observation.observed_at)} (observation {observation.id})")


@click.command()
@click.argument("key")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def step(key: str, actor: str | None, db_url: str | None, as_json: bool) -> None:
    """Take the first eventless transition of KEY whose guards hold. Exits 3 when none did."""
    print_result(make_engine(db_url).step(key, actor=actor, on_stale="return"), as_json)


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
    resource = make_engine(db_url).update(key, document, actor=actor)
    if as_json:
        print(json.dumps(resource.to_json(), indent=2))
    else:
        out.print(f"{resource.machine}:{resource.key}: data updated (version "
                  f"{resource.version}): {escape(json.dumps(resource.data, sort_keys=True))}")


def print_result(result: FireResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    elif result.fired:
        out.print(f"{result.machine}:{result.key}: {result.trigger}: {result.source} -> "
                  f"[bold]{result.dest}[/] (version {result.version})")
    else:
        why = f"{result.error}: {result.reason}" if result.error else (result.reason or "")
        out.print(f"{result.machine}:{result.key}: [yellow]not fired[/]: {escape(why)}")
        if "is not registered with this engine" in why:
            out.print(f"hint: a module named in {PLUGINS_VARIABLE} provides probes "
                      "(`probes`, or `drone_site` and `drone_batch_system` for drones); "
                      "or record a fresh status with `lifecycle observe` first")
    if not result.fired:
        sys.exit(3)


@click.command()
@click.argument("key")
@db_option
@json_option
def show(key: str, db_url: str | None, as_json: bool) -> None:
    """Show resource KEY: its state, version, data and the triggers it can take."""
    engine = make_engine(db_url)
    resource = engine.get(key)
    full_key = f"{resource.machine}:{resource.key}"
    triggers = engine.available_triggers(full_key)
    pending_timers = timer_records(engine, full_key, statuses=(PENDING,))
    open_effects = effect_records(engine, full_key, statuses=(PENDING, RUNNING, FAILED))
    if as_json:
        print(json.dumps({**resource.to_json(), "triggers": triggers,
                          "timers": [t.to_json() for t in pending_timers],
                          "effects": [e.to_json() for e in open_effects]}, indent=2))
        return
    table = Table(show_header=False, box=None)
    table.add_row("resource", f"{resource.machine}:{resource.key}")
    table.add_row("state", f"[bold]{resource.state}[/]")
    table.add_row("version", str(resource.version))
    table.add_row("spec version", resource.spec_version)
    table.add_row("created", time_text(resource.created_at))
    table.add_row("updated", time_text(resource.updated_at))
    table.add_row("triggers", ", ".join(triggers) or "none")
    table.add_row("data", escape(json.dumps(resource.data, sort_keys=True)))
    if resource.observation is not None:
        seen = resource.observation
        table.add_row("observed", escape(
            f"{json.dumps(seen.status, sort_keys=True)} at {time_text(seen.observed_at)} by "
            f"{seen.source} (#{seen.id})"))
    for timer in pending_timers:
        table.add_row("timer", f"{timer.trigger} at {time_text(timer.due_at)} (set on entering "
                               f"{timer.state})")
    for effect in open_effects:
        line = f"{effect.name} {effect.status}, attempt {effect.attempts}"
        if effect.status == PENDING:
            line += f", due {time_text(effect.next_attempt_at)}"
        if effect.last_error:
            line += f": {effect.last_error}"
        table.add_row("[red]stuck[/]" if effect.status == FAILED else "effect", escape(line))
    out.print(table)


@click.command("list")
@click.argument("machine", required=False)
@click.option("--state", help="Only resources in this state.")
@db_option
@json_option
def list_(machine: str | None, state: str | None, db_url: str | None, as_json: bool) -> None:
    """List resources, of one MACHINE or of all."""
    items = make_engine(db_url).resources(machine, state)
    if as_json:
        print(json.dumps([r.to_json() for r in items], indent=2))
        return
    table = Table("resource", "state", "version", "updated")
    for r in items:
        table.add_row(f"{r.machine}:{r.key}", r.state, str(r.version), time_text(r.updated_at))
    out.print(table)
    out.print(plural(len(items), "resource"))


@click.command()
@click.argument("key")
@db_option
@json_option
def history(key: str, db_url: str | None, as_json: bool) -> None:
    """Show the journal of resource KEY, oldest first."""
    engine = make_engine(db_url)
    entries = engine.history(key)
    if as_json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
        return
    resource = engine.get(key)
    days = {e.at.date() for e in entries}
    one_day = len(days) == 1
    title = f"{resource.machine}:{resource.key}" + (
        f", {next(iter(days)).isoformat()} (UTC)" if one_day else "")
    table = Table("seq", "at", "event", "from -> to", title=title, title_justify="left")
    table.add_column("details", overflow="fold")
    for e in entries:
        details = []
        if e.actor:
            details.append(f"by {e.actor}")
        if e.guards:
            # a transition shows the guards that let it fire; a refusal all it asked
            shown: dict[str, bool] = e.guards if e.kind == "refusal" else {
                name: ok for name, ok in e.guards.items() if ok}
            if shown:
                details.append(_verdicts(shown))
        if e.payload:
            label = "data" if e.kind in ("create", "adopt") else "payload"
            details.append(f"{label} {_short(e.payload)}")
        if e.observation is not None:
            details.append(f"on {_short(e.observation.status)} seen "
                           f"{time_text(e.observation.observed_at, one_day)} by "
                           f"{e.observation.source}")
        moved = f"{e.source} -> {e.dest}" if e.source and e.source != e.dest else e.dest
        table.add_row(str(e.seq), time_text(e.at, one_day), _what(e), moved,
                      escape("; ".join(details)))
    out.print(table)
    out.print("[dim]version, guard verdicts, payloads and observations in full: "
              "--json[/]")


def _short(document: Any, limit: int = 120) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _what(entry: JournalEntry) -> str:
    if entry.kind == "transition":
        return entry.trigger or "(eventless)"
    if entry.kind == "refusal":
        return f"[red]refused[/] {entry.trigger or '(eventless)'}"
    return entry.kind


def _verdicts(guards: dict[str, bool] | None) -> str:
    return ", ".join(f"{name}={'yes' if ok else 'no'}" for name, ok in (guards or {}).items())


@click.command()
@db_option
@json_option
def verify(db_url: str | None, as_json: bool) -> None:
    """Replay every resource's journal; exit 1 if any does not end where its resource is."""
    engine = make_engine(db_url)
    mismatches = engine.verify()
    total = sum(sum(c.values()) for c in engine.counts().values())
    if as_json:
        print(json.dumps({"resources": total, "mismatches": [
            {"machine": m.machine, "key": m.key, "problem": m.problem} for m in mismatches]},
            indent=2))
    else:
        for m in mismatches:
            out.print(f"[red]mismatch[/] {escape(str(m))}")
        if mismatches:
            out.print(f"{plural(len(mismatches), 'mismatch', 'mismatches')} in "
                      f"{plural(total, 'resource')}")
        else:
            out.print(f"{plural(total, 'resource')} verified: every journal replays to its "
                      "resource")
    if mismatches:
        sys.exit(1)


