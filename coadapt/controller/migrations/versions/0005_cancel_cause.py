"""Why a job was cancelled, as a column instead of a prefix of its human-readable reason.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

``jobs.cancel_cause`` holds a :class:`coadapt.protocol.CancelCause` value. The tuning loop
used to mark the jobs it cancelled only by a ``tune: <why>`` prefix of ``jobs.reason`` (and
read it back after a crash); existing CANCELLED rows get the cause those prefixes meant, so a
controller upgraded mid-experiment still settles their trials the same way.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen copy of coadapt.protocol.LEGACY_REASON_PREFIXES (a migration must not change when the
# code does): cause -> the reason prefix the tuning loop wrote before this revision.
_LEGACY = {
    "tune-pruned": "tune: pruned",
    "tune-preempted": "tune: preempted",
    "tune-dead": "tune: dead",
    "tune-ended": "tune: experiment ended",
}


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cancel_cause", sa.String(32), nullable=True))
    jobs = sa.table(
        "jobs",
        sa.column("state", sa.String),
        sa.column("reason", sa.Text),
        sa.column("cancel_cause", sa.String),
    )
    for cause, prefix in _LEGACY.items():
        op.execute(
            jobs.update()
            .where(jobs.c.state == "CANCELLED", jobs.c.reason.like(prefix + "%"))
            .values(cancel_cause=cause)
        )
    op.execute(
        jobs.update()
        .where(
            jobs.c.state == "CANCELLED",
            jobs.c.cancel_cause.is_(None),
            jobs.c.reason.like("cancelled by %"),
        )
        .values(cancel_cause="user")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancel_cause")
