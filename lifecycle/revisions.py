"""The schema's revisions, read from the revision files' own lines, and the table that says
which one a database is at: the one source of the code's head revision, for the store (which
migrates with Alembic) and for a read on the bare driver (:mod:`lifecycle.bare_read`), neither of
which imports Alembic or SQLAlchemy to know it."""

from __future__ import annotations

import functools
import os
import re

from .errors import DatabaseError

VERSION_TABLE = "lifecycle_alembic_version"


def migrations_dir() -> str:
    """``migrations/`` of a source checkout, or its copy inside an installed wheel."""
    package = os.path.dirname(os.path.realpath(__file__))
    for candidate in (os.path.join(package, "_migrations"),
                      os.path.join(os.path.dirname(package), "migrations")):
        if os.path.isfile(os.path.join(candidate, "env.py")):
            return candidate
    raise FileNotFoundError(f"lifecycle's migrations are missing (looked beside {package})")


def head_revision() -> str:
    return revisions()[-1][0]


CORE_REVISION = re.compile(r"[0-9]{4}_")
"""How the core's revision ids begin; a machine's branch's (``job_exit_0001_...``) never do,
so that the core's row of the version table is told apart from the branches' rows (one per
branch) without knowing the branches."""


def core_revision(rows: list[str]) -> str | None:
    """The core's revision among the version table's rows (None: the core has none)."""
    found = [row for row in rows if CORE_REVISION.match(row)]
    if len(found) > 1:
        raise DatabaseError(f"the database is at several schema revisions at once: "
                            f"{', '.join(sorted(found))}")
    return found[0] if found else None


_REVISION = re.compile(r'^revision: str = "([^"]+)"$', re.MULTILINE)
_DOWN = re.compile(r'^down_revision: str \| None = (?:None|"([^"]+)")$', re.MULTILINE)
_DOC = re.compile(r'\A\s*"""(.*?)(?:\n\s*\n|""")', re.DOTALL)


def revisions() -> list[tuple[str, str | None, str]]:
    """(revision, down revision, message) from base to head, read from the revision files'
    own lines (each declares ``revision: str = "..."`` and ``down_revision: str | None =
    ...``; a test checks that Alembic reads the same)."""
    return list(chain(os.path.join(migrations_dir(), "versions")))


@functools.cache
def chain(versions: str) -> tuple[tuple[str, str | None, str], ...]:
    """(revision, down revision, message) of the revision files in directory ``versions``,
    from base to head (the core's, or one machine's branch)."""
    found: dict[str | None, tuple[str, str | None, str]] = {}
    for name in sorted(n for n in os.listdir(versions) if n.endswith(".py")):
        with open(os.path.join(versions, name), encoding="utf-8") as file:
            source = file.read()
        revision, down = _REVISION.search(source), _DOWN.search(source)
        if revision is None or down is None:
            raise DatabaseError(f"migration {name} does not declare its revision and "
                                "down_revision as lifecycle's revisions do")
        doc = _DOC.search(source)
        message = doc.group(1).strip() if doc else ""
        found[down.group(1)] = (revision.group(1), down.group(1), message)
    chain: list[tuple[str, str | None, str]] = []
    below: str | None = None
    while below in found:
        chain.append(found.pop(below))
        below = chain[-1][0]
    if found or not chain:
        raise DatabaseError(f"the migrations in {versions} do not form one chain (left over: "
                            f"{sorted(r for r, _, _ in found.values())})")
    return tuple(chain)

