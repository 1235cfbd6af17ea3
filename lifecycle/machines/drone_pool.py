"""A pool of drones that COBalD drives through its own interface, ``cobald.interfaces.Pool``
(install ``lifecycle-fsm[cobald]``).

TARDIS gives COBalD one ``Drone`` per pilot job, each a pool of its own, gathered by COBalD's
``FactoryPool``, which spawns drones while demand exceeds what they provide and releases them
(demand 0) when supply exceeds demand. :class:`DronePool` is that composite over the
``drone`` machine: its drones are resources in the database, its keys are ``prefix`` and
its own number (``cpu-00001``: it reads and changes no other, not even ``cpu-big-00001`` of
a pool whose prefix is ``cpu-big-``), and releasing one is a journaled ``demand: 0``, after which
the machine takes the drone down the safe way (drained when it runs, removed only on a fresh
status that says it does not, the removal fenced).

What it reports is what TARDIS's drones report, summed and averaged as ``FactoryPool`` does:

- ``supply``: ``cores`` for each drone in ``available`` whose demand is not 0 (a TARDIS drone
  supplies its cores once it is Available, and nothing once its demand is 0);
- ``allocation`` and ``utilisation``: the mean, over those drones, of what the batch system
  says of each (TARDIS: the largest and the smallest of the ratios of requested to total
  resources); 1.0 when no drone supplies anything, so that an empty pool grows;
- ``demand``: the target COBalD set (at least 0, as COBalD's ``Standardiser`` keeps it, and
  at most ``max_drones`` drones' worth; a demand that is not a finite number is refused
  with a ``ValueError``); setting it spawns or releases drones at once, at most
  ``spawn_limit`` new drones per adjustment.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ..adapters.sites import Drone, PoolFigures
from ..logs import logger
from .drone import live_drones, release_order

log = logger(__name__)

try:
    from cobald.interfaces import Pool  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("lifecycle.machines.drone_pool needs COBalD: pip install "
                      "'lifecycle-fsm[cobald]'") from exc


class DronePool(Pool):  # type: ignore[misc]
    """COBalD's ``Pool`` over the drones of ``machine`` whose keys start with ``prefix``.

    ``figures`` is the batch system's view of how each drone is used (``allocation``,
    ``utilisation``); ``cores`` what one drone provides (TARDIS: the machine type's
    ``Cores``); ``policy`` the release order (:func:`~lifecycle.machines.drone.release_order`).
    """

    def __init__(self, engine: Any, figures: PoolFigures, *, machine: str = "drone",
                 prefix: str = "pool-", cores: float = 1.0,
                 policy: str = "established_first", actor: str = "cobald",
                 max_drones: int = 10_000, spawn_limit: int = 100) -> None:
        if not (math.isfinite(cores) and cores > 0):
            raise ValueError(f"a drone provides a positive number of cores, not {cores}")
        if max_drones < 1 or spawn_limit < 1:
            raise ValueError(f"max_drones ({max_drones}) and spawn_limit ({spawn_limit}) "
                             "are at least 1")
        self.max_drones = max_drones
        self.spawn_limit = spawn_limit
        self._own = re.compile(re.escape(prefix) + r"(\d+)")
        release_order([], policy)  # an unknown policy is refused now, not at the first release
        self.engine = engine
        self.figures = figures
        self.machine = machine
        self.prefix = prefix
        self.cores = float(cores)
        self.policy = policy
        self.actor = actor
        self._demand = sum(self._demand_of(d) for d in self.wanted())

    # -- the drones ----------------------------------------------------------------------

    def drones(self) -> list[Any]:
        """This pool's drones that are not down (``Resource``s)."""
        return [r for r in live_drones(self.engine, self.machine)
                if self._own.fullmatch(r.key)]

    def wanted(self) -> list[Any]:
        """The drones whose demand is not 0: FactoryPool's children that are not leaving."""
        return [d for d in self.drones() if d.data.get("demand", 1) != 0]

    def _demand_of(self, drone: Any) -> float:
        return self.cores * float(drone.data.get("demand", 1))

    def _supplying(self) -> list[Any]:
        return [d for d in self.wanted() if d.state == "available"]

    def _mean(self, figure: str) -> float:
        supplying = self._supplying()
        if not supplying:
            return 1.0
        refs = [Drone(d.key, d.data.get("remote_id"), d.data) for d in supplying]
        values = getattr(self.figures, figure)(refs)
        return sum(float(values.get(d.key, 0.0)) for d in supplying) / len(supplying)

    # -- cobald.interfaces.Pool ------------------------------------------------------------

    @property
    def supply(self) -> float:
        return self.cores * len(self._supplying())

    @property
    def demand(self) -> float:
        return self._demand

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
        self.adjust()

    @property
    def allocation(self) -> float:
        return self._mean("allocation")

    @property
    def utilisation(self) -> float:
        return self._mean("utilisation")

    # -- FactoryPool's adjustment ------------------------------------------------------------

    def adjust(self) -> dict[str, list[str]]:
        """Spawn drones while the wanted ones ask for less than the demand, or release drones
        (in the release policy's order) while supply exceeds it: FactoryPool's rule. The keys
        created and released."""
        wanted = self.wanted()
        done: dict[str, list[str]] = {"created": [], "released": []}
        if self.cores * sum(1 for d in wanted if d.state == "available") > self._demand:
            excess = sum(self._demand_of(d) for d in wanted) - self._demand
            for drone in release_order(wanted, self.policy):
                if excess <= 0:
                    break
                if self._demand_of(drone) <= excess:
                    excess -= self._demand_of(drone)
                    self.engine.update(f"{self.machine}:{drone.key}", {"demand": 0},
                                       actor=self.actor)
                    done["released"].append(drone.key)
            return done
        missing = self._demand - sum(self._demand_of(d) for d in wanted)
        number = self._last_number()
        while missing > 0 and len(done["created"]) < self.spawn_limit:
            number += 1
            key = f"{self.prefix}{number:05d}"
            self.engine.create(self.machine, key, {"demand": 1}, actor=self.actor)
            done["created"].append(key)
            missing -= self.cores
        return done

    def _last_number(self) -> int:
        numbers = [int(m.group(1)) for r in self.engine.resources(self.machine)
                   if (m := self._own.fullmatch(r.key))]
        return max(numbers, default=0)


__all__: Sequence[str] = ["DronePool"]
