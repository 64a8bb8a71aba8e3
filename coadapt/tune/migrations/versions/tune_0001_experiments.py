"""Tuning's branch starts: experiments and their trials (``coadapt.tune``).

Revision ID: tune_0001
Revises: (none: the base of branch ``tune``)
Depends on: 0001 (``tune_experiments.tenant_id`` references the controller's ``tenants``)
Create Date: 2026-11-24

Tables are prefixed ``tune_`` because Optuna's RDBStorage keeps its own ``studies`` and
``trials`` tables in the same database (one study per experiment).

Databases made before tuning had its own branch already hold these tables: the controller's
former revision 0003 created them, with exactly this schema. Such a database is stamped with
a controller revision only, so Alembic runs this revision on it; the tables (and their rows)
are then adopted as they are instead of created a second time.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "tune_0001"
down_revision = None
branch_labels = ("tune",)
depends_on = "0001"


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("tune_experiments"):
        return  # created by the controller's chain before the split (old revision 0003)
    op.create_table(
        "tune_experiments",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("target_reached_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("policy_state", sa.JSON(), nullable=True),
        sa.Column("best_history", sa.JSON(), nullable=True),
    )
    op.create_index("ix_tune_experiments_tenant_id", "tune_experiments", ["tenant_id"])
    op.create_index("ix_tune_experiments_state", "tune_experiments", ["state"])
    op.create_table(
        "tune_trials",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "experiment_id", sa.String(40), sa.ForeignKey("tune_experiments.id"), nullable=False
        ),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("curve", sa.JSON(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("last_progress_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.UniqueConstraint("experiment_id", "number", name="uq_tune_trials_number"),
    )
    op.create_index("ix_tune_trials_experiment_id", "tune_trials", ["experiment_id"])
    op.create_index("ix_tune_trials_state", "tune_trials", ["state"])
    op.create_index("ix_tune_trials_job_id", "tune_trials", ["job_id"])


def downgrade() -> None:
    op.drop_table("tune_trials")
    op.drop_table("tune_experiments")
