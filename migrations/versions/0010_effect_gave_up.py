"""effects: a status for an effect given up on (failed for good, its on_failure transition
asked for effects of its own), which no longer holds up the effects behind it

No row changes: an effect that failed for good before this revision stays failed (and keeps
its resource's queue until `lifecycle retry`).

Revision ID: 0010_effect_gave_up
Revises: 0009_dashboard_indexes
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_effect_gave_up"
down_revision: str | None = "0009_dashboard_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = "pending, running, done, failed"
AFTER = "pending, running, done, failed, gave_up"


def _comment(comment: str, was: str) -> None:
    with op.batch_alter_table("lifecycle_effects") as batch:
        batch.alter_column("status", existing_type=sa.String(16), existing_nullable=False,
                           comment=comment, existing_comment=was)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":  # SQLite keeps no comments
        _comment(AFTER, BEFORE)


def downgrade() -> None:
    # an effect given up on becomes done, the closed status the older code knows (as failed
    # it would hold up its queue again, and `retry` would run it once more after the
    # machine had gone another way); its last_error still says why it failed
    op.execute("UPDATE lifecycle_effects SET status = 'done' WHERE status = 'gave_up'")
    if op.get_context().dialect.name == "postgresql":
        _comment(BEFORE, AFTER)
