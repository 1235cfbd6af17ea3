"""What a value must be to be stored: the one check at the boundary, so that SQLite and
PostgreSQL keep exactly the same values and refuse exactly the same ones.

A resource's data, a payload, an observed status, a probe's answer and an effect's args are
JSON documents. Each is checked where it enters (the engine, the spec), before anything is
written, and refused with the path of the first offending value and the reason:

- strings and keys are text PostgreSQL can hold: no NUL character (``\\u0000``: ``jsonb`` and
  ``text`` refuse it) and no lone surrogate (``\\ud800``: not Unicode text, so not UTF-8);
- keys of objects are strings (JSON has no other keys; ``{1: ...}`` would come back as
  ``{"1": ...}``);
- numbers are finite (``NaN`` and ``Infinity`` are not JSON; ``1e999`` reads as infinity);
- integers fit in 64 bits, signed (:data:`MIN_INT` to :data:`MAX_INT`). That is the range
  both databases' own integers and JSON functions keep exact (SQLite's ``json_extract``
  turns a larger one into an approximate REAL, PostgreSQL's ``jsonb`` to ``bigint`` cast
  refuses it), and the range JSON readers of other languages read exactly; beyond it Python
  itself stops converting integers to text at 4,300 digits. A larger number belongs in a
  string;
- at most :data:`MAX_DEPTH` levels of nesting (as spec files), :data:`MAX_VALUES` values and
  :data:`MAX_TEXT` characters of strings and keys in one document, well inside what either
  database keeps in one value (PostgreSQL: 255 MiB per ``jsonb``);
- only ``dict``, ``list`` (or ``tuple``, stored as a list), ``str``, ``int``, ``float``,
  ``bool`` and ``None``.

Short text fields (a key, an actor, an observation's source) follow the string rule and
a length in characters (PostgreSQL's ``varchar(n)`` refuses a longer one; SQLite would keep
it): :func:`text_problem`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import InvalidInput

MAX_DEPTH = 64
MAX_VALUES = 100_000
MAX_TEXT = 1_000_000
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class ValueProblem(ValueError):
    """A value that cannot be stored: ``path`` (``data.a[0]``) and ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path if len(path) <= 120 else f"{path[:60]}...{path[-50:]}"
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def string_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as it is, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"contains a lone surrogate ({repr(text[exc.start])[1:-1]}), which is not "
                "Unicode text (a byte that is not UTF-8?)")
    return None


def text_problem(value: Any, longest: int) -> str | None:
    """Why ``value`` is not a storable string of at most ``longest`` characters, or None."""
    if not isinstance(value, str):
        return f"is {type(value).__name__}, not a string"
    if len(value) > longest:
        return f"is longer than {longest} characters"
    return string_problem(value)


def problems(value: Any, root: str) -> Iterator[ValueProblem]:
    """Every value of the document ``value`` that cannot be stored, as :class:`ValueProblem`,
    in document order, paths starting at ``root``. Stops after a problem of size (too deep,
    too many values, too much text): the rest is not looked at."""
    if type(value) is dict and len(value) <= 64 and all(
            _plain(key) and (_plain(item) or item is None or type(item) is bool
                             or (type(item) is int and MIN_INT <= item <= MAX_INT)
                             or (type(item) is float and math.isfinite(item)))
            for key, item in value.items()):
        return  # the common case, a flat object of plain values, checked at once
    count = 0
    text = 0
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            yield ValueProblem(root, f"holds more than {MAX_VALUES:,} values")
            return
        if isinstance(item, str):
            text += len(item)
            reason = string_problem(item)
        elif isinstance(item, bool) or item is None:
            reason = None
        elif isinstance(item, int):
            reason = None if MIN_INT <= item <= MAX_INT else (
                "is an integer outside the signed 64-bit range (-2**63 to 2**63-1), which "
                "databases and JSON readers do not keep exactly; store it as a string")
        elif isinstance(item, float):
            reason = None if math.isfinite(item) else (
                f"is {item}, not a finite number (JSON has no NaN or Infinity)")
        elif isinstance(item, Mapping | list | tuple):
            if depth >= MAX_DEPTH:
                yield ValueProblem(path, f"is nested deeper than {MAX_DEPTH} levels")
                return
            children: list[tuple[Any, str, int]] = []
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, str):
                        yield ValueProblem(path, f"has a key {_short(key)} of type "
                                           f"{type(key).__name__}; JSON keys are strings")
                        continue
                    text += len(key)
                    child_path = path_of(path, key)
                    key_reason = string_problem(key)
                    if key_reason is not None:
                        yield ValueProblem(child_path, f"the key {key_reason}")
                    children.append((child, child_path, depth + 1))
            else:
                children = [(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))
            reason = None
        else:
            reason = f"is a Python {type(item).__name__}, not a JSON value"
        if reason is not None:
            yield ValueProblem(path, reason)
        if text > MAX_TEXT:
            yield ValueProblem(root, f"holds more than {MAX_TEXT:,} characters of text")
            return


def _plain(text: Any) -> bool:
    return type(text) is str and text.isascii() and "\x00" not in text and len(text) <= 4096


def check(value: Any, root: str) -> None:
    """Raise :class:`ValueProblem` for the first value of the document that cannot be
    stored (see the module's rules)."""
    for problem in problems(value, root):
        raise problem


def path_of(parent: str, key: str) -> str:
    """``parent.key``, or ``parent['odd key']`` when the key is not a plain name."""
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}"
    return f"{parent}[{_short(key)}]"


def _short(key: Any, limit: int = 40) -> str:
    shown = repr(key)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


__all__ = ["MAX_DEPTH", "MAX_INT", "MAX_TEXT", "MAX_VALUES", "MIN_INT", "ValueProblem",
           "check", "path_of", "problems", "string_problem", "text_problem"]


LONGEST_KEY = 510
"""Characters of a key as asked for (``MACHINE:KEY``: two names of at most 255)."""


def split_key(key: str) -> tuple[str | None, str]:
    """``MACHINE:KEY`` or a plain key."""
    machine, sep, rest = key.partition(":")
    if sep and machine and rest:
        return machine, rest
    return None, key


def asked_key(key: str) -> tuple[str | None, str]:
    """The (machine or None, key) a reader asks for, if ``key`` is text a database can be
    asked about (PostgreSQL refuses a NUL): checked before any database is asked."""
    problem = text_problem(key, LONGEST_KEY)
    if problem is not None:
        raise InvalidInput(f"invalid key {key!r}: it {problem}")
    return split_key(key)
