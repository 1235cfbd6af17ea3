"""What every statement module shares: compiling for the store's dialect, constants."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

from sqlalchemy import ARRAY, String, any_, bindparam, func, literal_column, select
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

Binding = Callable[[Mapping[str, Any]], tuple[Any, ...]]
"""A statement's parameters, given by name, as the tuple its positional form takes."""

_QMARK = sqlite_dialect.dialect(paramstyle="qmark")


class Compiling:
    """A statement module's base: ``self.dialect`` and ``self.positional`` are set by
    :class:`Statements`."""

    dialect: Dialect
    positional: dict[str, tuple[str, Binding]]
    """On SQLite, the hot write's statements (by their text) in their positional form
    (``?``) and what binds their named parameters to it: sqlite3 binds a tuple for much
    less than a dict (a string made and looked up per parameter). Empty on PostgreSQL."""

    def _among(self, column: Any, name: str) -> Any:
        """``column`` is one of the list parameter ``name`` (what ``keys_param`` gives): an
        array on PostgreSQL, a JSON array on SQLite."""
        if self.dialect.name == "postgresql":
            return column == any_(bindparam(name, type_=ARRAY(String)))
        return column.in_(select(literal_column("value")).select_from(
            func.json_each(bindparam(name))).scalar_subquery())

    def _sql(self, statement: Any, *, positional: bool = False) -> str:
        """The statement's text for the store's dialect; ``positional``: on SQLite, its
        positional form recorded in :attr:`positional` too."""
        text = str(statement.compile(dialect=self.dialect))
        if positional and self.dialect.name == "sqlite":
            compiled = statement.compile(dialect=_QMARK)
            names = tuple(compiled.positiontup or ())
            self.positional[text] = (str(compiled), _binding(names))
        return text


def numbered(text: str, order: tuple[str, ...]) -> str:
    """A statement of the catalogue (``:name`` parameters, SQLite's compiled form) with each
    parameter numbered (``?N``) by its place in ``order``: bound by position from a tuple
    built in that order, whatever order the statement names them in (a name used twice is
    one parameter). Every name of ``order`` must be the statement's, and the other way round."""
    found = re.findall(r":(\w+)", text)
    if sorted(set(found)) != sorted(order) or len(set(order)) != len(order):
        raise ValueError(f"the statement takes {sorted(set(found))}, not {sorted(order)}")
    place = {name: index for index, name in enumerate(order, 1)}
    return re.sub(r":(\w+)", lambda match: f"?{place[match.group(1)]}", text)


def _binding(names: tuple[str, ...]) -> Binding:
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return itemgetter(*names) if names else (lambda _params: ())


def constant(value: str) -> Any:
    """A status written into a statement as a constant (it is part of the statement's text,
    compiled once)."""
    return literal_column(f"'{value}'")


__all__ = ["Binding", "Compiling", "constant", "numbered"]
