"""One drone's failure costs that drone's observation only: a TARDIS site adapter whose call
raises or hangs for one drone among five answers the other four (the heartbeat's side is in
tests/test_drone.py), a site answer cannot rename a drone, and a malformed one is a
SiteError naming the site and the drone. A COBalD pool owns its own drones only, and its
demand is finite and bounded."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any

import pytest

from lifecycle import Engine, SimulatedClock, Store
from lifecycle.adapters.sites import UNKNOWN, Drone, SiteError
from lifecycle.machines import drone

tardis = pytest.importorskip("lifecycle.adapters.tardis")
from tardis.exceptions.tardisexceptions import (  # type: ignore[import-untyped]  # noqa: E402
    TardisAuthError,
    TardisTimeout,
)
from tardis.interfaces.siteadapter import ResourceStatus  # type: ignore[import-untyped]  # noqa: E402


class Adapter:
    """A site adapter as TARDIS's: coroutines over resource attributes. ``bad`` says what
    each drone's status call does: raise an exception, ``"hang"``, or answer ``answer``."""

    site_name = "Site"

    def __init__(self, bad: Mapping[str, Any] | None = None, answer: Any = None) -> None:
        self.bad = dict(bad or {})
        self.answer = answer

    async def resource_status(self, attributes: Any) -> Any:
        what = self.bad.get(attributes.drone_uuid)
        if what == "hang":
            await asyncio.sleep(3600)
        if isinstance(what, BaseException):
            raise what
        return {"resource_status": ResourceStatus.Running}

    async def deploy_resource(self, attributes: Any) -> Any:
        return self.answer


DRONES = [Drone(f"site-d{i}", f"{100 + i}") for i in range(5)]


@pytest.mark.parametrize("failure", [KeyError("remote_resource_uuid"),
                                     TardisTimeout("no answer"), TardisAuthError("token"),
                                     "hang"], ids=["KeyError", "TardisTimeout",
                                                   "TardisAuthError", "hang"])
def test_one_drones_failure_costs_only_its_own_status(failure: Any) -> None:
    site = tardis.TardisSite(Adapter({"site-d2": failure}), status_timeout=0.5)
    answer = asyncio.run(site.status(DRONES))
    assert answer == {d.name: "Running" for d in DRONES} | {"site-d2": UNKNOWN}


def test_a_site_that_cannot_be_asked_costs_only_its_own_drones_their_status() -> None:
    down = tardis.TardisSite(Adapter({d.name: TardisTimeout("down") for d in DRONES}))
    up = tardis.TardisSite(Adapter())
    sites = tardis.TardisSites({"site-": down, "other-": up})
    others = [Drone(f"other-d{i}", f"{200 + i}") for i in range(2)]
    answer = asyncio.run(sites.status([*DRONES, *others]))
    assert answer == {d.name: UNKNOWN for d in DRONES} | {d.name: "Running" for d in others}
    with pytest.raises(SiteError, match="TardisTimeout"):     # none could be asked
        asyncio.run(tardis.TardisSites({"site-": down}).status(DRONES))


def test_a_site_that_fails_for_every_drone_could_not_be_asked() -> None:
    site = tardis.TardisSite(Adapter({d.name: TardisTimeout("down") for d in DRONES}))
    with pytest.raises(SiteError, match="TardisTimeout"):
        asyncio.run(site.status(DRONES))


@pytest.mark.parametrize("answer,said", [
    ({"remote_resource_uuid": 7, "drone_uuid": "victim"}, "answered drone_uuid 'victim'"),
    ({"remote_resource_uuid": 7, "site_name": "Other"}, "answered site_name 'Other'"),
    (None, "answered NoneType None, not the drone's resource attributes"),
])
def test_a_site_answer_cannot_rename_a_drone_and_a_malformed_one_names_both(
        answer: Any, said: str) -> None:
    site = tardis.TardisSite(Adapter(answer=answer))
    with pytest.raises(SiteError, match=f"deploy of site-d0 at Site: the site adapter {said}"):
        asyncio.run(site.deploy(Drone("site-d0")))


def _pool(store: Store, prefix: str, **options: Any) -> Any:
    pytest.importorskip("cobald")
    from lifecycle.machines.drone_pool import DronePool

    class Figures:
        def allocation(self, drones: Any) -> dict[str, float]:
            return {}

        def utilisation(self, drones: Any) -> dict[str, float]:
            return {}

    engine = Engine(store, [drone.SPEC], guards=drone.GUARDS, strict=False,
                    clock=SimulatedClock("2026-01-01T00:00:00Z"))
    return DronePool(engine, Figures(), prefix=prefix, **options)


def test_pools_with_overlapping_prefixes_keep_to_their_own_drones(store: Store) -> None:
    small, big = _pool(store, "cpu-"), _pool(store, "cpu-big-")
    big.demand = 3
    assert big.drones() == []                   # recorded: FactoryPool adjusts on its interval
    assert big.adjust()["created"] == ["cpu-big-00001", "cpu-big-00002", "cpu-big-00003"]
    assert small.drones() == [] and small.demand == 0
    small.demand = 2
    assert small.adjust()["created"] == ["cpu-00001", "cpu-00002"]
    up = Engine(store, [drone.SPEC], guards=drone.GUARDS, strict=False,
                clock=SimulatedClock("2026-01-01T00:00:00Z"))
    for key in ("cpu-00003", "cpu-big-00004"):  # one more each, already up: they supply
        up.create("drone", key, state="available", data={"demand": 1})
    assert big.refresh().supply == 1.0 and small.refresh().supply == 1.0
    big.demand = 0                              # releases its own, none of the other's
    assert big.adjust()["released"] == ["cpu-big-00004", "cpu-big-00001", "cpu-big-00002",
                                        "cpu-big-00003"]
    assert {d.key: d.data["demand"] for d in small.drones()} == {
        "cpu-00001": 1, "cpu-00002": 1, "cpu-00003": 1}
    small.demand = 2                            # supply 1 is not more: nothing to release
    assert small.adjust() == {"created": [], "released": []}
    assert small.demand == 2 and len(small.wanted()) == 3


@pytest.mark.parametrize("demand", [math.inf, math.nan, -math.inf])
def test_a_demand_that_is_not_a_finite_number_is_refused(store: Store, demand: float) -> None:
    pool = _pool(store, "p-")
    with pytest.raises(ValueError, match="demand must be a finite number"):
        pool.demand = demand
    assert pool.drones() == []


def test_a_huge_demand_is_bounded_and_spawned_a_bounded_number_at_a_time(
        store: Store) -> None:
    pool = _pool(store, "p-", max_drones=50, spawn_limit=20)
    pool.demand = 1e12
    assert pool.demand == 50 and pool.drones() == []          # recorded
    pool.adjust()
    assert len(pool.drones()) == 20                           # one adjustment: 20
    pool.adjust()
    pool.adjust()
    pool.adjust()
    assert len(pool.drones()) == 50                           # and never more than 50


class Pool:
    """A batch-system adapter whose machine status call fails for one drone."""

    async def get_machine_status(self, drone_uuid: str) -> str:
        if drone_uuid == "site-d3":
            raise KeyError(drone_uuid)
        return "Available"


def test_one_drones_failed_machine_status_costs_only_its_own() -> None:
    batch = tardis.TardisBatchSystem(Pool())
    answer = asyncio.run(batch.machine_status(DRONES))
    assert answer == {d.name: "Available" for d in DRONES} | {"site-d3": UNKNOWN}


def test_a_pool_numbers_on_past_a_key_another_process_took(store: Store) -> None:
    first, second = _pool(store, "p-"), _pool(store, "p-")   # two daemons, one prefix
    first.demand = 2
    assert first.adjust()["created"] == ["p-00001", "p-00002"]
    second.demand = 3
    assert second.adjust()["created"] == ["p-00003"]        # it read where the pool was
    first.demand = 4                                        # its own count says p-00003 next
    assert first.adjust()["created"] == ["p-00004"]
