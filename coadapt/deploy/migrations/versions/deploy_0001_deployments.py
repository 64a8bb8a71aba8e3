"""The deploy branch starts: deployments and their serving replicas.

Revision ID: deploy_0001
Revises: (none: the base of branch ``deploy``)
Depends on: 0001 (``deploy_deployments.tenant_id`` references the controller's ``tenants``)
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "deploy_0001"
down_revision = None
branch_labels = ("deploy",)
depends_on = "0001"


def upgrade() -> None:
    op.create_table(
        "deploy_deployments",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("active_name", sa.String(40), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("model_root", sa.Text(), nullable=False),
        sa.Column("gateway_port", sa.Integer(), nullable=False),
        sa.Column("gateway_pid", sa.Integer(), nullable=True),
        sa.Column("gateway_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("gateway_run_dir", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("tenant_id", "active_name", name="uq_deploy_deployments_active_name"),
    )
    op.create_index("ix_deploy_deployments_tenant_id", "deploy_deployments", ["tenant_id"])
    op.create_index("ix_deploy_deployments_state", "deploy_deployments", ["state"])
    op.create_table(
        "deploy_replicas",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "deployment_id",
            sa.Integer(),
            sa.ForeignKey("deploy_deployments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ready_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_deploy_replicas_deployment_id", "deploy_replicas", ["deployment_id"])
    op.create_index("ix_deploy_replicas_status", "deploy_replicas", ["status"])


def downgrade() -> None:
    op.drop_table("deploy_replicas")
    op.drop_table("deploy_deployments")
