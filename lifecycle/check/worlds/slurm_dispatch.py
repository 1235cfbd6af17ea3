"""The Slurm dispatcher's world: a container whose job may linger in squeue, polls that
may answer late, jobs that leave by themselves, and scancel that may fail.

The container runs, its job listed by squeue and seen so by the dispatcher. The world may
then, in any order: finish the container (the API's ``container_done``), let the job leave
squeue, poll squeue (an answer as of now), ask squeue and have the answer arrive later
(true as of when it was asked: a lagging squeue), and make scancel fail or work again. The
clock moves a second at a time. The invariants are what the incident's loop broke: the
dispatcher never decides another scancel of a job on an squeue picture from before its
previous scancel (``stale``); it starts at most ``RATE`` scancels in any second (``rate``:
the dispatcher runs with ``scancels_per_second = RATE``, its limiter's state kept in the
world, so that each explored state has its own); a finished container's job is scancelled
within ``LINGER`` seconds of the time the dispatcher had nothing to do at once (``linger``:
the time a worker lags is not the machine's); and a finished container's job leaves on
every fair run (``leaves``: the dispatcher's squeue poll is fair, and so is Slurm's removal
of a job it was told to cancel). ``never_cancels()`` is a dispatcher that waits for the job
to leave by itself. Arvados' cancel policy (no delay A, a scancel
every second while the job is listed in whatever squeue the dispatcher holds, no backoff,
no rate limit) is ``arvados()``.

The other global limit, commands in flight, needs a worker that runs several handlers at once
(``Model.overlap``: an effect's run is two moves, begun and finished, and any other move may
fall between them). Its world (``in_flight()``) is the scancel flood's: ``POOL + 1`` finished
containers whose jobs are listed, falling due together; the invariant (``in_flight``) is that
at most ``POOL`` sbatch, scancel or scontrol commands run at once. The dispatcher runs with
its pool of ``POOL`` commands (``CommandPool``, its state kept in the world as the limiter's
is); Arvados' dispatcher had no such bound, and ``unpooled()`` is the fixed one without it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ...adapters.container_api import ContainerAPI
from ...adapters.sites import SiteError
from ...adapters.slurm_dispatch import CancelOutcome, CommandPool, ScancelRate
from ...machines.slurm_dispatch import (
    BUILTIN,
    GUARDS,
    ScenarioContainers,
    ScenarioSlurm,
    effects,
)
from ...scenario import RUNNING, Playable
from ..explore import Eventually, Invariant, Machine, Model, variant
from ..memory import Actions
from ..moves import Action, Create, Fire, Move, Note, Observe, SetWorld
from ..state import View

JOB = "c1"
LISTED = {"in_squeue": True, "job_id": JOB, "state": "RUNNING"}
SHORT_DELAYS = {"delay_a": 0.0, "delay_b": 1.0, "next_delay": 1.0, "error_delay": 1.0,
                "error_cap": 1.0}
"""Arvados' delays (none before the first scancel, a second between them, no backoff). Both
machines are checked with them, so that a few seconds of horizon hold several scancels of
one job: what differs is the freshness rule alone."""


def _setup(delays: dict[str, float]) -> Any:
    def setup(resources: int) -> list[Move]:
        return [Create(JOB, "running", {"job_id": JOB, **delays}),
                SetWorld(JOB, {**LISTED, "container": "Running"}), Observe(JOB, LISTED)]
    return setup


def _squeue(world: dict[str, Any]) -> dict[str, Any]:
    """What squeue says of the job when the world is ``world``."""
    return dict(LISTED) if world.get("in_squeue") else {"in_squeue": False}


def actions(view: View) -> Iterator[Action]:
    world = view.world(JOB)
    state = view.machine_state(JOB)
    if state == "running":
        yield Action("the container finishes", (
            SetWorld(JOB, {**world, "container": "Complete"}), Fire(JOB, "container_done")))
    if world.get("in_squeue"):  # fair once scancelled: Slurm ends a job it was told to
        yield Action("the job leaves squeue", (SetWorld(JOB, {**world, "in_squeue": False}),),
                     fair=view.extra("last_scancel") is not None)
    if state == "gone":
        return
    now = _squeue(world)
    seen = view.resource(JOB).seen
    if seen is None or seen.at < view.now or view.believed(JOB) != now:
        # fair: the dispatcher's own loop polls squeue every few seconds
        yield Action("squeue is polled", (Observe(JOB, now, source="squeue"),), fair=True)
    asked = view.extra("asked")
    if asked is None:
        yield Action("squeue is asked; its answer is late",
                     (Note((("asked", [now, view.now]),), "squeue is asked"),))
    else:
        yield Action(f"the late squeue answer arrives (asked at {asked[1]:g} s)", (
            Note((("asked", None),), "its answer arrives"),
            Observe(JOB, asked[0], at=asked[1], source="squeue")))
    failing = world.get("scancel_exit", 0) != 0
    yield Action("scancel works again" if failing else "scancel starts failing",
                 (SetWorld(JOB, {**world, "scancel_exit": 0 if failing else 1}),))


RATE = 1.0
"""Scancels per second the dispatcher is held to (and the fixed one runs with)."""
LIMITER = "$scancel_rate"
"""The world's entry that holds the rate limiter's state (no resource has this key)."""


def _scancels(view: View, actions: Actions) -> dict[str, Any]:
    """When the job was last scancelled, and the times of the scancels of the last second."""
    done = sum(1 for a in actions if a[0] == "scancel")
    if not done:
        return {}
    recent = [t for t in view.extra("recent", []) if t > view.now - 1.0]
    return {"last_scancel": view.now, "recent": recent + [view.now] * done}


def _too_fast(before: View, after: View, actions: Actions) -> str | None:
    if not any(a[0] == "scancel" for a in actions):
        return None
    recent = [t for t in after.extra("recent", []) if t > after.now - 1.0]
    if len(recent) > RATE:
        return (f"{len(recent)} scancels started within one second (at "
                f"{', '.join(f'{t:g}' for t in recent)} s), more than the {RATE:g} allowed")
    return None


def _stale(before: View, after: View, actions: Actions) -> str | None:
    """A decision to scancel (``cancelling.due`` -> ``scancelling``) that rests on an squeue
    older than the job's previous scancel. (A scancel run again after the worker died is the
    outbox's at-least-once, not a new decision.)"""
    if not (before.machine_state(JOB) == "cancelling.due"
            and after.machine_state(JOB) == "cancelling.scancelling"):
        return None
    last = before.extra("last_scancel")
    seen = after.resource(JOB).seen
    if last is not None and seen is not None and seen.at < last:
        return (f"{JOB} is to be scancelled again at {after.now:g} s on the squeue of "
                f"{seen.at:g} s, older than its previous scancel at {last:g} s")
    return None


def _expect(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
    return [{"expect": {"key": JOB, "state": "cancelling.due"}}]


STALE = Invariant("stale", "never decides another scancel of a job on an squeue from before "
                  "its previous scancel", _stale, _expect)


def _count(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
    """What the world saw of the job, but the last scancel: replayed, the list has it."""
    names = [name for name, key, _ in [*before, *hop] if key == JOB]
    last = len(names) - 1 - names[::-1].index("scancel")
    return [{"expect_actions": {"key": JOB, "actions": names[:last] + names[last + 1:]}}]


LINGER = 1.0
"""Seconds a finished container's job may stay in squeue unscancelled while nothing fair is
left to do at once (delay A is 0 here; the rate limit may hold a scancel back a second)."""


def _lingers(view: View, actions: Actions) -> dict[str, Any]:
    """How long the finished container's job has lingered: the seconds, since it finished,
    that passed while it was listed, no scancel of it had gone through, scancel worked, and
    the run did not lag (``View.behind``: the clock moved before a fair move that had
    something to do, a step, the worker, a due timer, a poll)."""
    if view.machine_state(JOB) == "running":
        return {}
    world = view.world(JOB)
    counted: dict[str, Any] = {"at": view.now}
    if any(a[0] == "scancel" and a[2].get("exit") == 0 for a in actions):
        counted["scancelled"] = True
    if counted.get("scancelled") or view.extra("scancelled") or not world.get("in_squeue"):
        counted["lingered"] = 0.0  # over for good: paths that lingered differently are one
    elif world.get("scancel_exit", 0) == 0 and not view.behind:
        counted["lingered"] = view.extra("lingered", 0.0) + view.now - view.extra(
            "at", view.now)
    return counted


def _tally(view: View, actions: Actions) -> dict[str, Any]:
    return {**_scancels(view, actions), **_lingers(view, actions)}


def _lingered(before: View, after: View, actions: Actions) -> str | None:
    if after.extra("lingered", 0.0) > LINGER >= before.extra("lingered", 0.0):
        return (f"{JOB}'s container finished, and its job is still in squeue, unscancelled, "
                f"{after.extra('lingered'):g} s of the dispatcher's own time later (at "
                f"{after.now:g} s)")
    return None


def _scancelled(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
    """What the world saw of the job, and a scancel: replayed, it has none."""
    names = [name for name, key, _ in [*before, *hop] if key == JOB]
    return [{"expect_actions": {"key": JOB, "actions": [*names, "scancel"]}}]


LINGERS = Invariant("linger", f"a finished container's job is scancelled (or gone) within "
                    f"{LINGER:g} s of the time the dispatcher has nothing else to do",
                    _lingered, _scancelled)
FAST = Invariant("rate", f"starts at most {RATE:g} scancel a second", _too_fast, _count)
LEAVES = Eventually("leaves", "a finished container's job leaves squeue and the dispatcher "
                    "sees it go (gone)",
                    lambda view: view.machine_state(JOB) not in ("running", "gone"),
                    lambda view: view.machine_state(JOB) == "gone")


@dataclass
class _Turn:
    """A cancel waiting for its turn, as the limiter keeps one (its order, and the start it
    was told, in microseconds)."""

    order: int
    told: int


class _HeldRate(ScancelRate):
    """The dispatcher's limiter, its state read from the world before each scancel and
    written back after it: each explored state has its own (a limiter shared by every path
    would remember scancels of paths not taken). Times that can no longer hold anything back
    are raised to the earliest that still could, so that equal futures are equal states."""

    def __init__(self, world: Any) -> None:
        super().__init__(RATE, world.clock)
        self.world = world

    def reserve(self, key: str) -> float:
        saved = self.world.status.get(LIMITER, {})
        self._free = saved.get("free", -(2**62))
        self._last = saved.get("last", -(2**62))
        ranked = sorted(saved.get("asks", {}).items(), key=lambda kv: kv[1][0])
        self._asks = {k: cast(Any, _Turn(rank, told)) for rank, (k, (_, told)) in enumerate(ranked)}
        self._order = itertools.count(len(ranked))
        wait = super().reserve(key)
        now = self._now()
        ranked = sorted(self._asks.items(), key=lambda kv: kv[1].order)
        self.world.status[LIMITER] = {
            "free": max(self._free, now), "last": max(self._last, now - self.spacing),
            "asks": {k: [rank, ask.told] for rank, (k, ask) in enumerate(ranked)}}
        return wait


POOL = 2
"""Commands the dispatcher runs at once (P: ``SlurmDispatch.max_in_flight``)."""


class _HeldPool(CommandPool):
    """The dispatcher's pool of commands in flight, its state read from the world: the slots
    held are those of the runs begun and not finished that took one (the world's
    :data:`~lifecycle.scenario.RUNNING` entry, where a begun run's slot stays until it
    finishes), so that each explored state has its own. A command that finds every slot
    held is refused at once, as the pool refuses one whose wait ran out (the wait's other
    end, a slot freed in time, is the path on which a run finishes first). A scenario's
    ``begin_effect`` lists its run there as the checker does; a whole ``run_effect`` holds
    no slot past its command."""

    def __init__(self, world: Any, size: int) -> None:
        super().__init__(size, wait=0.0)
        self.world = world

    @contextlib.contextmanager
    def slot(self, what: str) -> Iterator[None]:
        """A slot for a command of ``what`` (the resource's key: its job's id here)."""
        running = self.world.status.get(RUNNING, {})
        held = [key for key, run in running.items() if run.get("slot")]
        self._slots = threading.BoundedSemaphore(self.size)
        for _ in held:
            self._slots.acquire(blocking=False)
        self.in_flight = len(held)
        with super().slot(what):
            if what in running:  # a begun run: its slot is held until it finishes
                running[what] = {**running[what], "slot": True}
            yield


class _PooledSlurm(ScenarioSlurm):
    """The scenario's Slurm with the dispatcher's limits: its scancels limited to ``RATE``
    a second (``rate``) and its sbatch and scancel commands to ``pool`` in flight (None: no
    bound). A scancel refused a slot fails, as ``SlurmDispatch.cancel`` says a command that
    could not run failed (``exit`` None)."""

    def __init__(self, world: Any, pool: int | None, rate: bool = True) -> None:
        super().__init__(world)
        if rate:
            self.rate = _HeldRate(world)
        self.pool = _HeldPool(world, pool) if pool is not None else None

    def _slot(self, key: str) -> Any:
        return self.pool.slot(key) if self.pool is not None else contextlib.nullcontext()

    def submit(self, name: str) -> str:
        with self._slot(name):
            return super().submit(name)

    def cancel(self, job_id: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        try:
            with self._slot(job_id):
                return super().cancel(job_id, steps)
        except SiteError as exc:
            return CancelOutcome(None, 1, str(exc))


def _dispatcher(pool: int | None, rate: bool = True) -> Any:
    def simulation(world: Any) -> tuple[Any, Any, Any]:
        api: ContainerAPI = ScenarioContainers(world)
        return GUARDS, effects(_PooledSlurm(world, pool, rate), api), {}
    return simulation


def limited(pool: int = POOL) -> Playable:
    """The dispatcher as it runs: ``slurm_dispatch`` with its scancels limited to ``RATE``
    a second and its commands to ``pool`` in flight."""
    return Machine(BUILTIN.spec, GUARDS, _dispatcher(pool))


def unpooled() -> Playable:
    """The dispatcher with its rate limit and without its pool: no bound on the commands in
    flight."""
    return Machine(BUILTIN.spec, GUARDS, _dispatcher(None))


def arvados() -> Playable:
    """Arvados' cancel policy as a machine: the edge to ``scancelling`` without its
    freshness rule (scancel while the held squeue lists the job), and no rate limit."""
    def edit(document: dict[str, Any]) -> None:
        for edge in document["eventless"]:
            if edge["dest"] == "cancelling.scancelling":
                edge.pop("fresh", None)
    return variant(BUILTIN, "slurm_dispatch_arvados", edit)


def never_cancels() -> Playable:
    """The dispatcher, rate-limited, that never decides a scancel: ``cancelling.due`` waits
    for the job to leave squeue by itself."""
    def edit(document: dict[str, Any]) -> None:
        document["eventless"] = [e for e in document["eventless"]
                                 if e["dest"] != "cancelling.scancelling"]
    edited = variant(BUILTIN, "slurm_dispatch_never_cancels", edit)
    return Machine(edited.spec, GUARDS, _dispatcher(POOL))


def model(machine: Playable, delays: dict[str, float] | None = None,
          label: str | None = None) -> Model:
    return Model(machine, _setup(delays or {}), actions, (STALE, FAST, LINGERS),
                 ticks=(1.0,), label=label, tally=_tally, eventually=(LEAVES,))


COMMANDS = ("submit", "scancel", "renice")
"""What the world records of the commands the pool bounds (sbatch, scancel, scontrol)."""


def _begun(view: View, key: str) -> bool:
    head = view.resource(key).head()
    return head is not None and head.begun is not None


def _commands(view: View, actions: Actions) -> dict[str, Any]:
    """The resources whose begun run has a command in flight: one started in this move, or
    before it, by a run that has not finished."""
    started = {key for name, key, _ in actions if name in COMMANDS}
    held = set(view.extra("in_flight", [])) | started
    return {"in_flight": sorted(key for key in held if _begun(view, key))}


def _unstarted(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
    """What the world saw of each job whose command started in the breaking move, but that
    command: replayed (``begin_effect``, the others' runs still in flight), it has it."""
    steps = []
    for key in sorted({k for name, k, _ in hop if name in COMMANDS}):
        names = [name for name, k, _ in [*before, *hop] if k == key]
        last = len(names) - 1 - [n in COMMANDS for n in names][::-1].index(True)
        steps.append({"expect_actions": {"key": key, "actions": names[:last] + names[last + 1:]}})
    return steps


def at_most(pool: int) -> Invariant:
    """At most ``pool`` commands in flight. Its scenario ends on the run whose command was
    one too many, begun while the others' runs are (``begin_effect``), and expects that
    command not to have started, which fails."""
    def too_many(before: View, after: View, actions: Actions) -> str | None:
        flying = after.extra("in_flight", [])
        if len(flying) > pool and len(flying) > len(before.extra("in_flight", [])):
            return (f"{len(flying)} commands in flight at once (of {', '.join(flying)}), "
                    f"more than the {pool} allowed")
        return None
    return Invariant("in_flight", f"runs at most {pool} Slurm commands at once", too_many,
                     _unstarted)


def in_flight(machine: Playable, label: str | None = None, pool: int = POOL) -> Model:
    """The scancel flood's world: ``pool + 1`` containers (or the bounds' number), finished,
    their jobs listed by an squeue as of now, falling due together; the worker runs their
    scancels at once (``overlap``); the clock moves a second at a time. Invariant: at most
    ``pool`` commands in flight."""
    def setup(resources: int) -> list[Move]:
        moves: list[Move] = []
        for number in range(1, resources + 1):
            key = f"c{number}"
            listed = {**LISTED, "job_id": key}
            moves += [Create(key, "cancelling.due", {"job_id": key, **SHORT_DELAYS}),
                      SetWorld(key, {**listed, "container": "Complete"}),
                      Observe(key, listed)]
        return moves
    return Model(machine, setup, invariants=(at_most(pool),), ticks=(1.0,), label=label,
                 tally=_commands, resources=pool + 1, overlap=True)


MODELS = {"slurm_dispatch": lambda: model(limited(), SHORT_DELAYS),
          "slurm_dispatch_arvados": lambda: model(arvados(), SHORT_DELAYS),
          "slurm_dispatch_never_cancels": lambda: model(never_cancels(), SHORT_DELAYS),
          "slurm_dispatch_in_flight": lambda: in_flight(limited(), "slurm_dispatch_in_flight"),
          "slurm_dispatch_arvados_in_flight": lambda: in_flight(
              arvados(), "slurm_dispatch_arvados_in_flight")}
