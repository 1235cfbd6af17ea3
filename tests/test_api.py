"""The public API: one list of names (``lifecycle.PUBLIC``) that the lazy imports, ``dir()``,
``__all__``, what a type checker sees and the API page all follow; the names ``lifecycle``
exported once (``lifecycle.MOVED``) say where they live now; and the exception tree grouped
by cause (a caller catches ``NotFound`` or ``InvalidInput`` instead of naming every error)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import lifecycle
from lifecycle import errors

INIT = Path(lifecycle.__file__)


def _type_checked_names() -> dict[str, set[str]]:
    """What the ``if TYPE_CHECKING:`` block of ``lifecycle/__init__.py`` imports, by module."""
    tree = ast.parse(INIT.read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    found: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            found.setdefault(str(node.module), set()).add(alias.name)
    return found


def test_what_a_type_checker_sees_is_the_public_list() -> None:
    assert _type_checked_names() == {m: set(names) for m, names in lifecycle.PUBLIC.items()}


def test_every_public_name_imports_and_is_listed() -> None:
    assert lifecycle.__all__ == sorted(n for names in lifecycle.PUBLIC.values() for n in names)
    for name in lifecycle.__all__:
        assert getattr(lifecycle, name) is not None
        assert name in dir(lifecycle)


def test_the_api_page_lists_the_public_names() -> None:
    """The table at the top of ``docs/api.md`` names exactly the public names."""
    page = (INIT.parent.parent / "docs" / "api.md").read_text()
    table = page[page.index("| for | names |"):].split("\n\n", 1)[0]
    listed = {name for row in table.splitlines()[2:]
              for name in re.findall(r"`(\w+)`", row.split("|")[2])}
    assert listed == set(lifecycle.__all__)


MOVED = sorted((name, home) for home, names in lifecycle.MOVED.items() for name in names)


@pytest.mark.parametrize(("name", "home"), MOVED, ids=[name for name, _ in MOVED])
def test_a_name_that_moved_says_where_it_lives(name: str, home: str) -> None:
    """Old code that asks ``lifecycle`` for a name it no longer exports is told where the name
    lives now, by ``lifecycle.NAME`` and by ``from lifecycle import NAME`` alike."""
    where = re.escape(f"no attribute {name!r}: it lives in {home} (from {home} import {name})")
    assert name not in lifecycle.__all__ and name not in dir(lifecycle)
    assert not hasattr(lifecycle, name)
    with pytest.raises(AttributeError, match=where):
        getattr(lifecycle, name)
    with pytest.raises(ImportError, match=where):
        exec(f"from lifecycle import {name}", {})
    assert getattr(importlib.import_module(home), name) is not None  # and it is there


def test_an_unknown_name_is_plainly_unknown() -> None:
    with pytest.raises(AttributeError, match=r"^module 'lifecycle' has no attribute 'Nope'$"):
        lifecycle.Nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'Nope'"):
        exec("from lifecycle import Nope", {})


GROUPS = {
    errors.NotFound: {"UnknownMachine", "UnknownResource", "UnknownTrigger", "UnknownState"},
    errors.InvalidInput: {"SpecError", "InvalidData", "AmbiguousKey", "ScenarioError"},
    errors.Conflict: {"ResourceExists", "ConcurrencyError", "StaleObservation",
                      "StrandedResources", "LostClaim"},
    errors.StorageError: {"DatabaseError", "SchemaOutOfDate"},
    errors.EffectError: {"RetryableError", "PermanentError"},
    errors.OutsideError: {"ProbeFailed"},
    errors.SetupError: {"GuardError", "RendererMissing", "RenderFailed"},
}


def test_every_public_exception_is_in_one_group_by_cause() -> None:
    exceptions = {name: value for name, value in vars(errors).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}
    grouped = {name: [g.__name__ for g in GROUPS if issubclass(cls, g)]
               for name, cls in exceptions.items() if cls is not errors.LifecycleError
               and cls not in GROUPS}
    assert {name: groups for name, groups in grouped.items() if len(groups) != 1} == {}
    assert {name: groups[0] for name, groups in grouped.items()} == {
        member: group.__name__ for group, members in GROUPS.items() for member in members}
    assert all(issubclass(cls, errors.LifecycleError) for cls in exceptions.values())


def test_the_adapters_and_machines_errors_are_in_their_groups() -> None:
    from lifecycle.adapters.sites import SiteError
    from lifecycle.adapters.smtp import MailConfigError
    from lifecycle.check.memory import CheckError
    from lifecycle.machines.startd import ClaimRefused

    assert issubclass(SiteError, errors.OutsideError)
    assert issubclass(MailConfigError, errors.SetupError)
    assert issubclass(ClaimRefused, errors.Conflict)
    assert issubclass(CheckError, errors.InvalidInput)  # a model the checker cannot run
    for name in ("SiteError", "MailConfigError"):   # defined where they are raised
        assert not hasattr(errors, name) and name not in lifecycle.__all__


def test_the_groups_and_what_a_handler_raises_are_public() -> None:
    """A caller catches a group from ``lifecycle`` itself; the specific errors are in
    ``lifecycle.errors``."""
    assert {g.__name__ for g in GROUPS} | {"LifecycleError", "RetryableError",
                                          "PermanentError"} == set(lifecycle.PUBLIC["errors"])


def test_the_groups_are_also_the_builtin_kinds_a_caller_catches() -> None:
    assert issubclass(errors.UnknownResource, LookupError)
    assert issubclass(errors.InvalidData, ValueError)
    assert issubclass(errors.SpecError, ValueError)
    assert not issubclass(errors.ConcurrencyError, ValueError)


TOGGLE = {"name": "toggle", "states": ["off", "on"], "initial": "off", "final": ["on"],
          "transitions": [{"trigger": "flip", "source": "off", "dest": "on"}]}


def test_invalid_arguments_are_invalid_input_hence_value_errors(sqlite_url: str) -> None:
    """A caller's bad argument is an ``InvalidInput`` (a ``ValueError``), raised before any
    database is asked, whichever of the API's doors it came through."""
    import asyncio

    from lifecycle.machines.job_exit import settings_from_environment

    store = lifecycle.Store(sqlite_url)
    try:
        engine = lifecycle.Engine(store, [TOGGLE])
        aengine = lifecycle.AsyncEngine(store, [TOGGLE])

        async def pages() -> list[lifecycle.Resource]:
            return [r async for r in aengine.iter_resources(page=0)]

        bad = {
            "a page after a plain key": (lambda: engine.resources(limit=5, after="plain"),
                                         "without a machine, a page starts after MACHINE:KEY"),
            "a position with a NUL": (lambda: engine.resources(limit=5, after="toggle:a\x00"),
                                      "invalid position"),
            "a key with a NUL": (lambda: engine.get("toggle:a\x00"), "invalid key"),
            "a key too long": (lambda: engine.get("k" * 600), "invalid key"),
            "an async page of 0": (lambda: asyncio.run(pages()), "invalid page 0"),
            "a page of 0": (lambda: next(engine.iter_resources(page=0)), "invalid page 0"),
            "a limit below 0": (lambda: engine.resources(limit=-1), "invalid limit -1"),
            "a state with a NUL": (lambda: engine.resources(state="a\x00", limit=1),
                                   "invalid state"),
            "a fire's key with a NUL": (lambda: engine.fire("toggle:a\x00", "flip"),
                                        "invalid key"),
            "a history's key with a NUL": (lambda: engine.history("toggle:a\x00"),
                                           "invalid key"),
            "a new key with a colon": (lambda: engine.create("toggle", "a:b"), "invalid key"),
            "a new key with spaces": (lambda: engine.create("toggle", " a"), "invalid key"),
            "a job exit setting": (lambda: settings_from_environment(
                {"LIFECYCLE_EMAIL_DOMAIN": "not a domain"}), "is not a domain name"),
        }
        for what, (call, message) in bad.items():
            with pytest.raises(lifecycle.InvalidInput, match=message) as raised:
                call()
            assert isinstance(raised.value, ValueError), what
    finally:
        store.dispose()
