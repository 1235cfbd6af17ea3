"""``drone``: the TARDIS pilot-job lifecycle, with the boot race closed.

A drone is a placeholder job at a site (Slurm, HTCondor, a cloud) that, once running, joins
an overlay pool and runs payload from it. The states and the status table are TARDIS's
(``tardis/resources/dronestates.py`` of cobald-tardis; docs/incidents.md tells the
race): each state does something first (an entry effect)
and then moves by the newest observation of the site's ResourceStatus and the pool's
MachineStatus, evaluated by ``step``.

The change: every edge that removes or stops a drone that might be running payload is a
risky edge. It fires only on an observation made after the drone's last transition and at
most ``max_age`` seconds old, asking the site when it has none; on a fresh Running the drone
goes on to integrate (and is drained, not removed). The removal itself is fenced: the site is
asked to terminate the job only if it is still in the observed state.

Around the table it does what TARDIS does: the site's ``drone_minimum_lifetime`` counts from
the drone's entry into ``available`` and is exceeded strictly; ``cleanup`` asks the site to
terminate again on every heartbeat while the status stays Booting, Stopped or Error (each
time fenced on that fresh status); a deploy that crashed (:class:`DroneCrashed`) goes to
``cleanup``; a stop that failed leaves the drone in ``shutdown`` to try again; ``down`` sets
the drone's demand to 0.

``drone_spec(race_guard=False)`` is TARDIS as it is today, for the simulation of the incident.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from ..adapters.sites import (
    AVAILABLE,
    BOOTING,
    DELETED,
    DRAINED,
    DRAINING,
    ERROR,
    NOT_AVAILABLE,
    RUNNING,
    STOPPED,
    UNKNOWN,
    BatchSystem,
    Drone,
    DroneCrashed,
    Site,
    SiteError,
)
from ..compiled import GuardContext
from ..effects import Effect, EffectCall, FollowUp, Retry
from ..engine.checks import argument
from ..errors import LifecycleError, SetupError
from ..freshness import ProbeRequest
from ..results import json_value
from ..spec import MachineSpec
from .builtin import Builtin
from .drone_sim import ScenarioBatch, ScenarioSite

REF = "TARDIS dronestates.py"
DEPLOY_ATTEMPTS = 3
"""Attempts at deploying a drone the site refuses, before it goes down."""
LIVE_STATES = ("request", "booting", "integrate", "integrating", "available", "drain",
               "draining", "disintegrate", "shutdown", "shutting_down", "cleanup")


class DroneData(BaseModel):
    model_config = ConfigDict(extra="allow")

    demand: int = 1
    """1 while the pool wants the drone, 0 once it is to be released."""
    minimum_lifetime: float | None = None
    """Seconds in ``available`` after which the drone is drained (strictly more): the site's
    ``drone_minimum_lifetime``, copied into the data when the drone is deployed."""
    drain_requested: bool = False
    """The pool asked for the drone to be drained."""
    remote_id: str | None = None
    deployed_at: str | None = None


# -- the spec -------------------------------------------------------------------------------


def _status_edges(source: str, table: Mapping[str, str | None], risky: set[str],
                  fresh: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Eventless edges from ``source`` for each ResourceStatus (and, for Running, each
    MachineStatus) the table names; None keeps the drone where it is."""
    edges = []
    for status, dest in table.items():
        if dest is None:
            continue
        guards = [f"rs_{status.split('+')[0].lower()}"]
        if "+" in status:
            guards.append(f"ms_{status.split('+')[1].lower()}")
        edge: dict[str, Any] = {"source": source, "dest": dest, "guards": guards,
                                "ref": f"{REF}: {source}, {status.replace('+', ' and ')}"}
        if dest in risky and fresh is not None:
            edge["fresh"] = fresh
        edges.append(edge)
    return edges


def drone_spec(*, race_guard: bool = True, start_gate: bool = False,
               max_age: float = 30.0) -> MachineSpec:
    """The drone machine. ``race_guard=False`` is TARDIS today (machine ``drone_tardis``):
    its removals rest on whatever status it holds, and its terminate is not fenced."""
    fresh = {"max_age": max_age, "probe": "site"} if race_guard else None
    # edges into these states stop or remove a job that may be running payload
    risky = {"cleanup", "shutdown"}
    rs = {  # the ResourceStatus columns common to most states
        "Stopped": "cleanup", "Deleted": "down", "Error": "cleanup"}
    eventless: list[dict[str, Any]] = []
    # booting: demand 0 -> cleanup, the race. With the guard: only on a fresh status that
    # does not say Running; a fresh Running goes on to integrate by the table below.
    release: dict[str, Any] = {
        "source": "booting", "dest": "cleanup", "guards": ["no_demand"],
        "description": "the pool no longer wants the drone",
        "ref": f"{REF}: booting, demand 0 (docs/incidents.md: the boot race)"}
    if race_guard:
        release["guards"] = ["no_demand", "not_running"]
        release["fresh"] = fresh
    eventless.append(release)
    eventless += _status_edges("booting", {"Running": "integrate", **rs}, risky, fresh)
    eventless += _status_edges("integrating", {
        "Booting": "booting", "Running+Available": "available",
        "Running+Draining": "draining", "Running+Drained": "disintegrate", **rs},
        risky, fresh)
    eventless.append({"source": "available", "dest": "drain", "guards": ["wants_drain"],
                      "description": "the pool asked for a drain, demand is 0, or the "
                                     "minimum lifetime is reached",
                      "ref": f"{REF}: available"})
    eventless += _status_edges("available", {
        "Booting": "booting", "Running+NotAvailable": "shutdown",
        "Running+Draining": "draining", "Running+Drained": "disintegrate", **rs},
        risky, fresh)
    eventless += _status_edges("draining", {
        "Booting": "cleanup", "Running+Available": "drain",
        "Running+Drained": "disintegrate", "Running+NotAvailable": "shutdown", **rs},
        risky, fresh)
    # shutdown + Running: stop the job, staying in shutdown until the site took the stop
    # (its follow-up `stopped` moves on); a failed stop stays, and the next heartbeat tries
    # again (TARDIS: ShutDownState, "failure -> stay")
    eventless += _status_edges("shutdown", {"Booting": "cleanup", "Running": "shutdown",
                                            **rs}, risky - {"shutdown"}, fresh)
    eventless += _status_edges("shutting_down", {"Booting": "cleanup", **rs}, risky, fresh)
    # cleanup + Booting, Stopped or Error: terminate again, on every heartbeat (TARDIS:
    # CleanupState). Each time is a risky edge of its own, so each terminate is fenced on a
    # status made after the previous one.
    eventless += _status_edges("cleanup", {"Booting": "cleanup", "Running": "drain",
                                           "Stopped": "cleanup", "Deleted": "down",
                                           "Error": "cleanup"}, {"cleanup"}, fresh)
    for edge in eventless:
        if edge["source"] == "shutdown" and edge["dest"] == "shutdown":
            edge["effects"] = ["stop"]
            edge["description"] = "stop the job; on success the drone goes to shutting_down"
        if edge["source"] == "cleanup" and edge["dest"] == "cleanup":
            edge["description"] = "the job is still there: ask the site to terminate it again"
        if edge["dest"] == "down":
            edge["effects"] = ["release"]
    name = "drone" if race_guard else "drone_tardis"
    return MachineSpec.model_validate({
        "name": name,
        "description": "A TARDIS drone: a pilot job at a site that joins an overlay pool. "
                       + ("Removals rest on a fresh site status and are fenced."
                          if race_guard else "TARDIS today: removals rest on any status."),
        "initial": "request",
        "final": ["down"],
        "states": [
            {"name": "request", "effects": [
                {"name": "deploy", "on_failure": "deploy_failed"}],
             "description": "submit the drone's job to the site"},
            {"name": "booting", "description": "the job is queued or starting"},
            {"name": "integrate", "effects": [
                {"name": "integrate", "args": {"open_gate": start_gate}}],
             "description": "let the machine into the pool"},
            {"name": "integrating", "description": "waiting for the pool to see it"},
            {"name": "available", "description": "in the pool, taking payload"},
            {"name": "drain", "effects": ["drain"], "description": "drain the machine"},
            {"name": "draining", "description": "payload finishing"},
            {"name": "disintegrate", "effects": ["disintegrate"],
             "description": "take the machine out of the pool"},
            {"name": "shutdown", "description": "stop the job if it runs (again on every "
                                                "heartbeat until the site takes it)"},
            {"name": "shutting_down", "description": "waiting for the job to stop"},
            {"name": "cleanup", "effects": [{"name": "terminate",
                                             "args": {"fenced": race_guard}}],
             "description": "remove the job from the site (again on every heartbeat while "
                            "it stays Booting, Stopped or Error)"},
            {"name": "down", "description": "finished; demand 0"},
        ],
        "transitions": [
            {"trigger": "deployed", "source": "request", "dest": "booting",
             "description": "the site accepted the job", "ref": f"{REF}: request"},
            {"trigger": "deploy_failed", "source": "request", "dest": "down",
             "effects": ["release"], "merge_payload": False,
             "description": "the site refused the job for good", "ref": f"{REF}: request"},
            {"trigger": "deploy_crashed", "source": "request", "dest": "cleanup",
             "description": "the site says the drone crashed while it was deployed: remove "
                            "what is left of it", "ref": f"{REF}: request, TardisDroneCrashed"},
            {"trigger": "integrated", "source": "integrate", "dest": "integrating",
             "ref": f"{REF}: integrate"},
            {"trigger": "drain_started", "source": "drain", "dest": "draining",
             "ref": f"{REF}: drain"},
            {"trigger": "disintegrated", "source": "disintegrate", "dest": "shutdown",
             "ref": f"{REF}: disintegrate"},
            {"trigger": "stopped", "source": "shutdown", "dest": "shutting_down",
             "description": "the site took the stop", "ref": f"{REF}: shutdown"},
            {"trigger": "stop_failed", "source": "shutdown", "dest": "shutdown",
             "merge_payload": False,
             "description": "the stop failed: stay, and stop again on the next heartbeat",
             "ref": f"{REF}: shutdown, stop_resource failed"},
            {"trigger": "released", "source": "down", "dest": "down",
             "description": "the drone is finished: its demand is 0",
             "ref": f"{REF}: down"},
        ],
        "eventless": eventless,
        "data_model": DroneData,
    })


# -- guards: on the newest observation and the data; no I/O ---------------------------------


def _rs(value: str) -> Callable[[GuardContext], bool]:
    return lambda c: c.status.get("resource_status") == value


def _ms(value: str) -> Callable[[GuardContext], bool]:
    return lambda c: c.status.get("machine_status") == value


def _wants_drain(c: GuardContext) -> bool:
    if c.data.get("drain_requested") or c.data.get("demand", 1) == 0:
        return True
    # TARDIS's check_minimum_lifetime: the time since the drone's last change of state (in
    # available: its entry into available), strictly more than the site's setting
    lifetime, since = c.data.get("minimum_lifetime"), c.last_transition_at
    if not lifetime or since is None:
        return False
    return (c.now - since).total_seconds() > float(lifetime)


GUARDS: dict[str, Callable[[GuardContext], bool]] = {
    **{f"rs_{s.lower()}": _rs(s) for s in (BOOTING, RUNNING, STOPPED, DELETED, ERROR)},
    **{f"ms_{s.lower()}": _ms(s) for s in (AVAILABLE, DRAINING, DRAINED, NOT_AVAILABLE)},
    "no_demand": lambda c: c.data.get("demand", 1) == 0,
    "not_running": lambda c: c.status.get("resource_status") != RUNNING,
    "wants_drain": _wants_drain,
}


# -- effects and the probe, through a site and a batch system ---------------------------------


def _drone(call: EffectCall) -> Drone:
    return Drone(call.key, call.data.get("remote_id"), call.data)


T = TypeVar("T")


async def answer(value: T | Awaitable[T]) -> T:
    """What a site (or an engine) answered: awaited when it is asyncio's (a TARDIS adapter,
    an AsyncEngine), as it is otherwise."""
    if inspect.isawaitable(value):
        return await value
    return value


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that awaits only plain answers (of a sync site) to its end, without
    an event loop: the one body of a handler serves sync and asyncio sites."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a handler of a sync site waited on something: give an asyncio site")


def is_asyncio(*adapters: Any) -> bool:
    """Whether these are asyncio's (a TardisSite, TardisBatchSystem): their calls are
    coroutines, and the drone's handlers and probe become coroutines too."""
    return any(inspect.iscoroutinefunction(getattr(a, name, None)) for a in adapters
               for name in ("deploy", "status", "integrate", "machine_status"))


def _either(asyncio_: bool, handler: Callable[[EffectCall], Coroutine[Any, Any, T]]
            ) -> Callable[[EffectCall], Any]:
    if asyncio_:
        return handler
    return lambda call: run_to_end(handler(call))


def effects(site: Site, batch: BatchSystem) -> dict[str, Effect]:
    """The drone's effect handlers, acting through ``site`` and ``batch``; coroutines when
    these are asyncio's (:func:`is_asyncio`)."""
    asyncio_ = is_asyncio(site, batch)
    # (the protocols say what a sync site answers; an asyncio one answers awaitables)
    site_: Any = site
    pool: Any = batch

    async def deploy(call: EffectCall) -> FollowUp:
        try:
            remote_id = await answer(site.deploy(_drone(call)))
        except DroneCrashed as exc:
            # TARDIS: TardisDroneCrashed in RequestState -> CleanupState
            return FollowUp("deploy_crashed", {"remote_id": exc.remote_id,
                                               "deploy_error": str(exc)})
        except SiteError as exc:
            if call.attempt < DEPLOY_ATTEMPTS:
                raise  # retried, with backoff
            # refused for good (TARDIS: auth, timeout, quota -> DownState); the effect is
            # done, so that down's own effect (demand 0) runs after it
            return FollowUp("deploy_failed", {"deploy_error": str(exc)})
        found: dict[str, Any] = {"remote_id": remote_id, "deployed_at": call.now.isoformat()}
        lifetime = getattr(site, "drone_minimum_lifetime", None)
        if lifetime is not None:  # a site setting, kept with the drone for every process
            found["minimum_lifetime"] = float(lifetime)
        return FollowUp("deployed", found)

    async def integrate(call: EffectCall) -> FollowUp:
        await answer(pool.integrate(_drone(call), open_gate=bool(call.args.get("open_gate"))))
        return FollowUp("integrated")

    async def drain(call: EffectCall) -> FollowUp:
        await answer(pool.drain(_drone(call)))
        return FollowUp("drain_started")

    async def disintegrate(call: EffectCall) -> FollowUp:
        await answer(pool.disintegrate(_drone(call)))
        return FollowUp("disintegrated")

    async def stop(call: EffectCall) -> FollowUp:
        try:
            await answer(site_.stop(_drone(call)))
        except SiteError as exc:
            # TARDIS: stop_resource failed -> stay in ShutDownState; the next heartbeat on a
            # Running status stops again
            return FollowUp("stop_failed", {"error": str(exc)})
        return FollowUp("stopped")

    async def release(call: EffectCall) -> FollowUp:
        return FollowUp("released", {"demand": 0})

    async def terminate(call: EffectCall) -> None:
        expect = None
        if call.args.get("fenced") and call.fence is not None:
            observed = call.fence.get("expect", {}).get("resource_status")
            expect = observed if observed in (BOOTING, RUNNING, STOPPED, ERROR) else None
        outcome = await answer(site.terminate(_drone(call), expect))
        # kept with the effect: whether the site acted, or why it left the job alone
        call.save_progress({"acted": outcome.acted, "detail": outcome.detail})

    patient = Retry(max_attempts=None, base=10, cap=300)
    return {
        "deploy": Effect(_either(asyncio_, deploy),
                         Retry(max_attempts=DEPLOY_ATTEMPTS, base=10, cap=60)),
        "integrate": Effect(_either(asyncio_, integrate), patient),
        "drain": Effect(_either(asyncio_, drain), patient),
        "disintegrate": Effect(_either(asyncio_, disintegrate), patient),
        "stop": Effect(_either(asyncio_, stop), patient),
        "terminate": Effect(_either(asyncio_, terminate), patient),
        "release": Effect(_either(asyncio_, release), patient),
    }


def probe(site: Site, batch: BatchSystem) -> Callable[[ProbeRequest], Any]:
    """Ask the site (and the pool) about one drone, now (a coroutine function when they are
    asyncio's)."""

    async def ask(request: ProbeRequest) -> dict[str, Any]:
        drone = Drone(request.key, request.data.get("remote_id"), request.data)
        site_status = await answer(site.status([drone]))
        pool_status = await answer(batch.machine_status([drone]))
        status = _status(site_status, pool_status, drone.name)
        if UNKNOWN in status.values():
            raise SiteError(f"drone {drone.name}: the site or the pool could not say its "
                            "status this time")
        return status

    if is_asyncio(site, batch):
        return ask
    return lambda request: run_to_end(ask(request))


# -- the pool: which drones to release ----------------------------------------------------------

_RELEASE_ORDER = {"available": 0, "integrating": 1, "integrate": 1, "booting": 2, "request": 3}
POOL_STATES = frozenset(_RELEASE_ORDER)
"""The states of a drone that counts towards the pool: on its way up, or up."""
SUPPLYING_STATES = frozenset({"available", "drain", "draining"})
"""The states in which a drone still wanted supplies its cores, as a TARDIS drone reports
its supply: from its first Available heartbeat until its demand is 0 (a drone drained for
its minimum lifetime keeps its demand, and its supply, until it is down)."""
RELEASE_POLICIES = ("established_first", "newest_first", "cobald")


def release_order(drones: Sequence[Any], policy: str = "established_first", *,
                  cores: float = 1.0, utilisation: Mapping[str, float] | None = None,
                  rng: Any = None) -> list[Any]:
    """Drones (``Resource``s with demand 1) in the order to release them when demand falls.

    ``established_first`` (the default): established idle drones first, oldest first, and
    booting drones last, so that a drone that may be starting payload is the last picked.
    ``newest_first``: the newest drones first, whatever their state (one proposal in the
    incident's thread). ``cobald``: COBalD's ``FactoryPool`` order, the lowest
    ``supply x utilisation`` first (``cores`` while supplying, ``utilisation`` per drone
    key), the drones that tie (every booting drone and every idle one) in no particular
    order, as COBalD holds its children in a set: shuffled by ``rng`` (a ``random.Random``)."""
    if policy not in RELEASE_POLICIES:
        raise ValueError(f"unknown release policy {policy!r}: "
                         f"{', '.join(RELEASE_POLICIES)}")
    states = POOL_STATES | SUPPLYING_STATES if policy == "cobald" else POOL_STATES
    wanted = [d for d in drones if d.data.get("demand", 1) == 1 and d.state in states]
    if policy == "newest_first":
        return sorted(wanted, key=lambda d: d.created_at, reverse=True)
    if policy == "cobald":
        if rng is not None:
            rng.shuffle(wanted)
        used = utilisation or {}
        return sorted(wanted, key=lambda d: (cores if d.state in SUPPLYING_STATES else 0.0)
                      * float(used.get(d.key, 0.0)))
    return sorted(wanted, key=lambda d: (_RELEASE_ORDER[d.state], d.created_at))


# -- the drone's own last word: may its startd start a payload? --------------------------------

PAYLOAD_VERDICTS = {
    **dict.fromkeys(("integrating", "available", "drain", "draining"), "yes"),
    **dict.fromkeys(("request", "booting", "integrate"), "wait"),
}
"""Whether a drone in each state may start a payload (a state not named: no)."""


def payload_verdict(state: str | None) -> tuple[str, str]:
    """Whether a drone in ``state`` (None: no such drone) may start a payload now, and why:
    ``yes`` once it is integrated (a drain lets what runs finish), ``wait`` while it is on
    its way up (its next heartbeat may still remove it: ask again), ``no`` once it is being
    stopped or removed, or gone (HTCondor's ``HOOK_PREPARE_JOB``: ``lifecycle hook
    prepare-job``)."""
    if state is None:
        return "no", "lifecycle knows no such drone"
    verdict = PAYLOAD_VERDICTS.get(state, "no")
    why = {"yes": "integrated", "wait": "not integrated yet: it may still be removed",
           "no": "it is being stopped or removed, or gone"}[verdict]
    return verdict, f"the drone is in {state}: {why}"


# -- the built-in and its simulation --------------------------------------------------------


def _simulation(world: Any) -> tuple[Any, Any, Any]:
    """For scenario files: a site that answers what the scenario's world says and records
    what it was asked to do."""
    site, batch = ScenarioSite(world), ScenarioBatch(world)
    return GUARDS, effects(site, batch), {"site": probe(site, batch)}


def _configure(settings: Any) -> tuple[dict[str, Effect], dict[str, Any]] | None:
    """The site and pool an application's settings name (``drone_site``, a
    :class:`~lifecycle.adapters.sites.Site`, and ``drone_batch_system``, a
    :class:`~lifecycle.adapters.sites.BatchSystem`): the drones' handlers and the ``site``
    probe on them."""
    site = getattr(settings, "drone_site", None)
    if site is None:
        return None
    batch = getattr(settings, "drone_batch_system", None)
    if batch is None:
        raise SetupError(f"{getattr(settings, '__name__', settings)!r} defines drone_site "
                         "but no drone_batch_system")
    return effects(site, batch), {"site": probe(site, batch)}


SPEC = drone_spec()
BUILTIN = Builtin(
    spec=SPEC,
    guards=GUARDS,
    summary="TARDIS drone: removals only on a fresh site status, fenced",
    simulation=_simulation,
    configure=_configure,
)
TARDIS_BUILTIN = Builtin(
    spec=drone_spec(race_guard=False),
    guards=GUARDS,
    summary="TARDIS drone as it is today (the boot race open), for comparison",
    simulation=_simulation,
    configure=_configure,
)


# -- the reconcile loop ---------------------------------------------------------------------


def heartbeat_drones(engine: Any, machine: str = "drone") -> list[Drone]:
    """The live drones of ``machine`` that have a job at the site (a ``remote_id``: one
    whose deploy has not run has nothing to ask about), by key, as the site and the pool are
    asked about them: one read of their keys and data, not a ``Resource`` each page by
    page (the heartbeat decides on the rows its step reads, not on these)."""
    argument(machine, "machine name")
    store = engine.store
    sql = store.sql
    with store.reading() as cursor:
        cursor.execute(sql.keys_and_data_by_states,
                       {"machine": machine, "states": sql.keys_param(list(LIVE_STATES))})
        rows = cursor.fetchall()
    drones = []
    for key, data in rows:
        data = json_value(data)
        remote_id = data.get("remote_id")
        if remote_id:
            drones.append(Drone(key, remote_id, data))
    return drones


HEARTBEAT_BATCH = 1000
"""Drones observed, then stepped, per transaction in a heartbeat."""


def reconcile(engine: Any, site: Site, batch: BatchSystem, *, machine: str = "drone",
              progress: Callable[[int, int], None] | None = None,
              probes: int = 8) -> dict[str, Any]:
    """One heartbeat of a drone pool: ask the site and the pool for every live drone's status
    in one call each (the two at once), record the answers as observations, and step every
    drone once, :data:`HEARTBEAT_BATCH` drones per transaction (``Engine.observe_many``,
    ``Engine.step_many``: each drone its own compare-and-swap and journal row). A risky edge
    that still wants a fresher status asks the site about its drone alone, up to ``probes``
    drones at once.

    When the site (or the pool) cannot be asked, nothing is observed and no drone is
    stepped: the drones keep their state, and no risky edge fires on an old picture. A drone
    that cannot be observed or stepped (it went away; it lost the race with another writer
    too often) is counted in ``errors`` and leaves the others untouched."""
    refs = heartbeat_drones(engine, machine)
    report = _report(refs)
    if not refs:
        return report
    # an answer is true at the moment the question was asked, not when it arrived: both
    # statuses are stamped with the time the site was asked, the earlier of the two
    asked_at = engine.clock.now()
    with ThreadPoolExecutor(2, thread_name_prefix="reconcile") as pool:
        asking = pool.submit(site.status, refs), pool.submit(batch.machine_status, refs)
        try:
            site_status, pool_status = (asked.result() for asked in asking)
        except SiteError as exc:
            report["site_error"] = str(exc)
            return report
    # each batch's results are counted and let go before the next batch is made: a
    # heartbeat's report is counts, and results held across batches are what the garbage
    # collector scans again and again
    for done, unseen, keys, statuses in _batches(refs, site_status, pool_status, machine):
        report["errors"] += unseen + _errors(engine.observe_many(
            statuses, asked_at, source="reconcile", batch=HEARTBEAT_BATCH))
        _tally(report, engine.step_many(keys, actor="reconcile", on_stale="return",
                                        probes=probes, batch=HEARTBEAT_BATCH))
        if progress is not None:
            progress(done, len(refs))
    return report


async def reconcile_async(engine: Any, site: Any, batch: Any, *, machine: str = "drone",
                          progress: Callable[[int, int], None] | None = None,
                          only: Callable[[str], bool] | None = None,
                          probes: int = 64) -> dict[str, Any]:
    """:func:`reconcile` on an event loop, with an :class:`~lifecycle.aio.AsyncEngine` and a
    site and pool that may be asyncio's (:class:`~lifecycle.adapters.tardis.TardisSite`):
    the same calls and batches, the probes that risky edges ask awaited on the loop, up to
    ``probes`` at once. ``only`` picks the drones of this site by key (default: all)."""
    drones = [r for state in LIVE_STATES for r in await engine.resources(machine, state)
              if r.data.get("remote_id") and (only is None or only(r.key))]
    drones.sort(key=lambda r: r.key)
    report = _report(drones)
    if not drones:
        return report
    asked_at = engine.clock.now()
    refs = [Drone(r.key, r.data.get("remote_id"), r.data) for r in drones]
    try:
        site_status, pool_status = await asyncio.gather(
            answer(site.status(refs)), answer(batch.machine_status(refs)))
    except SiteError as exc:
        report["site_error"] = str(exc)
        return report
    for done, unseen, keys, statuses in _batches(refs, site_status, pool_status, machine):
        report["errors"] += unseen + _errors(await engine.observe_many(
            statuses, asked_at, source="reconcile", batch=HEARTBEAT_BATCH))
        _tally(report, await engine.step_many(keys, actor="reconcile", on_stale="return",
                                              probes=probes, batch=HEARTBEAT_BATCH))
        if progress is not None:
            progress(done, len(drones))
    return report


def _batches(drones: Sequence[Drone], site_status: Mapping[str, str],
             pool_status: Mapping[str, str], machine: str
             ) -> Iterator[tuple[int, int, list[str], list[tuple[str, dict[str, str]]]]]:
    """A heartbeat's batches: (drones done after it, how many of its drones could not be
    observed, the others' keys, their statuses)."""
    for start in range(0, len(drones), HEARTBEAT_BATCH):
        chunk = drones[start:start + HEARTBEAT_BATCH]
        # a drone whose own status call failed is neither observed nor stepped this time
        known = [(f"{machine}:{d.name}", _status(site_status, pool_status, d.name))
                 for d in chunk]
        seen = [(key, status) for key, status in known if UNKNOWN not in status.values()]
        yield start + len(chunk), len(chunk) - len(seen), [key for key, _ in seen], seen


def _errors(observed: Sequence[Any]) -> int:
    """How many of a batch's drones could not be observed."""
    return sum(isinstance(o, LifecycleError) for o in observed)


def _tally(report: dict[str, Any], stepped: Sequence[Any]) -> None:
    """Count what a batch's steps did."""
    for result in stepped:
        _count(report, result)


def _report(drones: Sequence[Any]) -> dict[str, Any]:
    return {"drones": len(drones), "moved": {}, "refused": 0, "errors": 0, "site_error": None}


def _status(site_status: Mapping[str, str], pool_status: Mapping[str, str],
            key: str) -> dict[str, str]:
    return {"resource_status": site_status.get(key, DELETED),
            "machine_status": pool_status.get(key, NOT_AVAILABLE)}


def _count(report: dict[str, Any], result: Any) -> None:
    """A stepped drone in the heartbeat's report: moved, refused, or an error."""
    if isinstance(result, LifecycleError):
        report["errors"] += 1
    elif result.fired:
        move = f"{result.source} -> {result.dest}"
        report["moved"][move] = report["moved"].get(move, 0) + 1
    elif result.error:
        report["refused"] += 1
