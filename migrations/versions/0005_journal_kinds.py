"""journal kinds: the comment names the data update rows Engine.update writes

Revision ID: 0005_journal_kinds
Revises: 0004_job_queue
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_journal_kinds"
down_revision: str | None = "0004_job_queue"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = "create, adopt, transition, refusal"
AFTER = "create, adopt, transition, refusal, update"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps no column comments: nothing to rebuild a table for
    op.alter_column("lifecycle_journal", "kind", existing_type=sa.String(16),
                    existing_nullable=False, comment=AFTER, existing_comment=BEFORE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("lifecycle_journal", "kind", existing_type=sa.String(16),
                    existing_nullable=False, comment=BEFORE, existing_comment=AFTER)
