"""TARDIS's own site and batch-system adapters as the drone machine's site and batch system.

TARDIS (the ``cobald-tardis`` package) reaches each site through a *site adapter* (Slurm,
HTCondor, OpenStack, Kubernetes, ...: ``deploy_resource``, ``resource_status``,
``stop_resource``, ``terminate_resource``) and the overlay pool through a *batch-system
adapter* (``integrate_machine``, ``drain_machine``, ``disintegrate_machine``,
``get_machine_status``, ``get_allocation``, ``get_utilisation``), all coroutines.
:class:`TardisSite` and :class:`TardisBatchSystem` wrap such adapter objects, unchanged, as
the :class:`~lifecycle.adapters.sites.Site` and ``BatchSystem`` of the ``drone`` machine, with
coroutine methods: the drone's effects and probe await them (on an
:class:`~lifecycle.aio.AsyncEngine` and :class:`~lifecycle.aio.AsyncWorker`, or run to their end
in the sync engine's probe and handler threads).

What TARDIS answers becomes lifecycle's: a ``ResourceStatus`` or ``MachineStatus`` by its
name; ``TardisDroneCrashed`` on deploy becomes :class:`DroneCrashed` (the drone goes to
cleanup), and as a status, ``Error`` (cleanup, as TARDIS goes); ``TardisAuthError``,
``TardisTimeout``, ``TardisQuotaExceeded``, ``TardisResourceStatusUpdateFailed`` and
``TardisError`` become :class:`TardisSiteError`, a :class:`SiteError` (a deploy is retried,
then the drone goes down; a status that cannot be had is no observation, so no risky edge
fires on an old one). A status is asked drone by drone (TARDIS's adapters bundle the calls
themselves), each within ``status_timeout``: one drone whose call fails or hangs is
:data:`~lifecycle.adapters.sites.UNKNOWN` (not observed), and the others are answered. An
answer is checked before it is kept: it must be a mapping, and it cannot rename the drone
(``drone_uuid``) or move it to another site (``site_name``); otherwise
:class:`TardisSiteError` names the site and the drone.

A TARDIS site adapter has no conditional terminate. Where the drone asks for a fenced
terminate (``expect``) and the adapter is one of :mod:`~lifecycle.adapters.tardis_fences`'
(``FencedSlurmAdapter``, ``FencedHTCondorAdapter``: what a configuration's ``Slurm`` and
``HTCondor`` sites get), its ``terminate_resource_if`` removes the job only while it is in
that status: a true fence. With any other adapter, :meth:`TardisSite.terminate` asks the
site for the status again right before it terminates, and leaves a job that moved on alone;
a job that starts in the moment between that answer and the terminate is still removed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

with warnings.catch_warnings():  # its configuration model is pydantic 1 style: not ours
    warnings.simplefilter("ignore", DeprecationWarning)
    from tardis.configuration.configuration import Configuration  # type: ignore[import-untyped]
    from tardis.exceptions.tardisexceptions import (  # type: ignore[import-untyped]
        TardisAuthError,
        TardisDroneCrashed,
        TardisError,
        TardisQuotaExceeded,
        TardisResourceStatusUpdateFailed,
        TardisTimeout,
    )
    from tardis.interfaces.siteadapter import ResourceStatus  # type: ignore[import-untyped]
    from tardis.utilities.attributedict import AttributeDict  # type: ignore[import-untyped]

from ..clock import Clock, SystemClock
from ..logs import logger
from .sites import (
    BOOTING,
    ERROR,
    NOT_AVAILABLE,
    UNKNOWN,
    Drone,
    DroneCrashed,
    SiteError,
    Terminated,
)
from .tardis_fences import FENCED

log = logger(__name__)

FAILURES = (TardisAuthError, TardisTimeout, TardisQuotaExceeded,
            TardisResourceStatusUpdateFailed, TardisError)
"""What TARDIS's adapters raise when the site cannot be asked or refused (besides a crash)."""

HTCONDOR_TRANSLATION = {"Cores": 1, "Memory": 1024, "Disk": 1024 * 1024}
"""TARDIS's HTCondor batch system's units (Memory in MB, Disk in KB): the translation of a
machine's meta data a site adapter puts in the drone's environment, when no batch system
says its own."""


class TardisSiteError(SiteError):
    """A TARDIS adapter failed (its exception's name is in the message)."""


@contextmanager
def _translated(adapter: Any, what: str) -> Iterator[None]:
    """Run a call as TARDIS does (in the adapter's ``handle_exceptions``), with TARDIS's
    failures as lifecycle's."""
    handle = getattr(adapter, "handle_exceptions", None)
    try:
        if handle is None:
            yield
        else:
            with handle():
                yield
    except TardisDroneCrashed:
        raise
    except FAILURES as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        raise TardisSiteError(f"{what}: {type(exc).__name__}{exc and f' {exc}'}{cause}"
                              ) from exc


class TardisSite:
    """A TARDIS site adapter (``SlurmAdapter``, ``FakeSiteAdapter``, ...) as a drone's site.

    TARDIS keeps each drone's *resource attributes* (its job id, status, creation time) and
    hands them to every call; this keeps them per drone name, rebuilt from the drone's data
    (``remote_id``, ``deployed_at``) after a restart. ``translation`` is the batch system's
    ``machine_meta_data_translation_mapping`` (a :class:`TardisBatchSystem` gives it)."""

    def __init__(self, site_adapter: Any, *,
                 translation: Mapping[str, float] | None = None,
                 clock: Clock | None = None, status_timeout: float = 60.0) -> None:
        if not status_timeout > 0:
            raise ValueError(f"status_timeout is a positive number of seconds, not "
                             f"{status_timeout}")
        self.status_timeout = status_timeout
        self.adapter = site_adapter
        self.clock: Clock = clock or SystemClock()
        self.translation = dict(translation or HTCONDOR_TRANSLATION)
        self.attributes: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return str(getattr(self.adapter, "site_name", type(self.adapter).__name__))

    @property
    def drone_minimum_lifetime(self) -> float | None:
        """The site's ``drone_minimum_lifetime`` setting (the deploy copies it)."""
        try:
            value = self.adapter.drone_minimum_lifetime
        except (AttributeError, KeyError):
            return None
        return None if value is None else float(value)

    def _attributes(self, drone: Drone) -> Any:
        """The drone's TARDIS resource attributes, as its last call left them."""
        attributes = self.attributes.get(drone.name)
        if attributes is None:
            deployed = drone.data.get("deployed_at")
            # TARDIS's adapters compare it with their own local wall-clock time, naive
            moment = (dt.datetime.fromisoformat(deployed) if isinstance(deployed, str)
                      else self.clock.now())
            created = moment.astimezone().replace(tzinfo=None)
            attributes = AttributeDict(
                drone_uuid=drone.name, site_name=self.name, created=created, updated=created,
                obs_machine_meta_data_translation_mapping=AttributeDict(self.translation),
                resource_status=ResourceStatus.Booting)
            self.attributes[drone.name] = attributes
        if drone.remote_id is not None:
            attributes.remote_resource_uuid = _remote(drone.remote_id)
        return attributes

    async def deploy(self, drone: Drone) -> str:
        """``deploy_resource``; the job's id at the site (``remote_resource_uuid``)."""
        self.attributes.pop(drone.name, None)
        attributes = self._attributes(drone)
        try:
            with _translated(self.adapter, f"deploy {drone.name} at {self.name}"):
                answer = await self.adapter.deploy_resource(attributes)
            attributes.update(self._checked(answer, "deploy", drone))
        except TardisDroneCrashed as exc:
            remote = attributes.get("remote_resource_uuid")
            raise DroneCrashed(f"{type(exc).__name__} {exc}".strip(),
                               None if remote is None else str(remote)) from exc
        remote = attributes.get("remote_resource_uuid")
        if remote is None:
            raise TardisSiteError(f"deploy {drone.name} at {self.name}: the site adapter "
                                  "answered no remote_resource_uuid")
        return str(remote)

    async def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """``resource_status`` of each drone, at once (TARDIS's adapters bundle the calls
        themselves: Slurm's squeue asks for many jobs in one command). A drone whose call
        fails or does not answer within ``status_timeout`` is UNKNOWN; when every drone's
        fails, the site could not be asked: :class:`TardisSiteError`."""
        return await _each(drones, self._status, self.status_timeout, f"at {self.name}")

    async def _status(self, drone: Drone) -> str:
        attributes = self._attributes(drone)
        try:
            with _translated(self.adapter, f"status of {drone.name} at {self.name}"):
                answer = await self.adapter.resource_status(attributes)
        except TardisDroneCrashed:
            return ERROR  # TARDIS: cleanup
        # an answer without a status means unchanged (TARDIS's FakeSiteAdapter)
        attributes.update(self._checked(answer, "status", drone))
        return _named(attributes.get("resource_status"), BOOTING)

    def _checked(self, answer: Any, what: str, drone: Drone) -> Mapping[str, Any]:
        """A site adapter's answer, if it is one: a mapping that leaves the drone's name and
        site as they are."""
        if not isinstance(answer, Mapping):
            raise TardisSiteError(f"{what} of {drone.name} at {self.name}: the site adapter "
                                  f"answered {type(answer).__name__} {answer!r:.80}, not the "
                                  "drone's resource attributes")
        for name, mine in (("drone_uuid", drone.name), ("site_name", self.name)):
            if name in answer and str(answer[name]) != mine:
                raise TardisSiteError(f"{what} of {drone.name} at {self.name}: the site "
                                      f"adapter answered {name} {str(answer[name])!r:.80}; a "
                                      "site cannot rename a drone or move it")
        return answer

    async def stop(self, drone: Drone) -> None:
        with _translated(self.adapter, f"stop {drone.name} at {self.name}"):
            await self.adapter.stop_resource(self._attributes(drone))

    async def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        """``terminate_resource_if`` when ``expect`` is given and the adapter has it (a true
        fence); else ``terminate_resource``, after a fresh status when ``expect`` is given
        (a re-check: see the module's docstring)."""
        fenced = getattr(self.adapter, "terminate_resource_if", None)
        if expect is not None and fenced is not None:
            with _translated(self.adapter, f"terminate {drone.name} at {self.name}"):
                answer: Terminated = await fenced(self._attributes(drone), expect)
            return answer
        if expect is not None:
            try:
                now = await asyncio.wait_for(self._status(drone), self.status_timeout)
            except TimeoutError:
                raise TardisSiteError(f"terminate {drone.name} at {self.name}: its status "
                                      f"did not come within {self.status_timeout:g} s; "
                                      "left alone") from None
            if now != expect:
                return Terminated(False, f"the job is {now} now, not {expect}: left alone")
        attributes = self._attributes(drone)
        try:
            with _translated(self.adapter, f"terminate {drone.name} at {self.name}"):
                await self.adapter.terminate_resource(attributes)
        except TardisDroneCrashed:
            return Terminated(False, "the site says the drone crashed: nothing to terminate")
        checked = " (checked, not fenced)" if expect is not None else ""
        return Terminated(True, f"terminated{checked}")


class TardisBatchSystem:
    """A TARDIS batch-system adapter (``HTCondorAdapter``, ``FakeBatchSystemAdapter``, ...)
    as the drone's overlay pool (and its allocation and utilisation, for a ``DronePool``).
    The drone's name is TARDIS's ``drone_uuid``. TARDIS's integrate has no gate: the
    drone machine's ``open_gate`` is not passed on."""

    def __init__(self, batch_system_adapter: Any, *, status_timeout: float = 60.0) -> None:
        self.adapter = batch_system_adapter
        self.status_timeout = status_timeout

    @property
    def translation(self) -> dict[str, float]:
        mapping = getattr(self.adapter, "machine_meta_data_translation_mapping", None)
        return dict(mapping) if mapping else dict(HTCONDOR_TRANSLATION)

    async def _call(self, what: str, method: Callable[[str], Any], drone: Drone) -> Any:
        with _translated(self.adapter, f"{what} {drone.name}"):
            try:
                return await method(drone.name)
            except TardisDroneCrashed as exc:
                raise TardisSiteError(f"{what} {drone.name}: {type(exc).__name__}") from exc

    async def integrate(self, drone: Drone, *, open_gate: bool) -> None:
        await self._call("integrate", self.adapter.integrate_machine, drone)

    async def drain(self, drone: Drone) -> None:
        await self._call("drain", self.adapter.drain_machine, drone)

    async def disintegrate(self, drone: Drone) -> None:
        await self._call("disintegrate", self.adapter.disintegrate_machine, drone)

    async def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """Each drone's MachineStatus; one whose call fails is UNKNOWN (not observed), and
        when every call fails the pool could not be asked: :class:`TardisSiteError`."""
        async def machine_status(drone: Drone) -> str:
            answer = await self._call("machine status of", self.adapter.get_machine_status,
                                      drone)
            return _named(answer, NOT_AVAILABLE)

        return await _each(drones, machine_status, self.status_timeout, "in the pool")

    async def allocation(self, drones: Sequence[Drone]) -> dict[str, float]:
        answers = await asyncio.gather(*(self._call(
            "allocation of", self.adapter.get_allocation, d) for d in drones))
        return {d.name: float(a or 0.0) for d, a in zip(drones, answers, strict=True)}

    async def utilisation(self, drones: Sequence[Drone]) -> dict[str, float]:
        answers = await asyncio.gather(*(self._call(
            "utilisation of", self.adapter.get_utilisation, d) for d in drones))
        return {d.name: float(a or 0.0) for d, a in zip(drones, answers, strict=True)}


class TardisSites:
    """The sites and machine types of a TARDIS configuration as one drone site: a drone
    goes to the site and machine type its key starts with, ``<site>-<machine type>-``
    (the site's name in lower case, as TARDIS begins its drone names)."""

    def __init__(self, sites: Mapping[str, TardisSite]) -> None:
        if not sites:
            raise ValueError("a TARDIS configuration with no site")
        self.sites = dict(sites)

    @property
    def prefixes(self) -> list[str]:
        return sorted(self.sites)

    def site_of(self, drone: Drone) -> TardisSite:
        for prefix in sorted(self.sites, key=len, reverse=True):
            if drone.name.startswith(prefix):
                return self.sites[prefix]
        raise TardisSiteError(f"drone {drone.name}: its name starts with none of the "
                              f"configured sites' prefixes ({', '.join(self.prefixes)})")

    @property
    def drone_minimum_lifetime(self) -> float | None:
        """The sites' ``drone_minimum_lifetime`` when they all say the same (the drone's
        deploy copies one value; give sites that differ a configuration each)."""
        values = {site.drone_minimum_lifetime for site in self.sites.values()}
        return values.pop() if len(values) == 1 else None

    async def deploy(self, drone: Drone) -> str:
        return await self.site_of(drone).deploy(drone)

    async def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        groups: dict[int, tuple[TardisSite, list[Drone]]] = {}
        for d in drones:
            site = self.site_of(d)
            groups.setdefault(id(site), (site, []))[1].append(d)
        answers = await asyncio.gather(*(site.status(ds) for site, ds in groups.values()),
                                       return_exceptions=True)
        # a site that could not be asked costs its own drones their status, not the others'
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed and (len(failed) == len(answers)
                       or not all(isinstance(a, SiteError) for a in failed)):
            raise failed[0]
        found: dict[str, str] = {}
        for (site, ds), answer in zip(groups.values(), answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("site %s could not be asked: its %d drones are not observed this "
                            "time: %s", site.name, len(ds), answer)
                answer = dict.fromkeys((d.name for d in ds), UNKNOWN)
            found.update(answer)
        return found

    async def stop(self, drone: Drone) -> None:
        await self.site_of(drone).stop(drone)

    async def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        return await self.site_of(drone).terminate(drone, expect)


@dataclass(frozen=True)
class SiteType:
    """One site and machine type of a TARDIS configuration: its drones' key prefix
    (``<site>-<machine type>-``, the site's name in lower case, as TARDIS begins its drone
    names), its :class:`TardisSite`, the cores one drone provides (the machine type's
    ``MachineMetaData`` ``Cores``: a TARDIS drone's demand and supply) and the site's
    ``quota`` (None: none)."""

    site: str
    machine_type: str
    prefix: str
    adapter: TardisSite
    cores: float
    quota: float | None


def from_configuration(path: str | Path | None = None, *, clock: Clock | None = None
                       ) -> tuple[TardisSites, TardisBatchSystem]:
    """The sites and the batch system of a TARDIS YAML configuration (its ``Sites``, each
    site's ``MachineTypes``, its ``BatchSystem``), built as TARDIS builds them: adapter
    ``X`` is class ``XAdapter`` of module ``tardis.adapters.sites.x`` (batch systems:
    ``tardis.adapters.batchsystems.x``). The configuration is loaded into TARDIS's own
    (process-wide) ``Configuration``, from which its adapters read their settings; without
    ``path``, the one already there (a COBalD configuration's ``tardis:`` section)."""
    site_types, batch = configured(path, clock=clock)
    return TardisSites({t.prefix: t.adapter for t in site_types}), batch


def configured(path: str | Path | None = None, *, clock: Clock | None = None
               ) -> tuple[list[SiteType], TardisBatchSystem]:
    """:func:`from_configuration`, site type by site type."""
    configuration = Configuration(str(path)) if path is not None else Configuration()
    where = path or "TARDIS's configuration"
    try:
        batch_settings, sites = configuration.BatchSystem, configuration.Sites
    except AttributeError as exc:
        raise TardisSiteError(f"{where}: a TARDIS configuration has `Sites` and "
                              f"`BatchSystem`: {exc}") from None
    batch = TardisBatchSystem(_adapter("batchsystems", batch_settings.adapter)())
    found: list[SiteType] = []
    for site in sites:
        adapter_class = _adapter("sites", site.adapter)
        quota = getattr(site, "quota", None)
        quota = None if quota is None or quota < 0 or not math.isfinite(quota) else quota
        for machine_type in getattr(configuration, site.name).MachineTypes:
            adapter = adapter_class(machine_type=machine_type, site_name=site.name)
            found.append(SiteType(
                site.name, machine_type, f"{site.name.lower()}-{machine_type}-",
                TardisSite(adapter, translation=batch.translation, clock=clock),
                float(adapter.machine_meta_data["Cores"]), quota))
    return found, batch


def _adapter(kind: str, name: str) -> Any:
    if kind == "sites" and name in FENCED:
        return FENCED[name]
    try:
        return getattr(import_module(f"tardis.adapters.{kind}.{name.lower()}"),
                       f"{name}Adapter")
    except (ImportError, AttributeError) as exc:
        raise TardisSiteError(f"TARDIS has no {kind[:-1]} adapter {name!r}: {exc}") from None


async def _each(drones: Sequence[Drone], ask: Callable[[Drone], Awaitable[str]],
                timeout: float, where: str) -> dict[str, str]:
    """``ask`` about each drone at once, each within ``timeout`` seconds: a drone whose call
    fails (a SiteError, or an adapter's own bug such as a KeyError) or hangs is UNKNOWN, not
    observed this time, and costs no other drone its answer. When every drone's call fails,
    nothing could be asked: the first failure is raised."""
    async def one(drone: Drone) -> str | SiteError:
        try:
            return await asyncio.wait_for(ask(drone), timeout)
        except TimeoutError:
            return TardisSiteError(f"{drone.name} {where}: no answer within {timeout:g} s")
        except SiteError as exc:
            return exc
        except Exception as exc:
            return TardisSiteError(f"{drone.name} {where}: {type(exc).__name__} {exc}")

    answers = await asyncio.gather(*(one(d) for d in drones))
    failed = [a for a in answers if isinstance(a, SiteError)]
    if drones and len(failed) == len(drones):
        raise failed[0]
    found: dict[str, str] = {}
    for drone, answer in zip(drones, answers, strict=True):
        if isinstance(answer, SiteError):
            log.warning("drone %s is not observed this time: %s", drone.name, answer)
            answer = UNKNOWN
        found[drone.name] = answer
    return found


def _named(status: Any, default: str) -> str:
    """A TARDIS ResourceStatus or MachineStatus (an Enum) by its name, which is lifecycle's."""
    if status is None:
        return default
    return str(getattr(status, "name", status))


def _remote(remote_id: str) -> Any:
    """A job id as the adapter made it (Slurm's are ints; others strings)."""
    return int(remote_id) if remote_id.isdigit() else remote_id


__all__ = ["FAILURES", "HTCONDOR_TRANSLATION", "SiteType", "TardisBatchSystem", "TardisSite",
           "TardisSiteError", "TardisSites", "configured", "from_configuration"]
