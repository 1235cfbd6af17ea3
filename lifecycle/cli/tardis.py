"""``tardis``: a drone pool's heartbeat on asyncio, with the sites and the batch system of a
TARDIS YAML configuration (TARDIS's own adapters, through ``lifecycle.adapters.tardis``)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import click

from ..aio import AsyncEngine, AsyncWorker
from ..effects import as_effect
from ..errors import LifecycleError
from ..machines import drone
from .common import db_option, json_option, print_heartbeat
from .context import make_engine


@click.command()
@click.argument("configuration", type=click.Path(exists=True, dir_okay=False))
@click.option("--machine", default="drone", type=click.Choice(["drone", "drone_tardis"]),
              help="The drone machine: with the boot race closed (default), or TARDIS's.")
@click.option("--every", type=click.FloatRange(min=1), metavar="SECONDS",
              help="Repeat every SECONDS (the heartbeat) until SIGTERM or Ctrl-C; without it, "
                   "one round.")
@db_option
@json_option
def tardis(configuration: str, machine: str, every: float | None, db_url: str | None,
           as_json: bool) -> None:
    """Run the drones of a TARDIS site CONFIGURATION (YAML: `Sites`, each site's
    `MachineTypes` and settings, `BatchSystem`) on asyncio, through TARDIS's own site and
    batch-system adapters: the worker's effects (deploy, integrate, drain, stop, terminate)
    as tasks, then each site's status of every live drone, recorded as observations, then
    one step of every drone at once. A drone belongs to the site and machine type its key
    starts with, `<site>-<machine type>-` (site in lower case). Needs cobald-tardis."""
    try:
        from ..adapters.tardis import from_configuration
    except ImportError as exc:
        raise LifecycleError(f"`lifecycle tardis` needs TARDIS ({exc.name}): pip install "
                             "'lifecycle-fsm[tardis]' && pip install --no-deps "
                             "cobald-tardis") from None
    # (asyncio's sites: their calls are coroutines, which the drone's handlers await)
    sites: Any
    batch: Any
    engine = make_engine(db_url)
    sites, batch = from_configuration(Path(configuration), clock=engine.clock)
    engine.handlers.update({name: as_effect(handler)
                            for name, handler in drone.effects(sites, batch).items()})
    engine.probes["site"] = drone.probe(sites, batch)
    engine.register(drone.drone_spec(race_guard=machine == "drone"))
    prefixes = tuple(sites.prefixes)
    asyncio.run(_heartbeats(AsyncEngine.over(engine), sites, batch, machine, every, as_json,
                            lambda key: key.startswith(prefixes)))


async def _heartbeats(engine: AsyncEngine, sites: Any, batch: Any, machine: str,
                      every: float | None, as_json: bool, only: Any) -> None:
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
        print_heartbeat(report, as_json)
        if every is None or stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            continue
