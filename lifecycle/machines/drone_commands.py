"""The drones' own commands, named in the entry-point group ``lifecycle.commands``:
``tardis`` (a drone pool on asyncio, from a TARDIS configuration), ``reconcile`` (a drone
pool's heartbeat, with the site a $LIFECYCLE_PLUGINS module gives) and ``hook prepare-job``
(a drone's own last word: its startd's starter runs it before a payload starts,
``HOOK_PREPARE_JOB``, and it asks ``lifecycle serve`` whether lifecycle is about to remove
this drone; docs/tardis.md). Each is made by a function of what the command line gives a
machine's commands (:class:`~lifecycle.machines.builtin.CommandLine`); the drone's own
module, with pydantic and ``transitions``, is imported only when a command runs."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from .builtin import CommandLine

if TYPE_CHECKING:  # (asyncio, signal, pathlib, urllib.request: imported when a command
    # runs, not for `lifecycle --help`, which makes every machine's command to read its help)
    from ..aio import AsyncEngine

DRONES = click.Choice(["drone", "drone_tardis"])

_EVERY = click.option(
    "--every", type=click.FloatRange(min=1), metavar="SECONDS",
    help="Repeat every SECONDS (the heartbeat) until SIGTERM or Ctrl-C; without it, one round.")


def tardis(cli: CommandLine) -> click.Command:
    """The ``tardis`` command."""

    @click.command()
    @click.argument("configuration", type=click.Path(exists=True, dir_okay=False))
    @click.option("--machine", default="drone", type=DRONES,
                  help="The drone machine: with the boot race closed (default), or TARDIS's.")
    @_EVERY
    @cli.db_option
    @cli.json_option
    def tardis(configuration: str, machine: str, every: float | None, db_url: str | None,
               as_json: bool) -> None:
        """Run the drones of a TARDIS site CONFIGURATION (YAML: `Sites`, each site's
        `MachineTypes` and settings, `BatchSystem`) on asyncio, through TARDIS's own site and
        batch-system adapters: the worker's effects (deploy, integrate, drain, stop,
        terminate) as tasks, then each site's status of every live drone, recorded as
        observations, then one step of every drone at once. A drone belongs to the site and
        machine type its key starts with, `<site>-<machine type>-` (site in lower case).
        Needs cobald-tardis."""
        _tardis(cli, configuration, machine, every, db_url, as_json)

    return tardis


def _tardis(cli: CommandLine, configuration: str, machine: str, every: float | None,
            db_url: str | None, as_json: bool) -> None:
    import asyncio

    from ..aio import AsyncEngine
    from ..effects import as_effect
    from ..errors import SetupError
    from . import drone

    try:
        from ..adapters.tardis import from_configuration
    except ImportError as exc:
        raise SetupError(f"`lifecycle tardis` needs TARDIS ({exc.name}): pip install "
                             "'lifecycle-fsm[tardis]' && pip install --no-deps "
                             "cobald-tardis") from None
    # (asyncio's sites: their calls are coroutines, which the drone's handlers await)
    sites: Any
    batch: Any
    engine = cli.make_engine(db_url)
    from pathlib import Path

    sites, batch = from_configuration(Path(configuration), clock=engine.clock)
    engine.handlers.update({name: as_effect(handler)
                            for name, handler in drone.effects(sites, batch).items()})
    engine.probes["site"] = drone.probe(sites, batch)
    engine.register(drone.drone_spec(race_guard=machine == "drone"))
    prefixes = tuple(sites.prefixes)
    asyncio.run(_heartbeats(cli, AsyncEngine.over(engine), sites, batch, machine, every,
                            as_json, lambda key: key.startswith(prefixes)))


async def _heartbeats(cli: CommandLine, engine: AsyncEngine, sites: Any, batch: Any,
                      machine: str, every: float | None, as_json: bool, only: Any) -> None:
    import asyncio
    import signal

    from ..aio import AsyncWorker
    from . import drone

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if every is not None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    worker = AsyncWorker(engine, concurrency=16)
    while True:
        await worker.run_until_idle()  # effects of the last round (a deploy) first
        report = await drone.reconcile_async(engine, sites, batch, machine=machine,
                                             only=only)
        await worker.run_until_idle()
        print_heartbeat(cli, report, as_json)
        if every is None or stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            continue


def print_heartbeat(cli: CommandLine, report: dict[str, Any], as_json: bool) -> None:
    """A drone pool's heartbeat report (``reconcile``, ``tardis``): JSON, or one line."""
    from rich.markup import escape as _escape

    from ..story import plural

    if as_json:
        print(json.dumps(report), flush=True)
    elif report["site_error"]:
        cli.out.print(f"[yellow]site unreachable[/]: {_escape(report['site_error'])}; "
                  f"{plural(report['drones'], 'drone')} keep their state")
    else:
        moved = ", ".join(f"{n} {m}" for m, n in sorted(report["moved"].items()))
        cli.out.print(f"{plural(report['drones'], 'drone')}: {moved or 'none moved'}"
                  + (f"; {plural(report['refused'], 'risky edge')} refused"
                     if report["refused"] else "")
                  + (f"; {plural(report['errors'], 'drone')} not observed or stepped "
                     "(see the log)" if report.get("errors") else ""))


def reconcile(cli: CommandLine) -> click.Command:
    """The ``reconcile`` command."""

    @click.command()
    @click.argument("machine", default="drone", type=DRONES)
    @_EVERY
    @cli.db_option
    @cli.json_option
    def reconcile(machine: str, every: float | None, db_url: str | None,
                  as_json: bool) -> None:
        """Run a drone pool's heartbeat: the site's and the pool's status of every live drone
        in one call each, recorded as observations, then one step of every drone. The site
        and the pool come from a LIFECYCLE_PLUGINS module defining `drone_site` and
        `drone_batch_system`."""
        _reconcile(cli, machine, every, db_url, as_json)

    return reconcile


def _reconcile(cli: CommandLine, machine: str, every: float | None, db_url: str | None,
               as_json: bool) -> None:
    from rich.progress import Progress

    from ..errors import SetupError
    from ..worker import Worker
    from . import drone

    provided = [p for p in cli.plugins() if hasattr(p, "drone_site")]
    if not provided:
        raise SetupError(
            "no drone site is configured: name a module in LIFECYCLE_PLUGINS that defines "
            "`drone_site` and `drone_batch_system` (for example "
            "lifecycle.adapters.slurm.SlurmSite(...))")
    site = provided[0].drone_site
    batch = provided[0].drone_batch_system
    engine = cli.make_engine(db_url)
    engine.register(drone.drone_spec(race_guard=machine == "drone"))
    stop: list[bool] = []
    if every is not None:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    worker = Worker(engine)
    while True:
        worker.run_until_idle()  # effects of the last round (a deploy) before the statuses
        with Progress(console=cli.err, transient=True,
                      disable=not cli.err.is_terminal) as bar:
            task = bar.add_task("stepping drones", total=None)

            def advance(done: int, total: int, task: Any = task) -> None:
                bar.update(task, completed=done, total=total)

            report = drone.reconcile(engine, site, batch, machine=machine, progress=advance)
        worker.run_until_idle()
        print_heartbeat(cli, report, as_json)
        if every is None or stop:
            return
        try:
            deadline = time.monotonic() + every
            while time.monotonic() < deadline and not stop:
                time.sleep(min(0.2, every))
        except KeyboardInterrupt:
            return
        if stop:
            return


DRONE_VARIABLE = "TardisDroneUuid"
"""The drone's name, in its job's environment (TARDIS's site adapters put it there)."""


def hook(cli: CommandLine) -> click.Command:
    """The ``hook`` group: programs HTCondor runs as hooks."""

    @click.group()
    def hook() -> None:
        """Programs HTCondor runs as hooks: `prepare-job` for a drone's startd."""

    hook.add_command(prepare_job)
    return hook


@click.command("prepare-job")
@click.option("--url", required=True, metavar="URL",
              help="Where `lifecycle serve` answers (http://host:port).")
@click.option("--drone", "key", envvar=DRONE_VARIABLE, required=True, metavar="KEY",
              help=f"The drone's key. Default: ${DRONE_VARIABLE}.")
@click.option("--machine", default="drone", show_default=True,
              help="The drone's machine.")
@click.option("--wait", type=click.FloatRange(min=0), default=120.0, show_default=True,
              metavar="SECONDS", help="How long a drone on its way up may make the job wait.")
@click.option("--every", type=click.FloatRange(min=0.01), default=5.0, show_default=True,
              metavar="SECONDS", help="How often to ask again meanwhile.")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=5.0, show_default=True,
              metavar="SECONDS", help="How long one question may take.")
@click.option("--if-unreachable", type=click.Choice(["refuse", "allow"]), default="refuse",
              show_default=True,
              help="What to do when lifecycle serve gives no answer within --wait.")
def prepare_job(url: str, key: str, machine: str, wait: float, every: float, timeout: float,
                if_unreachable: str) -> None:
    """HTCondor's HOOK_PREPARE_JOB for a drone's startd: exit 0 (the payload may start) once
    lifecycle says the drone is integrated; ask again every --every seconds while it is on
    its way up, for at most --wait seconds; exit 1 (the starter does not run the payload)
    when the drone is being removed or is gone, or is still not integrated at the end."""
    import urllib.parse

    sys.stdin.read()   # the job's ClassAd, which the starter writes: read, so it never blocks
    asking = (f"{url.rstrip('/')}/machines/{urllib.parse.quote(machine, safe='')}/payload?"
              + urllib.parse.urlencode({"key": key}))
    deadline = time.monotonic() + wait
    while True:
        answer, trouble = _ask(asking, timeout)
        left = deadline - time.monotonic()
        if answer is not None and answer.get("verdict") in ("yes", "no"):
            _say(f"drone {key}: {answer.get('reason')}")
            sys.exit(0 if answer["verdict"] == "yes" else 1)
        said = trouble if answer is None else f"drone {key}: {answer.get('reason')}"
        if left <= 0:
            if answer is None and if_unreachable == "allow":
                _say(f"{said}; allowed (--if-unreachable allow)")
                sys.exit(0)
            _say(f"{said}; refused after {wait:g} s")
            sys.exit(1)
        _say(f"{said}; asking again in {min(every, left):.3g} s")
        time.sleep(min(every, left))


def _ask(url: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """lifecycle serve's answer, or None and why there is none."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read()), ""
    except urllib.error.HTTPError as exc:
        try:
            said = json.loads(exc.read()).get("error", "")
        except ValueError:
            said = ""
        return None, f"lifecycle serve answered {exc.code} {said}".rstrip()
    except (OSError, ValueError) as exc:   # refused, timed out, not JSON
        return None, f"no answer from {url} within {timeout:g} s: {exc}"


def _say(message: str) -> None:
    print(f"lifecycle hook prepare-job ({os.getpid()}): {message}", file=sys.stderr,
          flush=True)
