"""The dashboard's reads: functions over the :class:`~coadapt.controller.store.Store`.

The routes never open database sessions themselves; every read goes through
``Store.reading()`` (a deferred, read-only transaction that never takes SQLite's write lock,
database errors raised as :class:`~coadapt.controller.errors.StorageError`), like the API's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select

from coadapt.controller.models import MetricRow, ReplicaRow
from coadapt.controller.store import Store


@dataclass(frozen=True)
class Rep:
    """One replica row, as the cluster view needs it (``node`` is read tolerantly)."""

    job_id: str
    node: str
    slot: int
    rank: int
    attempt: int
    status: str
    started_at: float
    ended_at: float | None


def replica_rows(store: Store, since: float | None = None) -> list[Rep]:
    """Replica rows still holding a slot, or that ended after ``since`` (None: only live)."""
    q = select(ReplicaRow).order_by(ReplicaRow.id)
    if since is None:
        q = q.where(ReplicaRow.status.in_(("starting", "live")))
    else:
        q = q.where((ReplicaRow.ended_at.is_(None)) | (ReplicaRow.ended_at >= since))
    with store.reading() as s:
        return [
            Rep(
                r.job_id,
                str(getattr(r, "node", None) or "local"),
                r.slot,
                r.rank,
                r.attempt,
                r.status,
                r.started_at,
                r.ended_at,
            )
            for r in s.scalars(q)
        ]


def series_rows(
    store: Store,
    job_ids: Sequence[str],
    names: Iterable[str] | None = None,
    since: float | None = None,
) -> list[MetricRow]:
    """Metric rows of ``job_ids`` (optionally only ``names``, only after ``since``)."""
    if not job_ids:
        return []
    q = select(MetricRow).where(MetricRow.job_id.in_(list(job_ids))).order_by(MetricRow.id)
    if names is not None:
        q = q.where(MetricRow.name.in_(list(names)))
    if since is not None:
        q = q.where(MetricRow.time >= since)
    with store.reading() as s:
        rows = list(s.scalars(q))
        s.expunge_all()  # detached: the caller reads them after the transaction ends
        return rows
