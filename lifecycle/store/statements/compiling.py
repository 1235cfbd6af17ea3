"""What every statement module shares: compiling for the store's dialect, constants."""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column
from sqlalchemy.engine import Dialect


class Compiling:
    """A statement module's base: ``self.dialect`` is set by :class:`Statements`."""

    dialect: Dialect

    def _sql(self, statement: Any) -> str:
        return str(statement.compile(dialect=self.dialect))


def constant(value: str) -> Any:
    """A status written into a statement as a constant (it is part of the statement's text,
    compiled once)."""
    return literal_column(f"'{value}'")


__all__ = ["Compiling", "constant"]
