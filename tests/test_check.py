"""`lifecycle check`: the explorer finds each incident's shortest path on the machine that had
it, finds none on the fixed machine within bounds that contain it, and writes scenarios that
the real engine replays and fails on at their last step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lifecycle.check import (
    Action,
    Actions,
    Advance,
    Begin,
    Bounds,
    Crash,
    Create,
    Eventually,
    Finish,
    Fire,
    Invariant,
    Machine,
    Memory,
    Model,
    SetWorld,
    State,
    Step,
    Update,
    View,
    check,
    declared,
    scenario,
    text,
    write_scenario,
)
from lifecycle.check.explore import STUTTER
from lifecycle.check.memory import CheckError
from lifecycle.check.state import EMPTY, freeze
from lifecycle.check.worlds import drone, job_exit, slurm_dispatch, world_model
from lifecycle.cli import main
from lifecycle.errors import SpecError
from lifecycle.machines import builtins
from lifecycle.machines.drone import TARDIS_BUILTIN as BUILTIN_TARDIS
from lifecycle.machines.slurm_dispatch import BUILTIN as BUILTIN_SLURM
from lifecycle.scenario import RUNNING, Playable, replay
from lifecycle.spec import MachineSpec, load_spec

DRONE_INCIDENT = 4
"""Moves the incident needs from a booting drone the controller holds as Booting: the job
and its payload start, the demand drops, the engine steps the drone into cleanup on the
Booting it holds, the worker removes the job (or the demand first, and the job starts
between the step and the removal)."""
DRONE = Bounds(depth=10, horizon=120)
DRONE_WHOLE = Bounds(depth=40, horizon=80)
"""Two ticks of 40 s: observations go stale (the rule's 30 s) once and twice."""


def test_the_fixed_drone_removes_no_running_payload_within_bounds() -> None:
    report = check(world_model("drone"), DRONE_WHOLE)
    assert report.passed, text(report)
    assert report.exhausted and report.depth < DRONE_WHOLE.depth  # every state, not a depth
    assert report.invariants == ["payload", "fenced"]


def test_the_tardis_drone_removes_a_running_payload_in_the_incidents_moves() -> None:
    report = check(world_model("drone_tardis"), DRONE)
    example = report.violations["payload"]
    assert len(example) == DRONE_INCIDENT
    labels = [hop.label for hop in example.hops]
    assert "the site starts d1's job and payload" in labels
    assert labels[-1] == "the worker runs d1's terminate"
    # the controller stepped on the Booting it held while the site ran the payload
    stepped = next(h for h in example.hops if h.label == "step d1")
    assert stepped.state.resources[0].state == "cleanup"
    assert dict(stepped.state.resources[0].seen.status) == {"resource_status": "Booting"}
    assert "payload ran" in example.message
    printed = text(report)
    assert "VIOLATED payload" in printed and "Booting (0 s old)" in printed


@pytest.mark.parametrize("machine", ["drone", "drone_tardis"])
def test_bounds_below_the_incident_find_nothing(machine: str) -> None:
    report = check(world_model(machine), Bounds(depth=DRONE_INCIDENT - 1, horizon=120))
    assert "payload" not in report.violations


@pytest.mark.parametrize("made", [drone.without_freshness, drone.without_fence],
                         ids=["without_freshness", "without_fence"])
def test_a_broken_drone_is_caught(made: object) -> None:
    machine = made()  # type: ignore[operator]
    report = check(drone.model(machine), DRONE)
    assert len(report.violations["payload"]) == DRONE_INCIDENT


@pytest.mark.parametrize("invariant", ["payload", "fenced"])
def test_the_written_scenario_replays_and_fails_at_its_last_step(
        invariant: str, tmp_path: Path) -> None:
    example = check(world_model("drone_tardis"), DRONE).violations[invariant]
    path = write_scenario(example, tmp_path / f"{invariant}.yaml")
    steps = yaml.safe_load(path.read_text())["steps"]
    result = replay(path, builtins())
    assert not result.passed
    assert result.failure is not None
    # every state the checker found after each move, the real engine found too
    assert result.failure.step == len(steps)
    assert result.failure.kind == "expect_actions"
    assert result.failure.found == ["terminate"]


def test_the_scenario_says_what_the_checker_did() -> None:
    example = check(world_model("drone_tardis"), DRONE).violations["payload"]
    document = scenario(example)
    assert document["machine"] == "drone_tardis"
    kinds = [next(iter(step)) for step in document["steps"]]
    assert kinds[:3] == ["create", "world", "observe"]
    assert kinds.count("step") == 1 and kinds.count("run_effect") == 1
    assert kinds[-1] == "expect_actions"


def test_a_step_is_the_engines_own_decision() -> None:
    """A stale Booting on the fixed drone makes the step ask the probe, and the drone
    integrates on the fresh Running, as the incident's scenario shows on the engine."""
    model = world_model("drone")
    memory = Memory(model.machine, model.start)
    state = State(0.0, (), EMPTY)
    for move in [*model.setup(1), SetWorld("d1", {"resource_status": "Running"}),
                 Advance(40), Update("d1", {"demand": 0})]:
        state, _, _ = memory.apply(state, move)
    state, _, fired = memory.apply(state, Step("d1"))
    assert fired is not None and fired.fired and fired.probed and fired.dest == "integrate"


def test_a_probe_that_fails_refuses_the_edge_and_leaves_the_state_as_it_was() -> None:
    """The site cannot say the drone's status (the probe fails, as one that timed out
    does): the step asks, is refused, and the drone stays booting on the stale Booting it
    held; once the site answers, the same step integrates it."""
    model = world_model("drone")
    memory = Memory(model.machine, model.start)
    state = State(0.0, (), EMPTY)
    for move in [*model.setup(1), SetWorld("d1", {"resource_status": "Unknown"}),
                 Advance(40), Update("d1", {"demand": 0})]:
        state, _, _ = memory.apply(state, move)
    held = state
    state, _, fired = memory.apply(state, Step("d1"))
    assert fired is not None and fired.probed and not fired.fired
    assert state == held  # nothing moved, nothing observed: as if it had not stepped
    assert View(state, model.start).believed("d1") == {"resource_status": "Booting"}
    state, _, _ = memory.apply(state, SetWorld("d1", {"resource_status": "Running"}))
    state, _, fired = memory.apply(state, Step("d1"))
    assert fired is not None and fired.fired and fired.dest == "integrate"


# -- startd: the stale advertised claim --------------------------------------------------------

STARTD_INCIDENT = 9
"""Moves the incident needs, one effect per move: the startd fetches work, the collector
publishes the slot's ad, the worker publishes it again and runs the fetch (the hook's
answer starts the job, which publishes a new claim id), the fetched job ends, the worker
replies to the hook, the policy makes the slot Unclaimed, and the schedd claims with the id
it read."""
STARTD = Bounds(depth=20)


def test_the_startd_takes_the_claim_the_collector_published_within_bounds() -> None:
    report = check(world_model("startd"), STARTD)
    assert report.passed, text(report)
    assert report.exhausted  # every state of the slot's world, well within the depth


def test_the_startd_without_options_c_and_d_refuses_it_in_the_incidents_moves(
        tmp_path: Path) -> None:
    report = check(world_model("startd_without_cd"), STARTD)
    example = report.violations["claim"]
    assert len(example) == STARTD_INCIDENT
    assert [h.label for h in example.hops][-2:] == [
        "the startd evaluates its policy",
        "schedd-a claims with the id it read from the collector"]
    path = write_scenario(example, tmp_path / "claim.yaml")
    result = replay(path, builtins())
    assert result.failure is not None and result.failure.kind == "expect_last"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert "names_advertised_claim" in result.failure.found["reason"]
    fewer = check(world_model("startd_without_cd"), Bounds(depth=STARTD_INCIDENT - 1))
    assert fewer.passed


# -- slurm_dispatch: the scancel loop ---------------------------------------------------------

SLURM_INCIDENT = 8
"""Moves the loop needs: the container finishes, its job leaves squeue, delay A (0) runs
out, the dispatcher steps on the squeue it holds, a second passes, the worker scancels,
delay B runs out, and the dispatcher steps into another scancel on the same old squeue
(which still lists a job that has left)."""
SLURM = Bounds(depth=SLURM_INCIDENT, horizon=3)
SLURM_BURST = 5
"""Moves two scancels within a second need without a rate limit: the container finishes,
delay A (0) runs out, the dispatcher steps into a scancel, the worker runs it and dies
before recording it, and runs it again."""


def _dispatchers() -> dict[str, Playable]:
    return {**builtins(), "slurm_dispatch": slurm_dispatch.limited(),
            "slurm_dispatch_arvados": slurm_dispatch.arvados(),
            "slurm_dispatch_never_cancels": slurm_dispatch.never_cancels()}


def test_the_dispatcher_never_scancels_on_an_old_squeue_nor_faster_than_its_limit() -> None:
    report = check(world_model("slurm_dispatch"), SLURM)
    assert report.passed, text(report)
    assert report.invariants == ["stale", "rate", "linger"]
    assert report.eventually == ["leaves"]
    assert report.depth == SLURM.depth


def test_the_dispatchers_rate_limit_is_met_within_the_bounds() -> None:
    """Not a pass for want of trying: within the same bounds, the limiter holds a scancel
    back (``cancelling.throttled``) on some path."""
    held = Invariant("held", "never throttled",
                     lambda before, after, did: "throttled" if after.machine_state("c1")
                     == "cancelling.throttled" else None, lambda view, before, did: [])
    model = dataclasses.replace(world_model("slurm_dispatch"), invariants=(held,))
    assert "held" in check(model, SLURM).violations


def _only(model: Model | None, *names: str) -> Model:
    """``model`` checking only the invariants named (so that it stops at their
    counterexamples, not at the bounds)."""
    assert model is not None
    return dataclasses.replace(model, invariants=[i for i in model.invariants
                                                  if i.name in names])


def test_arvados_policy_scancels_again_on_the_old_squeue(tmp_path: Path) -> None:
    report = check(_only(world_model("slurm_dispatch_arvados"), "stale", "rate"), SLURM)
    example = report.violations["stale"]
    assert len(example) == SLURM_INCIDENT
    assert sum(a[0] == "scancel" for h in example.hops for a in h.actions) >= 1
    assert example.hops[-1].label == "step c1"
    path = write_scenario(example, tmp_path / "loop.yaml")
    result = replay(path, _dispatchers())
    assert result.failure is not None and result.failure.kind == "expect"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert result.failure.found["state"] == "cancelling.scancelling"
    fewer = check(world_model("slurm_dispatch_arvados"),
                  Bounds(depth=SLURM_INCIDENT - 1, horizon=3))
    assert "stale" not in fewer.violations


def test_arvados_policy_scancels_twice_within_a_second(tmp_path: Path) -> None:
    report = check(_only(world_model("slurm_dispatch_arvados"), "rate"), SLURM)
    example = report.violations["rate"]
    assert len(example) == SLURM_BURST
    assert "2 scancels started within one second" in example.message
    path = write_scenario(example, tmp_path / "burst.yaml")
    result = replay(path, _dispatchers())
    assert result.failure is not None and result.failure.kind == "expect_actions"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert result.failure.found.count("scancel") == 2
    fewer = check(world_model("slurm_dispatch_arvados"),
                  Bounds(depth=SLURM_BURST - 1, horizon=3))
    assert fewer.passed


def test_a_dispatcher_without_its_rate_limit_is_caught() -> None:
    """The fixed machine's spec (its freshness rule kept) run without the limiter."""
    unlimited = slurm_dispatch.model(BUILTIN_SLURM, slurm_dispatch.SHORT_DELAYS)
    report = check(_only(unlimited, "stale", "rate"), SLURM)
    assert len(report.violations["rate"]) == SLURM_BURST
    assert "stale" not in report.violations


def test_a_dispatcher_without_its_freshness_rule_is_caught_without_crashes() -> None:
    """Arvados' loop needs no fault: a scancel that matched nothing looks again at once, on
    the squeue it holds."""
    report = check(_only(world_model("slurm_dispatch_arvados"), "stale", "rate"),
                   dataclasses.replace(SLURM, crashes=False))
    assert len(report.violations["rate"]) == SLURM_INCIDENT
    assert len(report.violations["stale"]) == SLURM_INCIDENT


SLURM_LINGER = 5
"""Moves a job needs to linger past its bound when nothing scancels it: the container
finishes, delay A (0) runs out, a second passes, squeue is polled (a fair move the run
must not lag behind for the second to count), and another second passes."""


def test_a_dispatcher_that_never_scancels_lets_the_job_linger_past_its_bound(
        tmp_path: Path) -> None:
    report = check(world_model("slurm_dispatch_never_cancels"), SLURM, until_all=False)
    example = report.violations["linger"]
    assert len(example) == SLURM_LINGER
    assert "2 s of the dispatcher's own time" in example.message
    assert [h.label for h in example.hops][-3:] == ["1 s pass", "squeue is polled", "1 s pass"]
    assert not {"stale", "rate"} & set(report.violations)
    assert "leaves" in report.loops  # and, fairly run, it never leaves
    path = write_scenario(example, tmp_path / "linger.yaml")
    result = replay(path, _dispatchers())
    assert result.failure is not None and result.failure.kind == "expect_actions"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert "scancel" not in result.failure.found
    fewer = check(world_model("slurm_dispatch_never_cancels"),
                  Bounds(depth=SLURM_LINGER - 1, horizon=3))
    assert "linger" not in fewer.violations


def test_a_lagging_worker_is_not_the_dispatchers_linger() -> None:
    """The clock may pass while the worker has a scancel to run (the checker explores
    that), but that second is the worker's lag, not the dispatcher's: the fixed dispatcher
    keeps its bound (its check above) although some path's job stays listed longer."""
    listed = Invariant("listed", "the job is scancelled within 1 s of its finish",
                       lambda before, after, did: "late" if after.now >= 2
                       and after.machine_state("c1") != "running"
                       and not after.extra("scancelled") else None,
                       lambda view, before, did: [])
    model = dataclasses.replace(world_model("slurm_dispatch"), invariants=(listed,))
    assert "listed" in check(model, SLURM).violations


# -- slurm_dispatch: commands in flight ----------------------------------------------------------

FLOOD = Bounds(depth=6, horizon=2, crashes=False)
"""The scancel flood's world: its containers' steps and their scancels' starts, and two
seconds (a dead worker's commands die with it: crashes add nothing to what is in flight)."""
FLOOD_ARVADOS = 2 * (slurm_dispatch.POOL + 1)
"""Moves P + 1 commands in flight need with no bound: each container steps into its scancel,
and the worker starts each one, none finished."""
UNPOOLED = 5
"""Moves two scancels in flight need under the rate limit alone (P = 1): both containers
step, the worker starts c1's, a second passes (the next tick of the limit), and it starts
c2's while c1's runs."""


def _pooled(machine: Playable, pool: int = 1) -> Model:
    return slurm_dispatch.in_flight(machine, pool=pool)


def test_arvados_dispatcher_runs_more_commands_at_once_than_the_pool_allows(
        tmp_path: Path) -> None:
    report = check(world_model("slurm_dispatch_arvados_in_flight"), FLOOD)
    example = report.violations["in_flight"]
    assert len(example) == FLOOD_ARVADOS
    assert [h.label for h in example.hops][-3:] == [
        f"the worker starts c{n}'s scancel" for n in (1, 2, 3)]
    assert "3 commands in flight at once (of c1, c2, c3), more than the 2 allowed" \
        in example.message
    # as many as the pool allows, or fewer moves, find nothing
    assert check(world_model("slurm_dispatch_arvados_in_flight"),
                 dataclasses.replace(FLOOD, resources=slurm_dispatch.POOL)).passed
    assert check(world_model("slurm_dispatch_arvados_in_flight"),
                 dataclasses.replace(FLOOD, depth=FLOOD_ARVADOS - 1)).passed
    # the scenario replays each move on the real engine and worker (each run begun while
    # the others are in flight), and the state the checker found after each, then fails at
    # its last step: the command one too many started
    path = write_scenario(example, tmp_path / "flood.yaml")
    steps = yaml.safe_load(path.read_text())["steps"]
    assert [next(iter(s)) for s in steps].count("begin_effect") == slurm_dispatch.POOL + 1
    result = replay(path, _dispatchers())
    assert result.failure is not None, result
    assert result.failure.step == len(steps)
    assert result.failure.kind == "expect_actions"
    assert steps[-1] == {"expect_actions": {"key": "c3", "actions": []}}
    assert result.failure.found == ["scancel"]


def test_the_dispatchers_pool_keeps_its_commands_in_flight_within_bounds() -> None:
    report = check(world_model("slurm_dispatch_in_flight"), FLOOD)
    assert report.passed, text(report)
    assert report.invariants == ["in_flight"] and report.depth == FLOOD.depth


def test_the_rate_limit_alone_does_not_bound_the_commands_in_flight(tmp_path: Path) -> None:
    """Without its pool, the fixed dispatcher starts a second scancel a tick after the first
    while the first still runs; with it (P = 1), the second is refused its slot and fails,
    on the same bounds. The written scenario fails on the one and passes on the other."""
    found = check(_pooled(slurm_dispatch.unpooled()), FLOOD).violations["in_flight"]
    assert len(found) == UNPOOLED
    assert "2 commands in flight at once (of c1, c2)" in found.message
    path = write_scenario(found, tmp_path / "unpooled.yaml")
    steps = yaml.safe_load(path.read_text())["steps"]
    failure = replay(path, {"slurm_dispatch": slurm_dispatch.unpooled()}).failure
    assert failure is not None and failure.step == len(steps), failure
    assert (failure.kind, failure.found) == ("expect_actions", ["scancel"])
    pooled = replay(path, {"slurm_dispatch": slurm_dispatch.limited(pool=1)})
    assert pooled.passed, pooled.failure  # c2's begun run found c1's holding the slot
    assert check(_pooled(slurm_dispatch.unpooled()),
                 dataclasses.replace(FLOOD, depth=UNPOOLED - 1)).passed
    assert check(_pooled(slurm_dispatch.limited(pool=1)), FLOOD).passed
    refused = Invariant("refused", "no scancel fails",
                        lambda before, after, did: "failed" if any(
                            after.data(k).get("scancel_failures") for k in after.keys)
                        else None, lambda view, before, did: [])
    model = dataclasses.replace(_pooled(slurm_dispatch.limited(pool=1)), invariants=(refused,))
    example = check(model, FLOOD).violations["refused"]  # not a pass for want of trying
    assert [h.label for h in example.hops][-2:] == ["the worker starts c2's scancel",
                                                   "c2's scancel ends"]
    after = View(example.hops[-1].state, example.start)
    assert after.data("c2")["scancel_exit"] is None  # the command could not run


def test_a_begun_run_holds_its_slot_until_it_finishes() -> None:
    """Begin calls the handler (its command starts, its slot is noted in the world's
    running entry), any move may follow, and Finish lets the slot go and records the
    outcome the call had."""
    model = _pooled(slurm_dispatch.limited(pool=1))
    memory = Memory(model.machine, model.start)
    state = State(0.0, (), EMPTY)
    for move in [*model.setup(2), Step("c1"), Step("c2")]:
        state, _, _ = memory.apply(state, move)
    state, did, _ = memory.apply(state, Begin("c1"))
    assert [a[0] for a in did] == ["scancel"]
    assert state.find("c1")[1].state == "cancelling.scancelling"
    assert dict(state.world)[RUNNING] == freeze({"c1": {"slot": True}})
    state, did, _ = memory.apply(state, Advance(1.0))
    state, did, _ = memory.apply(state, Begin("c2"))
    assert did == []  # refused a slot: no scancel ran
    state, _, _ = memory.apply(state, Finish("c1"))
    assert state.find("c1")[1].state == "cancelling.waiting"
    assert dict(state.world)[RUNNING] == freeze({"c2": {}})
    state, _, _ = memory.apply(state, Finish("c2"))
    assert RUNNING not in dict(state.world)
    assert View(state, model.start).data("c2")["scancel_failures"] == 1
    start = model.start
    assert Begin("c1").scenario(start) == [{"begin_effect": "c1"}]
    assert Finish("c1").scenario(start) == [{"finish_effect": "c1"}]


# -- faults: the worker dies between a handler's end and its outcome's record -------------------


def _terminated_twice(before: View, after: View, actions: Actions) -> str | None:
    return "the job was terminated a second time" if any(
        name == "terminate" for name, _, _ in actions) and before.extra("terminated") else None


def test_a_crash_runs_the_effect_again_and_the_scenario_crashes_alike(tmp_path: Path) -> None:
    """At least once: a worker that dies after terminate ran, before it was recorded, leaves
    the effect to run again. The checker finds that path, and the scenario's
    ``crash_effect`` does on the real engine what the checker's crash did."""
    once = Invariant("once", "the site is asked to terminate once", _terminated_twice,
                     lambda view, before, hop: [{"expect_actions": {"key": "d1",
                                                                    "actions": ["terminate"]}}])
    model = dataclasses.replace(
        drone.model(BUILTIN_TARDIS), invariants=(once,),
        tally=lambda view, actions: {"terminated": True} if any(
            a[0] == "terminate" for a in actions) else {})
    example = check(model, Bounds(depth=5, horizon=0)).violations["once"]
    assert [h.moves[0].__class__.__name__ for h in example.hops] == [
        "Update", "Step", "Crash", "RunEffect"]
    path = write_scenario(example, tmp_path / "twice.yaml")
    result = replay(path, builtins())
    assert result.failure is not None and result.failure.kind == "expect_actions"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert result.failure.found == ["terminate", "terminate"]


# -- job_exit: the exit that repeats or skips steps ----------------------------------------------

JOB_EXIT_INCIDENT = 5
"""Moves a second queue update needs: the job exits, the worker runs its first two steps,
dies after the queue update, before recording it, and runs the update again."""
JOB_EXIT = Bounds(depth=JOB_EXIT_INCIDENT + 1, horizon=60)


def test_the_job_exit_updates_the_queue_once_across_crashes() -> None:
    report = check(world_model("job_exit"), JOB_EXIT)
    assert report.passed, text(report)
    assert report.invariants == ["queue_once", "mail_after_queue"]


def test_without_the_outbox_a_crash_updates_the_queue_twice(tmp_path: Path) -> None:
    example = check(world_model("job_exit_without_outbox"), JOB_EXIT).violations["queue_once"]
    assert len(example) == JOB_EXIT_INCIDENT
    assert isinstance(example.hops[-2].moves[0], Crash)
    path = write_scenario(example, tmp_path / "twice.yaml")
    result = replay(path, {**builtins(), "job_exit_without_outbox": job_exit.without_outbox()})
    assert result.failure is not None and result.failure.kind == "expect_actions"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert result.failure.found.count("committed") == 2
    fewer = check(world_model("job_exit_without_outbox"),
                  Bounds(depth=JOB_EXIT_INCIDENT - 1, horizon=60))
    assert "queue_once" not in fewer.violations


# -- the command line --------------------------------------------------------------------------

USER_MODEL = '''
from lifecycle import MachineSpec
from lifecycle.check import Action, Create, Fire, Invariant, Machine, Model

spec = MachineSpec.model_validate({
    "name": "toggle", "initial": "off", "states": ["off", "on", "broken"],
    "transitions": [{"trigger": "flip", "source": "off", "dest": "on"},
                    {"trigger": "flip", "source": "on", "dest": "broken"}]})
never_broken = Invariant(
    "broken", "never broken",
    lambda before, after, did: "broken" if after.machine_state("t1") == "broken" else None,
    lambda view, before, did: [{"expect": {"key": "t1", "state": "on"}}])
MODEL = Model(Machine(spec), lambda n: [Create("t1")],
              lambda view: [Action("flip", (Fire("t1", "flip"),))], [never_broken])
'''


def test_the_command_prints_the_timeline_writes_the_scenario_and_exits_1(
        tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "race.yaml"
    found = runner.invoke(main, ["check", "drone_tardis", "--invariant", "payload",
                                 "--write-scenario", str(path)])
    assert found.exit_code == 1, found.output
    assert "VIOLATED payload" in found.output and "shortest counterexample: 4 moves" in found.output
    assert not replay(path, builtins()).passed
    clean = runner.invoke(main, ["check", "drone", "--depth", "4", "--json"])
    assert clean.exit_code == 0, clean.output
    figures = json.loads(clean.output)
    assert figures["passed"] and figures["bounds"]["depth"] == 4 and figures["states"] > 1
    assert figures["violations"] == {}


@pytest.mark.parametrize("variant", ["slurm_dispatch_arvados_in_flight", "startd_without_cd",
                                     "job_exit_without_outbox"])
def test_lifecycle_replay_fails_on_what_check_wrote_for_a_variant(variant: str,
                                                                  tmp_path: Path) -> None:
    """A variant is no built-in machine: ``lifecycle replay`` finds it among the world
    models, as the message of ``lifecycle check`` says it will."""
    runner = CliRunner()
    path = tmp_path / "found.yaml"
    bounds = {"slurm_dispatch_arvados_in_flight": ["--depth", "6", "--horizon", "2"],
              "startd_without_cd": ["--depth", "10"],
              "job_exit_without_outbox": ["--depth", "6", "--horizon", "60"]}[variant]
    found = runner.invoke(main, ["check", variant, *bounds, "--write-scenario", str(path)])
    assert found.exit_code == 1, found.output
    written = sorted(tmp_path.glob("found*.yaml"))
    assert written, found.output
    for file in written:
        assert f"`lifecycle replay {file}` fails on it" in found.output
        replayed = runner.invoke(main, ["replay", str(file), "--json"])
        assert replayed.exit_code == 1, replayed.output
        result, = json.loads(replayed.output)
        assert not result["passed"] and "neither a built-in" not in replayed.output, result


def test_the_command_checks_a_users_model_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "toggle.py").write_text(USER_MODEL)
    result = CliRunner().invoke(main, ["check", f"{tmp_path / 'toggle.py'}:MODEL", "--json"])
    assert result.exit_code == 1, result.output
    violation = json.loads(result.output)["violations"]["broken"]
    assert violation["length"] == 2
    assert [row["move"] for row in violation["timeline"]] == ["start", "flip", "flip"]


def test_the_command_names_what_it_cannot_check() -> None:
    runner = CliRunner()
    unknown = runner.invoke(main, ["check", "no_such_machine"])
    assert unknown.exit_code == 2 and "neither a built-in machine" in unknown.output
    wrong = runner.invoke(main, ["check", "drone", "--invariant", "nope"])
    assert wrong.exit_code == 2 and "unknown invariant nope" in wrong.output


# -- liveness: what must stay possible -----------------------------------------------------------


def _trap_model(jam: bool, fair: bool = True) -> Model:
    spec = MachineSpec.model_validate({
        "name": "trap", "initial": "a", "states": ["a", "b", "trap"],
        "transitions": [{"trigger": "flip", "source": "a", "dest": "b"},
                        {"trigger": "flip", "source": "b", "dest": "a"},
                        {"trigger": "jam", "source": "b", "dest": "trap"}]})

    def actions(view: View) -> list[Action]:
        out = [Action("flip", (Fire("t1", "flip"),), fair=fair)] \
            if view.machine_state("t1") != "trap" else []
        if jam and view.machine_state("t1") == "b":
            out.append(Action("jam", (Fire("t1", "jam"),)))
        return out

    back = Eventually("back", "t1 gets back to a", lambda v: v.machine_state("t1") != "a",
                      lambda v: v.machine_state("t1") == "a")
    return Model(Machine(spec), lambda n: [Create("t1")], actions, eventually=[back])


def test_a_state_from_which_a_liveness_property_never_holds_is_found_shortest() -> None:
    report = check(_trap_model(jam=True), Bounds(depth=6))
    stuck = report.stuck["back"]
    assert [h.label for h in stuck.hops] == ["flip", "jam"]
    assert not report.passed and "NEVER back" in text(report)
    assert check(_trap_model(jam=False), Bounds(depth=6)).passed


def _job_exit_retrying(retries: int) -> Machine:
    """The job exit as its world model runs it, but a step gives up after ``retries`` retries
    (30 s apart, as HTCondor's) instead of HTCondor's five."""
    simulated = job_exit.BUILTIN.simulation
    assert simulated is not None
    policy = job_exit.Settings(max_retries=retries).retry

    def simulation(world: object) -> tuple[object, object, object]:
        guards, effects, probes = simulated(world)
        return guards, {name: dataclasses.replace(effect, retry=policy)
                        for name, effect in effects.items()}, probes

    return Machine(job_exit.BUILTIN.spec, job_exit.BUILTIN.guards, simulation)


def test_a_job_exit_that_gave_up_finishes_only_after_the_operators_retry(slow: bool) -> None:
    """A step that failed on every attempt gives up (stuck_queue), and only the operator's
    retry finishes the exit: with one retry, 30 s after the first attempt (the same give-up
    as after HTCondor's five, in a twentieth of the states); with --slow, the world model as
    it is, six attempts 30 s apart."""
    if slow:
        model = world_model("job_exit")
        bounds = Bounds(depth=30, horizon=150)  # six failed attempts, 30 s apart, then stuck
    else:
        model = job_exit.model(_job_exit_retrying(1))
        bounds = Bounds(depth=12, horizon=30)  # two failed attempts, 30 s apart, then stuck
    assert model is not None
    assert check(model, bounds).passed

    def without_retry(view: View) -> list[Action]:
        return [a for a in model.actions(view) if a.label != "the operator runs lifecycle retry"]

    stuck = check(dataclasses.replace(model, actions=without_retry), bounds).stuck["finishes"]
    assert stuck.hops[-1].state.resources[0].state == "stuck_queue"

    def unfair_retry(view: View) -> list[Action]:
        return [dataclasses.replace(a, fair=False) for a in model.actions(view)]

    # an operator who need not ever retry: the run that stops in stuck_queue is fair
    report = check(dataclasses.replace(model, actions=unfair_retry), bounds)
    assert "finishes" not in report.stuck  # the retry can still finish it ...
    loop = report.loops["finishes"]  # ... but nothing makes it
    assert loop.loop == 1 and loop.hops[-1].label == STUTTER
    assert loop.hops[-1].state.resources[0].state == "stuck_queue"


# -- liveness under weak fairness: a loop that never meets it -------------------------------------


def test_a_loop_in_which_the_property_never_holds_is_found_when_it_is_fair() -> None:
    """Stuck for good in ``trap``: nothing is enabled, so the run that stays there is fair.
    Flipping between a and b is a loop too, but a fair flip, enabled all along it, must be
    taken, and it leads back to a: only when the flip is not fair may the world stop at b."""
    jammed = check(_trap_model(jam=True), Bounds(depth=6)).loops["back"]
    assert [h.label for h in jammed.hops] == ["flip", "jam", STUTTER] and jammed.loop == 1
    assert check(_trap_model(jam=False), Bounds(depth=6)).passed
    idle = check(_trap_model(jam=False, fair=False), Bounds(depth=6))
    assert not idle.stuck and [h.label for h in idle.loops["back"].hops] == ["flip", STUTTER]
    assert "NEVER (fair loop) back" in text(idle)


def _pacing(finish_fair: bool) -> Model:
    spec = MachineSpec.model_validate({
        "name": "pacer", "initial": "left", "final": ["done"],
        "states": ["left", "right", "done"],
        "transitions": [{"trigger": "go", "source": "left", "dest": "right"},
                        {"trigger": "go", "source": "right", "dest": "left"},
                        {"trigger": "finish", "source": "right", "dest": "done"}]})

    def actions(view: View) -> list[Action]:
        if view.machine_state("p1") == "done":
            return []
        out = [Action("go", (Fire("p1", "go"),), fair=True)]
        if view.machine_state("p1") == "right":
            out.append(Action("finish", (Fire("p1", "finish"),), fair=finish_fair))
        return out

    done = Eventually("done", "p1 is done", lambda v: True,
                      lambda v: v.machine_state("p1") == "done")
    return Model(Machine(spec), lambda n: [Create("p1")], actions, eventually=[done])


def test_a_fair_loop_takes_each_fair_move_it_keeps_enabled_and_fairness_is_weak() -> None:
    """Pacing left and right for ever takes ``go``, which is enabled all along, so the loop
    must go both ways; ``finish``, enabled only on the right, may be neglected even when it
    is fair: weak fairness asks a move to be taken only when it stays enabled."""
    for finish_fair in (False, True):
        loop = check(_pacing(finish_fair), Bounds(depth=6)).loops["done"]
        assert loop.loop == 2 and [h.label for h in loop.hops] == ["go", "go"]
        assert "(go)" in loop.message


def test_a_drone_that_waits_for_the_heartbeat_stays_booting_on_a_fair_run() -> None:
    """``drone`` leaves booting on its own steps, asking its site when what it holds is
    stale; without the probe it waits for a heartbeat that need not come. Every state can
    still reach the release (the heartbeat may report), so only the fair loop shows it."""
    broken = check(world_model("drone_without_probe"), DRONE_WHOLE)
    assert not broken.violations and not broken.stuck
    loop = broken.loops["released"]
    assert loop.loop == 1 and [h.label for h in loop.hops][-1] == "step d1"
    stale = loop.hops[-1].state.resources[0]
    assert stale.state == "booting" and stale.data == loop.hops[-2].state.resources[0].data
    assert loop.hops[-1].state == loop.hops[-2].state  # the step is refused, again and again
    assert "step d1" in loop.message  # (the fixed drone passes: the first test above)
    # a heartbeat bound to report again releases it
    model = world_model("drone_without_probe")

    def heartbeat(view: View) -> list[Action]:
        return [dataclasses.replace(a, fair="heartbeat") if a.label.startswith("the heartbeat")
                else a for a in model.actions(view)]

    assert check(dataclasses.replace(model, actions=heartbeat), DRONE_WHOLE).passed


def test_the_command_prints_and_reports_a_fair_loop() -> None:
    result = CliRunner().invoke(main, ["check", "drone_without_probe", "--depth", "40",
                                       "--horizon", "80", "--json"])
    assert result.exit_code == 1, result.output
    figures = json.loads(result.output)
    assert figures["loops"]["released"]["loop"] == 1
    assert figures["loops"]["released"]["timeline"][-1]["move"] == "step d1"


# -- a world declared in the spec file -----------------------------------------------------------

VM = """\
name: vm
initial: running
final: [gone]
states: [running, deleting, gone]
transitions:
  - {trigger: idle, source: running, dest: deleting, effects: [delete]}
  - {trigger: deleted, source: deleting, dest: gone}
"""
VM_CHECK = """\
check:
  resources: [{key: vm1, world: {busy: true}}]
  world: [{set: {busy: false}}, {set: {busy: true}}, {fire: idle, when: {world: {busy: false}}}]
  never:
    - {name: busy, effect: delete, world: {busy: true}}
    - {state: deleting, world: {busy: true}}
"""


def test_a_check_section_is_no_part_of_the_machine(tmp_path: Path) -> None:
    bare = load_spec(_write(tmp_path / "bare.yaml", VM))
    checked = load_spec(_write(tmp_path / "vm.yaml", VM + VM_CHECK))
    assert checked.check is not None and bare.check is None
    assert checked.version == bare.version and "check" not in checked.to_json()


def test_a_declared_world_finds_the_race_and_its_scenario_replays_from_the_spec_file(
        tmp_path: Path) -> None:
    spec_file = _write(tmp_path / "vm.yaml", VM + VM_CHECK)
    report = check(declared(load_spec(spec_file)), Bounds(depth=6))
    assert report.invariants == ["busy", "never_2"]
    ran = report.violations["busy"]
    assert [h.label for h in ran.hops] == [
        "the world says vm1 is busy=False", "idle fires on vm1",
        "the world says vm1 is busy=True", "the worker runs vm1's delete"]
    assert report.violations["never_2"].message == (
        "after this move, of vm1: it is in deleting and the world says busy=True")
    assert len(report.violations["never_2"]) == 3
    path = write_scenario(ran, tmp_path / "busy.yaml", "vm.yaml")
    result = replay(path)  # the spec file beside it, its effect recorded
    assert result.failure is not None and result.failure.kind == "expect_actions"
    assert result.failure.step == len(yaml.safe_load(path.read_text())["steps"])
    assert result.failure.found == ["delete"]
    # broken by a move of the world alone: the scenario expects the world as it was
    world_alone = write_scenario(report.violations["never_2"], tmp_path / "w.yaml", "vm.yaml")
    result = replay(world_alone)
    assert result.failure is not None and result.failure.kind == "expect_world"
    assert result.failure.step == len(yaml.safe_load(world_alone.read_text())["steps"])
    assert (result.failure.expected, result.failure.found) == ({"busy": False}, {"busy": True})
    assert check(declared(load_spec(spec_file)), Bounds(depth=2)).passed


HEARD = """\
check:
  resources: [{key: vm1, world: {busy: false}}]
  world: [{set: {busy: true}}, {set: {busy: false}}, {report: true}]
  never: [{name: heard_busy, believed: {busy: true}}]
"""


def test_a_condition_on_what_the_controller_believes_writes_a_scenario_that_fails(
        tmp_path: Path) -> None:
    """Only the observation changes: the scenario's last step expects the one held before
    the move (none here), which the replay does not find."""
    spec_file = _write(tmp_path / "vm.yaml", VM + HEARD)
    example = check(declared(load_spec(spec_file)), Bounds(depth=4)).violations["heard_busy"]
    assert [h.label for h in example.hops] == ["the world says vm1 is busy=True",
                                               "vm1 is reported busy=True as of now"]
    path = write_scenario(example, tmp_path / "heard.yaml", "vm.yaml")
    steps = yaml.safe_load(path.read_text())["steps"]
    assert steps[-1] == {"expect_observed": {"key": "vm1", "status": None}}
    result = replay(path)
    assert result.failure is not None and result.failure.kind == "expect_observed"
    assert result.failure.step == len(steps)
    assert (result.failure.expected, result.failure.found) == (None, {"busy": True})


def test_a_declared_world_that_keeps_its_rule_passes(tmp_path: Path) -> None:
    """Only a VM the monitor saw idle is deleted, and only an idle one is ever reported:
    but nothing moves it to gone, which the rule forbids while busy."""
    kept = VM_CHECK.replace(
        "    - {name: busy, effect: delete, world: {busy: true}}\n"
        "    - {state: deleting, world: {busy: true}}\n",
        "    - {state: gone}\n")
    report = check(declared(load_spec(_write(tmp_path / "vm.yaml", VM + kept))),
                   Bounds(depth=10))
    assert report.passed and report.exhausted, text(report)


def test_a_check_section_names_only_what_the_machine_has(tmp_path: Path) -> None:
    wrong = VM_CHECK.replace("fire: idle", "fire: idel").replace("effect: delete",
                                                                 "effect: remove")
    with pytest.raises(CheckError, match="trigger 'idel', effect 'remove'"):
        declared(load_spec(_write(tmp_path / "vm.yaml", VM + wrong)))
    two = VM_CHECK.replace("{set: {busy: false}}", "{set: {busy: false}, report: true}")
    with pytest.raises(SpecError, match="one of set, report, fire, update, not set and report"):
        load_spec(_write(tmp_path / "two.yaml", VM + two))
    with pytest.raises(CheckError, match="no check: section"):
        declared(load_spec(_write(tmp_path / "bare.yaml", VM)))


def test_the_command_checks_a_spec_file_and_names_it_in_the_scenario(tmp_path: Path) -> None:
    spec_file = _write(tmp_path / "vm.yaml", VM + VM_CHECK)
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "race.yaml"
    result = CliRunner().invoke(main, ["check", str(spec_file), "--invariant", "busy",
                                       "--write-scenario", str(target)])
    assert result.exit_code == 1, result.output
    assert yaml.safe_load(target.read_text())["machine"] == "../vm.yaml"
    assert not replay(target).passed


def _write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path
