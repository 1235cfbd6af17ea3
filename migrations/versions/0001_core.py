"""core: machines, specs, resources and their journal

Revision ID: 0001_core
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import Document, Id, UtcDateTime

revision: str = "0001_core"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lifecycle_machines",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("spec_version", sa.String(64), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_lifecycle_machines"),
        comment="each machine name and the spec version registered last",
    )
    op.create_table(
        "lifecycle_specs",
        sa.Column("machine", sa.String(200), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("spec", Document(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("machine", "version", name="pk_lifecycle_specs"),
        comment="every spec version ever used, so history can be read long after a file changed",
    )
    op.create_table(
        "lifecycle_resources",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("machine", sa.String(200), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("spec_version", sa.String(64), nullable=False),
        sa.Column("state", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False,
                  comment="bumped by every change of state or data"),
        sa.Column("seq", sa.Integer(), nullable=False,
                  comment="sequence number of the last journal row"),
        sa.Column("data", Document(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_lifecycle_resources"),
        sa.UniqueConstraint("machine", "key", name="uq_lifecycle_resources_machine_key"),
    )
    op.create_index("ix_lifecycle_resources_key", "lifecycle_resources", ["key"])
    op.create_index("ix_lifecycle_resources_machine_state", "lifecycle_resources",
                    ["machine", "state"])
    op.create_table(
        "lifecycle_journal",
        sa.Column("resource_id", Id, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False, comment="create, adopt, transition"),
        sa.Column("trigger", sa.String(200)),
        sa.Column("source", sa.String(200)),
        sa.Column("dest", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False,
                  comment="the resource's version after this row"),
        sa.Column("spec_version", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(255)),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("payload", Document()),
        sa.Column("guards", Document(), comment="the verdict of each guard evaluated"),
        sa.ForeignKeyConstraint(["resource_id"], ["lifecycle_resources.id"],
                                name="fk_lifecycle_journal_resource_id_lifecycle_resources",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("resource_id", "seq", name="pk_lifecycle_journal"),
    )


def downgrade() -> None:
    op.drop_table("lifecycle_journal")
    op.drop_index("ix_lifecycle_resources_machine_state", table_name="lifecycle_resources")
    op.drop_index("ix_lifecycle_resources_key", table_name="lifecycle_resources")
    op.drop_table("lifecycle_resources")
    op.drop_table("lifecycle_specs")
    op.drop_table("lifecycle_machines")
