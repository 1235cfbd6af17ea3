"""The fenced terminate through TARDIS's HTCondor site adapter (``FencedHTCondorAdapter``),
tested as TARDIS tests its own HTCondor site adapter: with its executor replaced. The
replacement plays the schedd: it keeps job ads and runs ``condor_rm -constraint``, the
constraint evaluated by HTCondor's own ClassAd library, answering as condor_rm does. (The
Slurm one runs against the real Slurm: tests/test_tardis.py.)"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("lifecycle.adapters.tardis",
                    reason="cobald-tardis is not installed (make installs it)")
pytest.importorskip("classad2", reason="HTCondor's ClassAd library (the htcondor extra)")

import classad2
from tardis.configuration.configuration import Configuration
from tardis.exceptions.executorexceptions import CommandExecutionFailure
from tardis.utilities.attributedict import AttributeDict

from lifecycle.adapters.sites import BOOTING, DELETED, RUNNING, Drone
from lifecycle.adapters.tardis import TardisSite, configured
from lifecycle.adapters.tardis_fences import FencedHTCondorAdapter, FencedSlurmAdapter

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Schedd:
    """An executor that answers condor_rm -constraint over its job ads; ``before_rm`` runs
    first (a job that starts just then)."""

    def __init__(self, **jobs: int) -> None:
        self.ads = {job: classad2.ClassAd({"ClusterId": int(job.split(".")[0]),
                                           "ProcId": int(job.split(".")[1]),
                                           "JobStatus": status})
                    for job, status in jobs.items()}
        self.commands: list[list[str]] = []
        self.before_rm: Any = None

    async def run_command(self, command: str, stdin_input: str | None = None) -> Any:
        argv = shlex.split(command)
        self.commands.append(argv)
        assert argv[:2] == ["condor_rm", "-constraint"] and len(argv) == 3, argv
        if self.before_rm is not None:
            self.before_rm()
        constraint = classad2.ExprTree(argv[2])
        matched = [job for job, ad in self.ads.items() if constraint.eval(ad) is True]
        if not matched:
            raise CommandExecutionFailure(
                message=f"Run command {command} via ShellExecutor failed", exit_code=1,
                stdout="", stderr=f"Couldn't find/remove all jobs matching constraint "
                                  f"({argv[2]})")
        for job in matched:
            self.ads[job]["JobStatus"] = 3
        return AttributeDict(stdout=f"All jobs matching constraint ({argv[2]}) have been "
                                    "marked for removal", stderr="", exit_code=0)


@pytest.fixture
def schedd() -> Iterator[Schedd]:
    found = Schedd(**{"1351043.0": 1, "1351044.0": 1, "1351045.0": 2})
    Configuration().update_config({
        "Sites": [{"name": "Pool", "adapter": "HTCondor", "quota": 10}],
        "Pool": {"MachineTypes": ["big"], "executor": found, "bulk_size": 100,
                 "bulk_delay": 0.01, "max_age": 10,
                 "MachineTypeConfiguration": {"big": {"jdl": "submit.jdl"}},
                 "MachineMetaData": {"big": {"Cores": 8, "Memory": 32, "Disk": 160}}},
        "BatchSystem": {"adapter": "FakeBatchSystem", "allocation": 1.0,
                        "utilisation": 1.0, "machine_status": "Available"},
    })
    yield found


def terminate(site: TardisSite, job: str, expect: str | None) -> Any:
    return asyncio.run(site.terminate(Drone(f"pool-big-{job}", job, {}), expect))


def test_a_configured_htcondor_or_slurm_site_gets_the_fenced_adapter(schedd: Schedd) -> None:
    [pool], _ = configured()
    assert type(pool.adapter.adapter) is FencedHTCondorAdapter
    assert pool.adapter.adapter._executor is schedd
    Configuration().update_config({"Sites": [{"name": "Cluster", "adapter": "Slurm"}],
                                   "Cluster": {"MachineTypes": ["one"], "MachineMetaData": {
                                       "one": {"Cores": 1, "Memory": 1, "Disk": 1}},
                                       "MachineTypeConfiguration": {"one": {
                                           "Partition": "debug", "Walltime": 60,
                                           "StartupCommand": "drone.sh"}}}})
    [cluster], _ = configured()
    assert type(cluster.adapter.adapter) is FencedSlurmAdapter


def test_condor_rm_removes_an_idle_job_and_leaves_one_that_started(schedd: Schedd) -> None:
    [pool], _ = configured()
    site = pool.adapter
    removed = terminate(site, "1351043.0", BOOTING)
    assert removed.acted and schedd.ads["1351043.0"]["JobStatus"] == 3
    assert schedd.commands[-1] == ["condor_rm", "-constraint",
                                   "ClusterId == 1351043 && ProcId == 0 && JobStatus == 1"]
    # the job starts in the moment between the last status and the removal
    schedd.before_rm = lambda: schedd.ads["1351044.0"].update({"JobStatus": 2})
    kept = terminate(site, "1351044.0", BOOTING)
    assert not kept.acted and "no longer Booting (JobStatus == 1): left alone" in kept.detail
    assert schedd.ads["1351044.0"]["JobStatus"] == 2                  # still running
    schedd.before_rm = None
    assert terminate(site, "1351045.0", RUNNING).acted                 # fenced on Running
    assert not terminate(site, "1351045.0", DELETED).acted             # nothing to remove
    assert len(schedd.commands) == 3


def test_a_failing_condor_rm_is_a_site_error(schedd: Schedd) -> None:
    from lifecycle.adapters.sites import SiteError

    [pool], _ = configured()

    async def broken(command: str, stdin_input: str | None = None) -> Any:
        raise CommandExecutionFailure(message="failed", exit_code=2, stdout="",
                                      stderr="Failed to connect to the schedd")

    schedd.run_command = broken  # type: ignore[method-assign]
    with pytest.raises(SiteError, match=r"terminate pool-big-1351043\.0 at Pool"):
        terminate(pool.adapter, "1351043.0", BOOTING)
