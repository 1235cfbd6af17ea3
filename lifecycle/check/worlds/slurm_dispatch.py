"""The Slurm dispatcher's world: a container whose job may linger in squeue, polls that
may answer late, jobs that leave by themselves, and scancel that may fail.

The container runs, its job listed by squeue and seen so by the dispatcher. The world may
then, in any order: finish the container (the API's ``container_done``), let the job leave
squeue, poll squeue (an answer as of now), ask squeue and have the answer arrive later
(true as of when it was asked: a lagging squeue), and make scancel fail or work again. The
clock moves a second at a time. The invariant is what the incident's loop broke: the
dispatcher never decides another scancel of a job on an squeue picture from before its
previous scancel. Arvados' cancel
policy (no delay A, a scancel every second while the job is listed in whatever squeue the
dispatcher holds, no backoff) is ``arvados()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...machines.slurm_dispatch import BUILTIN
from ...scenario import Playable
from ..explore import Invariant, Model, variant
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
    if world.get("in_squeue"):
        yield Action("the job leaves squeue", (SetWorld(JOB, {**world, "in_squeue": False}),))
    if state == "gone":
        return
    now = _squeue(world)
    seen = view.resource(JOB).seen
    if seen is None or seen.at < view.now or view.believed(JOB) != now:
        yield Action("squeue is polled", (Observe(JOB, now, source="squeue"),))
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


def _scancels(view: View, actions: Actions) -> dict[str, Any]:
    return {"last_scancel": view.now} if any(a[0] == "scancel" for a in actions) else {}


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


def arvados() -> Playable:
    """Arvados' cancel policy as a machine: the edge to ``scancelling`` without its
    freshness rule (scancel while the held squeue lists the job)."""
    def edit(document: dict[str, Any]) -> None:
        for edge in document["eventless"]:
            if edge["dest"] == "cancelling.scancelling":
                edge.pop("fresh", None)
    return variant(BUILTIN, "slurm_dispatch_arvados", edit)


def model(machine: Playable = BUILTIN, delays: dict[str, float] | None = None,
          label: str | None = None) -> Model:
    return Model(machine, _setup(delays or {}), actions, (STALE,), ticks=(1.0,),
                 label=label, tally=_scancels)


MODELS = {"slurm_dispatch": lambda: model(BUILTIN, SHORT_DELAYS),
          "slurm_dispatch_arvados": lambda: model(arvados(), SHORT_DELAYS)}
