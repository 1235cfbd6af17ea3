"""What a machine that comes as code is: its spec, the guards and handlers it needs, what it
takes from an application's settings, and how it runs with simulated adapters. lifecycle's
own machines and a third party's are the same (entry points of ``lifecycle.machines``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (scenario brings the worker; a spec, pydantic and transitions: a command
    # that reads a resource from the database's own driver needs none of them)
    from ..compiled import GuardContext
    from ..scenario import Simulated
    from ..spec import MachineSpec


@dataclass(frozen=True)
class Builtin:
    """A machine that ships as code, with lifecycle or in any installed package that names
    it in the entry-point group ``lifecycle.machines``."""

    spec: MachineSpec
    guards: Mapping[str, Callable[[GuardContext], bool]] = field(default_factory=dict)
    effects: Mapping[str, Any] = field(default_factory=dict)
    probes: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    simulation: Simulated | None = None
    """``World -> (guards, effects, probes)``: the machine with simulated adapters, for
    scenario files and simulations (see lifecycle.scenario.World)."""
    configure: Callable[[Any], Wiring | None] | None = None
    """``settings -> (effects, probes)``, or None when ``settings`` say nothing about this
    machine: what an application's settings give it beyond plain ``guards``, ``effects`` and
    ``probes`` dicts (the drones' ``drone_site`` and ``drone_batch_system`` give their
    handlers and the ``site`` probe). ``settings`` is any object with attributes: the
    command line gives each module named in $LIFECYCLE_PLUGINS to every machine it loads.
    Raises :class:`~lifecycle.errors.SetupError` on settings it cannot use."""

    migrations: str | None = None
    """The directory of the machine's migration branch, where it keeps tables of its own
    (job_exit's job queue): revision files whose base has ``branch_labels = ("NAME",)``.
    The command line gives every loaded machine's to the store; an application gives them
    itself: ``Store(url, branches=[b.migrations for b in machines if b.migrations])``."""
    commands: tuple[str, ...] = ()
    """Modules (dotted names) whose ``COMMANDS`` (click commands) the command line adds
    when it loads this machine: ``lifecycle tardis``, ``lifecycle queue``. Named, not
    imported, so a machine's module does not import click."""

    def configured(self, settings: Any) -> Wiring:
        """The effects and probes ``settings`` give this machine (none, if they say
        nothing about it)."""
        found = self.configure(settings) if self.configure is not None else None
        return found if found is not None else ({}, {})


Wiring = tuple[Mapping[str, Any], Mapping[str, Any]]
"""A machine's effect handlers and probes, by name, as its settings give them."""
