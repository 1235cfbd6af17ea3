"""The ``lifecycle`` command."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .engine import Engine
from .errors import LifecycleError, UnknownMachine
from .machines import builtins
from .outbox import effect_records, outbox_counts, retry_failed, timer_records
from .records import FireResult, JournalEntry
from .spec import MachineSpec, load_spec
from .store import Store, migrate
from .worker import Worker

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Group(click.Group):
    """Errors lifecycle raises on purpose are one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LifecycleError as exc:
            err.print(f"[bold red]error:[/] {_escape(str(exc))}")
            sys.exit(1)


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def db_option(f: F) -> F:
    return click.option(
        "--db", "db_url", metavar="URL",
        help="Database URL, or a SQLite file path. Default: $LIFECYCLE_DATABASE_URL, "
             "else ./lifecycle.db",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def _json_arg(value: str | None, option: str) -> dict[str, Any]:
    if value is None:
        return {}
    def refuse(constant: str) -> Any:
        raise click.BadParameter(f"not JSON: {constant} is not a JSON number",
                                 param_hint=option)

    try:
        parsed = json.loads(value, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg} at line {exc.lineno} column "
                                 f"{exc.colno}", param_hint=option) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"must be a JSON object, not {type(parsed).__name__}",
                                 param_hint=option)
    return parsed


def _store(db_url: str | None, *, upgrade: bool = False) -> Store:
    return Store(db_url, upgrade=upgrade)


def _engine(db_url: str | None, *, upgrade: bool = False) -> Engine:
    """An engine with every built-in machine's guards and handlers; the built-in specs are
    registered as they are used, machines from files as the database stored them."""
    guards: dict[str, Any] = {}
    effects: dict[str, Any] = {}
    probes: dict[str, Any] = {}
    for provider in [*builtins().values(), *_plugins()]:
        guards.update(getattr(provider, "guards", None) or {})
        effects.update(getattr(provider, "effects", None) or {})
        probes.update(getattr(provider, "probes", None) or {})
        if hasattr(provider, "drone_site"):  # a site and a pool for the built-in drones
            from .machines import drone

            site, batch = provider.drone_site, provider.drone_batch_system
            effects.update(drone.effects(site, batch))
            probes["site"] = drone.probe(site, batch)
    return Engine(_store(db_url, upgrade=upgrade), guards=guards, effects=effects,
                  probes=probes, spec_for=_builtin_spec)


PLUGINS_VARIABLE = "LIFECYCLE_PLUGINS"


def _plugins() -> list[Any]:
    """Modules named in $LIFECYCLE_PLUGINS (comma-separated): each may define ``guards``,
    ``effects`` and ``probes`` dicts, for machines declared in spec files."""
    import importlib
    import os

    names = [n.strip() for n in os.environ.get(PLUGINS_VARIABLE, "").split(",") if n.strip()]
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise LifecycleError(f"{PLUGINS_VARIABLE}: cannot import {name!r}: {exc}") from None
    return modules


def _builtin_spec(machine: str) -> MachineSpec | None:
    """A built-in machine runs with the code's spec, not the copy stored in the database."""
    builtin = builtins().get(machine)
    return builtin.spec if builtin is not None else None


def _machine(engine: Engine, name_or_path: str) -> MachineSpec:
    """A built-in name, a spec file (registered), or a machine the database knows."""
    if name_or_path in builtins():
        return engine.register(builtins()[name_or_path].spec)
    path = Path(name_or_path)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        return engine.register(load_spec(path))
    try:
        return engine.spec(name_or_path)
    except UnknownMachine:
        raise UnknownMachine(name_or_path, [*builtins(), *engine.machine_names()]) from None


# -- commands ------------------------------------------------------------------------------


@click.group(cls=_Group)
@click.version_option(package_name="lifecycle-fsm")
def main() -> None:
    """Explicit, persisted state machines of computing resources."""


@main.command()
@db_option
@json_option
def machines(db_url: str | None, as_json: bool) -> None:
    """List the built-in machines and those the database knows."""
    engine = _engine(db_url)
    counts = engine.counts()
    known = builtins()
    names = sorted({*known, *engine.machine_names()})
    rows = []
    for name in names:
        spec = known[name].spec if name in known else engine.spec(name)
        rows.append({
            "name": name, "kind": "built-in" if name in known else "stored",
            "spec_version": spec.version, "resources": sum(counts.get(name, {}).values()),
            "summary": known[name].summary if name in known else (spec.description or ""),
        })
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("machine", "kind", "spec version", "resources", "about")
    for r in rows:
        table.add_row(*(str(r[k]) for k in ("name", "kind", "spec_version", "resources",
                                             "summary")))
    out.print(table)


@main.command()
@click.argument("machine")
@db_option
@json_option
def describe(machine: str, db_url: str | None, as_json: bool) -> None:
    """Show a machine's states and transitions. MACHINE is a built-in name, a spec file
    (checked without a database when no --db is needed), or a stored machine."""
    if machine not in builtins() and Path(machine).suffix.lower() in (".yaml", ".yml", ".json"):
        spec = load_spec(machine)  # a file is described without touching a database
    elif machine in builtins():
        spec = builtins()[machine].spec
    else:
        spec = _machine(_engine(db_url), machine)
    doc = describe_json(spec)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    out.print(f"[bold]{spec.name}[/] (spec version {spec.version})")
    if spec.description:
        out.print(spec.description)
    states = Table("state", "parent", "final", title="states", title_justify="left")
    for s in doc["states"]:
        initial = " (initial)" if s["name"] == spec.graph.enter(spec.initial) else ""
        states.add_row(s["name"] + initial, s["parent"] or "", "yes" if s["final"] else "")
    out.print(states)
    columns = ["trigger", "source", "dest", "guards", "effects", "fresh", "about"]
    rows = []
    for t in doc["transitions"]:
        fresh = t["fresh"]
        rows.append([
            t["trigger"] or "(eventless)", ", ".join(t["source"]), t["dest"],
            ", ".join([*t["guards"], *(f"not {u}" for u in t["unless"])]),
            ", ".join(t["effects"]),
            (f"{fresh['max_age']:g} s" + (f", probe {fresh['probe']}" if fresh["probe"] else ""))
            if fresh else "",
            _escape(t["description"] or ""),
        ])
    used = [i for i, name in enumerate(columns) if i < 3 or any(row[i] for row in rows)]
    table = Table(*(columns[i] for i in used), title="transitions", title_justify="left")
    for row in rows:
        table.add_row(*(row[i] for i in used))
    out.print(table)


def describe_json(spec: MachineSpec) -> dict[str, Any]:
    graph = spec.graph
    edges: list[tuple[str | None, Any]] = [(t.trigger, t) for t in spec.transitions]
    edges += [(None, e) for e in spec.eventless]
    return {
        "name": spec.name,
        "version": spec.version,
        "initial": spec.initial,
        "states": [
            {"name": n, "parent": graph.parent[n],
             "final": graph.is_leaf(n) and graph.is_final(n, spec.final)}
            for n in graph.names
        ],
        "transitions": [
            {"trigger": trigger, "source": list(e.sources), "dest": e.dest,
             "guards": list(e.guards), "unless": list(e.unless),
             "effects": [f.name for f in e.effects],
             "fresh": e.fresh.model_dump() if e.fresh else None, "ref": e.ref,
             "description": e.description}
            for trigger, e in edges
        ],
    }


@main.command()
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
    document = _json_arg(data, "--data")
    engine = _engine(db_url)
    spec = _machine(engine, machine)
    resource = engine.create(spec.name, key, document, state=state, actor=actor)
    if as_json:
        print(json.dumps(resource.to_json(), indent=2))
    else:
        out.print(f"created {resource.machine}:{resource.key} in [bold]{resource.state}[/] "
                  f"(version {resource.version})")


@main.command()
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
    document = _json_arg(payload, "--payload")
    result = _engine(db_url).fire(key, trigger, document, actor=actor, on_stale="return")
    _print_result(result, as_json)


@main.command()
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
    document = _json_arg(status, "STATUS")
    when = None
    if observed_at is not None:
        try:
            when = dt.datetime.fromisoformat(observed_at.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(f"not an ISO 8601 time: {observed_at!r}",
                                     param_hint="--at") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
    observation = _engine(db_url).observe(key, document, when, source=source)
    if as_json:
        print(json.dumps(observation.to_json(), indent=2))
    else:
        out.print(f"{key}: observed {_escape(json.dumps(observation.status, sort_keys=True))} "
                  f"at {_time(observation.observed_at)} (observation {observation.id})")


@main.command()
@click.argument("key")
@click.option("--actor", help="Who did it, for the journal.")
@db_option
@json_option
def step(key: str, actor: str | None, db_url: str | None, as_json: bool) -> None:
    """Take the first eventless transition of KEY whose guards hold. Exits 3 when none did."""
    _print_result(_engine(db_url).step(key, actor=actor, on_stale="return"), as_json)


def _print_result(result: FireResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    elif result.fired:
        out.print(f"{result.machine}:{result.key}: {result.trigger}: {result.source} -> "
                  f"[bold]{result.dest}[/] (version {result.version})")
    else:
        why = f"{result.error}: {result.reason}" if result.error else (result.reason or "")
        out.print(f"{result.machine}:{result.key}: [yellow]not fired[/]: {_escape(why)}")
    if not result.fired:
        sys.exit(3)


@main.command()
@click.argument("key")
@db_option
@json_option
def show(key: str, db_url: str | None, as_json: bool) -> None:
    """Show resource KEY: its state, version, data and the triggers it can take."""
    engine = _engine(db_url)
    resource = engine.get(key)
    full_key = f"{resource.machine}:{resource.key}"
    triggers = engine.available_triggers(full_key)
    pending_timers = timer_records(engine, full_key, statuses=("pending",))
    open_effects = effect_records(engine, full_key, statuses=("pending", "running", "failed"))
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
    table.add_row("created", _time(resource.created_at))
    table.add_row("updated", _time(resource.updated_at))
    table.add_row("triggers", ", ".join(triggers) or "none")
    table.add_row("data", _escape(json.dumps(resource.data, sort_keys=True)))
    if resource.observation is not None:
        seen = resource.observation
        table.add_row("observed", _escape(
            f"{json.dumps(seen.status, sort_keys=True)} at {_time(seen.observed_at)} by "
            f"{seen.source} (#{seen.id})"))
    for timer in pending_timers:
        table.add_row("timer", f"{timer.trigger} at {_time(timer.due_at)} (set on entering "
                               f"{timer.state})")
    for effect in open_effects:
        line = f"{effect.name} {effect.status}, attempt {effect.attempts}"
        if effect.status == "pending":
            line += f", due {_time(effect.next_attempt_at)}"
        if effect.last_error:
            line += f": {effect.last_error}"
        table.add_row("[red]stuck[/]" if effect.status == "failed" else "effect", _escape(line))
    out.print(table)


@main.command("list")
@click.argument("machine", required=False)
@click.option("--state", help="Only resources in this state.")
@db_option
@json_option
def list_(machine: str | None, state: str | None, db_url: str | None, as_json: bool) -> None:
    """List resources, of one MACHINE or of all."""
    items = _engine(db_url).resources(machine, state)
    if as_json:
        print(json.dumps([r.to_json() for r in items], indent=2))
        return
    table = Table("resource", "state", "version", "updated")
    for r in items:
        table.add_row(f"{r.machine}:{r.key}", r.state, str(r.version), _time(r.updated_at))
    out.print(table)
    out.print(f"{len(items)} resources")


@main.command()
@click.argument("key")
@db_option
@json_option
def history(key: str, db_url: str | None, as_json: bool) -> None:
    """Show the journal of resource KEY, oldest first."""
    engine = _engine(db_url)
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
                           f"{_time(e.observation.observed_at, one_day)} by "
                           f"{e.observation.source}")
        moved = f"{e.source} -> {e.dest}" if e.source and e.source != e.dest else e.dest
        table.add_row(str(e.seq), _time(e.at, one_day), _what(e), moved,
                      _escape("; ".join(details)))
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


def _time(value: Any, clock_only: bool = False) -> str:
    if clock_only:
        return str(value.strftime("%H:%M:%S.%f")[:-3])
    return str(value.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


@main.command()
@db_option
@json_option
def verify(db_url: str | None, as_json: bool) -> None:
    """Replay every resource's journal; exit 1 if any does not end where its resource is."""
    engine = _engine(db_url)
    mismatches = engine.verify()
    total = sum(sum(c.values()) for c in engine.counts().values())
    if as_json:
        print(json.dumps({"resources": total, "mismatches": [
            {"machine": m.machine, "key": m.key, "problem": m.problem} for m in mismatches]},
            indent=2))
    else:
        for m in mismatches:
            out.print(f"[red]mismatch[/] {_escape(str(m))}")
        if mismatches:
            out.print(f"{len(mismatches)} mismatches in {total} resources")
        else:
            out.print(f"{total} resources verified: every journal replays to its resource")
    if mismatches:
        sys.exit(1)


# -- scenarios -----------------------------------------------------------------------------


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=True))
@json_option
def replay(files: tuple[str, ...], as_json: bool) -> None:
    """Replay scenario FILES (or every *.yaml/*.yml/*.json in a directory), each on a fresh
    database with a simulated clock; exit 1 at the first failing expectation of any."""
    from .scenario import replay as replay_one

    paths: list[Path] = []
    for name in files:
        path = Path(name)
        if path.is_dir():
            paths += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
        else:
            paths.append(path)
    results = [replay_one(path, builtins()) for path in paths]
    failed = [r for r in results if not r.passed]
    if as_json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for result in failed:
            out.print(f"[red]FAILED[/] {_escape(result.file)}: {_escape(str(result.failure))}")
        steps = sum(r.steps for r in results)
        verdict = "all passed" if not failed else f"{len(failed)} failed"
        out.print(f"{len(results)} scenarios, {steps} steps, {verdict}")
    if failed:
        sys.exit(1)


# -- drones --------------------------------------------------------------------------------


@main.command()
@click.argument("machine", default="drone", type=click.Choice(["drone", "drone_tardis"]))
@click.option("--every", type=click.FloatRange(min=1), metavar="SECONDS",
              help="Repeat every SECONDS (the heartbeat) until SIGTERM or Ctrl-C; without it, "
                   "one round.")
@db_option
@json_option
def reconcile(machine: str, every: float | None, db_url: str | None, as_json: bool) -> None:
    """Run a drone pool's heartbeat: the site's and the pool's status of every live drone in
    one call each, recorded as observations, then one step of every drone. The site and the
    pool come from a LIFECYCLE_PLUGINS module defining `drone_site` and
    `drone_batch_system`."""
    import signal as signals
    import time as timing

    from .machines import drone

    provided = [p for p in _plugins() if hasattr(p, "drone_site")]
    if not provided:
        raise LifecycleError(
            "no drone site is configured: name a module in LIFECYCLE_PLUGINS that defines "
            "`drone_site` and `drone_batch_system` (for example "
            "lifecycle.adapters.slurm.SlurmSite(...))")
    site = provided[0].drone_site
    batch = provided[0].drone_batch_system
    engine = _engine(db_url)
    engine.register(drone.drone_spec(race_guard=machine == "drone"))
    stop = []
    if every is not None:
        signals.signal(signals.SIGTERM, lambda *_: stop.append(True))
    from rich.progress import Progress as Bar

    worker = Worker(engine)
    while True:
        worker.run_until_idle()  # effects of the last round (a deploy) before the statuses
        with Bar(console=err, transient=True) as bar:
            task = bar.add_task("stepping drones", total=None)
            def advance(done: int, total: int, task: Any = task) -> None:
                bar.update(task, completed=done, total=total)

            report = drone.reconcile(engine, site, batch, machine=machine, progress=advance)
        worker.run_until_idle()
        if as_json:
            print(json.dumps(report), flush=True)
        elif report["site_error"]:
            out.print(f"[yellow]site unreachable[/]: {_escape(report['site_error'])}; "
                      f"{report['drones']} drones keep their state")
        else:
            moved = ", ".join(f"{n} {m}" for m, n in sorted(report["moved"].items()))
            out.print(f"{report['drones']} drones: {moved or 'none moved'}"
                      + (f"; {report['refused']} risky edges refused" if report["refused"]
                         else ""))
        if every is None or stop:
            return
        try:
            deadline = timing.monotonic() + every
            while timing.monotonic() < deadline and not stop:
                timing.sleep(min(0.2, every))
        except KeyboardInterrupt:
            return
        if stop:
            return


# -- simulations ---------------------------------------------------------------------------


@main.command()
@click.argument("name", required=False)
@click.option("--seed", default=1, show_default=True, help="The random seed: the same seed "
              "gives the same result.")
@click.option("--set", "settings", multiple=True, metavar="OPTION=VALUE",
              help="An option of the simulation (see the list without NAME).")
@click.option("--timing", is_flag=True, help="With --json, include the wall-clock timing "
              "(which differs between runs).")
@json_option
def simulate(name: str | None, seed: int, settings: tuple[str, ...], timing: bool,
             as_json: bool) -> None:
    """Run simulation NAME: the incident's race as it happened and with lifecycle's
    machine, on temporary databases. Without NAME, list the simulations and their options."""
    from .sim import simulations

    known = simulations()
    if name is None:
        for simulation in known.values():
            out.print(f"[bold]{simulation.name}[/]: {simulation.summary}")
            for option, (kind, default, help_text) in simulation.options.items():
                out.print(f"  --set {option}={default}  ({kind.__name__}) {help_text}")
        return
    if name not in known:
        raise LifecycleError(f"unknown simulation {name!r}; known: {', '.join(known)}")
    simulation = known[name]
    options: dict[str, Any] = {}
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or key not in simulation.options:
            raise click.BadParameter(f"{setting!r}: options of {name} are "
                                     f"{', '.join(simulation.options)}", param_hint="--set")
        kind = simulation.options[key][0]
        try:
            options[key] = (raw.lower() in ("1", "true", "yes")) if kind is bool else kind(raw)
        except ValueError:
            raise click.BadParameter(f"{setting!r}: {key} takes a {kind.__name__}",
                                     param_hint="--set") from None
    from rich.progress import Progress as Bar

    with Bar(console=err, transient=True) as bar:
        task = bar.add_task(name, total=1.0)
        report = simulation.run(seed=seed, progress=lambda done, total: bar.update(
            task, completed=done / total if total else 1.0), **options)
    if as_json:
        if not timing:
            report = {k: v for k, v in report.items() if k != "timing"}
        print(json.dumps({k: v for k, v in report.items() if k != "hints"}, indent=2))
        return
    table = Table("what was measured", "before", "after",
                  title=f"{name}, seed {seed}", title_justify="left")
    for measure in report["measures"]:
        table.add_row(measure["what"], str(measure["before"]), str(measure["after"]))
    out.print(table)
    if "timing" in report:
        speed = report["timing"]
        out.print(f"simulated in {speed['seconds']} s"
                  + (f", {speed['drone_hours_per_second']} drone-hours per second"
                     if "drone_hours_per_second" in speed else ""))


# -- effects -------------------------------------------------------------------------------


@main.command()
@click.option("--until-idle", is_flag=True,
              help="Stop when nothing is due, instead of waiting for more work.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Handlers running at once.")
@click.option("--lease", default=300.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a claim holds before another worker may take the effect over.")
@click.option("--poll", default=0.5, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between looks for new work when idle.")
@db_option
@json_option
def worker(until_idle: bool, concurrency: int, lease: float, poll: float, db_url: str | None,
           as_json: bool) -> None:
    """Carry out the effects of committed transitions, and fire due timers. SIGTERM stops
    it gracefully (running handlers finish); a second SIGTERM or SIGQUIT stops it at once,
    giving the running effects back."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    engine = _engine(db_url)
    for name, builtin in builtins().items():
        spec = builtin.spec
        missing = sorted((spec.effect_names() - set(engine.handlers))
                         | (spec.probe_names() - set(engine.probes)))
        if missing:  # a machine whose adapters this process does not have (e.g. a site)
            logging.getLogger(__name__).info(
                "not serving %s: no %s here (LIFECYCLE_PLUGINS)", name, ", ".join(missing))
            continue
        engine.register(spec)
    runner = Worker(engine, concurrency=concurrency, lease=lease, poll=poll)
    stats = runner.run_until_idle() if until_idle else runner.run(handle_signals=True)
    left = outbox_counts(engine)
    if as_json:
        print(json.dumps({**stats.to_json(), "outbox": left}, indent=2))
    else:
        out.print(f"effects: {stats.done} done, {stats.retried} to retry, {stats.failed} "
                  f"failed for good; timers: {stats.timers_fired} fired, "
                  f"{stats.timers_refused} refused")
        waiting = {k: v for k, v in left.items() if k in ("pending", "running", "failed")}
        if waiting:
            out.print("outbox: " + ", ".join(f"{v} {k}" for k, v in sorted(waiting.items())))


@main.command()
@db_option
@json_option
def stuck(db_url: str | None, as_json: bool) -> None:
    """List the resources whose effects failed for good; `lifecycle retry KEY` resumes one."""
    failed = effect_records(_engine(db_url), statuses=("failed",))
    if as_json:
        print(json.dumps([e.to_json() for e in failed], indent=2))
        return
    table = Table("resource", "effect", "attempts", "last error")
    for e in failed:
        table.add_row(f"{e.machine}:{e.key}", e.name, str(e.attempts), _escape(e.last_error or ""))
    out.print(table)
    out.print(f"{len(failed)} failed effects")


@main.command()
@click.argument("key")
@db_option
def retry(key: str, db_url: str | None) -> None:
    """Put KEY's failed effects back in the queue, due now, with fresh attempts."""
    count = retry_failed(_engine(db_url), key)
    out.print(f"{key}: {count} failed effects queued again" if count else
              f"{key}: no failed effects")


# -- database ------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Create and migrate the database schema (Alembic)."""


@db.command()
@click.argument("revision", default="head")
@db_option
def upgrade(revision: str, db_url: str | None) -> None:
    """Upgrade the schema to REVISION (default: the newest)."""
    store = Store(db_url, check=False)
    before = store.current_revision()
    store.upgrade(revision)
    after = store.current_revision()
    if before == after:
        out.print(f"{store.display_url}: already at {after}")
    else:
        out.print(f"{store.display_url}: {before or 'empty'} -> {after}")


@db.command()
@click.argument("revision")
@db_option
def downgrade(revision: str, db_url: str | None) -> None:
    """Downgrade the schema to REVISION ('base' drops every lifecycle table)."""
    store = Store(db_url, check=False)
    before = store.current_revision()
    store.downgrade(revision)
    out.print(f"{store.display_url}: {before or 'empty'} -> {store.current_revision() or 'empty'}")


@db.command()
@db_option
def current(db_url: str | None) -> None:
    """Print the schema revision of the database, and whether it is the newest."""
    store = Store(db_url, check=False)
    revision = store.current_revision()
    head = migrate.head_revision()
    state = "up to date" if revision == head else f"behind {head}: run `lifecycle db upgrade`"
    out.print(f"{store.display_url}: {revision or 'empty'} ({state})")
    if revision != head:
        sys.exit(1)


@db.command("history")
def db_history() -> None:
    """List the schema revisions, oldest first."""
    for revision, down, message in migrate.revisions():
        out.print(f"{down or 'base'} -> {revision}: {message.splitlines()[0] if message else ''}")


@main.command()
@db_option
def demo(db_url: str | None) -> None:
    """Run the tutorial machine on the embedded database and show what was recorded."""
    from .demo import run_demo

    run_demo(_engine(db_url, upgrade=True), out)


from .diagram_cli import diagram, diagrams  # noqa: E402

main.add_command(diagram)
main.add_command(diagrams)


from .adapters.queue_cli import queue  # noqa: E402

main.add_command(queue)
