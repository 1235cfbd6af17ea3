"""The world models ``lifecycle check NAME`` knows by name: the built-in machines' and any an
installed package ships, each an entry point of the group ``lifecycle.worlds`` (the name is
the model's; the value a :class:`~lifecycle.check.explore.Model`, a function that makes one,
or a mapping of model names to such functions, as each module here keeps in ``MODELS``)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from ...errors import SetupError
from ..explore import Model

GROUP = "lifecycle.worlds"
"""The entry-point group a package names its world models in."""


def names() -> list[str]:
    """Every world model's name."""
    return sorted({point.name for point in metadata.entry_points(group=GROUP)})


def world_model(machine: str) -> Model | None:
    """The world model named ``machine`` (importing its module only), or None."""
    for point in metadata.entry_points(group=GROUP, name=machine):
        value = point.load()
        value = value[machine] if isinstance(value, Mapping) else value
        made = value() if callable(value) and not isinstance(value, Model) else value
        if not isinstance(made, Model):
            raise SetupError(f"world model {machine!r}: its entry point {point.value!r} "
                             f"gives {type(made).__name__}, not a lifecycle.check.Model")
        return made
    return None
