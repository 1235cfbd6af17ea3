"""``lifecycle db``: the schema, created and migrated by Alembic."""

from __future__ import annotations

import sys

import click

from ..store import migrate
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
    before = store.current_revision()
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
    before = store.current_revision()
    store.downgrade(revision)
    out.print(f"{store.display_url}: {before or 'empty'} -> {store.current_revision() or 'empty'}")


@db.command()
@db_option
def current(db_url: str | None) -> None:
    """Print the schema revision of the database, and whether it is the newest."""
    store = open_store(db_url, check=False)
    revision = store.current_revision()
    head = migrate.head_revision()
    state = "up to date" if revision == head else f"behind {head}: run `lifecycle db upgrade`"
    out.print(f"{store.display_url}: {revision or 'empty'} ({state})")
    if revision != head:
        sys.exit(1)


@db.command("history")
def db_history() -> None:
    """List the schema revisions, oldest first."""
    for revision, down, message in migrate.revisions():
        out.print(f"{down or 'base'} -> {revision}: {message.splitlines()[0] if message else ''}")


