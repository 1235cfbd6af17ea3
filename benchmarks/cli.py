"""``python -m benchmarks``: run the cases, print one table of results side by side."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import (
    aio,
    backlog,
    check,
    dashboard,
    effects,
    fleet,
    heartbeat,
    in_memory,
    network,
    persisted,
    postgres,
    queues,
    simulations,
    sqlite_instructions,
    startup,
    vs_django,
    vs_sqlalchemy,
)
from .harness import Case, Measurement, Settings, Workspace, run_group, warm_up

GROUPS: dict[str, list[Case]] = {
    "sqlite": [persisted.SQLITE_FLOOR, persisted.SQLITE_LIFECYCLE,
               persisted.SQLITE_LIFECYCLE_GUARD, persisted.SQLITE_LIFECYCLE_NESTED,
               vs_django.DJANGO, vs_sqlalchemy.SQLALCHEMY_FSM],
    "pg": [persisted.PG_FLOOR, persisted.PG_LIFECYCLE, persisted.PG_LIFECYCLE_GUARD],
    "memory": [in_memory.DECIDE, in_memory.DECIDE_NESTED, in_memory.HIERARCHICAL,
               in_memory.TRANSITIONS, in_memory.STATEMACHINE],
    "effects": effects.CASES,
    "backlog": [*backlog.CASES["sqlite"], *backlog.CASES["postgresql"]],
    "fleet": [*fleet.CASES["sqlite"], *fleet.CASES["postgresql"]],
    "startup": startup.CASES,
    "aio": aio.CASES,
    "drones": aio.DRONES_GROUP,
    "heartbeat": heartbeat.CASES,
    "simulations": simulations.CASES,
    "dashboard": [*dashboard.CASES["sqlite"], *dashboard.CASES["postgresql"]],
    "check": check.CASES,
    "queues": queues.CASES,
    "network": network.CASES,
}
CASES: dict[str, Case] = {case.id: case for cases in GROUPS.values() for case in cases}


@dataclass(frozen=True, slots=True)
class Goal:
    limit: float
    strict: bool = False  # "<" instead of "<="
    unit: str = "x"
    """``x``: a ratio to the reference; ``ms``: the subject's own milliseconds per operation
    (a reference, if any, is shown beside it)."""

    def met(self, ratio: float) -> bool:
        return ratio < self.limit if self.strict else ratio <= self.limit

    def __str__(self) -> str:
        return f"{'<' if self.strict else '≤'} {self.limit:g}{' ms' if self.unit == 'ms' else 'x'}"


@dataclass(frozen=True, slots=True)
class Comparison:
    subject: str
    reference: str | None
    """None: the subject is held to a goal in milliseconds of its own."""
    goal: Goal | None
    """None: no goal set, the ratio is reported only."""
    cpu: bool = False
    """The ratio of this process's CPU time (without the database server's), not wall time."""


def _fleet_section(db: str, title: str) -> tuple[str, list[Comparison]]:
    f = f"fleet.{db}"
    rows = [Comparison(f"{f}.fire", f"{f}.floor_fire", Goal(1.5)),
            Comparison(f"{f}.get", f"{f}.floor_get", None)]
    if db == "postgresql":
        rows += [Comparison(f"{f}.fire", f"{f}.floor_fire", None, cpu=True),
                 Comparison(f"{f}.get", f"{f}.floor_get", None, cpu=True)]
    rows += [Comparison(f"{f}.list", None, Goal(50, unit="ms")),
             Comparison(f"{f}.list_after", None, Goal(50, unit="ms")),
             Comparison(f"{f}.counts", None, Goal(5, unit="ms"))]
    return (f"6 · a fleet: {title}, {fleet.RESOURCES:,} resources (--quick "
            f"{fleet.QUICK_RESOURCES:,}), {fleet.DEPTH} journal rows each", rows)


SECTIONS: list[tuple[str, list[Comparison]]] = [
    ("1 · vs the floor: SQLite file", [
        Comparison("sqlite.lifecycle", "sqlite.floor", Goal(3)),
        Comparison("sqlite.lifecycle_guard", "sqlite.floor", Goal(3)),
        Comparison("sqlite.lifecycle_nested", "sqlite.floor", Goal(3)),
        Comparison("sqlite.lifecycle_nested", "sqlite.lifecycle_guard", Goal(1.5)),
    ]),
    ("1 · vs the floor: PostgreSQL", [
        Comparison("pg.lifecycle", "pg.floor", Goal(1.5)),
        Comparison("pg.lifecycle_guard", "pg.floor", Goal(1.5)),
    ]),
    ("2 · vs alternatives: SQLite file", [
        Comparison("sqlite.lifecycle", "sqlite.django_fsm", Goal(1, strict=True)),
        Comparison("sqlite.lifecycle", "sqlite.sqlalchemy_fsm", Goal(1, strict=True)),
    ]),
    ("3 · in memory, no database", [
        Comparison("memory.lifecycle", "memory.transitions", Goal(2)),
        Comparison("memory.lifecycle", "memory.statemachine", Goal(1, strict=True)),
        Comparison("memory.lifecycle_nested", "memory.lifecycle", Goal(1.5)),
        Comparison("memory.lifecycle_nested", "memory.hierarchical", Goal(1, strict=True)),
    ]),
    ("4 · effects drained from the outbox: PostgreSQL, µs per effect", [
        Comparison(f"effects.lifecycle.{n}p", f"effects.floor.{n}p", None)
        for n in effects.PROCESSES
    ]),
    *[(f"5 · the claim as the backlog grows: {title}, µs per claim of {backlog.BATCH}", [
        *[Comparison(f"backlog.{db}.{who}.{size}", f"backlog.{db}.{who}.{backlog.SIZES[0]}",
                     Goal(1.2) if who == "lifecycle" else None)
          for who in ("lifecycle", "before") for size in backlog.SIZES[1:]],
        Comparison(f"backlog.{db}.lifecycle.{backlog.SIZES[-1]}",
                   f"backlog.{db}.before.{backlog.SIZES[-1]}", Goal(1)),
    ]) for db, title in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))],
    *[(f"5 · the worker per effect as the backlog grows: {title}, µs per effect "
       "(claimed, done, the head passed on, and a transition asking for the next)", [
        Comparison(f"backlog.{db}.effect.{size}", f"backlog.{db}.effect.{backlog.SIZES[0]}",
                   Goal(1.2)) for size in backlog.SIZES[1:]
    ]) for db, title in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))],
    _fleet_section("sqlite", "SQLite file"),
    _fleet_section("postgresql", "PostgreSQL"),
    ("7 · the command line's start-up, against python -c pass", [
        Comparison("startup.help", "startup.pass", None),
        Comparison("startup.show", "startup.pass", None),
        Comparison("startup.show", "startup.floor", None),
        Comparison("startup.show", None, Goal(150, strict=True, unit="ms")),
    ]),
    *[(f"8 · AsyncEngine.fire against Engine.fire: {title}", [
        Comparison(f"aio.{db}.inline", f"aio.{db}.sync", Goal(1.2)),
        Comparison(f"aio.{db}.threads", f"aio.{db}.sync", None),
    ]) for db, title in (("sqlite", "SQLite file"), ("pg", "PostgreSQL"))],
    ("9 · N drones whose risky edge awaits a slow probe (SQLite): wall time", [
        Comparison("aio.drones.async", "aio.drones.one", Goal(1.5)),
        Comparison("aio.drones.sync", "aio.drones.one", None),
        Comparison("aio.drones.async", "aio.drones.sync", None),
        Comparison("aio.drones.async", "aio.drones.instant", None),
    ]),
    *[(f"10 · the dashboard, {title}: µs per request with {dashboard.LARGE:,} resources and "
       f"{dashboard.LARGE * dashboard.JOURNAL_ROWS:,} journal rows, vs {dashboard.SMALL:,}", [
        Comparison(f"dashboard.{db}.{page}.{dashboard.LARGE}",
                   f"dashboard.{db}.{page}.{dashboard.SMALL}", Goal(budget, unit="ms"))
        for page, (_label, _path, budget) in dashboard.PAGES.items()
    ]) for db, title in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))],
    (f"11 · a drone pool's heartbeat on PostgreSQL, µs per heartbeat (goal: 100,000 drones "
     f"within {heartbeat.GOAL_SECONDS:g} s)", [
        *[Comparison(f"heartbeat.lifecycle.{size}", f"heartbeat.floor.{size}", None, cpu=cpu)
          for size in heartbeat.SIZES for cpu in (False, True)],
        *[Comparison(heartbeat.case_id("lifecycle", size, 1.0),
                     heartbeat.case_id("floor", size, 1.0), None) for size in heartbeat.SIZES],
        Comparison(f"heartbeat.lifecycle.{heartbeat.SIZES[-1]}", None,
                   Goal(heartbeat.GOAL_SECONDS * 1000, unit="ms")),
    ]),
    (f"12 · a simulation as it grows (drone-race): {simulations.GROWTH}x the simulated hours, "
     f"{simulations.GROWTH}x the drones; this process's CPU time per simulated drone-hour "
     "(linear: about 1x)", [
        Comparison(f"sim.drone_race.{grown}", "sim.drone_race.base", Goal(1.1), cpu=True)
        for grown in ("hours", "drones")
    ]),
    ("13 · lifecycle check: exploring each built-in's world, ms per state explored (states "
     "per second: 1000 / ms)", [
        Comparison("check.drone", None, Goal(2, unit="ms")),
        Comparison("check.drone_tardis", None, None),
        *(Comparison(f"check.{name}", None, None) for name in check.OTHERS),
    ]),
    ("14 · draining no-op jobs against pgqueuer and procrastinate, PostgreSQL: µs per job", [
        Comparison(f"queues.lifecycle.{n}p", f"queues.{other}.{n}p", None, cpu=cpu)
        for n in queues.PROCESSES for other in ("pgqueuer", "procrastinate")
        for cpu in (False, True)
    ]),
    ("15 · PostgreSQL across a network: a proxy holds each message to the server 0.25 or 1 ms "
     "(µs per operation; observe_many: per batch)", [
        *[Comparison(network.case_id("fire", d), network.case_id("floor", d),
                     Goal(network.GOAL_1MS) if d == 1 else None)
          for d in network.DELAYS_MS],
        Comparison(network.case_id("fire", 0), network.case_id("floor", 0), None, cpu=True),
        *[Comparison(network.case_id(kind, d), network.case_id(kind, 0) if d else None, None)
          for kind in ("create", "observe", "observe_many") for d in network.DELAYS_MS],
    ]),
]

PACKAGES = ["lifecycle-fsm", "transitions", "SQLAlchemy", "psycopg", "django", "django-fsm-2",
            "django-fsm-log", "sqlalchemy-fsm", "python-statemachine", "pgqueuer",
            "procrastinate"]


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="lifecycle side by side with the raw drivers and the libraries a user "
        "would pick instead, measured in one run on this machine.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of a few seconds (numbers are rough)")
    parser.add_argument("--json", action="store_true",
                        help="print machine-readable results instead of the table")
    parser.add_argument("--rounds", type=int, help="rounds per case (default 7, quick 2; "
                        f"the effects group starts no new round after {effects.BUDGET:g} s "
                        f"once it ran {effects.MIN_ROUNDS}, quick "
                        f"{effects.QUICK_ROUNDS}, unless --rounds is given)")
    parser.add_argument("--seconds", type=float,
                        help="target seconds per case and round (default 0.6, quick 0.04)")
    parser.add_argument("--ops", type=int,
                        help="a fixed number of operations per round instead of calibrating")
    parser.add_argument("--effects", type=int, metavar="N",
                        help=f"effects the effects group drains per round, ten per resource "
                        f"(default {effects.COUNT:,}, quick {effects.QUICK_COUNT}); jobs the "
                        f"queues group drains (default {queues.COUNT:,}, quick "
                        f"{queues.QUICK_COUNT})")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated groups or case ids: " + ", ".join(
                            [*GROUPS, *CASES]))
    parser.add_argument("--postgres-url", default=postgres.DEFAULT_URL,
                        help="PostgreSQL server (default $LIFECYCLE_TEST_POSTGRES_URL or "
                        "%(default)s); each case uses a schema of its own, dropped afterwards")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL rows")
    parser.add_argument("--profile", nargs="?", const="sqlite.lifecycle", metavar="CASE",
                        help="instead of the table, a cProfile breakdown of one case "
                        "(default %(const)s)")
    parser.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall",
                        help="what --profile measures: wall-clock time, waits for the "
                        "database included (default), or this process's CPU time")
    parser.add_argument("--no-instructions", action="store_true",
                        help="with the sqlite group, skip counting a fire's instructions "
                        "under valgrind's callgrind (lifecycle against raw sqlite3)")
    parser.add_argument("--top", type=int, default=25,
                        help="functions listed per ordering with --profile (default 25)")
    args = parser.parse_args(argv)
    if args.profile is not None and args.profile not in CASES:
        parser.error(f"--profile: unknown case {args.profile!r}; cases: {', '.join(CASES)}")
    if args.effects is not None and (args.effects < 10 or args.effects % 10):
        parser.error("--effects: a positive multiple of 10 (ten effects per resource)")
    if args.only:
        unknown = [n for n in args.only.split(",") if n and n not in GROUPS and n not in CASES]
        if unknown:
            parser.error(f"--only: unknown {', '.join(unknown)}; groups: {', '.join(GROUPS)}; "
                         f"cases: {', '.join(CASES)}")
    return args


def _settings(args: argparse.Namespace) -> Settings:
    base = Settings.quick() if args.quick else Settings()
    return Settings(
        rounds=args.rounds or base.rounds,
        round_seconds=args.seconds or base.round_seconds,
        warmup_seconds=base.warmup_seconds,
        min_warmup_ops=base.min_warmup_ops,
        ops=args.ops,
    )


def _selected(args: argparse.Namespace) -> dict[str, list[Case]]:
    if not args.only:
        return GROUPS
    names = set(args.only.split(","))
    out = {}
    for group, cases in GROUPS.items():
        chosen = cases if group in names else [c for c in cases if c.id in names]
        if chosen:
            out[group] = chosen
    return out


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    source = _lifecycle_source()
    if source:
        out["lifecycle source"] = source
    return out


def _lifecycle_source() -> str | None:
    """The commit of the lifecycle checkout measured, and whether it has local changes: the
    version number alone does not tell two runs of a development tree apart."""
    import lifecycle

    root = Path(lifecycle.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                capture_output=True, text=True, timeout=5, check=True)
        changes = subprocess.run(["git", "status", "--porcelain", "--", "lifecycle"],
                                 cwd=root, capture_output=True, text=True, timeout=5,
                                 check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = " + uncommitted changes" if changes.stdout.strip() else ""
    return f"{commit.stdout.strip()}{dirty}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    fleet.QUICK[0] = args.quick
    verify_figures: list[dict[str, Any]] = []
    settings = _settings(args)
    err = Console(stderr=True)
    groups = _selected(args)
    if args.profile is not None:
        groups = {"profile": [CASES[args.profile]]}
    needs_postgres = any(c.needs == "postgres" for cases in groups.values() for c in cases)
    skipped: dict[str, str] = {}
    postgres_url: str | None = None
    environment = _versions()
    environment["machine"] = (f"{platform.machine()}, {os.cpu_count()} CPUs, "
                              f"{platform.system()} {platform.release()}, load average "
                              f"{os.getloadavg()[0]:.2f} at start")
    if needs_postgres:
        if args.no_postgres:
            reason = "skipped: --no-postgres"
        else:
            problem = postgres.problem(args.postgres_url)
            reason = f"skipped: PostgreSQL unreachable at {args.postgres_url} ({problem})"
            if problem is None:
                postgres_url = args.postgres_url
                environment["postgresql"] = postgres.server_version(postgres_url)
        if postgres_url is None:
            for cases in groups.values():
                skipped.update({c.id: reason for c in cases if c.needs == "postgres"})

    started = time.perf_counter()
    results: dict[str, Measurement] = {}
    summary: effects.Summary | None = None
    count, resources = effects.sizes(args.quick, args.effects)
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="lifecycle-bench-")))
        workspace = Workspace(directory, postgres_url, stack.enter_context(ExitStack()))
        if args.profile is not None:
            case = CASES[args.profile]
            if case.id in skipped:
                err.print(f"{case.id}: {skipped[case.id]}", style="red", markup=False)
                return 1
            try:
                if case.id in effects.SPECS:
                    with err.status("profiling") as status:
                        profiler, header = effects.profile(
                            case, workspace, count, resources, _profiler(args),
                            lambda message: status.update(message))
                    return _print_profile(profiler, header, args)
                return _profile(case, workspace, settings, args)
            except ImportError as exc:
                err.print(f"{case.id}: {exc.name or exc} is not installed: "
                          "pip install -e '.[bench]'", style="red", markup=False)
                return 1
        with err.status("benchmarking") as status:
            for group, cases in groups.items():
                runnable = [c for c in cases if c.id not in skipped]
                if group == "drones":
                    results.update(aio.run_drones(workspace, args.quick,
                                                  lambda message: status.update(message)))
                    continue
                if group == "queues":
                    results.update(queues.run_group(
                        runnable, workspace, lambda message: status.update(message),
                        quick=args.quick, rounds=args.rounds, count=args.effects))
                    continue
                if group == "effects":
                    measured, summary = effects.run_group(
                        runnable, workspace, settings, lambda message: status.update(message),
                        rounds=args.rounds or (effects.QUICK_ROUNDS if args.quick
                                               else settings.rounds),
                        budget=None if args.rounds or args.quick else effects.BUDGET,
                        count=count, resources=resources)
                    results.update(measured)
                    continue
                results.update(run_group(
                    runnable, workspace,
                    heartbeat.settings(args.rounds, args.quick) if group == "heartbeat"
                    else simulations.settings(args.rounds, args.quick)
                    if group == "simulations"
                    else check.settings(args.rounds, args.quick)
                    if group == "check" else settings,
                    skipped, lambda message: status.update(message)))
            instructions = _instructions(args, groups, lambda message: status.update(message))
            verified = [db for db in ("sqlite", "postgresql") if f"fleet.{db}.fire" in results]
            if verified:
                status.update("verify of each fleet, in a process of its own")
                verify_figures = fleet.verify_figures(workspace, verified)
    elapsed = time.perf_counter() - started

    if args.json:
        print(json.dumps({**_to_json(results, skipped, settings, environment, elapsed,
                                     summary), "verify": verify_figures,
                          "round_trips": network.ROUND_TRIPS,
                          "sqlite_instructions": instructions and {
                              "fires": instructions.fires, "per_fire": instructions.per_fire,
                              "ratio": instructions.ratio}}, indent=2))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=130)
        console.print(_table(results, skipped, settings, environment, elapsed, summary,
                             quick=args.quick))
        if verify_figures:
            console.print(_verify_table(verify_figures))
        if instructions is not None:
            console.print(sqlite_instructions.report(instructions))
    return 0


def _instructions(args: argparse.Namespace, groups: dict[str, list[Case]],
                  progress: Callable[[str], None]) -> sqlite_instructions.Count | None:
    """With the sqlite group: a SQLite fire's instructions, lifecycle's and raw sqlite3's
    (callgrind; the load of the machine does not move them)."""
    if "sqlite" not in groups or args.no_instructions:
        return None
    problem = sqlite_instructions.available()
    if problem is not None:
        Console(stderr=True).print(f"sqlite instructions skipped: {problem}", style="yellow")
        return None
    return sqlite_instructions.count(40 if args.quick else 200, 10 if args.quick else 50,
                                     progress)


VERIFY_SECONDS, VERIFY_MIB = 10.0, 100.0
"""The goals of ``verify`` on a fleet of 1,000,000 journal rows."""


def _verify_table(figures: list[dict[str, Any]]) -> Table:
    table = Table(title="6 · verify of each fleet, once, in a process of its own",
                  title_justify="left", caption_justify="left")
    for name in ("database", "journal rows", "seconds", "peak MiB", "MiB, store opened only",
                 "goal", "met"):
        table.add_column(name, justify="left" if name == "database" else "right")
    for f in figures:
        ok = f["seconds"] < VERIFY_SECONDS and f["peak_mib"] < VERIFY_MIB
        table.add_row(f["database"], f"{f['journal_rows']:,}", f"{f['seconds']:.2f}",
                      f"{f['peak_mib']:.1f}", f"{f['open_only_peak_mib']:.1f}",
                      f"< {VERIFY_SECONDS:g} s, < {VERIFY_MIB:g} MiB",
                      Text("✓", style="green") if ok else Text("✗ missed", style="bold red"))
    table.caption = ("peak MiB: the process's peak resident memory (VmHWM), the interpreter "
                     "and lifecycle included; the goals are for 1,000,000 rows")
    return table


# -- output ---------------------------------------------------------------------------------


def _comparisons(results: dict[str, Measurement], skipped: dict[str, str]
                 ) -> list[tuple[str, Comparison, float | None]]:
    out = []
    for title, comparisons in SECTIONS:
        for c in comparisons:
            if not {c.subject, c.reference} & {*results, *skipped}:
                continue  # not selected with --only
            ratio = None
            if c.reference is None:
                if c.subject in results:
                    ratio = results[c.subject].median / 1000
            elif c.subject in results and c.reference in results:
                subject, reference = results[c.subject], results[c.reference]
                ratio = subject.cpu_ratio_to(reference) if c.cpu else subject.ratio_to(
                    reference)
            out.append((title, c, ratio))
    return out


def _met(c: Comparison, ratio: float | None, results: dict[str, Measurement]) -> bool | None:
    """Whether the goal was met; None when there is no goal or nothing to judge."""
    if c.goal is not None and c.goal.unit == "ms":
        return c.goal.met(results[c.subject].median / 1000) if c.subject in results else None
    if ratio is None or c.goal is None:
        return None
    return c.goal.met(ratio)


def _cell(results: dict[str, Measurement], skipped: dict[str, str], case_id: str) -> Text:
    if case_id in results:
        m = results[case_id]
        return Text.assemble(f"{m.median:,.1f}", (f" ±{m.spread:.0%}", "dim"))
    return Text("skipped" if case_id in skipped else "not run", style="yellow")


def _cpu_cell(results: dict[str, Measurement], case_id: str) -> Text:
    if case_id not in results:
        return Text("not run", style="yellow")
    return Text(f"{statistics.median(results[case_id].cpu_samples_us):,.1f} CPU")


def _table(results: dict[str, Measurement], skipped: dict[str, str], settings: Settings,
           environment: dict[str, str], elapsed: float,
           summary: effects.Summary | None = None, *, quick: bool = False) -> Table:
    table = Table(title="lifecycle benchmarks: µs per operation (median of rounds)",
                  title_justify="left", caption_justify="left")
    table.add_column("lifecycle")
    table.add_column("µs/op", justify="right")
    table.add_column("reference")
    table.add_column("µs/op", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("goal", justify="right")
    table.add_column("met", justify="center")
    section = None
    for title, c, ratio in _comparisons(results, skipped):
        if title != section:
            if section is not None:
                table.add_section()
            table.add_row(Text(title, style="bold"))
            section = title
        shown = "" if ratio is None else (
            f"{ratio:,.1f} ms" if c.reference is None else f"{ratio:.2f}x")
        ok = _met(c, ratio, results)
        judged = c.goal is not None and (c.goal.unit == "x" or c.reference is None)
        ratio_cell = Text("—", style="dim") if ratio is None else Text(
            shown, style=("green" if ok else "red") if judged and ok is not None else "")
        if ok is None:
            met = Text("—", style="dim")
        else:
            met = Text("✓", style="green") if ok else Text("✗ missed", style="bold red")
        table.add_row(
            "  " + CASES[c.subject].label.removeprefix("lifecycle ")
            + (" (client CPU)" if c.cpu else ""),
            _cpu_cell(results, c.subject) if c.cpu else _cell(results, skipped, c.subject),
            Text("its own time", style="dim") if c.reference is None else
            CASES[c.reference].label,
            Text("") if c.reference is None else
            _cpu_cell(results, c.reference) if c.cpu else
            _cell(results, skipped, c.reference),
            ratio_cell, str(c.goal) if c.goal else Text("none", style="dim"), met,
        )
    notes = sorted({reason for reason in skipped.values()})
    noisy = _noisy(results)
    if noisy:
        notes.append(f"Noisy: rounds differed by more than ±{NOISY:.0%} ({', '.join(noisy)}). "
                     "Was the machine busy? Per-round ratios absorb some of it; rerun on a "
                     "quiet machine for firm numbers.")
    whole = ("heartbeat.", "sim.")  # one whole heartbeat or simulation per round
    counts = sorted({m.ops_per_round for m in results.values()
                     if m.case.id not in effects.SPECS and m.case.id not in aio.DRONE_CASES
                     and m.case.id not in queues.SPECS
                     and not m.case.id.startswith(whole)}) or [0]
    span = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,} to {counts[-1]:,}"
    ops = (f"{settings.ops:,} ops per round" if settings.ops else
           f"~{settings.round_seconds:g} s per case and round ({span} ops, calibrated in "
           "warm-up)")
    timed = [m for m in results.values()
             if m.case.id not in effects.SPECS and m.case.id not in queues.SPECS]
    rounds = sorted({len(m.samples_us) for m in timed}) or [settings.rounds]
    rounds_text = "/".join(str(r) for r in rounds)
    if any(m.case.id.startswith(whole) for m in timed):
        ops += "; sections 11 and 12: one heartbeat or simulation per round"
        if counts == [0]:
            ops = "one heartbeat or simulation per round"
    versions = ", ".join(f"{k} {v}" for k, v in environment.items() if k != "machine")
    table.caption = Text("\n".join([
        "ratio = lifecycle / reference, the median of the per-round ratios; "
        + (f"µs/op: median of {rounds_text} interleaved rounds, {ops}; " if timed else "")
        + f"± is half the range of the rounds. Whole run {elapsed:.1f} s.",
        *([_effects_note(summary, results)] if summary and summary.throughput else []),
        *([drones] if (drones := aio.note(results, quick)) else []),
        *([jobs] if (jobs := queues.note(results)) else []),
        *([trips] if (trips := network.note(results)) else []),
        f"{environment['machine']}; {versions}",
        *notes,
    ]))
    return table


NOISY = 0.15


def _effects_note(summary: effects.Summary, results: dict[str, Measurement]) -> str:
    """Section 4 in effects per second, and how it scales with processes."""
    lines = []
    for kind, name in (("lifecycle", "lifecycle Worker"), ("floor", "raw psycopg")):
        scaling = summary.scaling(kind)
        steps = []
        for n in effects.PROCESSES:
            case_id = f"effects.{kind}.{n}p"
            if case_id in summary.throughput:
                factor = f" (x{scaling[n]:.2f})" if n in scaling and n > 1 else ""
                cpu = statistics.median(results[case_id].cpu_samples_us)
                steps.append(f"{n}p {summary.throughput[case_id]:,.0f}{factor}, "
                             f"{cpu:,.0f} µs CPU")
        if steps:
            lines.append(f"{name}: " + " → ".join(steps))
    return (f"Section 4: wall time per effect of draining {summary.count:,} no-op effects over "
            f"{summary.resources} resources, median of {summary.rounds} rounds (each round "
            "drains once per case; rotating order). Effects/s by worker processes (x: over "
            "1 process; CPU: the workers' own per effect, all processes, without the "
            "server's): " + "; ".join(lines) + ".")


def _noisy(results: dict[str, Measurement]) -> list[str]:
    return [case_id for case_id, m in results.items() if m.spread > NOISY]


def _to_json(results: dict[str, Measurement], skipped: dict[str, str], settings: Settings,
             environment: dict[str, str], elapsed: float,
             summary: effects.Summary | None = None) -> dict[str, Any]:
    return {
        "unit": "microseconds per operation",
        "settings": {"rounds": settings.rounds, "round_seconds": settings.round_seconds,
                     "ops_per_round": settings.ops},
        "environment": environment,
        "elapsed_seconds": round(elapsed, 2),
        "cases": {case_id: m.to_json() for case_id, m in results.items()},
        "skipped": skipped,
        "noisy": _noisy(results),
        "comparisons": [
            {"section": title, "subject": c.subject, "reference": c.reference,
             "ratio": None if ratio is None else round(ratio, 4),
             "goal": str(c.goal) if c.goal else None,
             "goal_limit": c.goal.limit if c.goal else None,
             "goal_strict": c.goal.strict if c.goal else None,
             "goal_unit": c.goal.unit if c.goal else None,
             "met": _met(c, ratio, results)}
            for title, c, ratio in _comparisons(results, skipped)
        ],
        "effects": summary.to_json() if summary and summary.throughput else None,
    }


# -- profiling ------------------------------------------------------------------------------


def _profile(case: Case, workspace: Workspace, settings: Settings,
             args: argparse.Namespace) -> int:
    """Warm one case up, then run it under cProfile and print where the time goes."""
    with case.open(workspace) as bench:
        warm, per_op = warm_up(bench, settings)
        n = args.ops or max(200, round(settings.round_seconds * settings.rounds / per_op))
        profiler = _profiler(args)
        op = bench.op
        start = time.perf_counter()
        profiler.enable()
        for _ in range(n):
            op()
        profiler.disable()
        profiled = time.perf_counter() - start
        if bench.verify is not None:
            bench.verify(warm + n)
    header = (f"{case.id} ({case.label}): {n:,} operations; {per_op * 1e6:.1f} µs/op in "
              f"warm-up without the profiler, {profiled / n * 1e6:.1f} µs/op under it.\n"
              f"Times in the listing are totals over all operations; divide by {n:,} for one "
              "operation.\n")
    return _print_profile(profiler, header, args)


def _profiler(args: argparse.Namespace) -> cProfile.Profile:
    if args.profile_clock == "cpu":
        return cProfile.Profile(time.process_time)
    return cProfile.Profile()


def _print_profile(profiler: cProfile.Profile, header: str, args: argparse.Namespace) -> int:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    clock = ("this process's CPU time" if args.profile_clock == "cpu" else
             "wall-clock time, waits for the database included (--profile-clock cpu for CPU)")
    print(header + f"The profile measures {clock}.\n")
    for order in ("tottime", "cumulative"):
        out.seek(0)
        out.truncate()
        stats.sort_stats(order).print_stats(args.top)
        text = out.getvalue()
        print(f"== by {order} ==")
        print(text[text.index("   ncalls"):] if "   ncalls" in text else text)
    return 0
