"""What a machine that comes as code is: its spec, the guards and handlers it needs, what it
takes from an application's settings, and how it runs with simulated adapters. lifecycle's
own machines and a third party's are the same (entry points of ``lifecycle.machines``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import Console

    # that reads a resource from the database's own driver needs none of them)
    from ..compiled import GuardContext
    from ..engine import Engine
    from ..scenario import Simulated
    from ..spec import MachineSpec
    from ..store import (
        Store,  # (scenario brings the worker; a spec, pydantic and transitions: a command
    )

F = TypeVar("F", bound=Callable[..., Any])


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

    def configured(self, settings: Any) -> Wiring:
        """The effects and probes ``settings`` give this machine (none, if they say
        nothing about it)."""
        found = self.configure(settings) if self.configure is not None else None
        return found if found is not None else ({}, {})


Wiring = tuple[Mapping[str, Any], Mapping[str, Any]]
"""A machine's effect handlers and probes, by name, as its settings give them."""


class CommandLine(Protocol):
    """What the command line gives a machine's own commands (``lifecycle.cli.kit``). A
    package names each of its machines' commands in the entry-point group
    ``lifecycle.commands`` (the entry point's name is the command's, its value a function
    ``(CommandLine) -> click.Command``); the command line makes it when it is run or its help
    is read, so the function and its module's top level import no more than click."""

    out: Console
    err: Console

    def db_option(self, f: F) -> F:
        """The ``--db URL`` option (``db_url``)."""
        ...

    def json_option(self, f: F) -> F:
        """The ``--json`` flag (``as_json``)."""
        ...

    def make_engine(self, db_url: str | None, *, upgrade: bool = False,
                    machines: Iterable[str] | None = None) -> Engine:
        """The command line's engine, with what $LIFECYCLE_PLUGINS adds and configures."""
        ...

    def open_store(self, db_url: str | None, *, check: bool = True) -> Store:
        """The command's database, closed when the command ends."""
        ...

    def plugins(self) -> list[Any]:
        """The modules $LIFECYCLE_PLUGINS names."""
        ...
