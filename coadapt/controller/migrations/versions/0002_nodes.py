"""Multi-node clusters: which node a replica runs on, and the per-node allocation of a job.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

``replicas.node`` defaults to ``local`` so rows written by a single-node controller stay
valid; ``jobs.allocation`` (what the current attempt holds) and ``jobs.desired_allocation``
(the policy's latest choice) map node name to replica count, and are NULL on old rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("node", sa.String(128), nullable=False, server_default="local"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("allocation", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("desired_allocation", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("desired_allocation")
        batch.drop_column("allocation")
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("node")
