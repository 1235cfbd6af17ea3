"""The schema's history, managed by Alembic. Nothing else creates tables.

Alembic is imported only to migrate: which revisions there are, and which one a database is
at, are read without it (the revision files' own lines, and the version table), so that
opening a store costs no Alembic import (a third of a command's start-up)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

from .. import redact
from ..errors import DatabaseError
from ..revisions import VERSION_TABLE as VERSION_TABLE
from ..revisions import head_revision as head_revision
from ..revisions import migrations_dir as migrations_dir
from ..revisions import revisions as revisions


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def current_revision(connection: Connection) -> str | None:
    """The revision in the database's version table (None when it has none)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    found = [row[0] for row in connection.execute(text(
        f"SELECT version_num FROM {VERSION_TABLE}"))]
    if len(found) > 1:
        raise DatabaseError(f"the database is at several schema revisions at once: "
                            f"{', '.join(sorted(found))}")
    return found[0] if found else None


def upgrade(engine: SAEngine, revision: str = "head") -> None:
    from alembic import command

    _run(engine, lambda config: command.upgrade(config, known(revision)))


def downgrade(engine: SAEngine, revision: str) -> None:
    from alembic import command

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
    from alembic.util import CommandError

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
