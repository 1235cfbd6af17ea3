"""job_exit's branch: its job queue, adopted where core revision 0004 made it

The job queue (``lifecycle_job_queue``) was the core's, made by core revision 0004, before
machines had branches of their own. Core 0004 still makes it, so every database at 0004 or
later has it, with its rows; this revision depends on 0004 and so only takes the table over
(the version table gains the branch's row). It creates the table where it is missing (a
database from which it was dropped by hand), never touches one that is there, and its
downgrade leaves it to core 0004, whose downgrade drops it.

Revision ID: job_exit_0001_queue
Revises: (base of the job_exit branch)
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from lifecycle.store.schema import Document, UtcDateTime

revision: str = "job_exit_0001_queue"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("job_exit",)
depends_on: str | Sequence[str] | None = "0004_job_queue"


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("lifecycle_job_queue"):
        return
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
    """The table stays: core revision 0004 made it and its downgrade drops it."""
