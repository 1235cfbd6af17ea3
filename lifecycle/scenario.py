"""Scenario files: a table of "in this state, when this is observed, it goes there", replayed
against a machine on a fresh database with a simulated clock.

```yaml
machine: drone                  # a built-in name, or a spec file (relative to this file)
start: 2026-01-01T00:00:00Z     # the simulated clock's start (optional)
steps:
  - create: {key: d1, state: booting, data: {demand: 1}}
  - advance: 5
  - observe: {key: d1, status: {resource_status: Running}, at: 2026-01-01T00:00:03Z}
  - world: {key: d1, status: {resource_status: Running}}   # what simulated probes answer
  - update: {key: d1, data: {demand: 0}}
  - step: d1
  - fire: {key: d1, trigger: release, payload: {}}
  - expect: {key: d1, state: integrate, data: {demand: 0}}
  - expect_last: {fired: false, error: StaleObservation}
  - run_effects: {}
  - expect_actions: {key: d1, actions: [deploy, terminate]}  # what simulated effects did
  - expect_world: {key: d1, status: {resource_status: Running}}  # what the world says (subset)
  - expect_observed: {key: d1, status: {resource_status: Booting}}  # the newest observation
  - retry: d1                   # put a stuck resource's failed effects back in the queue
  - crash_effect: d1            # its queue head's handler runs; the worker dies unrecorded
  - run_effect: d1              # its queue head alone runs and is recorded (nothing else)
  - begin_effect: d1            # its queue head's handler runs; the run stays in flight
  - finish_effect: d1           # d1's begun run ends and its outcome is recorded
  - fire_timers: d1             # its due timers fire (nothing else)
```
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from .clock import SimulatedClock
from .effects import EffectCall
from .engine import Engine
from .errors import LifecycleError, ScenarioError
from .freshness import run_to_end
from .outbox_admin import retry_failed
from .spec import MachineSpec, load_spec, suggest
from .store import Store
from .store.statements import effects as effect_rows
from .user_documents import DocumentError, compose_yaml, construct_yaml, read_text
from .worker import Worker
from .worker_core import WorkerCore

STEP_KINDS = ("create", "advance", "observe", "world", "update", "step", "fire", "expect",
              "expect_last", "run_effects", "expect_actions", "expect_world", "retry",
              "crash_effect", "run_effect", "fire_timers", "expect_observed", "begin_effect",
              "finish_effect")


@dataclass(frozen=True, slots=True)
class Failure:
    step: int
    line: int
    kind: str
    expected: Any
    found: Any

    def __str__(self) -> str:
        return (f"step {self.step} (line {self.line}, {self.kind}): expected "
                f"{_show(self.expected)}, found {_show(self.found)}")


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    file: str
    passed: bool
    steps: int
    failure: Failure | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "passed": self.passed, "steps": self.steps,
                "failure": None if self.failure is None else {
                    "step": self.failure.step, "line": self.failure.line,
                    "kind": self.failure.kind, "expected": self.failure.expected,
                    "found": self.failure.found, "message": str(self.failure)}}


@dataclass
class World:
    """The outside world as a scenario or a simulation sets it: what simulated probes answer
    for each key, and what simulated effects did."""

    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    clock: SimulatedClock | None = None
    """The scenario's clock, for simulated adapters that need the time."""


@dataclass
class Step:
    number: int
    line: int
    kind: str
    args: Any


@dataclass
class Scenario:
    file: str
    machine: str
    start: dt.datetime
    steps: list[Step]
    base: Path


Simulated = Callable[[World], tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]]
"""A machine's simulation: given the world, its guards, effect handlers and probes."""


SCENARIO_SUFFIXES = (".yaml", ".yml", ".json")
"""What a scenario file's name ends with (a directory is replayed file by file of these)."""


def load(path: str | Path) -> Scenario:
    """Parse a scenario file; a malformed one raises :class:`ScenarioError` naming the line."""
    path = Path(path)
    if path.suffix.lower() not in SCENARIO_SUFFIXES:
        raise ScenarioError(f"{path}: not a scenario file: a scenario is a YAML or JSON file "
                            f"({', '.join(SCENARIO_SUFFIXES)}) with `machine` and `steps`")
    try:
        text = read_text(path)
        root = compose_yaml(text, str(path))
        document = (construct_yaml(root, str(path)) if isinstance(root, yaml.MappingNode)
                    else None)  # (the text parsed once: its tree gives lines and the value)
    except DocumentError as exc:
        raise ScenarioError(str(exc)) from None
    if not isinstance(root, yaml.MappingNode) or not isinstance(document, dict):
        raise ScenarioError(f"{path}:1: a scenario is a mapping with `machine` and `steps`")
    for key in document:
        if key not in ("machine", "start", "steps", "description"):
            raise ScenarioError(f"{path}:{_line_of_key(root, key)}: unknown field {key!r} "
                                "(machine, start, steps, description)")
    machine = document.get("machine")
    if not isinstance(machine, str) or not machine:
        raise ScenarioError(f"{path}:{_line_of_key(root, 'machine')}: `machine` must name a "
                            "built-in machine or a spec file")
    start = document.get("start", "2026-01-01T00:00:00Z")
    try:
        start = _time(start)
    except ValueError as exc:
        raise ScenarioError(f"{path}:{_line_of_key(root, 'start')}: {exc}") from None
    step_nodes = _value_node(root, "steps")
    if not isinstance(step_nodes, yaml.SequenceNode) or not step_nodes.value:
        raise ScenarioError(f"{path}:{_line_of_key(root, 'steps')}: `steps` must be a "
                            "non-empty list")
    steps = []
    for number, (node, raw) in enumerate(zip(step_nodes.value, document["steps"], strict=True),
                                         start=1):
        line = node.start_mark.line + 1
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ScenarioError(f"{path}:{line}: step {number} must be one of "
                                f"{', '.join(STEP_KINDS)} with its arguments")
        (kind, args), = raw.items()
        if kind not in STEP_KINDS:
            hint = suggest(str(kind), STEP_KINDS)
            raise ScenarioError(f"{path}:{line}: step {number}: unknown step {kind!r}"
                                + (f"; {hint}" if hint else ""))
        steps.append(Step(number, line, kind, args))
    return Scenario(str(path), machine, start, steps, path.parent)


def _value_node(root: yaml.MappingNode, key: str) -> yaml.Node | None:
    for k, v in root.value:
        if k.value == key:
            return v  # type: ignore[no-any-return]
    return None


def _line_of_key(root: yaml.MappingNode, key: str) -> int:
    for k, _ in root.value:
        if k.value == key:
            return int(k.start_mark.line) + 1
    return 1


def _time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class _StepFailed(Exception):
    def __init__(self, expected: Any, found: Any) -> None:
        self.expected = expected
        self.found = found


class Playable(Protocol):
    """A machine a scenario may name instead of a spec file (an application's built-in):
    its spec, its guards, and how it runs with simulated adapters."""

    @property
    def spec(self) -> MachineSpec: ...

    @property
    def guards(self) -> Mapping[str, Any]: ...

    @property
    def simulation(self) -> Simulated | None: ...


def replay(path: str | Path, machines: Mapping[str, Playable] | None = None) -> ScenarioResult:
    """Replay one scenario file on a fresh temporary database. Its ``machine`` is one of
    ``machines`` by name, or a spec file beside the scenario."""
    scenario = load(path)
    with tempfile.TemporaryDirectory(prefix="lifecycle-scenario-") as directory:
        store = Store.new_sqlite(Path(directory) / "scenario.db")
        try:
            return _run(scenario, store, machines or {})
        finally:
            store.dispose()


def _machine(scenario: Scenario, world: World,
             machines: Mapping[str, Playable]) -> tuple[MachineSpec, dict[str, Any]]:
    """The spec and the engine options (guards, simulated effects and probes)."""
    playable = machines.get(scenario.machine)
    if playable is not None:
        simulation = playable.simulation
        guards, effects, probes = (simulation(world) if simulation is not None
                                   else (playable.guards, {}, {}))
        return playable.spec, {"guards": guards, "effects": effects, "probes": probes}
    path = scenario.base / scenario.machine
    if not path.exists():
        known = ", ".join(sorted(machines)) or "none given"
        raise ScenarioError(f"{scenario.file}: machine {scenario.machine!r} is neither a "
                            f"built-in machine ({known}) nor a spec file")
    spec = load_spec(path)
    return spec, {"effects": recorded_effects(world, spec.effect_names())}


def recorded_effects(world: World, names: Iterable[str]) -> dict[str, Any]:
    """Simulated effects that record their names in ``world.actions`` (with the resource's
    key) and are done: a spec file's effects in a scenario (``expect_actions`` sees them)."""
    def recorder(name: str) -> Callable[[EffectCall], None]:
        def handler(call: EffectCall) -> None:
            world.actions.append((name, call.key, {}))
        return handler
    return {name: recorder(name) for name in sorted(names)}


def _run(scenario: Scenario, store: Store, machines: Mapping[str, Playable]) -> ScenarioResult:
    clock = SimulatedClock(scenario.start)
    world = World(clock=clock)
    spec, options = _machine(scenario, world, machines)
    try:
        engine = Engine(store, [spec], clock=clock, **options)
    except LifecycleError as exc:
        raise ScenarioError(f"{scenario.file}: {exc}") from None
    worker = Worker(engine, seed=0)
    runs: dict[str, Run] = {}
    try:
        return _steps(scenario, engine, clock, world, worker, spec, runs)
    finally:
        for run in runs.values():
            run.abandon()


def _steps(scenario: Scenario, engine: Engine, clock: SimulatedClock, world: World,
           worker: Worker, spec: MachineSpec, runs: dict[str, Run]) -> ScenarioResult:
    last: dict[str, Any] | None = None
    for index, step in enumerate(scenario.steps):
        try:
            last = _do(step, engine, clock, world, worker, spec, runs, last)
            following = scenario.steps[index + 1] if index + 1 < len(scenario.steps) else None
            if step.kind in ("fire", "step") and last is not None and last["raised"] and (
                    following is None or following.kind != "expect_last"):
                raise _StepFailed("no error (or an expect_last step naming it)",
                                  f"{last['error']}: {last['reason']}")
        except _StepFailed as failed:
            return ScenarioResult(scenario.file, False, step.number,
                                  Failure(step.number, step.line, step.kind, failed.expected,
                                          failed.found))
        except (LifecycleError, TypeError, KeyError, ValueError) as exc:
            return ScenarioResult(scenario.file, False, step.number,
                                  Failure(step.number, step.line, step.kind, "no error",
                                          f"{type(exc).__name__}: {exc}"))
    return ScenarioResult(scenario.file, True, len(scenario.steps))


def _args(step: Step, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    args = step.args
    if isinstance(args, str) and len(required) == 1 and required[0] == "key":
        args = {"key": args}
    if not isinstance(args, dict):
        raise _StepFailed(f"arguments {', '.join(required + optional)}", args)
    missing = [name for name in required if name not in args]
    unknown = [name for name in args if name not in required + optional]
    if missing or unknown:
        raise ValueError(f"{step.kind} takes {', '.join(required)}"
                         + (f" and optionally {', '.join(optional)}" if optional else "")
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    return args


def _do(step: Step, engine: Engine, clock: SimulatedClock, world: World, worker: Worker,
        spec: MachineSpec, runs: dict[str, Run],
        last: dict[str, Any] | None) -> dict[str, Any] | None:
    """Carry out one step; the outcome of the last fire or step (for ``expect_last``)."""
    kind = step.kind
    if kind == "create":
        a = _args(step, ("key",), ("state", "data"))
        engine.create(spec.name, a["key"], a.get("data"), state=a.get("state"),
                      actor="scenario")
    elif kind == "advance":
        seconds = step.args
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"advance takes a number of seconds, not {seconds!r}")
        clock.advance(float(seconds))
    elif kind == "observe":
        a = _args(step, ("key", "status"), ("at", "source"))
        engine.observe(a["key"], a["status"], _time(a["at"]) if "at" in a else None,
                       source=a.get("source", "scenario"))
    elif kind == "world":
        a = _args(step, ("key", "status"))
        world.status[a["key"]] = dict(a["status"])
    elif kind == "update":
        a = _args(step, ("key", "data"))
        engine.update(a["key"], a["data"], actor="scenario")
    elif kind in ("fire", "step"):
        return _fire(step, engine)
    elif kind.startswith("expect"):
        _expect(step, engine, world, last)
    elif kind == "retry":
        retry_failed(engine, _args(step, ("key",))["key"])
    elif kind == "crash_effect":
        crash_effect(engine, _args(step, ("key",))["key"])
    elif kind == "run_effect":
        run_effect(engine, _args(step, ("key",))["key"])
    elif kind == "begin_effect":
        key = _args(step, ("key",))["key"]
        if key in runs:
            raise ValueError(f"{key} has a run begun and not finished")
        runs[key] = begin_effect(engine, key, world)
    elif kind == "finish_effect":
        finish_effect(runs, _args(step, ("key",))["key"], world)
    elif kind == "fire_timers":
        fire_timers(engine, _args(step, ("key",))["key"])
    elif kind == "run_effects":
        if step.args not in (None, {}):
            raise ValueError("run_effects takes no arguments ({})")
        worker.run_until_idle()
    return last


def crash_effect(engine: Engine, key: str) -> str:
    """A worker runs the queue head of ``key`` and dies before it records the outcome: the
    handler is called as the worker calls it (a failure of its own is lost with the worker),
    and the outbox is left as it was, so the effect runs again. Its name."""
    resource = engine.get(key)
    with engine.store.read() as db:
        row = effect_rows.pending_head(db, resource.machine, resource.key)
    if row is None:
        raise ValueError(f"crash_effect: {key} has no effect to run")
    (id_, name, args, idempotency_key, fence, attempts, seq, progress, trigger,
     payload) = row
    value = engine.store.json_value
    call = EffectCall(id_, name, resource.machine, resource.key, dict(value(args)),
                      idempotency_key, value(fence) if fence is not None else None,
                      attempts + 1, seq, trigger, dict(value(payload) or {}),
                      dict(resource.data), dict(value(progress) or {}), engine.clock.now())
    with contextlib.suppress(Exception):  # its failure is lost with the worker, as its
        run_to_end(engine.handlers[name].handler(call))  # outcome is
    return str(name)


RUNNING = "$running"
"""The world's entry that lists the runs begun and not finished (``begin_effect``), by
resource key, each with what its handler holds in the world until the run finishes (a slot
of a pool of commands): the run's entry is added before its handler is called and dropped
when it finishes, and a handler's adapter notes there what it holds past its call. A whole
``run_effect`` has no entry: it lets go of everything when its call returns."""


@dataclass
class Run:
    """An effect's run begun and not finished (a worker that runs several at once): its
    claim held, its handler called (what it did to the world done, what it started in
    flight), its outcome kept until :meth:`finish` records it."""

    core: WorkerCore
    call: EffectCall
    outcome: tuple[str, Any]

    def finish(self) -> str:
        """The run ends: its outcome is recorded as the worker records it (its follow-up
        fired, a failure rescheduled or given up) and its claim let go. Its effect's name."""
        try:
            self.core.outcome(self.call, *self.outcome)
            self.core.record()
            self.core.let_go([self.call.id])
        finally:
            self.core.heartbeat_stopped()
        return str(self.call.name)

    def abandon(self) -> None:
        """The run is never finished (its scenario ended first): its claim is given back."""
        self.core.give_back([self.call], refund=False)
        self.core.heartbeat_stopped()


def begin_effect(engine: Engine, key: str, world: World | None = None) -> Run:
    """The worker starts the queue head of ``key``, due now, among others it runs at once:
    its claim is taken and held, its handler called (with the run listed in ``world``'s
    :data:`RUNNING` entry, if given), and its outcome kept, unrecorded, in the :class:`Run`
    (``lifecycle check`` explores one such start per move)."""
    resource = engine.get(key)
    core = WorkerCore(engine, seed=0, batch=_ALL, lease=_HELD)
    try:
        claimed = core.claim(_ALL, [])
        mine = [c for c in claimed if (c.machine, c.key) == (resource.machine, resource.key)]
        core.give_back([c for c in claimed if c not in mine])
        if not mine:
            raise ValueError(f"{key} has no effect due")
        call = mine[0]
        if world is not None:
            begun(world, resource.key)
        try:
            handler = engine.handlers[call.name].handler
            outcome: tuple[str, Any] = ("ok", run_to_end(handler(call)))
        except Exception as exc:  # the handler's failure is recorded at the finish
            outcome = ("error", exc)
    except BaseException:
        core.heartbeat_stopped()
        raise
    return Run(core, call, outcome)


def finish_effect(runs: dict[str, Run], key: str, world: World | None = None) -> str:
    """``key``'s begun run ends: its entry leaves ``world``'s :data:`RUNNING` (what it held
    is let go) and its outcome is recorded. Its effect's name."""
    run = runs.pop(key, None)
    if run is None:
        raise ValueError(f"{key} has no run begun")
    if world is not None:
        finished(world, key)
    return run.finish()


def begun(world: World, key: str) -> None:
    """List ``key``'s run in ``world``'s :data:`RUNNING` entry, holding nothing yet."""
    world.status.setdefault(RUNNING, {})[key] = {}


def finished(world: World, key: str) -> None:
    """Drop ``key``'s run from ``world``'s :data:`RUNNING` entry (the entry with the last)."""
    running = world.status.get(RUNNING, {})
    running.pop(key, None)
    if not running:
        world.status.pop(RUNNING, None)


def run_effect(engine: Engine, key: str) -> str:
    """The worker runs the queue head of ``key``, due now, and records its outcome (its
    follow-up fired, a failure rescheduled or given up), as in its loop; nothing else runs
    (``lifecycle check`` explores one effect per move). Its name."""
    return begin_effect(engine, key).finish()


_ALL = 1_000_000
"""Effects one claim of a run may look at: all that are due."""
_HELD = 365 * 86400.0
"""A begun run's lease, in seconds of the scenario's clock: it holds its claim until its
``finish_effect`` however far the scenario moves the clock meanwhile."""


def fire_timers(engine: Engine, key: str) -> int:
    """``key``'s due timers fire, soonest first, as the worker fires them; nothing else
    runs. How many fired."""
    resource = engine.get(key)
    due = [(timer_id, trigger) for timer_id, trigger, machine, k
           in engine.store.due_timers(engine.clock.now(), _ALL)
           if (machine, k) == (resource.machine, resource.key)]
    if not due:
        raise ValueError(f"fire_timers: {key} has no timer due")
    return sum(engine.fire_timer(timer_id, f"{resource.machine}:{resource.key}", trigger)
               is not None for timer_id, trigger in due)


def _fire(step: Step, engine: Engine) -> dict[str, Any]:
    """A ``fire`` or ``step`` step, and what came of it (an error included)."""
    if step.kind == "fire":
        a = _args(step, ("key", "trigger"), ("payload",))
    else:
        a = _args(step, ("key",))
    try:
        if step.kind == "fire":
            result = engine.fire(a["key"], a["trigger"], a.get("payload"), actor="scenario",
                                 on_stale="return")
        else:
            result = engine.step(a["key"], actor="scenario", on_stale="return")
    except LifecycleError as exc:
        return {"fired": False, "error": type(exc).__name__, "reason": str(exc),
                "dest": None, "raised": True}
    return {"fired": result.fired, "error": result.error, "reason": result.reason,
            "dest": result.dest, "raised": False}


def _expect(step: Step, engine: Engine, world: World, last: dict[str, Any] | None) -> None:
    """An ``expect``, ``expect_last`` or ``expect_actions`` step: raises when it fails."""
    if step.kind == "expect":
        a = _args(step, ("key",), ("state", "data", "version"))
        resource = engine.get(a["key"])
        expected = {k: v for k, v in a.items() if k != "key"}
        found: dict[str, Any] = {}
        if "state" in a:
            found["state"] = resource.state
        if "version" in a:
            found["version"] = resource.version
        if "data" in a:
            found["data"] = {k: resource.data.get(k, "<missing>") for k in a["data"]}
        if found != expected:
            raise _StepFailed(expected, {**found, "state": resource.state})
    elif step.kind == "expect_last":
        a = _args(step, (), ("fired", "error", "dest", "reason"))
        if last is None:
            raise _StepFailed(a, "no fire or step before it")
        found = {k: last.get(k) for k in a if k != "reason"}
        wanted = {k: v for k, v in a.items() if k != "reason"}
        reason_ok = "reason" not in a or str(a["reason"]) in (last.get("reason") or "")
        if found != wanted or not reason_ok:
            raise _StepFailed(a, {k: last.get(k) for k in ("fired", "error", "dest", "reason")})
    elif step.kind == "expect_observed":  # the newest observation's status (the keys given)
        a = _args(step, ("key", "status"))
        observation = engine.get(a["key"]).observation
        if a["status"] is None:  # no observation at all
            if observation is not None:
                raise _StepFailed(None, observation.status)
        elif observation is None:
            raise _StepFailed(dict(a["status"]), None)
        else:
            held = {k: observation.status.get(k, "<missing>") for k in a["status"]}
            if held != dict(a["status"]):
                raise _StepFailed(dict(a["status"]), held)
    elif step.kind == "expect_world":
        a = _args(step, ("key", "status"))
        said = world.status.get(a["key"], {})
        found = {k: said.get(k, "<missing>") for k in a["status"]}
        if found != dict(a["status"]):
            raise _StepFailed(dict(a["status"]), found)
    else:
        a = _args(step, ("key", "actions"))
        actions = [action for action, key, _ in world.actions if key == a["key"]]
        if actions != list(a["actions"]):
            raise _StepFailed(list(a["actions"]), actions)
