"""Built-in machines. Each module declares a spec and the guards and effect handlers it
needs; it uses nothing but lifecycle's public modules."""

from __future__ import annotations

from .builtin import Builtin


def builtins() -> dict[str, Builtin]:
    """Every built-in machine, by name."""
    from . import batch_job, drone, job_exit, slurm_dispatch, startd

    found = [batch_job.BUILTIN, drone.BUILTIN, drone.TARDIS_BUILTIN, job_exit.BUILTIN,
             slurm_dispatch.BUILTIN, startd.BUILTIN]
    return {b.spec.name: b for b in found}


__all__ = ["Builtin", "builtins"]
