"""``lifecycle db``: the schema, created and migrated by Alembic."""

from __future__ import annotations

import sys

import click

from ..errors import DatabaseError
from ..store import Store, migrate
from .common import db_option, out
from .context import open_store


@click.group()
def db() -> None:
    """Create and migrate the database schema (Alembic)."""


@db.command()
@click.argument("revision", default="head")
@db_option
def upgrade(revision: str, db_url: str | None) -> None:
    """Upgrade the schema to REVISION (default: the newest)."""
    store = open_store(db_url, check=False)
    before = known_revision(store)
    store.upgrade(revision)
    after = store.current_revision()
    if before == after:
        out.print(f"{store.display_url}: already at {after}")
    else:
        out.print(f"{store.display_url}: {before or 'empty'} -> {after}")


@db.command()
@click.argument("revision")
@db_option
def downgrade(revision: str, db_url: str | None) -> None:
    """Downgrade the schema to REVISION ('base' drops every lifecycle table)."""
    store = open_store(db_url, check=False)
    before = known_revision(store)
    store.downgrade(revision)
    out.print(f"{store.display_url}: {before or 'empty'} -> {store.current_revision() or 'empty'}")


@db.command()
@db_option
def current(db_url: str | None) -> None:
    """Print the schema revision of the database, and whether it is the newest."""
    store = open_store(db_url, check=False)
    revision = store.current_revision()
    head = migrate.head_revision()
    if revision == head:
        state = "up to date"
    elif revision is not None and revision not in {r for r, _, _ in migrate.revisions()}:
        state = f"newer than this lifecycle, whose newest is {head}: upgrade lifecycle itself"
    else:
        state = f"behind {head}: run `lifecycle db upgrade`"
    out.print(f"{store.display_url}: {revision or 'empty'} ({state})")
    if revision != head:
        sys.exit(1)


def known_revision(store: Store) -> str | None:
    """The database's revision, if this lifecycle knows it (not a newer one's)."""
    revision = store.current_revision()
    if revision is not None and revision not in {r for r, _, _ in migrate.revisions()}:
        raise DatabaseError(
            f"database {store.display_url} is at schema revision {revision}, newer than this "
            f"lifecycle knows (its newest is {migrate.head_revision()}): upgrade lifecycle "
            "itself, or migrate with the lifecycle that wrote it")
    return revision


@db.command("history")
def db_history() -> None:
    """List the schema revisions, oldest first."""
    for revision, down, message in migrate.revisions():
        # the revision's first paragraph whole: its file wraps it, the terminal may again
        out.print(f"{down or 'base'} -> {revision}: {' '.join(message.split())}", soft_wrap=True)


