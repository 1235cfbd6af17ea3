"""The PostgreSQL server the benchmarks use: reachability, and schemas of their own."""

from __future__ import annotations

import os
import re
import uuid
from urllib.parse import quote

DEFAULT_URL = os.environ.get(
    "LIFECYCLE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
SCHEMA_PREFIX = "lc_bench_"


def libpq(url: str) -> str:
    """A SQLAlchemy URL as psycopg wants it."""
    return re.sub(r"^postgres(ql)?(\+psycopg)?://", "postgresql://", url)


def with_search_path(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def problem(url: str) -> str | None:
    """Why the server cannot be used, or None when it can."""
    try:
        import psycopg

        with psycopg.connect(libpq(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # shown to the user as the reason for skipping
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return None


def server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(libpq(url), connect_timeout=3) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def create_schema(url: str, name: str) -> str:
    import psycopg

    schema = f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:8]}_{name}"
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
