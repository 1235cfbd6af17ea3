"""Alembic environment of lifecycle. Run through `lifecycle db upgrade`, or plain `alembic`
with ``-x url=...`` (default: $LIFECYCLE_DATABASE_URL, else ./lifecycle.db)."""

from alembic import context
from sqlalchemy import Connection

# tables that adapters keep in lifecycle's database, beside the core's
from lifecycle.store.database import create_sa_engine
from lifecycle.store.migrate import VERSION_TABLE
from lifecycle.store.schema import metadata
from lifecycle.urls import resolve_url


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("lifecycle's migrations run online only: give them a database")

given = context.config.attributes.get("connection")
if given is not None:
    run(given)
else:
    engine = create_sa_engine(resolve_url(context.get_x_argument(as_dictionary=True).get("url")))
    with engine.begin() as connection:
        run(connection)
