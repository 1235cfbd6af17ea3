"""TARDIS's Slurm and HTCondor site adapters with a true fence: a terminate that removes the
drone's job only while the job is still in the status the decision saw.

A TARDIS site adapter's ``terminate_resource`` removes the job whatever it is doing, so
:class:`~lifecycle.adapters.tardis.TardisSite` can only ask for the status again first (a
re-check: a job that starts between that answer and the removal is still removed). These
two subclasses add ``terminate_resource_if(attributes, expect)``, which ``TardisSite`` uses
when the adapter has it; everything else is TARDIS's adapter, unchanged, its commands run by
the site's own executor (a shell, or SSH):

- :class:`FencedSlurmAdapter`: lifecycle's own Slurm fence (``SlurmSite.terminate``):
  ``scontrol hold``, then ``scancel --state=PENDING``, and ``scontrol release`` when the job
  had started; ``--state=RUNNING`` or ``SUSPENDED`` for the other statuses.
- :class:`FencedHTCondorAdapter`: ``condor_rm -constraint 'ClusterId == C && ProcId == P &&
  JobStatus == S'``: the schedd evaluates the constraint and removes the job in one step, so
  a job that left status S is not removed.

A TARDIS configuration that names ``adapter: Slurm`` or ``adapter: HTCondor`` gets these
(``lifecycle.adapters.tardis.configured``); other adapters keep the re-check.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

with warnings.catch_warnings():  # its configuration model is pydantic 1 style: not ours
    warnings.simplefilter("ignore", DeprecationWarning)
    from tardis.adapters.sites.htcondor import (  # type: ignore[import-untyped]
        HTCondorAdapter,
    )
    from tardis.adapters.sites.slurm import SlurmAdapter  # type: ignore[import-untyped]
    from tardis.exceptions.executorexceptions import (  # type: ignore[import-untyped]
        CommandExecutionFailure,
    )

from ..logs import logger
from .sites import BOOTING, DELETED, ERROR, RUNNING, STOPPED, Drone, Terminated
from .slurm import Runner, SlurmSite

log = logger(__name__)


def through_executor(executor: Any, loop: asyncio.AbstractEventLoop) -> Runner:
    """A :class:`SlurmSite` runner that runs each command with a TARDIS executor on
    ``loop``, from the thread the fenced terminate runs in."""
    def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None
            ) -> subprocess.CompletedProcess[str]:
        future = asyncio.run_coroutine_threadsafe(executor.run_command(shlex.join(argv)), loop)
        try:
            done = future.result(timeout)
        except CommandExecutionFailure as exc:
            code = exc.exit_code if exc.exit_code is not None else 1
            return subprocess.CompletedProcess(list(argv), code, exc.stdout or "",
                                               exc.stderr or "")
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise subprocess.TimeoutExpired(list(argv), timeout) from None
        return subprocess.CompletedProcess(list(argv), done.exit_code or 0,
                                           done.stdout or "", done.stderr or "")
    return run


class FencedSlurmAdapter(SlurmAdapter):  # type: ignore[misc]
    """TARDIS's ``SlurmAdapter``, with lifecycle's fenced terminate."""

    async def terminate_resource_if(self, resource_attributes: Any,
                                    expect: str) -> Terminated:
        site = SlurmSite(wrap="", runner=through_executor(self._executor,
                                                          asyncio.get_running_loop()))
        drone = Drone(str(resource_attributes.drone_uuid),
                      str(resource_attributes.remote_resource_uuid))
        return await asyncio.to_thread(site.terminate, drone, expect)


JOB_STATUS = {BOOTING: "JobStatus == 1", RUNNING: "(JobStatus == 2 || JobStatus == 6)",
              STOPPED: "JobStatus == 7", ERROR: "JobStatus == 5"}
"""The JobStatus values of each ResourceStatus, as TARDIS's HTCondor site reads them (3,
Removed, which TARDIS counts as Running, is left out: a job being removed needs no other
removal)."""


class FencedHTCondorAdapter(HTCondorAdapter):  # type: ignore[misc]
    """TARDIS's HTCondor site ``HTCondorAdapter``, with a fenced terminate."""

    async def terminate_resource_if(self, resource_attributes: Any,
                                    expect: str) -> Terminated:
        job = str(resource_attributes.remote_resource_uuid)
        if expect == DELETED:
            return Terminated(False, f"job {job} was expected gone: nothing to remove")
        cluster, _, proc = job.partition(".")
        constraint = (f"ClusterId == {int(cluster)} && ProcId == {int(proc or 0)} && "
                      f"{JOB_STATUS[expect]}")
        command = shlex.join(["condor_rm", "-constraint", constraint])
        try:
            await self._executor.run_command(command)
        except CommandExecutionFailure as exc:
            if exc.exit_code == 1 and "matching constraint" in (exc.stderr or ""):
                why = f"job {job} is no longer {expect} ({JOB_STATUS[expect]}): left alone"
                log.info("drone %s: %s", resource_attributes.drone_uuid, why)
                return Terminated(False, why)
            raise
        return Terminated(True, f"job {job} removed while {JOB_STATUS[expect]}")


FENCED = {"Slurm": FencedSlurmAdapter, "HTCondor": FencedHTCondorAdapter}
"""The site adapters (a TARDIS configuration's ``adapter`` names) that get a true fence."""

__all__ = ["FENCED", "JOB_STATUS", "FencedHTCondorAdapter", "FencedSlurmAdapter",
           "through_executor"]
