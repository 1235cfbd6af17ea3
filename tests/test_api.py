"""The public API: one list of names (``lifecycle.PUBLIC``) that the lazy imports, ``dir()``,
``__all__`` and what a type checker sees all follow, and the exception tree grouped by cause
(a caller catches ``NotFound`` or ``InvalidInput`` instead of naming every error)."""

from __future__ import annotations

import ast
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
    with pytest.raises(AttributeError, match="no attribute 'ProbeBatch'"):
        lifecycle.ProbeBatch  # noqa: B018  (sans-IO plumbing is not the API)


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
    exceptions = {name: getattr(lifecycle, name) for name in lifecycle.__all__
                  if isinstance(getattr(lifecycle, name), type)
                  and issubclass(getattr(lifecycle, name), BaseException)}
    grouped = {name: [g.__name__ for g in GROUPS if issubclass(cls, g)]
               for name, cls in exceptions.items() if cls is not errors.LifecycleError
               and cls not in GROUPS}
    assert {name: groups for name, groups in grouped.items() if len(groups) != 1} == {}
    assert {name: groups[0] for name, groups in grouped.items()} == {
        member: group.__name__ for group, members in GROUPS.items() for member in members}
    assert all(issubclass(cls, errors.LifecycleError) for cls in exceptions.values())


def test_the_adapters_errors_are_in_their_groups() -> None:
    from lifecycle.adapters.sites import SiteError
    from lifecycle.adapters.smtp import MailConfigError

    assert issubclass(SiteError, errors.OutsideError)
    assert issubclass(MailConfigError, errors.SetupError)


def test_the_groups_are_also_the_builtin_kinds_a_caller_catches() -> None:
    assert issubclass(lifecycle.UnknownResource, LookupError)
    assert issubclass(lifecycle.InvalidData, ValueError)
    assert issubclass(lifecycle.SpecError, ValueError)
    assert not issubclass(lifecycle.ConcurrencyError, ValueError)
