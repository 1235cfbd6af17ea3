"""claimants: the process that holds an effect's claim, so that a worker on the same host
can take over the claims of one that died without waiting for their leases

Revision ID: 0006_claimants
Revises: 0005_journal_kinds
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_claimants"
down_revision: str | None = "0005_journal_kinds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIMANT = "the claiming process: boot id/PID namespace/pid/start time"


def upgrade() -> None:
    # adding a nullable column needs no table rebuild, on SQLite either
    op.add_column("lifecycle_effects", sa.Column("claimant", sa.String(200), comment=CLAIMANT))
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps no column comments
    op.alter_column("lifecycle_effects", "claimed_by", existing_type=sa.String(200),
                    comment="the worker holding the claim (its name)")
    op.alter_column("lifecycle_effects", "lease_until", existing_type=sa.DateTime(timezone=True),
                    comment="the claim's end, renewed by its worker's heartbeat")


def downgrade() -> None:
    with op.batch_alter_table("lifecycle_effects") as batch:
        batch.drop_column("claimant")
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("lifecycle_effects", "claimed_by", existing_type=sa.String(200),
                    comment=None)
    op.alter_column("lifecycle_effects", "lease_until", existing_type=sa.DateTime(timezone=True),
                    comment=None)
