"""The house rules, read from the source: every module sits in a layer and imports only from
its own layer or those below; no module imports another in a circle; no private name is used
across modules; no function of the core runs over 60 lines; SQL is built only in the store
(no file of lifecycle/ outside ``store/`` and the machines' migration branches,
``machines/_migrations/``, imports SQLAlchemy; the core's ``migrations/`` is not in lifecycle/).

The layers, lowest first (ARCHITECTURE.md draws them):
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lifecycle"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("results", "errors", "clock", "user_documents", "storable", "redact", "logs")),
    ("spec", ("graph", "spec")),
    ("store", ("store", "store.*", "revisions", "urls")),
    ("pieces", ("freshness", "compiled", "effects", "file_writes", "registry", "queries", "verify",
                "processes", "bare_read", "within")),
    ("engine", ("engine", "engine.*")),
    ("tools", ("worker_core", "worker", "aio", "outbox_admin", "scenario", "render", "story")),
    ("api", ("__init__",)),
    ("adapters", ("adapters.*",)),
    # a machine's own commands (machines/NAME_commands.py) are here, below the command line:
    # a function each that cli/kit.py is given to, so they never import cli/
    ("machines", ("machines.*", "machines.drone_commands", "machines.job_exit_commands")),
    ("simulations", ("sim.*", "demo")),
    ("check", ("check", "check.*")),
    ("dashboard", ("dashboard", "dashboard.*")),
    ("cli", ("cli", "cli.*", "__main__")),
]
CORE = {"foundation", "spec", "store", "pieces", "engine", "tools"}
LONGEST_FUNCTION = 60

__doc__ += "\n".join(f"  {name}: {', '.join(modules)}" for name, modules in LAYERS)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
           if "_migrations" not in p.parts}
PACKAGES = {name for name, p in MODULES.items() if p.name == "__init__.py" and name != "__init__"}


def layer_of(module: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if module == pattern or (pattern.endswith(".*") and (
                    module == pattern[:-2] or module.startswith(pattern[:-1]))):
                return index
    raise AssertionError(f"lifecycle.{module} is in no layer: add it to LAYERS in "
                         f"{Path(__file__).name} (and to ARCHITECTURE.md)")


@dataclass(frozen=True)
class Import:
    importer: str
    line: int
    module: str
    names: tuple[str, ...]


def _resolve(importer: str, level: int, target: str | None) -> str:
    """The lifecycle module a relative (or absolute) import names, as a MODULES key."""
    if level == 0:
        assert target is not None
        return target.removeprefix("lifecycle").lstrip(".") or "__init__"
    base = importer.split(".") if importer != "__init__" else []
    if importer not in PACKAGES:  # a module's package is its parent
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    parts = [*base, *(target.split(".") if target else [])]
    return ".".join(parts) or "__init__"


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the rules (which only read it)."""
    return ast.parse(path.read_text(), str(path))


def imports() -> Iterator[Import]:
    return iter(_imports())


@functools.cache
def _imports() -> tuple[Import, ...]:
    return tuple(_read_imports())


def _read_imports() -> Iterator[Import]:
    for name, path in MODULES.items():
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and not (node.module or "").startswith("lifecycle"):
                    continue
                target = _resolve(name, node.level, node.module)
                names = tuple(alias.name for alias in node.names)
                submodules = [f"{target}.{n}" if target != "__init__" else n for n in names]
                found = [m for m in submodules if m in MODULES]
                if found:  # `from . import queries`: the modules themselves
                    yield from (Import(name, node.lineno, m, ()) for m in found)
                    names = tuple(n for n, m in zip(names, submodules, strict=True)
                                  if m not in MODULES)
                    if not names:
                        continue
                yield Import(name, node.lineno, target, names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("lifecycle"):
                        yield Import(name, node.lineno, _resolve(name, 0, alias.name), ())


def test_every_import_goes_down_or_sideways() -> None:
    upward = []
    for found in imports():
        if found.module not in MODULES:
            continue
        if layer_of(found.module) > layer_of(found.importer):
            upward.append(f"lifecycle/{MODULES[found.importer].relative_to(PACKAGE)}:"
                          f"{found.line}: {found.importer} ({LAYERS[layer_of(found.importer)][0]})"
                          f" imports {found.module} ({LAYERS[layer_of(found.module)][0]})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for found in imports():
        if found.module in MODULES and found.module != found.importer:
            # a package's __init__ is imported with any of its modules: count that edge too
            graph[found.importer].add(found.module)
            parent = found.module.rpartition(".")[0]
            if parent in PACKAGES and parent != found.importer and not \
                    found.importer.startswith(parent + "."):
                graph[found.importer].add(parent)
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                circles.append(" -> ".join([*path[path.index(successor):], successor]))
            elif successor not in state:
                visit(successor, [*path, successor])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_private_name_is_used_across_modules() -> None:
    used = []
    for found in imports():
        for name in found.names:
            if name.startswith("_") and not name.startswith("__"):
                used.append(f"{found.importer}:{found.line}: from {found.module} import {name}")
    for name, path in MODULES.items():
        tree = parsed(path)
        aliases = {alias.asname or alias.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and (node.level or (
                       node.module or "").startswith("lifecycle"))
                   for alias in node.names
                   if _submodule(name, node, alias.name) in MODULES}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                used.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not used, "private names used from another module:\n" + "\n".join(used)


def _submodule(importer: str, node: ast.ImportFrom, alias: str) -> str:
    target = _resolve(importer, node.level, node.module)
    return f"{target}.{alias}" if target != "__init__" else alias


def test_no_long_function_in_the_core() -> None:
    long = []
    for name, path in MODULES.items():
        if LAYERS[layer_of(name)][0] not in CORE:
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"lifecycle/{path.relative_to(PACKAGE)}:{node.lineno}: "
                                f"{node.name} has {lines} lines")
    assert not long, (f"functions over {LONGEST_FUNCTION} lines in the core:\n"
                      + "\n".join(long))


SQLALCHEMY_ALLOWED = (("store",), ("machines", "_migrations"))
"""Where lifecycle/ may import SQLAlchemy: the store, and the machines' branches of Alembic
revisions (``machines/_migrations/NAME/``, migrations like the core's ``migrations/`` beside
the package, which is not lifecycle/ and so not read here)."""


def sqlalchemy_imports() -> Iterator[tuple[Path, int, str]]:
    """(file, line, module) of every SQLAlchemy import in lifecycle/, every ``.py`` file read
    (the migration branches too, which the layer rules skip: they are no modules)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                       else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for module in modules:
                if module == "sqlalchemy" or module.startswith("sqlalchemy."):
                    yield path, node.lineno, module


def sqlalchemy_allowed(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return any(parts[:len(allowed)] == allowed for allowed in SQLALCHEMY_ALLOWED)


def test_sql_is_built_only_in_the_store() -> None:
    """Every statement lifecycle runs is in ``lifecycle/store/`` (one module per table in
    ``store/statements/``): the answer to "what touches this table?" is one file. Migrations
    (a machine's branch in ``machines/_migrations/``) build their tables with SQLAlchemy."""
    found = [f"lifecycle/{path.relative_to(PACKAGE)}:{line}: {module}"
             for path, line, module in sqlalchemy_imports() if not sqlalchemy_allowed(path)]
    assert not found, ("SQLAlchemy imported outside lifecycle/store/ and the migrations (put "
                       "the statement in lifecycle/store/statements/):\n" + "\n".join(found))


def test_the_rules_see_what_they_check() -> None:
    """The readers above find real imports (a test that reads nothing passes for nothing)."""
    found = {(i.importer, i.module) for i in imports()}
    assert ("engine.rows", "store") in found
    assert ("worker", "engine") in found
    assert ("engine.reads", "queries") in found  # `from .. import queries`
    assert ("engine.single", "engine.transitions") in found
    assert layer_of("machines.drone") > layer_of("engine")
    # the SQLAlchemy reader sees the imports it allows, in the store and in a machine's
    # migration branch, and allows no other place of lifecycle/
    allowed = {path.relative_to(PACKAGE).parts[:2] for path, _, _ in sqlalchemy_imports()}
    assert {("store", "schema.py"), ("machines", "_migrations")} <= allowed
    assert all(sqlalchemy_allowed(PACKAGE / "store" / p) for p in ("schema.py", "a/b.py"))
    assert sqlalchemy_allowed(PACKAGE / "machines" / "_migrations" / "job_exit" / "x_0001.py")
    for elsewhere in ("queries.py", "machines/job_exit.py", "cli/db.py", "migrations/x.py",
                      "storey/x.py", "machines/_migrationsx/x.py"):
        assert not sqlalchemy_allowed(PACKAGE / elsewhere), elsewhere


OTHERS_PRIVATE_NAMES = {
    ("store.database", "Writing", "held._connection"),
    ("store.database", "Writing", "held._discard"),
    ("store.database", "Writing", "held._local"),
}
"""(module, class, expression) allowed to use another object's private name: a transaction
reaching into the held connections it was made by (and the thread's holder, so that a read of
the same thread joins the write), in their own module."""


def private_uses(tree: ast.AST) -> Iterator[tuple[str | None, int, str]]:
    """(class, line, expression) of every ``obj._name`` whose ``obj`` is not ``self`` or
    ``cls`` (``__dunder__`` names aside): one object using another's private state. The
    class is the innermost one around it (None outside any)."""

    def visit(node: ast.AST, cls: str | None) -> Iterator[tuple[str | None, int, str]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls
            if (isinstance(child, ast.Attribute) and child.attr.startswith("_")
                    and not child.attr.startswith("__")
                    and not (isinstance(child.value, ast.Name)
                             and child.value.id in ("self", "cls"))):
                yield inner, child.lineno, ast.unparse(child)
            yield from visit(child, inner)

    return visit(tree, None)


def test_no_class_uses_another_class_private_names() -> None:
    """A class's private names are its own: no other class (nor a subclass through
    ``super()``) reads or calls them, so changing one class's internals cannot silently
    change another (the worker's two drivers share its core through public steps)."""
    used, allowed = [], set()
    for name, path in MODULES.items():
        for cls, line, expression in private_uses(parsed(path)):
            if (name, cls, expression) in OTHERS_PRIVATE_NAMES:
                allowed.add((name, cls, expression))
            else:
                used.append(f"lifecycle/{path.relative_to(PACKAGE)}:{line}: {expression} "
                            f"(in {cls or 'no class'})")
    assert not used, "another object's private names used:\n" + "\n".join(used)
    assert allowed == OTHERS_PRIVATE_NAMES, ("exceptions no longer needed: "
                                             f"{OTHERS_PRIVATE_NAMES - allowed}")


def test_the_class_rule_sees_a_violation() -> None:
    source = ("class Driver:\n"
              "    def go(self, core):\n"
              "        self._mine = cls_ = core._queue\n"
              "        return super()._settle(self._x, cls_.__dict__)\n"
              "def helper(worker):\n"
              "    return worker._running\n")
    assert [(cls, line, e) for cls, line, e in private_uses(ast.parse(source))] == [
        ("Driver", 3, "core._queue"), ("Driver", 4, "super()._settle"),
        (None, 6, "worker._running")]


def test_architecture_draws_the_same_layers() -> None:
    """ARCHITECTURE.md's table of layers names the modules LAYERS does, layer by layer, in
    order (``store/`` for a package), so a module given a layer here is drawn there too."""
    drawn = []
    for line in (PACKAGE.parent / "ARCHITECTURE.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and cells[1].isidentifier() and cells[2].startswith("`"):
            names = {name.strip("`").removesuffix("/") for name in cells[2].split(", ")}
            drawn.append((cells[1], names))
    listed = [(layer, {p.removesuffix(".*") for p in patterns
                       if p.removesuffix(".*").partition(".")[0] == p.removesuffix(".*")})
              for layer, patterns in LAYERS]
    assert drawn == listed
