"""job queue: the table the job_exit machine's queue update writes

The table is the job_exit machine's, and later revisions of it are that machine's branch
(``lifecycle/machines/_migrations/job_exit/``), whose base adopts the table this revision
made. This revision keeps its id and its upgrade: a database already past it never runs it
again, and a database upgraded without the machine's branch keeps a job queue.

Revision ID: 0004_job_queue
Revises: 0003_effects_timers
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import Document, UtcDateTime

revision: str = "0004_job_queue"
down_revision: str | None = "0003_effects_timers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lifecycle_job_queue",
        sa.Column("cluster", sa.Integer(), nullable=False),
        sa.Column("proc", sa.Integer(), nullable=False),
        sa.Column("ad", Document(), nullable=False,
                  comment="the job's ClassAd: attribute -> value"),
        sa.Column("job_status", sa.Integer(), nullable=False,
                  comment="JobStatus: 1 Idle, 2 Running, 3 Removed, 4 Completed, 5 Held, ..."),
        sa.Column("updates", sa.Integer(), nullable=False,
                  comment="how many times the job's completion was recorded"),
        sa.Column("submitted_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime()),
        sa.Column("updated_by", sa.String(400),
                  comment="idempotency key of the effect that recorded it"),
        sa.PrimaryKeyConstraint("cluster", "proc", name="pk_lifecycle_job_queue"),
        comment="the job queue the job_exit machine updates (step c): one row per job",
    )


def downgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("lifecycle_job_queue"):
        op.drop_table("lifecycle_job_queue")
