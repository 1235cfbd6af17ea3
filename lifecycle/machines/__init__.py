"""Built-in machines. Each module declares a spec and the guards and effect handlers it
needs; it uses nothing but lifecycle's public modules."""

from __future__ import annotations

import importlib

from .builtin import Builtin

MODULES = {"batch_job": "batch_job", "drone": "drone", "drone_tardis": "drone",
           "job_exit": "job_exit", "slurm_dispatch": "slurm_dispatch", "startd": "startd"}
"""Each built-in machine's module, so that one machine is loaded without the others (a
command about one resource imports its machine's module alone); a test checks it against
the modules."""


def builtin(name: str) -> Builtin | None:
    """The built-in machine ``name`` (importing its module only), or None."""
    module = MODULES.get(name)
    if module is None:
        return None
    for value in vars(importlib.import_module(f".{module}", __name__)).values():
        if isinstance(value, Builtin) and value.spec.name == name:
            return value
    raise LookupError(f"lifecycle.machines.{module} defines no built-in machine {name!r}")


def builtins() -> dict[str, Builtin]:
    """Every built-in machine, by name."""
    found = {name: builtin(name) for name in MODULES}
    return {name: b for name, b in found.items() if b is not None}


__all__ = ["MODULES", "Builtin", "builtin", "builtins"]
