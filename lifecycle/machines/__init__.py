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


SHIPPED: dict[str, tuple[str, tuple[str, ...]]] = {
    "batch_job": ("df8046e091e5c596", ()),
    "drone": ("f1fdb95c55169c1c", ()),
    "drone_tardis": ("35a639cbb5fc0858", ()),
    "job_exit": ("38d2f0963370d387", ("send_job_notification", "update_job_queue",
                                     "write_output_ad", "write_terminated_event")),
    "slurm_dispatch": ("90af6f9e4a51fe56", ()),
    "startd": ("aced30d9684ebaff", ()),
}
"""Each built-in machine's spec version and the effects it has handlers for, known without
importing it (and pydantic and ``transitions`` with it): ``lifecycle show`` reads the spec
the database stores under that version, which is the code's. A test checks it against the
machines; when a built-in spec changes, the test's message gives the new table."""


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


__all__ = ["MODULES", "SHIPPED", "Builtin", "builtin", "builtins"]
