"""dashboard indexes: a machine's resources of one state in key order, the journal's risky
rows (fenced transitions, refusals) by edge, observations by source

Revision ID: 0009_dashboard_indexes
Revises: 0008_state_counts
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_dashboard_indexes"
down_revision: str | None = "0008_state_counts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FENCED_WHERE = "fence IS NOT NULL"  # as lifecycle.store.schema says
REFUSALS_WHERE = "kind = 'refusal'"
EDGE = ["spec_version", "trigger", "source", "dest"]


def upgrade() -> None:
    # (machine, state, key) serves every lookup (machine, state) served, and pages in order
    op.create_index("ix_lifecycle_resources_machine_state_key", "lifecycle_resources",
                    ["machine", "state", "key"])
    op.drop_index("ix_lifecycle_resources_machine_state", table_name="lifecycle_resources")
    op.create_index("ix_lifecycle_journal_fenced", "lifecycle_journal", EDGE,
                    sqlite_where=sa.text(FENCED_WHERE), postgresql_where=sa.text(FENCED_WHERE))
    op.create_index("ix_lifecycle_journal_refusals", "lifecycle_journal", [*EDGE, "at"],
                    sqlite_where=sa.text(REFUSALS_WHERE),
                    postgresql_where=sa.text(REFUSALS_WHERE))
    op.create_index("ix_lifecycle_observations_source", "lifecycle_observations", ["source"])


def downgrade() -> None:
    op.drop_index("ix_lifecycle_observations_source", table_name="lifecycle_observations")
    op.drop_index("ix_lifecycle_journal_refusals", table_name="lifecycle_journal")
    op.drop_index("ix_lifecycle_journal_fenced", table_name="lifecycle_journal")
    op.create_index("ix_lifecycle_resources_machine_state", "lifecycle_resources",
                    ["machine", "state"])
    op.drop_index("ix_lifecycle_resources_machine_state_key", table_name="lifecycle_resources")
