"""The drone's world: the site that runs each drone's job, a status cache that lags, and
COBalD, which lowers the demand.

Each drone starts as the incident did (docs/incidents.md): its job queued at the site
(Booting), the controller holding that status, demand 1. The world may then, in any order:
start the job and its payload (Running), end them (the job leaves: Deleted), let the
status cache take the site's current status, have the heartbeat report the cached status as
of now (as ``reconcile`` stamps what the site answered with the time it asked), and lower the
demand to 0. The site is the scenario's simulated site (``ScenarioSite``): the drone's own
effect handlers and probe talk to it, and it records what it was asked to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...adapters.sites import BOOTING, DELETED, RUNNING
from ...machines.drone import BUILTIN, TARDIS_BUILTIN
from ...scenario import Playable
from ..explore import Eventually, Invariant, Model, variant
from ..memory import Actions
from ..moves import Action, Create, Move, Note, Observe, SetWorld, Update
from ..state import View

LIVE = frozenset({"booting", "integrate", "integrating", "available", "drain", "draining",
                  "disintegrate", "shutdown", "shutting_down", "cleanup"})


def setup(resources: int) -> list[Move]:
    moves: list[Move] = []
    for key in _keys(resources):
        booting = {"resource_status": BOOTING}
        moves += [Create(key, "booting", {"remote_id": f"job-{key}"}),
                  SetWorld(key, booting), Observe(key, booting)]
    return moves


def _keys(resources: int) -> list[str]:
    return [f"d{i}" for i in range(1, resources + 1)]


def actions(view: View) -> Iterator[Action]:
    for key in view.keys:
        truth = view.world(key).get("resource_status")
        cached = view.extra(f"cache:{key}", BOOTING)
        if truth == BOOTING:
            yield Action(f"the site starts {key}'s job and payload",
                         (SetWorld(key, {"resource_status": RUNNING}),))
        if truth == RUNNING:
            yield Action(f"{key}'s payload ends and its job leaves",
                         (SetWorld(key, {"resource_status": DELETED}),))
        if cached != truth:
            yield Action(f"the status cache takes {key}'s status ({truth})",
                         (Note(((f"cache:{key}", truth),)),))
        seen = view.resource(key).seen
        if view.machine_state(key) in LIVE and (
                seen is None or seen.at < view.now
                or view.believed(key) != {"resource_status": cached}):
            yield Action(f"the heartbeat reports {key} {cached} (cached) as of now",
                         (Observe(key, {"resource_status": cached}, source="reconcile"),))
        if view.data(key).get("demand", 1) == 1 and view.machine_state(key) in LIVE:
            yield Action(f"COBalD sets {key}'s demand to 0", (Update(key, {"demand": 0}),))


def _removals(before: View, actions: Actions) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, key, details in actions:
        if name == "terminate" and details.get("acted"):
            yield key, details


def _kills_payload(before: View, after: View, actions: Actions) -> str | None:
    for key, details in _removals(before, actions):
        if before.world(key).get("resource_status") == RUNNING:
            return (f"the site removed {key}'s job while its payload ran (terminate, expect "
                    f"{details.get('expect')}); the controller held "
                    f"{before.believed(key)} in {before.machine_state(key)}")
    return None


def _unfenced(before: View, after: View, actions: Actions) -> str | None:
    for name, key, details in actions:
        if (name == "terminate" and details.get("expect") is None
                and before.world(key).get("resource_status") != DELETED):
            return (f"the site was asked to remove {key}'s job, which was "
                    f"{before.world(key).get('resource_status')}, without a fence")
    return None


def _without(picked: Any) -> Any:
    def expect(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
        keys = {key for _, key, _ in hop}
        return [{"expect_actions": {"key": key, "actions": [
            name for name, k, details in [*before, *hop]
            if k == key and not (name == "terminate" and picked(details))]}}
            for key in sorted(keys)]
    return expect


PAYLOAD = Invariant("payload", "never removes a job whose payload is running",
                    _kills_payload, _without(lambda details: details.get("acted")))
FENCED = Invariant("fenced", "only fenced removals reach a job the site has", _unfenced,
                   _without(lambda details: details.get("expect") is None))


# None of the world's actions is fair: the site need not start the job, nor the heartbeat
# report again; a drone with demand 0 must leave booting on the engine's steps, the worker's
# runs and the clock alone (asking its site when what it holds is stale).
RELEASED = Eventually(
    "released", "a drone with demand 0 leaves booting",
    lambda view: any(view.machine_state(k) == "booting" and view.data(k).get("demand") == 0
                     for k in view.keys),
    lambda view: all(view.machine_state(k) != "booting" or view.data(k).get("demand") != 0
                     for k in view.keys))


def model(machine: Playable = BUILTIN, invariants: Sequence[Invariant] = (PAYLOAD, FENCED),
          ticks: tuple[float, ...] = (40.0,)) -> Model:
    """The drone's world around ``machine`` (``drone``, ``drone_tardis``, or a variant)."""
    return Model(machine, setup, actions, tuple(invariants), ticks=ticks,
                 eventually=(RELEASED,))


def without_freshness() -> Playable:
    """``drone`` with no freshness rule on any edge (and so no fence: a fence is the
    observation a risky edge rested on)."""
    def edit(document: dict[str, Any]) -> None:
        for edge in [*document["transitions"], *document["eventless"]]:
            edge.pop("fresh", None)
    return variant(BUILTIN, "drone_without_freshness", edit)


def without_probe() -> Playable:
    """``drone`` whose booting drone, with demand 0 and a stale status, does not ask the site
    but waits for the heartbeat's next report (its freshness rules keep their age, without
    their probe): a drone the heartbeat stops reporting stays in ``booting`` for ever."""
    def edit(document: dict[str, Any]) -> None:
        for edge in document["eventless"]:
            if edge["source"] == "booting" and edge.get("fresh"):
                edge["fresh"] = {k: v for k, v in edge["fresh"].items() if k != "probe"}
    return variant(BUILTIN, "drone_without_probe", edit)


def without_fence() -> Playable:
    """``drone`` whose terminate does not pass the site the status it expects."""
    def edit(document: dict[str, Any]) -> None:
        for state in document["states"]:
            for effect in state.get("effects", ()):
                if isinstance(effect, dict) and effect.get("name") == "terminate":
                    effect["args"] = {"fenced": False}
    return variant(BUILTIN, "drone_without_fence", edit)


MODELS = {"drone": lambda: model(BUILTIN), "drone_tardis": lambda: model(TARDIS_BUILTIN),
          "drone_without_probe": lambda: model(without_probe())}
