"""The world models of the built-in machines, by machine name: each module's ``MODELS``
maps a machine to a function that makes its :class:`~lifecycle.check.explore.Model`."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..explore import Model

MODULES = {"drone": "drone", "drone_tardis": "drone", "startd": "startd",
           "startd_without_cd": "startd", "slurm_dispatch": "slurm_dispatch",
           "slurm_dispatch_arvados": "slurm_dispatch", "job_exit": "job_exit",
           "job_exit_without_outbox": "job_exit"}


def world_model(machine: str) -> Model | None:
    """The model of built-in ``machine``'s world (importing its module only), or None."""
    module = MODULES.get(machine)
    if module is None:
        return None
    made: dict[str, Callable[[], Model]] = importlib.import_module(
        f".{module}", __name__).MODELS
    return made[machine]()
