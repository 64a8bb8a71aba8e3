"""Formerly the tuning tables; now an empty step of the controller's chain.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 (emptied 2026-11-24)

The ``tune_*`` tables moved to tuning's own branch (``coadapt/tune/migrations``, revision
``tune_0001``), so the controller's chain holds no tuning schema. This revision stays, empty,
because databases are stamped with it (or with 0004/0005 after it): Alembic must still find
it in the chain. On such a database ``tune_0001`` adopts the tables this revision created.
"""

from __future__ import annotations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
