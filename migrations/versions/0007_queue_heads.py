"""queue heads: the first open effect of each resource is marked, and the claim walks only
those, in due order, through a partial index: its cost no longer grows with the backlog

Revision ID: 0007_queue_heads
Revises: 0006_claimants
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import HEAD_COMMENT, HEADS_WHERE

revision: str = "0007_queue_heads"
down_revision: str | None = "0006_claimants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_lifecycle_effects_heads"
OPEN = "('pending', 'running', 'failed')"


def upgrade() -> None:
    op.add_column("lifecycle_effects", sa.Column("head", sa.Integer(), comment=HEAD_COMMENT))
    # the effects that are heads now: the first open one of each resource
    op.execute(f"""
        UPDATE lifecycle_effects SET head = 1
        WHERE status IN {OPEN} AND id IN (
            SELECT min(id) FROM lifecycle_effects WHERE status IN {OPEN} GROUP BY resource_id)
    """)
    op.create_index(INDEX, "lifecycle_effects", ["next_attempt_at", "id"],
                    sqlite_where=sa.text(HEADS_WHERE), postgresql_where=sa.text(HEADS_WHERE))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="lifecycle_effects")
    with op.batch_alter_table("lifecycle_effects") as batch:
        batch.drop_column("head")
