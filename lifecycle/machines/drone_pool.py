"""A pool of drones that COBalD drives through its own interface, ``cobald.interfaces.Pool``
(install ``lifecycle-fsm[cobald]``).

TARDIS gives COBalD one ``Drone`` per pilot job, each a pool of its own, gathered by COBalD's
``FactoryPool``, which spawns drones while demand exceeds what they provide and releases them
(demand 0) when supply exceeds demand. :class:`DronePool` is that composite over the
``drone`` machine: its drones are resources in the database, its keys are ``prefix`` and
its own number (``cpu-00001``: it reads and changes no other, not even ``cpu-big-00001`` of
a pool whose prefix is ``cpu-big-``), and releasing one is a journaled ``demand: 0``, after
which the machine takes the drone down the safe way (drained when it runs, removed only on a
fresh status that says it does not, the removal fenced).

It behaves as ``FactoryPool`` does:

- ``demand``: setting it records the target and nothing else (at least 0, as COBalD's
  ``Standardiser`` keeps it, and at most ``max_drones`` drones' worth; a demand that is not
  a finite number is refused with a ``ValueError``); :meth:`adjust`, every ``interval``
  seconds (:meth:`run`), spawns drones while the wanted ones ask for less, or releases them
  in the ``policy``'s order while supply exceeds it, at most ``spawn_limit`` new drones per
  adjustment.
- ``supply``: ``cores`` for each drone still wanted in ``available``, ``drain`` or
  ``draining`` (a TARDIS drone supplies its cores from its first Available heartbeat until
  its demand is 0: one drained for its minimum lifetime still counts);
- ``allocation`` and ``utilisation``: the mean, over those drones, of what the batch system
  says of each (TARDIS: the largest and the smallest of the ratios of requested to total
  resources); 1.0 when no drone supplies anything, so that an empty pool grows.

The three figures are those of the last :meth:`refresh` (after each heartbeat, and each
adjustment): COBalD's controller reads them from its own thread, and a property never asks
the database or the batch system. With an :class:`~lifecycle.aio.AsyncEngine` and an
asyncio batch system (TARDIS's), :meth:`refresh`, :meth:`adjust`, :meth:`drones` and
:meth:`wanted` are coroutines; with a sync engine they return their answer.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..adapters.sites import Drone, PoolFigures
from ..errors import ResourceExists
from ..logs import logger
from .drone import LIVE_STATES, SUPPLYING_STATES, answer, release_order, run_to_end

log = logger(__name__)

try:
    from cobald.interfaces import Pool  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("lifecycle.machines.drone_pool needs COBalD: pip install "
                      "'lifecycle-fsm[cobald]'") from exc

T = TypeVar("T")


@dataclass(frozen=True)
class Figures:
    """What the pool reported at its last refresh."""

    supply: float = 0.0
    allocation: float = 1.0
    utilisation: float = 1.0
    per_drone: dict[str, float] = field(default_factory=dict)
    """Each supplying drone's utilisation (COBalD's release order reads it)."""


class DronePool(Pool):  # type: ignore[misc]
    """COBalD's ``Pool`` over the drones of ``machine`` whose keys are ``prefix`` and digits.

    ``figures`` is the batch system's view of how each drone is used (``allocation``,
    ``utilisation``); ``cores`` what one drone provides (TARDIS: the machine type's
    ``Cores``); ``policy`` the release order (:func:`~lifecycle.machines.drone.release_order`);
    ``interval`` the seconds between two adjustments (COBalD's ``FactoryPool``: 30).
    """

    def __init__(self, engine: Any, figures: PoolFigures, *, machine: str = "drone",
                 prefix: str = "pool-", cores: float = 1.0,
                 policy: str = "established_first", actor: str = "cobald",
                 max_drones: int = 10_000, spawn_limit: int = 100,
                 interval: float = 30.0, seed: int | None = None) -> None:
        if not (math.isfinite(cores) and cores > 0):
            raise ValueError(f"a drone provides a positive number of cores, not {cores}")
        if max_drones < 1 or spawn_limit < 1:
            raise ValueError(f"max_drones ({max_drones}) and spawn_limit ({spawn_limit}) "
                             "are at least 1")
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval is a positive number of seconds, not {interval}")
        release_order([], policy)  # an unknown policy is refused now, not at the first release
        self.max_drones = max_drones
        self.spawn_limit = spawn_limit
        self.interval = float(interval)
        self._own = re.compile(re.escape(prefix) + r"(\d+)")
        self.engine = engine
        self.figures = figures
        self.machine = machine
        self.prefix = prefix
        self.cores = float(cores)
        self.policy = policy
        self.actor = actor
        self.asyncio = asyncio.iscoroutinefunction(getattr(engine, "resources", None))
        self._rng = random.Random(seed)
        self._figures = Figures()
        self._number: int | None = None
        # FactoryPool starts at its children's demand: read now on a sync engine, at the
        # first refresh on an asyncio one (unless COBalD set a demand before)
        self._demand: float | None = None if self.asyncio else run_to_end(self._wanted_demand())

    def _run(self, work: Coroutine[Any, Any, T]) -> Any:
        """A coroutine for an asyncio engine; its answer, at once, for a sync one."""
        return work if self.asyncio else run_to_end(work)

    # -- the drones ----------------------------------------------------------------------

    async def _drones(self) -> list[Any]:
        found = []
        for state in LIVE_STATES:
            found += [r for r in await answer(self.engine.resources(self.machine, state))
                      if self._own.fullmatch(r.key)]
        return sorted(found, key=lambda r: r.key)

    async def _wanted(self) -> list[Any]:
        return [d for d in await self._drones() if d.data.get("demand", 1) != 0]

    async def _wanted_demand(self) -> float:
        return sum(self._demand_of(d) for d in await self._wanted())

    def drones(self) -> Any:
        """This pool's drones that are not down (``Resource``s, by key)."""
        return self._run(self._drones())

    def wanted(self) -> Any:
        """The drones whose demand is not 0: FactoryPool's children that are not leaving."""
        return self._run(self._wanted())

    def _demand_of(self, drone: Any) -> float:
        return self.cores * float(drone.data.get("demand", 1))

    # -- cobald.interfaces.Pool ------------------------------------------------------------

    @property
    def supply(self) -> float:
        return self._figures.supply

    @property
    def demand(self) -> float:
        return self._demand or 0.0

    @demand.setter
    def demand(self, value: float) -> None:
        wanted = float(value)
        if not math.isfinite(wanted):
            raise ValueError(f"pool {self.prefix!r}: demand must be a finite number of "
                             f"cores, not {value!r}")
        ceiling = self.cores * self.max_drones
        if wanted > ceiling:
            log.warning("pool %r: demand %g is more than max_drones (%d) provide; %g it is",
                        self.prefix, wanted, self.max_drones, ceiling)
        self._demand = min(max(0.0, wanted), ceiling)

    @property
    def allocation(self) -> float:
        return self._figures.allocation

    @property
    def utilisation(self) -> float:
        return self._figures.utilisation

    # -- what the drones report --------------------------------------------------------------

    def refresh(self) -> Any:
        """Read this pool's drones and ask the batch system about those that supply: the
        figures the properties give until the next refresh."""
        return self._run(self._refresh())

    async def _refresh(self, wanted: list[Any] | None = None) -> Figures:
        if wanted is None:
            wanted = await self._wanted()
        if self._demand is None:
            self._demand = sum(self._demand_of(d) for d in wanted)
        supplying = [d for d in wanted if d.state in SUPPLYING_STATES]
        if not supplying:
            self._figures = Figures()
            return self._figures
        refs = [Drone(d.key, d.data.get("remote_id"), d.data) for d in supplying]
        try:
            allocation = await answer(self.figures.allocation(refs))
            utilisation = await answer(self.figures.utilisation(refs))
        except Exception as exc:  # a batch system that cannot say: the last figures stand
            log.warning("pool %r: the batch system could not say how its drones are used: "
                        "%s", self.prefix, exc)
            return self._figures
        per_drone = {d.key: float(utilisation.get(d.key, 0.0)) for d in supplying}
        self._figures = Figures(
            self.cores * len(supplying),
            sum(float(allocation.get(d.key, 0.0)) for d in supplying) / len(supplying),
            sum(per_drone.values()) / len(supplying), per_drone)
        return self._figures

    # -- FactoryPool's adjustment ------------------------------------------------------------

    def adjust(self) -> Any:
        """Spawn drones while the wanted ones ask for less than the demand, or release drones
        (in the release policy's order) while supply exceeds it: FactoryPool's rule, on the
        demand recorded last. The keys created and released."""
        return self._run(self._adjust())

    async def _adjust(self) -> dict[str, list[str]]:
        wanted = await self._wanted()
        figures = await self._refresh(wanted)
        demand = self.demand   # as FactoryPool, the target is frozen for the adjustment
        done: dict[str, list[str]] = {"created": [], "released": []}
        if figures.supply > demand:
            excess = sum(self._demand_of(d) for d in wanted) - demand
            actor = f"{self.actor}: demand {demand:g} < supply {figures.supply:g}"
            for drone in release_order(wanted, self.policy, cores=self.cores,
                                       utilisation=figures.per_drone, rng=self._rng):
                if excess <= 0:
                    break
                if self._demand_of(drone) <= excess:
                    excess -= self._demand_of(drone)
                    await answer(self.engine.update(f"{self.machine}:{drone.key}",
                                                    {"demand": 0}, actor=actor))
                    done["released"].append(drone.key)
        else:
            done["created"] = await self._grow(demand, wanted)
        if any(done.values()):
            await self._refresh()
        return done

    async def _grow(self, demand: float, wanted: list[Any]) -> list[str]:
        have = sum(self._demand_of(d) for d in wanted)
        missing = demand - have
        created: list[str] = []
        if missing <= 0:
            return created
        if self._number is None:
            self._number = await self._last_number()
        actor = f"{self.actor}: demand {demand:g} > {have:g} wanted"
        while missing > 0 and len(created) < self.spawn_limit:
            key = f"{self.prefix}{self._number + 1:05d}"
            try:
                await answer(self.engine.create(self.machine, key, {"demand": 1}, actor=actor))
            except ResourceExists:   # another process numbers this prefix too: read again
                self._number = await self._last_number()
                continue
            self._number += 1
            created.append(key)
            missing -= self.cores
        return created

    async def _last_number(self) -> int:
        """The highest number of this pool's drones, down ones included (read once: the
        pool numbers on from there itself)."""
        numbers = [0]
        async for resource in self._all():
            if m := self._own.fullmatch(resource.key):
                numbers.append(int(m.group(1)))
        return max(numbers)

    async def _all(self) -> Any:
        after = None
        while True:
            page = await answer(self.engine.resources(self.machine, limit=1000, after=after))
            for resource in page:
                yield resource
            if len(page) < 1000:
                return
            after = f"{self.machine}:{page[-1].key}"

    async def run(self) -> None:
        """Adjust every ``interval`` seconds, for ever (FactoryPool's ``run``), on an asyncio
        engine; an adjustment that fails is logged and tried again at the next interval."""
        if not self.asyncio:
            raise TypeError("DronePool.run needs an AsyncEngine")
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._adjust()
            except Exception:
                log.exception("pool %r: the adjustment failed", self.prefix)


__all__: Sequence[str] = ["DronePool", "Figures"]
