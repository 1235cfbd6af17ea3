"""A world declared as plain data, in a spec's ``check:`` section, as a :class:`Model`.

```yaml
check:
  resources: [{key: vm1, state: busy, world: {busy: true}}]  # the start, and what the world says
  world:                                   # what the world may do to each resource, any time
    - set: {busy: false}                   # what the world says of it changes
    - set: {busy: true}
    - report: true                         # what it says reaches the controller, as of now
    - fire: idle                           # a trigger from outside (with payload: {...})
      when: {world: {busy: false}}         # only while this holds
    - update: {demand: 0}                  # its data changes
  ticks: [40]                              # how far the clock may move in one move
  never:                                   # what must never hold after a move
    - {state: deleting, world: {busy: true}}
    - {effect: delete, world: {busy: true}}  # that effect's handler ran while this held
```

A condition (``when``, ``never``) holds of a resource in ``state`` or a state within it,
whose data has ``data``'s values, of which the world says ``world``'s, and whose newest
observation (what the controller believes) has ``believed``'s. Effects that the machine
has no handler for record their name in the world (``delete`` above) and are done; a
handler of the machine's own (``Machine.simulation``) is called instead, and records in
the world what it did, as in a scenario.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..scenario import Playable, World, recorded_effects
from ..spec import CheckAction, CheckNever, CheckSpec, CheckWhen, MachineSpec
from .explore import Invariant, Machine, Model
from .memory import Actions, CheckError
from .moves import Action, Create, Fire, Move, Observe, SetWorld, Update
from .state import View


def declared(machine: Playable | MachineSpec) -> Model:
    """The model a spec's ``check:`` section declares, around ``machine`` (a spec, or a
    machine with its guards and simulation)."""
    playable = Machine(machine) if isinstance(machine, MachineSpec) else machine
    spec = playable.spec
    section = spec.check
    if section is None:
        raise CheckError(f"machine {spec.name} has no check: section to check it with")
    _validate(spec, section)
    resources = section.resources

    def setup(count: int) -> list[Move]:
        return [move for r in resources[:count]
                for move in (Create(r.key, r.state, r.data), SetWorld(r.key, r.world))]

    return Model(recording(playable), setup, _actions(spec, section.world),
                 tuple(_never(spec, rule, i) for i, rule in enumerate(section.never, 1)),
                 ticks=tuple(section.ticks), resources=len(resources))


def recording(machine: Playable) -> Machine:
    """``machine`` with a handler for each effect it has none for, as a scenario gives a
    spec file's: it records its name in the world (``world.actions``) and is done."""
    simulation = machine.simulation
    names = machine.spec.effect_names()

    def simulated(world: World) -> tuple[Any, Any, Any]:
        guards, effects, probes = (simulation(world) if simulation is not None
                                   else (machine.guards, {}, {}))
        return guards, {**recorded_effects(world, names), **effects}, probes

    return Machine(machine.spec, machine.guards, simulated)


def _validate(spec: MachineSpec, section: CheckSpec) -> None:
    """Every state, trigger and effect the section names is the machine's."""
    states, triggers = set(spec.graph.parent), spec.triggers
    effects = spec.effect_names()
    named = [*(r.state for r in section.resources), *(r.state for r in section.never),
             *(a.when.state for a in section.world if a.when is not None)]
    wrong = [f"state {s!r}" for s in named if s is not None and s not in states]
    wrong += [f"trigger {a.fire!r}" for a in section.world
              if a.fire is not None and a.fire not in triggers]
    wrong += [f"effect {r.effect!r}" for r in section.never
              if r.effect is not None and r.effect not in effects]
    if wrong:
        raise CheckError(f"machine {spec.name}'s check: section names what the machine has "
                         f"not: {', '.join(wrong)}")


def holds(spec: MachineSpec, when: CheckWhen, view: View, key: str) -> bool:
    """Whether ``when`` holds of resource ``key`` in ``view``."""
    resource = view.resource(key)
    if when.state is not None and when.state not in spec.graph.ancestors(resource.state):
        return False
    return (_has(view.data(key), when.data) and _has(view.world(key), when.world)
            and _has(view.believed(key) or {}, when.believed))


def _has(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(k in found and found[k] == v for k, v in wanted.items())


def _actions(spec: MachineSpec, declared: tuple[CheckAction, ...]) -> Any:
    def actions(view: View) -> Iterator[Action]:
        for key in view.keys:
            for action in declared:
                if action.when is not None and not holds(spec, action.when, view, key):
                    continue
                world = view.world(key)
                if action.set is not None:
                    changed = {**world, **action.set}
                    if changed != world:
                        yield Action(f"the world says {key} is {_said(action.set)}",
                                     (SetWorld(key, changed),))
                elif action.report:
                    yield Action(f"{key} is reported {_said(world)} as of now",
                                 (Observe(key, world),))
                elif action.fire is not None:
                    yield Action(f"{action.fire} fires on {key}",
                                 (Fire(key, action.fire, action.payload),))
                elif action.update is not None and any(
                        view.data(key).get(k) != v for k, v in action.update.items()):
                    yield Action(f"{key}'s data: {_said(action.update)}",
                                 (Update(key, action.update),))
    return actions


def _said(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "{}"


def _never(spec: MachineSpec, rule: CheckNever, number: int) -> Invariant:
    name = rule.name or f"never_{number}"
    text = (f"never runs {rule.effect} on a resource while {_condition(rule)}"
            if rule.effect is not None else f"never: {_condition(rule)}")

    def check(before: View, after: View, actions: Actions) -> str | None:
        if rule.effect is not None:
            for action, key, _ in actions:
                if action == rule.effect and holds(spec, rule, before, key):
                    return f"{key}'s {rule.effect} ran while {_condition(rule)}"
            return None
        for key in after.keys:
            if holds(spec, rule, after, key) and not (
                    key in before.keys and holds(spec, rule, before, key)):
                return f"after this move, of {key}: {_condition(rule)}"
        return None

    def expect(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
        if rule.effect is not None:  # what the world saw of the resource, but that effect
            ran: list[dict[str, Any]] = []
            for key in sorted({k for a, k, _ in hop if a == rule.effect}):
                names = [a for a, k, _ in [*before, *hop] if k == key]
                last = len(names) - 1 - names[::-1].index(rule.effect)
                ran.append({"expect_actions": {"key": key,
                                                "actions": names[:last] + names[last + 1:]}})
            return ran
        previous = view.previous  # what the move changed: as it was before, which fails
        assert previous is not None
        steps: list[dict[str, Any]] = []
        for key in view.keys:
            if not (key in previous.keys and holds(spec, rule, view, key)
                    and not holds(spec, rule, previous, key)):
                continue
            steps.append({"expect": {"key": key, "state": previous.resource(key).state, **(
                {"data": {k: previous.data(key).get(k) for k in rule.data}}
                if rule.data else {})}})
            if rule.world:
                said = previous.world(key)
                steps.append({"expect_world": {"key": key, "status": {
                    k: said.get(k, "<missing>") for k in rule.world}}})
            if rule.believed:
                held = previous.believed(key)
                steps.append({"expect_observed": {"key": key, "status": None if held is None
                                                  else {k: held.get(k, "<missing>")
                                                        for k in rule.believed}}})
        return steps

    return Invariant(name, text, check, expect)


def _condition(when: CheckWhen) -> str:
    parts = [f"it is in {when.state}"] if when.state else []
    parts += [f"{what} {_said(values)}" for what, values in
              (("its data has", when.data), ("the world says", when.world),
               ("the controller believes", when.believed)) if values]
    return " and ".join(parts) or "it is in any state"
