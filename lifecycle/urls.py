"""The database a command or an application names: its URL, resolved, and as it may be
shown (no password). Read without SQLAlchemy, so that a command that only reads can open
the database on its driver alone."""

from __future__ import annotations

import os

from . import redact

DEFAULT_URL = "sqlite:///lifecycle.db"
URL_VARIABLE = "LIFECYCLE_DATABASE_URL"


def resolve_url(url: str | None = None) -> str:
    """The database URL: the argument, else ``$LIFECYCLE_DATABASE_URL``, else
    ``./lifecycle.db``. A plain path means a SQLite file; ``postgresql://`` means psycopg 3.
    A password holding ``@`` that is not percent-encoded is encoded (its user information
    ends at the URL's last ``@``)."""
    url = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    if "://" not in url:
        return f"sqlite:///{url}"
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            url = "postgresql+psycopg://" + url[len(plain):]
    head, user, password, rest = redact.split_credentials(url)
    if password is not None and "@" in password:
        url = f"{head}{user}:{password.replace('@', '%40')}@{rest}"
    return url


def display_url(url: str) -> str:
    """The URL without its password, for messages, logs and anything stored."""
    return redact.url(url)
