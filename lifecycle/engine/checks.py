"""What the engine checks of its arguments before it touches the database: keys, names,
documents (data, payloads, statuses), actors, and the data a spec's model makes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .. import storable
from ..errors import InvalidData, InvalidInput
from ..graph import EVENTLESS
from ..spec import MachineSpec

KEY_MAX = 255
NAME_MAX = 200  # the schema's Name columns (an observation's source)


def argument(value: str | None, what: str) -> None:
    """A name to look up (a machine's, a state's) is text a database can be asked about."""
    if value is not None and (problem := storable.text_problem(value, 4 * KEY_MAX)):
        raise InvalidInput(f"invalid {what} {value!r}: it {problem}")


def looked_up(key: str) -> str:
    """``key`` (or ``MACHINE:KEY``), if it is text a database can be asked about."""
    problem = storable.text_problem(key, 2 * KEY_MAX)
    if problem is not None:
        raise InvalidInput(f"invalid key {key!r}: it {problem}")
    return key


def new_key(key: str) -> None:
    """A key a new resource may have: plain (no ``MACHINE:``), trimmed, not too long."""
    looked_up(key)
    if not isinstance(key, str) or not key or key != key.strip():
        raise InvalidInput(f"invalid key {key!r}: a key is a non-empty string without "
                             "surrounding spaces")
    if ":" in key:
        raise InvalidInput(f"invalid key {key!r}: ':' separates MACHINE:KEY, so a key "
                             "cannot contain it")
    if len(key) > KEY_MAX:
        raise InvalidInput(f"invalid key {key[:40]!r}...: longer than {KEY_MAX} characters")


def document(machine: str | None, key: str, given: Any, what: str,
             actor: str | None = None) -> dict[str, Any]:
    """``given`` (data, a payload, a status) as a dict, if it is a JSON object that both
    databases keep as it is (see :mod:`lifecycle.storable`); ``actor`` checked too."""
    if actor is not None and (problem := storable.text_problem(actor, KEY_MAX)) is not None:
        raise InvalidData(machine or "?", key, f"actor {problem}")
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise InvalidData(machine or "?", key,
                          f"{what} must be a JSON object, not {type(given).__name__}")
    try:
        storable.check(given, what)
    except storable.ValueProblem as exc:
        raise InvalidData(machine or "?", key, str(exc)) from None
    return dict(given)


def key_document(key: str, given: Any, what: str, actor: str | None = None) -> dict[str, Any]:
    """:func:`document` for ``key`` as a caller gave it (checked first)."""
    if given is None and actor is None:  # a fire without a payload: the key alone
        looked_up(key)
        return {}
    return document(storable.split_key(looked_up(key))[0], key, given, what, actor)


def in_range(moment: dt.datetime) -> bool:
    try:
        moment.astimezone(dt.UTC)
    except OverflowError:
        return False
    return True


def shown(trigger: str) -> str:
    """A trigger as results and messages show it (a step has none of its own)."""
    return "(step)" if trigger == EVENTLESS else trigger


def validated_data(spec: MachineSpec, key: str, data: dict[str, Any],
                   transition: dict[str, Any] | None = None) -> dict[str, Any]:
    """The data as the spec's model makes it. The key is in the validation context (a model
    may check the data against it: job_exit's id); so is, for a model whose class says
    ``follows_transitions = True``, the ``transition`` being written (trigger, source, dest,
    payload, now, seq), from which it computes the data that follows."""
    if spec.data_model is None:
        return data
    try:
        return spec.data_model.model_validate(data, context={
            "key": key, "transition": transition}).model_dump(mode="json")
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}"
            for e in exc.errors()
        )
        raise InvalidData(spec.name, key, detail) from None
