"""A slot's policy in HTCondor's own language: ``START``, ``RANK``, ``PREEMPT``, ``SUSPEND``,
``CONTINUE``, ``KILL``, ``WANT_SUSPEND``, ``WANT_VACATE``, ``IS_OWNER`` (and the backfill and
benchmark knobs) are ClassAd expressions evaluated against the slot ad (``MY``) and the job
ad (``TARGET``) by HTCondor's ClassAd library, ``classad2`` from the ``htcondor`` package
(the optional extra ``lifecycle-fsm[htcondor]``). Pure: no I/O.

Without the extra the machine still runs: each policy entry must then be a plain value
(``true``/``false``, a number for ``RANK``), and :data:`NEEDS_CLASSADS` says what is out of
reach: expressions, and the FETCH_WORK hook's output (parsed by ``classad2``, old syntax).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from ..adapters.htcondor import classads

HAVE_CLASSADS = importlib.util.find_spec("classad2") is not None
NEEDS_CLASSADS = ("policy written as ClassAd expressions (START, RANK, PREEMPT, ...)",
                  "work fetch: the FETCH_WORK hook's output is read by classad2")
INSTALL_HINT = "pip install 'lifecycle-fsm[htcondor]' (HTCondor's ClassAd library, classad2)"

DEFAULTS: dict[str, bool | int] = {
    "IS_OWNER": False, "START": True, "RANK": 0, "PREEMPT": False, "SUSPEND": False,
    "CONTINUE": True, "KILL": False, "WANT_SUSPEND": False, "WANT_VACATE": True,
    "START_BACKFILL": False, "EVICT_BACKFILL": False, "RUNBENCHMARKS": False}
"""HTCondor's defaults (``param_info.in``): ``IS_OWNER`` is ``False``, a dedicated machine; a
desktop sets it to ``START =?= False``, as HTCondor's ``POLICY : Desktop`` template does."""
NAMES = tuple(DEFAULTS)


class PolicyError(ValueError):
    """A policy entry that cannot be evaluated here."""


def _plain(value: Any) -> Any:
    classad2 = classads()
    if classad2 is not None and isinstance(value, classad2.Value):
        return None  # Undefined or Error
    return value


def _ad(values: Mapping[str, Any]) -> Any:
    classad2 = classads()
    assert classad2 is not None
    ad = classad2.ClassAd()
    for name, value in values.items():
        if value is not None:
            ad[name] = value
    return ad


def evaluate(policy: Mapping[str, Any], name: str, my: Mapping[str, Any],
             target: Mapping[str, Any] | None) -> Any:
    """The value of policy entry ``name`` (a constant, or an expression) for slot ad ``my``
    and job ad ``target``; None when it is undefined or an error. The policy's entries are
    attributes of ``my``, as they are of HTCondor's slot ad, so one may name another
    (``IS_OWNER = START =?= False``)."""
    if name not in policy:
        return DEFAULTS[name]
    expression = policy[name]
    if isinstance(expression, bool | int | float):
        return expression
    if classads() is None:
        raise PolicyError(f"{name} = {expression!r} is a ClassAd expression: evaluating it "
                          f"needs {INSTALL_HINT}; without it give {name} as a constant")
    tree = _expression(name, expression)
    slot = _ad(my)
    for other, value in policy.items():
        slot[other] = _expression(other, value) if isinstance(value, str) else value
    if target is None:
        return _plain(tree.eval(slot))
    return _plain(tree.eval(slot, _ad(target)))


def _expression(name: str, text: str) -> Any:
    classad2 = classads()
    assert classad2 is not None
    try:
        return classad2.ExprTree(str(text))
    except Exception as exc:  # classad2 raises its own ClassAdException (or ValueError)
        raise PolicyError(f"{name} = {text!r} is not a ClassAd expression: {exc}") \
            from None


def holds(policy: Mapping[str, Any], name: str, my: Mapping[str, Any],
          target: Mapping[str, Any] | None) -> bool:
    """Whether ``name`` evaluates to TRUE (undefined is not true)."""
    return evaluate(policy, name, my, target) is True


def is_owner(policy: Mapping[str, Any], my: Mapping[str, Any]) -> bool:
    return holds(policy, "IS_OWNER", my, None)


def job_rank(policy: Mapping[str, Any], my: Mapping[str, Any],
             job: Mapping[str, Any]) -> float:
    """The slot's ``RANK`` of ``job`` (0 when undefined)."""
    value = evaluate(policy, "RANK", my, job)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)


def request_rank(policy: Mapping[str, Any], my: Mapping[str, Any],
                 payload: Mapping[str, Any]) -> float:
    """The rank of a claim request: the one it states, else the slot's RANK of its job."""
    rank = payload.get("rank")
    if isinstance(rank, int | float) and not isinstance(rank, bool):
        return float(rank)
    job = payload.get("job")
    return job_rank(policy, my, job if isinstance(job, Mapping) else {})


__all__ = ["DEFAULTS", "HAVE_CLASSADS", "INSTALL_HINT", "NAMES", "NEEDS_CLASSADS",
           "PolicyError", "evaluate", "holds", "is_owner", "job_rank", "request_rank"]
