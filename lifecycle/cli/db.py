"""``lifecycle db``: the schema, created and migrated by Alembic: the core's revisions and the
branches of the machines that keep tables of their own (``Builtin.migrations``)."""

from __future__ import annotations

import sys

import click

from ..errors import DatabaseError
from ..machines import builtins
from ..store import Store, migrate
from .common import db_option, out
from .context import open_store


def branches() -> list[str]:
    """The migration branches of every machine this command loads (lifecycle's own and any
    installed package's)."""
    return [found.migrations for found in builtins().values() if found.migrations]


@click.group()
def db() -> None:
    """Create and migrate the database schema (Alembic)."""


@db.command()
@click.argument("revision", default="head")
@db_option
def upgrade(revision: str, db_url: str | None) -> None:
    """Upgrade the schema to REVISION (default: the newest, with the machines' branches)."""
    store = open_store(db_url, check=False, branches=branches())
    before = known_revision(store)
    old = _branches(store)
    store.upgrade(revision)
    after = store.current_revision()
    if before == after:
        out.print(f"{store.display_url}: already at {after}")
    else:
        out.print(f"{store.display_url}: {before or 'empty'} -> {after}")
    _print_branches(old, _branches(store))


@db.command()
@click.argument("revision")
@db_option
def downgrade(revision: str, db_url: str | None) -> None:
    """Downgrade the schema to REVISION ('base' drops every lifecycle table)."""
    store = open_store(db_url, check=False, branches=branches())
    before = known_revision(store)
    old = _branches(store)
    store.downgrade(revision)
    out.print(f"{store.display_url}: {before or 'empty'} -> {store.current_revision() or 'empty'}")
    _print_branches(old, _branches(store))


def _branches(store: Store) -> dict[str, str | None]:
    """Each branch's label -> the revision the database is at (None: absent)."""
    return {migrate.branch_label(b): store.branch_revision(b) for b in store.branches}


def _print_branches(before: dict[str, str | None], after: dict[str, str | None]) -> None:
    for label, now in after.items():
        was = before.get(label)
        change = f"already at {now}" if was == now else f"{was or 'empty'} -> {now or 'empty'}"
        out.print(f"  branch {label}: {change}")


@db.command()
@db_option
def current(db_url: str | None) -> None:
    """Print the schema revision of the database and of each machine's branch, and whether
    they are the newest."""
    store = open_store(db_url, check=False, branches=branches())
    revision = store.current_revision()
    head = migrate.head_revision()
    if revision == head:
        state = "up to date"
    elif revision is not None and revision not in {r for r, _, _ in migrate.revisions()}:
        state = f"newer than this lifecycle, whose newest is {head}: upgrade lifecycle itself"
    else:
        state = f"behind {head}: run `lifecycle db upgrade`"
    out.print(f"{store.display_url}: {revision or 'empty'} ({state})")
    behind = revision != head
    for label, now in _branches(store).items():
        newest = migrate.branch_head(next(b for b in store.branches
                                          if migrate.branch_label(b) == label))
        behind = behind or now != newest
        mark = "up to date" if now == newest else f"behind {newest}: run `lifecycle db upgrade`"
        out.print(f"  branch {label}: {now or 'empty'} ({mark})")
    if behind:
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
    """List the schema revisions, oldest first: the core's, then each machine's branch."""
    for revision, down, message in migrate.revisions():
        # the revision's first paragraph whole: its file wraps it, the terminal may again
        out.print(f"{down or 'base'} -> {revision}: {' '.join(message.split())}", soft_wrap=True)
    for directory in branches():
        out.print(f"branch {migrate.branch_label(directory)} ({directory}):", soft_wrap=True)
        for revision, down, message in migrate.chain(directory):
            out.print(f"  {down or 'base'} -> {revision}: {' '.join(message.split())}",
                      soft_wrap=True)
