"""The engine's machines: the registry of specs, each compiled once with the engine's
guards; loaded when first met. Reading a spec (:meth:`MachineRegistry.spec`) and compiling
one (:meth:`MachineRegistry.compiled`) never write; only :meth:`~MachineRegistry.register`
(and ``spec_for`` loading one through it) stores a spec."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import registry
from ..clock import Clock, SystemClock
from ..compiled import CompiledMachine, GuardContext
from ..effects import Effect, Handler, as_effect
from ..errors import SpecError, StrandedResources
from ..freshness import Probe
from ..spec import MachineSpec, SpecSource, load_spec
from ..store import Store
from .checks import argument

Guard = Callable[[GuardContext], bool]
SpecFor = Callable[[str], MachineSpec | None]
"""Given a machine's name, the spec to register for it, or None to run the stored one."""


class MachineRegistry:
    """The engine's state (its store, clock, guards, handlers, probes and settings) and its
    machines. Every other layer of the engine builds on this one."""

    def __init__(
        self,
        store: Store,
        machines: Iterable[SpecSource] = (),
        *,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Handler | Effect] | None = None,
        probes: Mapping[str, Probe] | None = None,
        clock: Clock | None = None,
        probe_timeout: float = 10.0,
        max_attempts: int = 50,
        spec_for: SpecFor | None = None,
        strict: bool = True,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.guards: dict[str, Guard] = dict(guards or {})
        self.handlers: dict[str, Effect] = {name: as_effect(handler)
                                            for name, handler in (effects or {}).items()}
        self.probes: dict[str, Probe] = dict(probes or {})
        self.probe_timeout = probe_timeout
        self.max_attempts = max_attempts
        self.spec_for = spec_for
        self.strict = strict
        self._compiled: dict[str, CompiledMachine] = {}
        self.register_all(machines)

    @property
    def machines(self) -> dict[str, MachineSpec]:
        return {name: compiled.spec for name, compiled in self._compiled.items()}

    def register(self, source: SpecSource) -> MachineSpec:
        """Validate a spec, store it if it is new, and make it the machine's current version.

        A changed spec is refused when live resources are in states it no longer has."""
        return self.register_all([source])[0]

    def register_all(self, sources: Iterable[SpecSource]) -> list[MachineSpec]:
        """:meth:`register` each spec, in order, as one: a database whose machines run these
        specs already (a process starting, again) is read once and written nothing;
        only the others are registered, together. A spec refused (invalid, naming what this
        engine lacks, stranding resources) raises as :meth:`register` of each in turn
        would: the specs before it are registered."""
        valid: list[MachineSpec] = []
        refused: Exception | None = None
        for source in sources:
            try:
                spec = load_spec(source)
                self.check_names(spec)
            except Exception as exc:  # raised once the specs before it are registered
                refused = exc
                break
            valid.append(spec)
        try:
            registry.store_specs(self.store, valid, self.clock.now())
        except StrandedResources as exc:
            before = next(i for i, spec in enumerate(valid)
                          if (spec.name, spec.version) == (exc.machine, exc.version))
            valid, refused = valid[:before], exc
        for spec in valid:
            self._compiled[spec.name] = CompiledMachine(spec, self.guards)
        if refused is not None:
            raise refused
        return valid

    def check_names(self, spec: MachineSpec) -> None:
        """Refuse a spec that names a guard, an effect or a probe this engine lacks."""
        known: dict[str, Mapping[str, Any]] = {"guards": self.guards}
        if self.strict:
            known.update(effects=self.handlers, probes=self.probes)
        problems = spec.unregistered(**known)
        if problems:
            raise SpecError(spec.name, problems)

    def loaded(self, machine: str) -> CompiledMachine | None:
        """The machine compiled, if this engine has met it (no I/O)."""
        return self._compiled.get(machine)

    def compiled(self, machine: str) -> CompiledMachine:
        """The machine, compiled: this engine's, else the one ``spec_for`` gives, else the
        database's current one; refused when it names a guard (an effect, a probe, when
        ``strict``) this engine lacks.

        It writes nothing: a spec that ``spec_for`` gives is compiled here, not stored nor
        kept (:meth:`load` stores it, which a write does outside its transaction, so that a
        fire never stamps a spec version the database does not hold)."""
        compiled = self._compiled.get(machine)
        if compiled is not None:
            return compiled
        argument(machine, "machine name")
        given = self.spec_for(machine) if self.spec_for is not None else None
        if given is None:
            return self.load(machine)  # the stored spec: read, compiled and kept
        spec = load_spec(given)
        self.check_names(spec)
        return CompiledMachine(spec, self.guards)

    def load(self, machine: str) -> CompiledMachine:
        """Make ``machine`` one of this engine's: the spec ``spec_for`` gives, registered
        (stored if new), else the database's current one. What a write does (outside its
        transaction) on meeting a resource of a machine it has not loaded."""
        compiled = self._compiled.get(machine)
        if compiled is not None:
            return compiled
        argument(machine, "machine name")
        given = self.spec_for(machine) if self.spec_for is not None else None
        if given is not None:
            self.register(given)
        else:
            spec = registry.stored_spec(self.store, machine, list(self._compiled))
            self.check_names(spec)
            self._compiled[machine] = CompiledMachine(spec, self.guards)
        return self._compiled[machine]

    def machine_names(self) -> list[str]:
        """Every machine registered with this engine or stored in the database."""
        return sorted({*self._compiled, *registry.stored_names(self.store)})

    def spec(self, machine: str) -> MachineSpec:
        """The machine's spec, to read: the compiled one, else the one ``spec_for`` gives,
        else the database's current one. Reading it needs none of the machine's guards,
        effects or probes (compiling it does: :meth:`compiled`), and writes nothing."""
        compiled = self._compiled.get(machine)
        if compiled is not None:
            return compiled.spec
        argument(machine, "machine name")
        given = self.spec_for(machine) if self.spec_for is not None else None
        if given is not None:
            return load_spec(given)
        return registry.stored_spec(self.store, machine, list(self._compiled))

    def missing_names(self, machine: str) -> dict[str, list[str]]:
        """The guards, effects and probes ``machine`` names that this engine has not loaded
        (empty lists: it can decide and run it all)."""
        spec = self.spec(machine)
        return {"guards": sorted(spec.guard_names() - set(self.guards)),
                "effects": sorted(spec.effect_names() - set(self.handlers)),
                "probes": sorted(spec.probe_names() - set(self.probes))}
