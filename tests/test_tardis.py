"""The drone machine driven through TARDIS's own adapters (cobald-tardis): its
FakeSiteAdapter and FakeBatchSystemAdapter, configured as TARDIS configures them, under the
AsyncEngine and AsyncWorker (and the sync Engine and Worker, which run the same coroutine
handlers in their threads); TARDIS's exceptions as lifecycle's outcomes."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("lifecycle.adapters.tardis",
                    reason="cobald-tardis is not installed (make installs it)")

from tardis.adapters.batchsystems.fakebatchsystem import (
    FakeBatchSystemAdapter,
)
from tardis.adapters.sites.fakesite import FakeSiteAdapter
from tardis.configuration.configuration import Configuration
from tardis.exceptions.tardisexceptions import (
    TardisAuthError,
    TardisDroneCrashed,
    TardisResourceStatusUpdateFailed,
)
from tardis.interfaces.siteadapter import ResourceStatus
from tardis.utilities.simulators.randomgauss import RandomGauss

from lifecycle import (
    AsyncEngine,
    AsyncWorker,
    Engine,
    SimulatedClock,
    Store,
    Worker,
)
from lifecycle.adapters.sites import Drone
from lifecycle.adapters.tardis import (
    TardisBatchSystem,
    TardisSite,
    TardisSiteError,
    from_configuration,
)
from lifecycle.machines import drone
from lifecycle.machines.drone_sim import ScenarioBatch
from lifecycle.queries import resource_id
from lifecycle.results import DONE
from lifecycle.scenario import World
from lifecycle.store.statements import effects as effect_rows

WAIT = 60.0
# TARDIS's site configuration model is pydantic 1 style, which pydantic 2 warns about
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def fixed(value: float) -> Any:
    return RandomGauss(mu=value, sigma=0)


@pytest.fixture
def tardis_config() -> Iterator[None]:
    """TARDIS's configuration (a process-wide Borg) of two fake sites: one whose jobs run
    at once, one whose jobs boot for an hour; and a fake pool where machines are
    Available."""
    Configuration().update_config({
        "Sites": [{"name": "Quick", "adapter": "FakeSite", "quota": 10},
                  {"name": "Slow", "adapter": "FakeSite", "quota": 10,
                   "drone_minimum_lifetime": 3600}],
        "Quick": {"api_response_delay": fixed(0), "resource_boot_time": fixed(0),
                  "MachineTypes": ["one"], "MachineMetaData": {"one": {
                      "Cores": 1, "Memory": 1, "Disk": 1}}},
        "Slow": {"api_response_delay": fixed(0), "resource_boot_time": fixed(3600),
                 "MachineTypes": ["one"], "MachineMetaData": {"one": {
                     "Cores": 1, "Memory": 1, "Disk": 1}}},
        "BatchSystem": {"adapter": "FakeBatchSystem", "allocation": 1.0,
                        "utilisation": 1.0, "machine_status": "Available"},
    })
    yield


def adapters(site_name: str) -> tuple[TardisSite, TardisBatchSystem]:
    batch = TardisBatchSystem(FakeBatchSystemAdapter())
    return (TardisSite(FakeSiteAdapter(machine_type="one", site_name=site_name),
                       translation=batch.translation), batch)


def async_engine(store: Store, site: Any, batch: Any, **options: Any) -> AsyncEngine:
    return AsyncEngine(store, [drone.SPEC], guards=drone.GUARDS,
                       effects=drone.effects(site, batch),
                       probes={"site": drone.probe(site, batch)}, **options)


def test_a_drone_lives_its_whole_life_through_tardis_fake_adapters(
        store: Store, tardis_config: None) -> None:
    site, batch = adapters("Quick")
    engine = async_engine(store, site, batch)
    worker = AsyncWorker(engine, concurrency=4)

    async def beat() -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            await worker.run_until_idle()
            report = await drone.reconcile_async(engine, site, batch)
            await worker.run_until_idle()
            return report

    async def main() -> list[str]:
        await engine.create("drone", "quick-0001")
        states = []
        for _ in range(3):  # deploy; Running: integrate; Available
            await beat()
            states.append((await engine.get("quick-0001")).state)
        await engine.update("quick-0001", {"demand": 0})
        for _ in range(6):  # drain; Drained: disintegrate; stop; Stopped: cleanup; down
            await beat()
            states.append((await engine.get("quick-0001")).state)
        return states

    states = asyncio.run(main())
    assert states[2] == "available" and states[-1] == "down"
    path = [e.dest for e in engine.engine.history("quick-0001") if e.kind != "update"]
    assert path == ["request", "booting", "integrate", "integrating", "available", "drain",
                    "draining", "disintegrate", "shutdown", "shutdown", "shutting_down",
                    "cleanup", "down", "down"]
    resource = engine.engine.get("quick-0001")
    assert resource.data["demand"] == 0 and resource.data["remote_id"]
    assert site.attributes["quick-0001"].resource_status is ResourceStatus.Deleted
    assert engine.engine.verify() == []


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_the_boot_race_through_tardis_fake_adapters(store: Store, tardis_config: None,
                                                   kind: str) -> None:
    """A released drone still booting is removed on a fresh Booting (its terminate checked
    first); one whose job started meanwhile is kept and goes on to integrate."""
    slow_site, slow_batch = adapters("Slow")
    quick_site, quick_batch = adapters("Quick")
    slow = Engine(store, [drone.SPEC], guards=drone.GUARDS,
                  effects=drone.effects(slow_site, slow_batch),
                  probes={"site": drone.probe(slow_site, slow_batch)})
    quick = Engine(Store(store.url), [drone.SPEC], guards=drone.GUARDS,
                   effects=drone.effects(quick_site, quick_batch),
                   probes={"site": drone.probe(quick_site, quick_batch)})
    try:
        for engine, key in ((slow, "slow-0001"), (quick, "quick-0001")):
            engine.create("drone", key)
            if kind == "sync":
                Worker(engine).run_until_idle()  # the deploy
                engine.update(key, {"demand": 0})
                engine.step(key, on_stale="return")  # asks the site: a fresh status
                Worker(engine).run_until_idle()
            else:
                aengine = AsyncEngine.over(engine)

                async def release(aengine: AsyncEngine = aengine, key: str = key) -> None:
                    async with asyncio.timeout(WAIT):
                        await AsyncWorker(aengine).run_until_idle()
                        await aengine.update(key, {"demand": 0})
                        await aengine.step(key, on_stale="return")
                        await AsyncWorker(aengine).run_until_idle()

                asyncio.run(release())
        removed, kept = slow.get("slow-0001"), quick.get("quick-0001")
        assert removed.state == "cleanup" and removed.data["minimum_lifetime"] == 3600
        [terminate] = [e for e in slow.history("slow-0001") if e.dest == "cleanup"]
        assert terminate.fence is not None
        assert terminate.fence["expect"]["resource_status"] == "Booting"
        assert slow_site.attributes["slow-0001"].resource_status is ResourceStatus.Deleted
        assert kept.state == "integrating"  # the fresh Running: integrated, not removed
        assert quick_site.attributes["quick-0001"].resource_status is ResourceStatus.Running
    finally:
        quick.store.dispose()


def test_a_tardis_configuration_gives_a_site_per_site_and_machine_type(
        tmp_path: Any) -> None:
    path = tmp_path / "tardis.yml"
    path.write_text("""\
Sites:
  - {name: Quick, adapter: FakeSite, quota: 10}
  - {name: Slow, adapter: FakeSite, quota: 10, drone_minimum_lifetime: 600}
Quick:
  api_response_delay: !RandomGauss {mu: 0, sigma: 0}
  resource_boot_time: !RandomGauss {mu: 0, sigma: 0}
  MachineTypes: [small, large]
  MachineMetaData: {small: {Cores: 1, Memory: 1, Disk: 1}, large: {Cores: 8, Memory: 16, Disk: 1}}
Slow:
  api_response_delay: !RandomGauss {mu: 0, sigma: 0}
  resource_boot_time: !RandomGauss {mu: 3600, sigma: 0}
  MachineTypes: [small]
  MachineMetaData: {small: {Cores: 1, Memory: 1, Disk: 1}}
BatchSystem: {adapter: FakeBatchSystem, allocation: 1.0, utilisation: 1.0,
              machine_status: Available}
""")
    sites, batch = from_configuration(path)
    assert sites.prefixes == ["quick-large-", "quick-small-", "slow-small-"]
    large = sites.site_of(Drone("quick-large-7"))
    assert (large.name, large.adapter.machine_type) == ("Quick", "large")
    assert sites.site_of(Drone("slow-small-1")).drone_minimum_lifetime == 600
    assert sites.drone_minimum_lifetime is None  # the sites differ: none is copied
    with pytest.raises(TardisSiteError, match="starts with none of the configured sites"):
        sites.site_of(Drone("elsewhere-1"))

    async def deploy_and_ask() -> dict[str, str]:
        drones = [Drone(name, await sites.deploy(Drone(name)), {})
                  for name in ("quick-small-1", "slow-small-1")]
        return await sites.status(drones)

    assert asyncio.run(deploy_and_ask()) == {"quick-small-1": "Running",
                                              "slow-small-1": "Booting"}
    assert batch.translation == {"Cores": 1, "Memory": 1, "Disk": 1}  # the fake pool's
    path.write_text("Sites: []\nBatchSystem: {adapter: NoSuchSystem}\n")
    with pytest.raises(TardisSiteError, match="no batchsystem adapter 'NoSuchSystem'"):
        from_configuration(path)


class Troubled:
    """A TARDIS-style site adapter whose calls raise TARDIS's exceptions, in turn."""

    site_name = "troubled"

    def __init__(self) -> None:
        self.deploys: list[type[Exception]] = []
        self.status_failure: type[Exception] | None = None
        self.status = ResourceStatus.Booting
        self.terminated: list[Any] = []

    async def deploy_resource(self, attributes: Any) -> dict[str, Any]:
        if self.deploys:
            raise self.deploys.pop(0)("from the test")
        return {"remote_resource_uuid": 42, "resource_status": ResourceStatus.Booting}

    async def resource_status(self, attributes: Any) -> dict[str, Any]:
        if self.status_failure is not None:
            raise self.status_failure()
        return {"resource_status": self.status}

    async def stop_resource(self, attributes: Any) -> None:
        return None

    async def terminate_resource(self, attributes: Any) -> None:
        self.terminated.append(attributes.remote_resource_uuid)


def test_tardis_exceptions_become_lifecycle_outcomes(store: Store) -> None:
    adapter = Troubled()
    site, batch = TardisSite(adapter), ScenarioBatch(World())
    clock = SimulatedClock(dt.datetime.now(dt.UTC).isoformat())
    engine = async_engine(store, site, batch, clock=clock)

    async def main() -> None:
        worker = AsyncWorker(engine)
        # an auth error is a site error: the deploy is retried (then deployed)
        adapter.deploys = [TardisAuthError]
        await engine.create("drone", "d1")
        assert (await worker.run_until_idle()).retried == 1
        clock.advance(60)
        await worker.run_until_idle()
        assert (await engine.get("d1")).data["remote_id"] == "42"
        # a drone that crashed while deployed goes to cleanup
        adapter.deploys = [TardisDroneCrashed]
        await engine.create("drone", "d2")
        await worker.run_until_idle()
        assert (await engine.get("d2")).state == "cleanup"
        # a status that cannot be had is no observation: nothing moves
        adapter.status_failure = TardisResourceStatusUpdateFailed
        report = await drone.reconcile_async(engine, site, batch)
        assert "TardisResourceStatusUpdateFailed" in report["site_error"]
        assert (await engine.get("d1")).observation is None
        # and a probe that fails refuses the risky edge
        await engine.update("d1", {"demand": 0})
        refused = await engine.step("d1", on_stale="return")
        assert refused.error == "StaleObservation" and "TardisSiteError" in refused.reason
        # a terminate whose job moved on since the status it rests on is left alone
        adapter.status_failure = None
        removed = await engine.step("d1")
        assert removed.dest == "cleanup"
        adapter.status = ResourceStatus.Running
        await worker.run_until_idle()
        assert adapter.terminated == []

    asyncio.run(main())
    [terminate] = [r for r in drone_effects(engine, "d1") if r[0] == "terminate"]
    assert terminate[1]["acted"] is False and "Running now, not Booting" in terminate[1]["detail"]


def drone_effects(engine: Engine | AsyncEngine, key: str, *,
                  done: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The drone's effects in order (``done``: only those carried out), each its name and
    what its handler saved."""
    with engine.store.read() as db:
        rid, _ = resource_id(db, key)
        rows = effect_rows.of_resource(db, rid)
    return [(row.name, engine.store.json_value(row.progress) or {}) for row in rows
            if not done or row.status == DONE]


# -- TARDIS's real SlurmAdapter against the real single-node Slurm of tests/slurm_cluster.py


@pytest.fixture
def slurm_site(cluster: Any, tardis_config: None,
               monkeypatch: pytest.MonkeyPatch) -> tuple[TardisSite, TardisBatchSystem]:
    """TARDIS's SlurmAdapter, configured as a TARDIS site configuration says, submitting
    held jobs (they stay PENDING, Booting, until the test releases them)."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # TARDIS's ShellExecutor inherits it
    script = cluster.directory / "drone.sh"
    script.write_text("#!/bin/sh\nexec sleep 300\n")
    script.chmod(0o755)
    Configuration().update_config({
        "Sites": [{"name": "Cluster", "adapter": "Slurm", "quota": 10}],
        "Cluster": {
            "MachineTypes": ["one"], "bulk_size": 50, "bulk_delay": 0.01,
            "MachineTypeConfiguration": {"one": {
                "Partition": "debug", "Walltime": 60, "StartupCommand": str(script),
                "SubmitOptions": {"long": {"hold": None, "chdir": str(cluster.directory),
                                           "output": f"{cluster.directory}/log/job-%j.out"}},
            }},
            "MachineMetaData": {"one": {"Cores": 1, "Memory": 0.1, "Disk": 1}},
        },
    })
    from tardis.adapters.sites.slurm import SlurmAdapter

    batch = TardisBatchSystem(FakeBatchSystemAdapter())
    return TardisSite(SlurmAdapter(machine_type="one", site_name="Cluster"),
                      translation=batch.translation), batch


def test_tardis_slurm_adapter_a_booting_drone_is_removed_one_that_started_is_kept(
        store: Store, cluster: Any, slurm_site: tuple[TardisSite, TardisBatchSystem]) -> None:
    site, batch = slurm_site
    engine = async_engine(store, site, batch)

    async def main() -> None:
        worker = AsyncWorker(engine, concurrency=2)
        async with asyncio.timeout(WAIT):
            for key in ("cluster-booting", "cluster-started", "cluster-meanwhile"):
                await engine.create("drone", key)
            await worker.run_until_idle()  # three sbatch --hold: PENDING
            ids = {key: (await engine.get(key)).data["remote_id"]
                   for key in ("cluster-booting", "cluster-started", "cluster-meanwhile")}
            for job in ids.values():
                assert cluster.job_state(job) == "PENDING"
            # the pool lets all three go; one job started before the decision, one after
            cluster.run("scontrol", "release", ids["cluster-started"])
            await asyncio.to_thread(cluster.wait_for_state, ids["cluster-started"], "RUNNING")
            for key in ids:
                await engine.update(key, {"demand": 0})
            # each step asks TARDIS's adapter for a fresh status (squeue)
            booting = await engine.step("cluster-booting")
            started = await engine.step("cluster-started")
            meanwhile = await engine.step("cluster-meanwhile")
            assert (booting.dest, booting.probed) == ("cleanup", True)
            assert (started.dest, started.probed) == ("integrate", True)
            assert meanwhile.dest == "cleanup"
            # the third job starts between its fresh Booting and the terminate
            cluster.run("scontrol", "release", ids["cluster-meanwhile"])
            await asyncio.to_thread(cluster.wait_for_state, ids["cluster-meanwhile"],
                                    "RUNNING")
            await worker.run_until_idle()  # terminate x2, integrate
        assert cluster.job_state(ids["cluster-booting"]) in ("CANCELLED", "")
        assert cluster.job_state(ids["cluster-started"]) == "RUNNING"
        assert cluster.job_state(ids["cluster-meanwhile"]) == "RUNNING"  # checked, spared
        assert (await engine.get("cluster-started")).state == "integrating"

    asyncio.run(main())
    done = {key: dict(drone_effects(engine, key)).get("terminate")
            for key in ("cluster-booting", "cluster-meanwhile")}
    assert done["cluster-booting"] == {"acted": True, "detail": "terminated (checked, not fenced)"}
    assert done["cluster-meanwhile"]["acted"] is False
    assert "Running now, not Booting" in done["cluster-meanwhile"]["detail"]


class StartsFirst:
    """TARDIS's ShellExecutor, except that the job ``starting`` starts (is released, and
    runs) right before the first command that would remove it: the moment a re-check cannot
    see and a fence is for."""

    def __init__(self, cluster: Any, removing: str) -> None:
        from tardis.utilities.executors.shellexecutor import ShellExecutor

        self.shell = ShellExecutor()
        self.cluster = cluster
        self.removing = removing
        self.starting: str | None = None
        self.commands: list[str] = []

    async def run_command(self, command: str, stdin_input: str | None = None) -> Any:
        self.commands.append(command)
        job = self.starting
        if job is not None and command.startswith(self.removing) and job in command:
            self.starting = None
            await asyncio.to_thread(self.cluster.run, "scontrol", "release", job)
            await asyncio.to_thread(self.cluster.wait_for_state, job, "RUNNING")
        return await self.shell.run_command(command, stdin_input)


@pytest.mark.parametrize("fenced", [False, True], ids=["re-check", "fence"])
def test_a_job_that_starts_between_the_last_status_and_the_removal_keeps_its_drone_only_fenced(
        store: Store, cluster: Any, tardis_config: None, monkeypatch: pytest.MonkeyPatch,
        fenced: bool) -> None:
    """TARDIS's SlurmAdapter (a re-check) and lifecycle's FencedSlurmAdapter, on the real
    Slurm: the drone is released while its job is pending, its fresh status says Booting,
    and the job starts just before the command that removes it."""
    from tardis.adapters.sites.slurm import SlurmAdapter

    from lifecycle.adapters.tardis_fences import FencedSlurmAdapter

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    script = cluster.directory / "drone.sh"
    script.write_text("#!/bin/sh\nexec sleep 300\n")
    script.chmod(0o755)
    # the fence holds the job first: the job starts before that, the hold then changes
    # nothing, and scancel --state=PENDING finds it running; the re-check's scancel kills it
    executor = StartsFirst(cluster, "scontrol hold" if fenced else "scancel")
    Configuration().update_config({
        "Sites": [{"name": "Cluster", "adapter": "Slurm", "quota": 10}],
        "Cluster": {
            "MachineTypes": ["one"], "bulk_size": 50, "bulk_delay": 0.01, "executor": executor,
            "MachineTypeConfiguration": {"one": {
                "Partition": "debug", "Walltime": 60, "StartupCommand": str(script),
                "SubmitOptions": {"long": {"hold": None, "chdir": str(cluster.directory),
                                           "output": f"{cluster.directory}/log/job-%j.out"}},
            }},
            "MachineMetaData": {"one": {"Cores": 1, "Memory": 0.1, "Disk": 1}},
        },
    })
    adapter = (FencedSlurmAdapter if fenced else SlurmAdapter)(machine_type="one",
                                                              site_name="Cluster")
    batch = TardisBatchSystem(FakeBatchSystemAdapter())
    site = TardisSite(adapter, translation=batch.translation)
    engine = async_engine(store, site, batch)

    async def main() -> str:
        async with asyncio.timeout(WAIT):
            await engine.create("drone", "cluster-late")
            await AsyncWorker(engine).run_until_idle()              # sbatch --hold
            job = (await engine.get("cluster-late")).data["remote_id"]
            await engine.update("cluster-late", {"demand": 0})
            assert (await engine.step("cluster-late")).dest == "cleanup"   # fresh Booting
            executor.starting = job
            await AsyncWorker(engine).run_until_idle()              # the terminate
            assert executor.starting is None                        # it did start first
            return str(job)

    job = asyncio.run(main())
    [outcome] = [p for name, p in drone_effects(engine, "cluster-late") if name == "terminate"]
    if fenced:
        assert cluster.job_state(job) == "RUNNING"                  # kept: the fence held
        assert outcome["acted"] is False and "not PENDING: left alone" in outcome["detail"]
        assert any(c.startswith("scancel -v --state=PENDING") for c in executor.commands)
    else:
        # the re-check's hole: killed (COMPLETING while slurmd ends it, under load a while)
        assert cluster.wait_for_state(job, "CANCELLED", "") in ("CANCELLED", "")
        assert outcome == {"acted": True, "detail": "terminated (checked, not fenced)"}
