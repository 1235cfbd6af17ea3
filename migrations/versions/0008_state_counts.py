"""state counts: how many resources each machine has in each state, as rows appended by
triggers in the writing transaction and folded by the reader, so that counting does not
scan the resources and no counter row is a lock every writer waits on

Revision ID: 0008_state_counts
Revises: 0007_queue_heads
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import COUNT_TRIGGERS, COUNTS_SEED

revision: str = "0008_state_counts"
down_revision: str | None = "0007_queue_heads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "lifecycle_state_counts"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("machine", sa.String(200), nullable=False),
        sa.Column("state", sa.String(200), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False,
                  comment="resources gained (or, negative, lost)"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        comment="how many resources each machine has in each state, as rows to add up: "
                "triggers on lifecycle_resources append +1 and -1 in the writing "
                "transaction, and reading the counts folds them now and then (no row every "
                "writer updates)",
    )
    op.execute(COUNTS_SEED)
    for statement in COUNT_TRIGGERS[op.get_bind().dialect.name][0]:
        op.execute(statement)


def downgrade() -> None:
    for statement in COUNT_TRIGGERS[op.get_bind().dialect.name][1]:
        op.execute(statement)
    op.drop_table(TABLE)
