"""The registry's branch starts: models, their versions and the promotion history.

Revision ID: registry_0001
Revises: (none: the base of branch ``registry``)
Depends on: 0001 (``registry_models.tenant_id`` references the controller's ``tenants``)
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "registry_0001"
down_revision = None
branch_labels = ("registry",)
depends_on = "0001"


def upgrade() -> None:
    op.create_table(
        "registry_models",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("root", sa.Text(), nullable=False),
        sa.Column("gates", sa.JSON(), nullable=False),
        sa.Column("retention", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("synced_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("tenant_id", "name", name="uq_registry_models_name"),
    )
    op.create_index("ix_registry_models_tenant_id", "registry_models", ["tenant_id"])
    op.create_table(
        "registry_versions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "model_id",
            sa.Integer(),
            sa.ForeignKey("registry_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("parent", sa.String(32), nullable=True),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("data_offset", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("checks", sa.JSON(), nullable=True),
        sa.Column("validated_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("model_id", "version", name="uq_registry_versions"),
    )
    op.create_index("ix_registry_versions_model_id", "registry_versions", ["model_id"])
    op.create_index("ix_registry_versions_state", "registry_versions", ["state"])
    op.create_table(
        "registry_promotions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "model_id",
            sa.Integer(),
            sa.ForeignKey("registry_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("from_version", sa.String(32), nullable=True),
        sa.Column("to_version", sa.String(32), nullable=False),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_registry_promotions_model_id", "registry_promotions", ["model_id"])


def downgrade() -> None:
    op.drop_table("registry_promotions")
    op.drop_table("registry_versions")
    op.drop_table("registry_models")
