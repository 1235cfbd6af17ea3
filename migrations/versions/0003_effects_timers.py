"""effects and timers: the transactional outbox and durable timeouts

Revision ID: 0003_effects_timers
Revises: 0002_observations
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import Document, Id, UtcDateTime

revision: str = "0003_effects_timers"
down_revision: str | None = "0002_observations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lifecycle_effects",
        sa.Column("id", Id, autoincrement=True, nullable=False,
                  comment="per resource, the order effects run in"),
        sa.Column("resource_id", Id, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False,
                  comment="the journal row that asked for it"),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("args", Document(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False,
                  comment="pending, running, done, failed"),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=False),
        sa.Column("last_error", sa.Text()),
        sa.Column("idempotency_key", sa.String(400), nullable=False),
        sa.Column("fence", Document()),
        sa.Column("on_failure", sa.String(200), comment="trigger fired when it fails for good"),
        sa.Column("progress", Document(), comment="what the handler saved across attempts"),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("lease_until", UtcDateTime()),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime()),
        sa.ForeignKeyConstraint(["resource_id"], ["lifecycle_resources.id"],
                                name="fk_lifecycle_effects_resource_id_lifecycle_resources",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_lifecycle_effects"),
        sa.UniqueConstraint("idempotency_key", name="uq_lifecycle_effects_idempotency_key"),
        comment="the transactional outbox: side effects of committed transitions",
    )
    op.create_index("ix_lifecycle_effects_status_next_attempt_at", "lifecycle_effects",
                    ["status", "next_attempt_at"])
    op.create_index("ix_lifecycle_effects_resource_id_status", "lifecycle_effects",
                    ["resource_id", "status"])
    op.create_table(
        "lifecycle_timers",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("resource_id", Id, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False,
                  comment="the journal row that entered the state"),
        sa.Column("state", sa.String(200), nullable=False),
        sa.Column("trigger", sa.String(200), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False,
                  comment="pending, fired, refused, cancelled"),
        sa.Column("outcome", sa.Text()),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime()),
        sa.ForeignKeyConstraint(["resource_id"], ["lifecycle_resources.id"],
                                name="fk_lifecycle_timers_resource_id_lifecycle_resources",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_lifecycle_timers"),
        comment="timeouts of states: fired only while the resource is in the visit that set "
                "them",
    )
    op.create_index("ix_lifecycle_timers_status_due_at", "lifecycle_timers",
                    ["status", "due_at"])
    op.create_index("ix_lifecycle_timers_resource_id_status", "lifecycle_timers",
                    ["resource_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_lifecycle_timers_resource_id_status", table_name="lifecycle_timers")
    op.drop_index("ix_lifecycle_timers_status_due_at", table_name="lifecycle_timers")
    op.drop_table("lifecycle_timers")
    op.drop_index("ix_lifecycle_effects_resource_id_status", table_name="lifecycle_effects")
    op.drop_index("ix_lifecycle_effects_status_next_attempt_at", table_name="lifecycle_effects")
    op.drop_table("lifecycle_effects")
