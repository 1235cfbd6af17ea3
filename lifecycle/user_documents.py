"""Reading YAML and JSON documents that come from users (spec files, scenario files) safely.

- Only UTF-8 text (a byte-order mark is allowed) of at most :data:`MAX_BYTES`.
- YAML with the core schema of YAML 1.2: only ``true``/``false`` are booleans, so a state
  named ``on``, ``off``, ``yes`` or ``no`` is the string it looks like; ``012`` is twelve and
  ``1:20`` is a string (YAML 1.1 read them as octal and sexagesimal).
- A key given twice in one mapping is refused, in YAML and in JSON, with its line.
- Numbers are finite: ``.inf``, ``.nan``, ``Infinity`` and ``NaN`` are refused, and so are
  integers too long to be exact.
- At most :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES` values once YAML aliases
  are expanded, so an alias bomb or a recursive alias is refused instead of filling memory.

Problems are raised as :class:`DocumentError` with a location (``file:line:column`` where
there is one); spec and scenario loading turn them into their own errors.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (PyYAML is imported when a YAML document is read: JSON needs none)
    from pathlib import Path

    import yaml

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 200_000


class DocumentError(ValueError):
    """A document that cannot be read as asked: ``where`` it is, ``what`` is wrong."""

    def __init__(self, where: str, what: str) -> None:
        self.where = where
        self.what = what
        super().__init__(f"{where}: {what}")


def read_text(path: Path) -> str:
    """The file's text, if it is UTF-8 text of a sensible size."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise DocumentError(str(path), f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise DocumentError(str(path), f"larger than {MAX_BYTES // (1024 * 1024)} MiB; a "
                            "machine spec or scenario is a small text file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DocumentError(f"{path}:{line}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                            f"at offset {exc.start}); save the file as UTF-8") from None
    if "\x00" in text:
        raise DocumentError(str(path), "contains NUL characters: not a text file")
    return text


# -- YAML 1.2 core schema -------------------------------------------------------------------

_BOOL = r"^(?:true|True|TRUE|false|False|FALSE)$"
_NULL = r"^(?:~|null|Null|NULL|)$"
_INT = r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"
_FLOAT = (r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
"""The implicit types of YAML 1.2's core schema (compiled with the loader, on first use)."""


@functools.cache
def core_loader() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader with the core schema of YAML 1.2 and duplicate keys refused
    (made on first use: importing PyYAML costs a command that reads no YAML)."""
    import yaml

    class CoreLoader(yaml.SafeLoader):
        yaml_implicit_resolvers = {}  # noqa: RUF012  (its own: the core schema only)

        def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, yaml.Node] = {}
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    try:
                        earlier = seen.get(key)
                    except TypeError:  # an unhashable key: PyYAML says so below
                        continue
                    if earlier is not None and key != "<<":
                        mark = key_node.start_mark
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} is given twice (first on line "
                            f"{earlier.start_mark.line + 1})", mark)
                    seen[key] = key_node
            return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]

    for tag, pattern, first in (
            ("tag:yaml.org,2002:bool", _BOOL, "tTfF"),
            ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
            ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
            ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789.")):
        CoreLoader.add_implicit_resolver(tag, re.compile(pattern), list(first))
    CoreLoader.add_implicit_resolver(
        "tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
    CoreLoader.add_constructor("tag:yaml.org,2002:bool", _core_bool)
    CoreLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
    CoreLoader.add_constructor("tag:yaml.org,2002:float", _core_float)
    return CoreLoader


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    import yaml

    text = str(loader.construct_scalar(node))
    try:
        if text.startswith("0o"):
            return int(text[2:], 8)
        if text.startswith("0x"):
            return int(text[2:], 16)
        return int(text, 10)
    except ValueError as exc:  # longer than Python converts exactly
        raise yaml.constructor.ConstructorError(None, None, f"the integer is too long ({exc})",
                                                node.start_mark) from None


def _core_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    import yaml

    text = str(loader.construct_scalar(node))
    value = float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    if not math.isfinite(value):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text} is not a finite number (lifecycle keeps only finite ones)",
            node.start_mark)
    return value


def _core_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


def _mark(origin: str, exc: yaml.YAMLError) -> tuple[str, str]:
    mark = getattr(exc, "problem_mark", None)
    where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark else origin
    what = getattr(exc, "problem", None) or str(exc)
    return where, f"invalid YAML: {what}"


@contextmanager
def _reading_yaml(origin: str) -> Iterator[None]:
    """PyYAML's errors, and a document nested too deep for it, as ``origin``'s
    :class:`DocumentError`."""
    import yaml

    try:
        yield
    except yaml.YAMLError as exc:
        raise DocumentError(*_mark(origin, exc)) from None
    except RecursionError:
        raise DocumentError(origin, f"nested deeper than {MAX_DEPTH} levels") from None


def compose_yaml(text: str, origin: str) -> yaml.Node | None:
    """The document's node tree (for line numbers), with the same limits as :func:`load_yaml`."""
    import yaml

    with _reading_yaml(origin):
        return yaml.compose(text, Loader=core_loader())


def construct_yaml(node: yaml.Node, origin: str) -> Any:
    """The value of a node tree :func:`compose_yaml` gave, as :func:`load_yaml` reads it from
    the text (its constructors, limits and checks), without parsing the text again."""
    loader = core_loader()("")
    try:
        with _reading_yaml(origin):
            value = loader.construct_document(node)
    finally:
        loader.dispose()
    check_shape(value, origin)
    return value


def load_yaml(text: str, origin: str) -> Any:
    """One YAML document, read with the core schema of YAML 1.2, checked for its shape."""
    import yaml

    with _reading_yaml(origin):
        value = yaml.load(text, Loader=core_loader())  # a SafeLoader
    check_shape(value, origin)
    return value


def load_json(text: str, origin: str) -> Any:
    """One JSON document: duplicate keys and non-finite numbers refused, shape checked."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise DocumentError(origin, f"invalid JSON: key {key!r} is given twice in "
                                    "one object")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise DocumentError(origin, f"invalid JSON: {name} is not a finite number")

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{origin}:{exc.lineno}:{exc.colno}",
                            f"invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(origin, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer too long to convert exactly
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(origin, f"invalid JSON: {exc}") from None
    check_shape(value, origin)
    return value


def check_shape(value: Any, origin: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_DEPTH`, holding more than
    :data:`MAX_NODES` values once shared parts (YAML aliases) are counted each time they are
    used, referring to itself, or holding a number that is not finite."""
    nodes = 0
    stack: list[tuple[Any, int, tuple[int, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise DocumentError(origin, f"more than {MAX_NODES:,} values once its aliases "
                                "are expanded (an alias bomb?)")
        if depth > MAX_DEPTH:
            raise DocumentError(origin, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, float) and not math.isfinite(item):
            raise DocumentError(origin, f"{item} is not a finite number")
        if isinstance(item, dict | list):
            if id(item) in path:
                raise DocumentError(origin, "an alias refers to the mapping or list that "
                                    "holds it")
            inner = (*path, id(item))
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1, inner) for child in children)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "DocumentError",
           "check_shape", "compose_yaml", "construct_yaml", "core_loader", "load_json",
           "load_yaml", "read_text"]
