"""``!LifecyclePoolFactory``: lifecycle's drones in a TARDIS site's own COBalD daemon.

TARDIS registers ``!TardisPoolFactory`` in COBalD's ``cobald.config.yaml_constructors``: the
last element of a ``pipeline``, it reads TARDIS's configuration (a file named by
``configuration``, or the ``tardis:`` section TARDIS registers in ``cobald.config.sections``)
and builds, per site and machine type, a ``FactoryPool`` of TARDIS drones, each site's
pools weighted by utilisation under a ``Standardiser`` of the site's ``quota``, the sites
weighted by utilisation. :func:`create_composite_pool`, registered as
``!LifecyclePoolFactory``, reads the same configuration and builds the same composition,
with a :class:`~lifecycle.machines.drone_pool.DronePool` in place of each ``FactoryPool``:
its drones are resources of the ``drone`` machine (or ``drone_tardis``), driven through
TARDIS's own site and batch-system adapters on asyncio.

What TARDIS's drones do in their own loops runs as one COBalD service on the daemon's
asyncio loop (:class:`LifecycleDrones`, the pool the factory returns): the outbox worker
(the drones' effects: deploy, integrate, drain, stop, terminate, as tasks), the heartbeat
(every live drone's status from its site and the pool, observed and stepped; a risky edge's
probe is awaited on the loop) followed by each pool's figures, and each pool's adjustment
on its ``interval``. The database work runs on a small thread pool (``AsyncEngine``,
``database="threads"``), so the loop COBalD's services share never waits on the database;
COBalD's controller, on its own thread, reads figures the pools computed and sets a demand
that the pools record. SIGTERM stops the daemon as Ctrl-C does: the worker gives back the
effects it holds, and the database's connections are closed.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from collections.abc import Sequence
from typing import Any

from ..adapters.tardis import TardisBatchSystem, TardisSites, configured
from ..aio import AsyncEngine, AsyncWorker
from ..logs import logger
from ..store import Store
from . import drone
from .drone_pool import DronePool

log = logger(__name__)

try:
    from cobald.composite.weighted import WeightedComposite  # type: ignore[import-untyped]
    from cobald.daemon import runtime, service  # type: ignore[import-untyped]
    from cobald.decorator.logger import Logger  # type: ignore[import-untyped]
    from cobald.decorator.standardiser import Standardiser  # type: ignore[import-untyped]
    from cobald.interfaces import PoolDecorator  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("lifecycle's COBalD pool factory needs COBalD and TARDIS: pip install "
                      "'lifecycle-fsm[tardis]' && pip install --no-deps cobald-tardis"
                      ) from exc

MACHINES = ("drone", "drone_tardis")


@service(flavour=asyncio)
class LifecycleDrones(PoolDecorator):  # type: ignore[misc]
    """The pools of a TARDIS configuration (``target``, COBalD's composition of them) and
    the COBalD service that drives their drones: the worker, the heartbeat, the pools'
    adjustments. COBalD's pipeline holds this object, so the service lives as long as the
    pipeline does."""

    def __init__(self, target: Any, *, engine: AsyncEngine, sites: TardisSites,
                 batch: TardisBatchSystem, pools: Sequence[DronePool], machine: str,
                 heartbeat: float, concurrency: int) -> None:
        super().__init__(target)
        self.engine = engine
        self.sites = sites
        self.batch = batch
        self.pools = list(pools)
        self.machine = machine
        self.heartbeat = heartbeat
        self.worker = AsyncWorker(engine, concurrency=concurrency, name="cobald")
        self.beats = 0

    async def run(self) -> None:
        """The service: runs until COBalD's runtime cancels it (then gives its claims back
        and closes the database's connections)."""
        if threading.current_thread() is threading.main_thread():
            # SIGTERM stops COBalD's runtime (its own shutdown, which waits for the loop, so
            # from a thread of its own) instead of ending the process where it stands
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _shut_down)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.worker.run())
                group.create_task(self._heartbeats())
                for pool in self.pools:
                    group.create_task(pool.run())
        finally:
            log.info("lifecycle's drones stopped: closing the database")
            await self.engine.aclose()
            self.engine.store.dispose()

    async def _heartbeats(self) -> None:
        prefixes = tuple(self.sites.prefixes)
        while True:
            try:
                report = await drone.reconcile_async(
                    self.engine, self.sites, self.batch, machine=self.machine,
                    only=lambda key: key.startswith(prefixes))
                log.info("heartbeat: %s", report)
                for pool in self.pools:
                    await pool.refresh()
            except Exception:
                log.exception("heartbeat failed; the next one tries again")
            self.beats += 1
            await asyncio.sleep(self.heartbeat)


def _shut_down() -> None:
    log.info("SIGTERM: stopping COBalD's services")
    threading.Thread(target=runtime.shutdown, name="cobald-shutdown", daemon=True).start()


def create_composite_pool(configuration: str | None = None, *, database: str | None = None,
                          machine: str = "drone", policy: str = "established_first",
                          interval: float = 30.0, heartbeat: float = 60.0,
                          max_drones: int = 10_000, spawn_limit: int = 100,
                          concurrency: int = 16) -> LifecycleDrones:
    """TARDIS's ``create_composite_pool`` with lifecycle's drones: the sites, machine types
    and batch system of the TARDIS configuration file ``configuration`` (or of the
    ``tardis:`` section already read), the database ``database`` (default:
    ``$LIFECYCLE_DATABASE_URL``, else ./lifecycle.db; migrated to the code's revision), the
    machine ``drone`` (the boot race closed) or ``drone_tardis`` (TARDIS's own table),
    ``policy`` the release order, ``interval`` the seconds between a pool's adjustments
    (FactoryPool's 30), ``heartbeat`` the seconds between two statuses of every drone
    (TARDIS's 60)."""
    if machine not in MACHINES:
        raise ValueError(f"machine is one of {', '.join(MACHINES)}, not {machine!r}")
    if not (math.isfinite(heartbeat) and heartbeat > 0):
        raise ValueError(f"heartbeat is a positive number of seconds, not {heartbeat}")
    site_types, batch_system = configured(configuration)
    # (asyncio's: their calls are coroutines, which the drone's handlers and pools await)
    sites: Any = TardisSites({t.prefix: t.adapter for t in site_types})
    batch: Any = batch_system
    spec = drone.drone_spec(race_guard=machine == "drone")
    store = Store(database, upgrade=True)
    try:
        engine = AsyncEngine(store, [spec], guards=drone.GUARDS,
                             effects=drone.effects(sites, batch),
                             probes={"site": drone.probe(sites, batch)}, database="threads")
    except BaseException:
        store.dispose()
        raise
    pools: list[DronePool] = []
    composites = []
    for site in dict.fromkeys(t.site for t in site_types):
        mine = [t for t in site_types if t.site == site]
        children = []
        for t in mine:
            pool = DronePool(engine, batch, machine=spec.name, prefix=t.prefix, cores=t.cores,
                             policy=policy, interval=interval, max_drones=max_drones,
                             spawn_limit=spawn_limit)
            pools.append(pool)
            children.append(Logger(pool, name=f"{site.lower()}_{t.machine_type.lower()}"))
        quota = mine[0].quota
        composites.append(Standardiser(WeightedComposite(*children, weight="utilisation"),
                                       maximum=math.inf if quota is None else quota))
    return LifecycleDrones(WeightedComposite(*composites, weight="utilisation"),
                           engine=engine, sites=sites, batch=batch, pools=pools,
                           machine=spec.name, heartbeat=heartbeat, concurrency=concurrency)


__all__ = ["MACHINES", "LifecycleDrones", "create_composite_pool"]
