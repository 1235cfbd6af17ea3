"""The schema's history, managed by Alembic. Nothing else creates tables.

Alembic is imported only to migrate: which revisions there are, and which one a database is
at, are read without it (the revision files' own lines, and the version table), so that
opening a store costs no Alembic import (a third of a command's start-up).

A machine that keeps tables of its own ships their revisions as a *branch*: a directory of
revision files (``Builtin.migrations``) whose base revision has ``down_revision = None`` and
``branch_labels = ("NAME",)``, and whose ids begin with NAME (never with four digits, as the
core's do). The directories a store is given join Alembic's ``version_locations``; the
version table then holds one row per branch. A store checks and upgrades the core and the
branches it was given; a branch's rows that it was not given are left alone."""

from __future__ import annotations

import functools
import os
import re
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

from .. import redact
from ..errors import DatabaseError
from ..revisions import CORE_REVISION
from ..revisions import VERSION_TABLE as VERSION_TABLE
from ..revisions import chain as chain
from ..revisions import head_revision as head_revision
from ..revisions import migrations_dir as migrations_dir
from ..revisions import revisions as revisions

_LABEL = re.compile(r'^branch_labels(?::[^=\n]*)? = [(\[]?\s*"([^"]+)"', re.MULTILINE)


@functools.cache
def branch_label(directory: str) -> str:
    """The label of the branch whose revision files are in ``directory``: its base revision's
    ``branch_labels`` (and the start of each of its revision ids)."""
    revisions_ = chain(directory)
    base = next(name for name in sorted(os.listdir(directory)) if name.endswith(".py") and
                f'revision: str = "{revisions_[0][0]}"' in _read(directory, name))
    found = _LABEL.search(_read(directory, base))
    if found is None or any(not r.startswith(found.group(1)) or CORE_REVISION.match(r)
                            for r, _, _ in revisions_):
        raise DatabaseError(f"the branch in {directory} must name itself in its base "
                            "revision's branch_labels and begin each revision id with it")
    return found.group(1)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name), encoding="utf-8") as file:
        return file.read()


def branch_head(directory: str) -> str:
    """The newest revision of the branch in ``directory``."""
    return chain(directory)[-1][0]


def _config(connection: Connection | None = None, branches: Sequence[str] = ()) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if branches:
        config.set_main_option("path_separator", "os")
        config.set_main_option("version_locations", os.pathsep.join(
            [os.path.join(migrations_dir(), "versions"), *branches]))
    config.attributes["connection"] = connection
    return config


VERSION_ROWS = f"SELECT version_num FROM {VERSION_TABLE}"
"""The version table's rows, read on the driver (:meth:`lifecycle.store.Store.revisions`)."""


def no_version_table(exc: BaseException) -> bool:
    """Whether the driver's error ``exc`` says that the version table does not exist (a
    database without lifecycle's schema): SQLite's ``no such table``, PostgreSQL's
    ``undefined_table``."""
    if getattr(exc, "sqlstate", None) == "42P01":  # psycopg's UndefinedTable
        return True
    return isinstance(exc, sqlite3.OperationalError) and str(exc).startswith("no such table")


def revision_rows(connection: Connection) -> list[str]:
    """The rows of the database's version table: the core's revision and each branch's
    (asked inside a migration's transaction, where a failed statement would spoil it)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return []
    return [row[0] for row in connection.execute(text(VERSION_ROWS))]


def branch_revision(rows: list[str], directory: str) -> str | None:
    """The revision of the branch in ``directory`` among the version table's ``rows`` (None:
    not applied)."""
    ids = {r for r, _, _ in chain(directory)}
    label = branch_label(directory)
    found = [row for row in rows if row in ids or row.startswith(label)]
    return found[0] if found else None


def upgrade(engine: SAEngine, revision: str = "head", branches: Sequence[str] = ()) -> None:
    """Upgrade the core and the ``branches`` (directories) to ``revision`` (``head``: all of
    them to their newest)."""
    from alembic import command

    target = "heads" if revision == "head" and branches else known(revision, branches)
    _run(engine, lambda config: command.upgrade(config, target), branches)


def downgrade(engine: SAEngine, revision: str, branches: Sequence[str] = ()) -> None:
    from alembic import command

    _run(engine, lambda config: command.downgrade(config, known(revision, branches)),
         branches)


def known(revision: str, branches: Sequence[str] = ()) -> str:
    """``revision`` if it names one of lifecycle's revisions (``head``, ``base``, a
    revision or a unique prefix of one, a relative step, a branch's ``LABEL@head``);
    :class:`DatabaseError` naming them otherwise."""
    step = re.fullmatch(r"(head-|base\+)([0-9]+)", revision)
    if step and branches:  # the core's own (with branches, Alembic finds several heads)
        chain_ = [r for r, _, _ in revisions()]
        at = len(chain_) - 1 - int(step[2]) if step[1] == "head-" else int(step[2]) - 1
        if not 0 <= at < len(chain_):
            raise DatabaseError(f"schema revision {revision} is beyond lifecycle's revisions")
        return chain_[at]
    if revision in ("head", "heads", "base") or re.fullmatch(r"(?:head|base)?[+-][0-9]+",
                                                             revision):
        return revision  # a relative step (head-1, -1) is checked by Alembic
    labels = [branch_label(b) for b in branches]
    if "@" in revision and revision.split("@")[0] in labels:
        return revision  # a branch's own head, base or step: checked by Alembic
    names = [r for r, _, _ in revisions()] + [r for b in branches for r, _, _ in chain(b)]
    matches = [r for r in names if r == revision] or [r for r in names if r.startswith(revision)]
    if len(matches) != 1 or not revision:
        raise DatabaseError(f"unknown schema revision {revision!r}: lifecycle's revisions are "
                            f"{', '.join(names)} (and head, base); `lifecycle db history` "
                            "lists them")
    return matches[0]


def _run(engine: SAEngine, step: Callable[[Config], None], branches: Sequence[str]) -> None:
    """Run migrations in one transaction. On SQLite, a batch migration rebuilds a table by
    copying it and dropping the original, and dropping a table with foreign keys enforced
    would cascade into the rows that point at it: enforcement is off while migrating (it can
    only be switched outside a transaction), and the keys are checked before the commit."""
    from alembic.util import CommandError

    try:
        _migrate(engine, step, branches)
    except CommandError as exc:  # the database's revision is not one of the code's
        raise DatabaseError(f"cannot migrate {redact.url(str(engine.url))}: {exc}; "
                            "`lifecycle db current` says where it is") from None
    except DBAPIError as exc:
        raise DatabaseError(f"database {redact.url(str(engine.url))}: "
                            f"{redact.text(str(exc.orig))}") from None


def _refuse_unknown_branches(connection: Connection, branches: Sequence[str]) -> None:
    """Alembic cannot move a database whose version table holds a revision it cannot find:
    a branch this process was not given says so in lifecycle's words."""
    given = {r for b in branches for r, _, _ in chain(b)}
    others = [row for row in revision_rows(connection)
              if not CORE_REVISION.match(row) and row not in given]
    if others:
        raise DatabaseError(
            f"the database holds the machine branch revision(s) {', '.join(sorted(others))}, "
            "which this process was not given: migrate with `lifecycle db upgrade` (it "
            "applies the branches of the machines it loads), or give their directories "
            "(Store(url, branches=[builtin.migrations, ...]))")


def _migrate(engine: SAEngine, step: Callable[[Config], None], branches: Sequence[str]) -> None:
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
                _refuse_unknown_branches(connection, branches)
                step(_config(connection, branches))
                if sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"migration broke foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")
