"""The schema's history, managed by Alembic. Nothing else creates tables."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import DBAPIError

from .. import redact
from ..errors import DatabaseError

VERSION_TABLE = "lifecycle_alembic_version"


def migrations_dir() -> Path:
    """``migrations/`` of a source checkout, or its copy inside an installed wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(f"lifecycle's migrations are missing (looked beside {package})")


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def current_revision(connection: Connection) -> str | None:
    # Alembic says at INFO which dialect it found ("Context impl SQLiteImpl."): news at an
    # upgrade, noise on every start of a program that only checks the revision
    chatty = logging.getLogger("alembic.runtime.migration")
    level = chatty.level
    chatty.setLevel(max(level, logging.WARNING))
    try:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
    finally:
        chatty.setLevel(level)


def revisions() -> list[tuple[str, str | None, str]]:
    """(revision, down revision, message) from base to head."""
    script = ScriptDirectory.from_config(_config())
    out = [(r.revision, r.down_revision if isinstance(r.down_revision, str) else None,
            r.doc or "") for r in script.walk_revisions()]
    return list(reversed(out))


def upgrade(engine: SAEngine, revision: str = "head") -> None:
    _run(engine, lambda config: command.upgrade(config, known(revision)))


def downgrade(engine: SAEngine, revision: str) -> None:
    _run(engine, lambda config: command.downgrade(config, known(revision)))


def known(revision: str) -> str:
    """``revision`` if it names one of lifecycle's revisions (``head``, ``base``, a
    revision or a unique prefix of one, a relative step); :class:`DatabaseError` naming them
    otherwise."""
    if revision in ("head", "heads", "base") or re.fullmatch(r"(?:head|base)?[+-][0-9]+",
                                                             revision):
        return revision  # a relative step (head-1, -1) is checked by Alembic
    names = [r for r, _, _ in revisions()]
    matches = [r for r in names if r == revision] or [r for r in names if r.startswith(revision)]
    if len(matches) != 1 or not revision:
        raise DatabaseError(f"unknown schema revision {revision!r}: lifecycle's revisions are "
                            f"{', '.join(names)} (and head, base); `lifecycle db history` "
                            "lists them")
    return matches[0]


def _run(engine: SAEngine, step: Callable[[Config], None]) -> None:
    """Run migrations in one transaction. On SQLite, a batch migration rebuilds a table by
    copying it and dropping the original, and dropping a table with foreign keys enforced
    would cascade into the rows that point at it: enforcement is off while migrating (it can
    only be switched outside a transaction), and the keys are checked before the commit."""
    try:
        _migrate(engine, step)
    except CommandError as exc:  # the database's revision is not one of the code's
        raise DatabaseError(f"cannot migrate {redact.url(str(engine.url))}: {exc}; "
                            "`lifecycle db current` says where it is") from None
    except DBAPIError as exc:
        raise DatabaseError(f"database {redact.url(str(engine.url))}: "
                            f"{redact.text(str(exc.orig))}") from None


def _migrate(engine: SAEngine, step: Callable[[Config], None]) -> None:
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        assert raw is not None
        if sqlite:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                if engine.dialect.name == "postgresql":
                    # processes upgrading at once take turns (PostgreSQL's DDL is
                    # transactional: the next one finds the schema at head); held until commit
                    connection.exec_driver_sql(
                        "SELECT pg_advisory_xact_lock(hashtext('lifecycle.migrate'))")
                step(_config(connection))
                if sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"migration broke foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")
