"""observations: status reports from outside, the newest one per resource, and the
observation and fence each decision rested on

Revision ID: 0002_observations
Revises: 0001_core
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import Document, Id, UtcDateTime

revision: str = "0002_observations"
down_revision: str | None = "0001_core"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lifecycle_observations",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("resource_id", Id, nullable=False),
        sa.Column("status", Document(), nullable=False),
        sa.Column("observed_at", UtcDateTime(), nullable=False,
                  comment="when the status was true at its source"),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        sa.Column("source", sa.String(200), nullable=False),
        sa.ForeignKeyConstraint(["resource_id"], ["lifecycle_resources.id"],
                                name="fk_lifecycle_observations_resource_id_lifecycle_resources",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_lifecycle_observations"),
        comment="status reports from outside, append-only",
    )
    op.create_index("ix_lifecycle_observations_resource_id_observed_at",
                    "lifecycle_observations", ["resource_id", "observed_at"])
    with op.batch_alter_table("lifecycle_resources") as batch:
        batch.add_column(sa.Column("observation_id", Id,
                                   comment="the newest observation (by observed_at)"))
        batch.add_column(sa.Column("observed_at", UtcDateTime(),
                                   comment="observed_at of that observation"))
        batch.add_column(sa.Column("last_transition_at", UtcDateTime(),
                                   comment="when the last transition (or the creation) "
                                           "committed"))
    op.execute("UPDATE lifecycle_resources SET last_transition_at = updated_at")
    with op.batch_alter_table("lifecycle_resources") as batch:
        batch.alter_column("last_transition_at", existing_type=UtcDateTime(), nullable=False,
                           existing_comment="when the last transition (or the creation) "
                                            "committed")
    with op.batch_alter_table("lifecycle_journal") as batch:
        batch.add_column(sa.Column("observation_id", Id,
                                   comment="the observation the decision rested on"))
        batch.add_column(sa.Column("fence", Document(),
                                   comment="what the effects may still assume of the world"))
        batch.alter_column("kind", existing_type=sa.String(16), existing_nullable=False,
                           comment="create, adopt, transition, refusal",
                           existing_comment="create, adopt, transition")


def downgrade() -> None:
    with op.batch_alter_table("lifecycle_journal") as batch:
        batch.alter_column("kind", existing_type=sa.String(16), existing_nullable=False,
                           comment="create, adopt, transition",
                           existing_comment="create, adopt, transition, refusal")
        batch.drop_column("fence")
        batch.drop_column("observation_id")
    with op.batch_alter_table("lifecycle_resources") as batch:
        batch.drop_column("last_transition_at")
        batch.drop_column("observed_at")
        batch.drop_column("observation_id")
    op.drop_index("ix_lifecycle_observations_resource_id_observed_at",
                  table_name="lifecycle_observations")
    op.drop_table("lifecycle_observations")
