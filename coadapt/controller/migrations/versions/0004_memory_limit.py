"""Out-of-memory co-adaptation: a job's learned per-replica batch cap, a replica's OOM flag.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

``jobs.memory_limit`` holds what the controller learned when a replica ran out of memory
(``{"max_local_bsz", "oom_local_bsz", "ooms"}``); ``replicas.oom`` says a replica ended for
lack of memory (the OOM killer, or the library's OOM exit code). Existing rows: no limit, no OOM.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("memory_limit", sa.JSON(), nullable=True))
    op.add_column(
        "replicas", sa.Column("oom", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("oom")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("memory_limit")
