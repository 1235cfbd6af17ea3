"""``worker``, ``stuck`` and ``retry``: the outbox, carried out and repaired."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import click

from ..effects import FAILED, PENDING, RUNNING
from ..machines import builtins
from ..outbox_admin import effect_records, outbox_counts, retry_failed, unhandled
from ..story import plural, time_text
from ..worker import DEFAULT_LEASE, HeldClaims, Worker, WorkerStats
from .common import (
    PLUGINS_VARIABLE,
    db_option,
    escape,
    json_option,
    say,
)
from .context import make_engine

# (the worker and retry print lines with common.say: on a pipe or to a file, rich is not
# imported; stuck prints a table, with rich)


@click.command()
@click.option("--until-idle", is_flag=True,
              help="Stop when nothing is due, instead of waiting for more work. Effects "
                   "that other workers hold are waited for (and said so) until they are "
                   "done or their worker is gone.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Handlers running at once.")
@click.option("--lease", default=DEFAULT_LEASE, show_default=True, type=click.FloatRange(1),
              help="Seconds a claim holds without its worker's heartbeat (renewed every "
                   "third of it while the worker lives): how long the effects of a worker "
                   "that died on another host wait to be taken over.")
@click.option("--poll", default=0.5, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between looks for new work when idle.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve /metrics for Prometheus on this port while working: what "
                   "`lifecycle serve` reads from the database, and this worker's probe calls "
                   "and failures (needs the serve extra).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="The address /metrics listens on.")
@db_option
@json_option
def worker(until_idle: bool, concurrency: int, lease: float, poll: float,
           metrics_port: int | None, metrics_host: str, db_url: str | None,
           as_json: bool) -> None:
    """Carry out the effects of committed transitions, and fire due timers. SIGTERM stops
    it gracefully (running handlers finish); a second SIGTERM or SIGQUIT stops it at once,
    giving the running effects back."""

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger(__name__)
    engine = make_engine(db_url)
    served = []
    for name, builtin in builtins().items():
        lacking = engine.missing_names(name)
        missing = sorted(lacking["effects"] + lacking["probes"])
        if missing:  # a machine whose adapters this process does not have (e.g. a site)
            log.debug("not serving %s: no %s here (%s)", name, ", ".join(missing),
                      PLUGINS_VARIABLE)
            continue
        served.append(builtin.spec)
    engine.register_all(served)  # one read where the database runs them already
    for line in _unhandled_lines(engine):   # said where it matters: work is waiting
        log.warning("%s", line)
    stop_metrics = None
    if metrics_port is not None:
        from .serve import needs_serve_extra

        try:
            from ..dashboard.metrics import serve_metrics
        except ModuleNotFoundError as exc:
            raise needs_serve_extra(exc) from None
        engine.probes, stop_metrics = serve_metrics(engine.store.url, metrics_port,
                                                    metrics_host, engine.probes)
    worker = Worker(engine, concurrency=concurrency, lease=lease, poll=poll)
    try:
        stats = _until_idle(worker) if until_idle else worker.run(handle_signals=True)
    finally:
        if stop_metrics is not None:
            stop_metrics()
    left = outbox_counts(engine)
    if as_json:
        not_run: dict[str, dict[str, int]] = {}
        for (machine, name), count in unhandled(engine).items():
            not_run.setdefault(machine, {})[name] = count
        print(json.dumps({**stats.to_json(), "outbox": left, "not_run_here": not_run},
                         indent=2))
    else:
        say(f"effects: {stats.done} done, {stats.retried} to retry, {stats.failed} "
            f"failed for good; timers: {stats.timers_fired} fired, "
            f"{stats.timers_refused} refused")
        waiting = {k: v for k, v in left.items() if k in (PENDING, RUNNING, FAILED)}
        if waiting:
            say("outbox: " + ", ".join(f"{v} {k}" for k, v in sorted(waiting.items())))
        for line in _unhandled_lines(engine):
            say(escape(line))


def _unhandled_lines(engine: Any) -> list[str]:
    """What this process cannot run though it waits in the outbox, one line a machine."""
    by_machine: dict[str, list[str]] = {}
    for (machine, name), count in unhandled(engine).items():
        by_machine.setdefault(machine, []).append(f"{name} ({count})")
    return [f"not run here: {machine}'s {', '.join(names)}: no handler in this process; name "
            f"the module that defines it in {PLUGINS_VARIABLE}"
            for machine, names in by_machine.items()]


def _until_idle(worker: Worker) -> WorkerStats:
    """Work until nothing is due; then, while other workers hold effects this one could
    serve, say so and wait: for them to finish, or for a dead worker's claims to come free."""
    said: list[HeldClaims] = []
    while True:
        stats = worker.run_until_idle()
        held = worker.held_elsewhere()
        if not held:
            return stats
        if [(h.claimed_by, h.effects) for h in held] != [(h.claimed_by, h.effects)
                                                         for h in said]:
            for h in held:
                say(f"waiting for {plural(h.effects, 'effect')} held by worker "
                    f"{escape(h.claimed_by)} (lease until {time_text(h.lease_until)}, "
                    "renewed while that worker lives)", stderr=True)
            said = held
        time.sleep(worker.poll)


@click.command()
@db_option
@json_option
def stuck(db_url: str | None, as_json: bool) -> None:
    """List the resources whose effects failed for good; `lifecycle retry KEY` resumes one."""
    from rich.table import Table

    from .common import out

    failed = effect_records(make_engine(db_url), statuses=(FAILED,))
    if as_json:
        print(json.dumps([e.to_json() for e in failed], indent=2))
        return
    table = Table("resource", "effect", "attempts", "last error")
    for e in failed:
        table.add_row(f"{e.machine}:{e.key}", e.name, str(e.attempts), escape(e.last_error or ""))
    out.print(table)
    out.print(plural(len(failed), "failed effect"))


@click.command()
@click.argument("key")
@db_option
def retry(key: str, db_url: str | None) -> None:
    """Put KEY's failed effects back in the queue, due now, with fresh attempts."""
    count = retry_failed(make_engine(db_url, as_met=True), key)
    say(f"{escape(key)}: {plural(count, 'failed effect')} queued again" if count else
        f"{escape(key)}: no failed effects")


