"""Case 3: deciding a guarded transition in memory, no database.

lifecycle's decision alone
(``CompiledMachine(spec, guards).decide(state, trigger, GuardContext(...))``, a fresh context
per decision as the engine makes one) against a bare ``transitions.Machine`` trigger with one
condition on one kept model, and python-statemachine with one guard. Every
guard is as cheap as a guard gets, so the numbers show the machinery around it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lifecycle import GuardContext, load_spec
from lifecycle.compiled import CompiledMachine, hierarchical

from . import toggle
from .harness import Bench, BenchError, Case

UTC = dt.UTC


@contextmanager
def lifecycle_decide(*, nested: bool = False) -> Iterator[Bench]:
    spec = load_spec(toggle.spec(guarded=True, nested=nested))
    compiled = CompiledMachine(spec, {toggle.GUARD: toggle.enabled})
    decide, machine, key, trigger = compiled.decide, toggle.MACHINE, toggle.KEY, toggle.TRIGGER
    data: dict[str, Any] = {}
    payload: dict[str, Any] = {}
    now = dt.datetime.now(UTC)
    state, version = spec.graph.enter(spec.initial), 1

    def op() -> None:
        nonlocal state, version
        decision = decide(state, trigger, GuardContext(machine, key, state, version, data,
                                                       payload, now))
        if not decision.fired or decision.dest is None or decision.dest == state:
            raise BenchError(f"lifecycle: {trigger} from {state} was refused: "
                             f"{decision.reason}")
        state, version = decision.dest, version + 1

    yield Bench(op)


@contextmanager
def hierarchical_trigger() -> Iterator[Bench]:
    """The nested toggle decided by ``HierarchicalMachine``'s trigger path (how lifecycle
    decided nested machines before their tables), a fresh context per decision."""
    spec = load_spec(toggle.spec(guarded=True, nested=True))
    machine = hierarchical(spec, {toggle.GUARD: toggle.enabled})

    class Model:
        state: str

    model = Model()
    machine.add_model(model, initial=spec.graph.enter(spec.initial))
    flip = getattr(model, toggle.TRIGGER)
    data: dict[str, Any] = {}
    now = dt.datetime.now(UTC)

    def op() -> None:
        state = model.state
        if not flip(ctx=GuardContext(toggle.MACHINE, toggle.KEY, state, 1, data, data, now)):
            raise BenchError("HierarchicalMachine: flip was refused")

    yield Bench(op)


@contextmanager
def transitions_trigger() -> Iterator[Bench]:
    from transitions import Machine

    class Model:
        pass

    def enabled() -> bool:
        return True

    model: Any = Model()
    Machine(
        model=model, states=["a", "b"], initial="a", auto_transitions=False,
        transitions=[
            {"trigger": toggle.TRIGGER, "source": "a", "dest": "b", "conditions": [enabled]},
            {"trigger": toggle.TRIGGER, "source": "b", "dest": "a", "conditions": [enabled]},
        ],
    )
    flip = getattr(model, toggle.TRIGGER)

    def op() -> None:
        if not flip():
            raise BenchError("transitions: flip was refused")

    def verify(n: int) -> None:
        if model.state != ("a" if n % 2 == 0 else "b"):
            raise BenchError(f"transitions: after {n} flips the state is {model.state}")

    yield Bench(op, verify)


@contextmanager
def statemachine_send() -> Iterator[Bench]:
    from statemachine import State, StateMachine

    class Toggle(StateMachine):
        a = State(initial=True)
        b = State()
        flip = a.to(b, cond="enabled") | b.to(a, cond="enabled")

        def enabled(self) -> bool:
            return True

    machine = Toggle()
    send = machine.send

    def op() -> None:
        send(toggle.TRIGGER)

    def verify(n: int) -> None:
        state = machine.current_state_value
        if state != ("a" if n % 2 == 0 else "b"):
            raise BenchError(f"python-statemachine: after {n} flips the state is {state}")

    yield Bench(op, verify)


DECIDE = Case("memory.lifecycle", "lifecycle CompiledMachine.decide, 1 guard",
              lambda _ws: lifecycle_decide())
DECIDE_NESTED = Case("memory.lifecycle_nested",
                     "lifecycle CompiledMachine.decide, 1 guard, nested (parent's edge)",
                     lambda _ws: lifecycle_decide(nested=True))
HIERARCHICAL = Case("memory.hierarchical", "transitions.HierarchicalMachine, the same nested",
                    lambda _ws: hierarchical_trigger())
TRANSITIONS = Case("memory.transitions", "transitions.Machine, 1 condition",
                   lambda _ws: transitions_trigger())
STATEMACHINE = Case("memory.statemachine", "python-statemachine, 1 guard",
                    lambda _ws: statemachine_send())
