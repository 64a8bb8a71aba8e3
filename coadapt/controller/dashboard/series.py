"""Time series of a job's system figures (batch size, LR scale, φ, goodput, step), for plots.

A job's ``progress`` and ``goodput`` records (:mod:`coadapt.protocol`) only replace the
latest values in ``jobs.report``; the dashboard needs their history. Each such record is also
written as rows of the ``metrics`` table under reserved names (``coadapt/batch_size``, ...), in one
transaction per record. User metrics (``kind="metric"``) keep their own names; the public
``GET /api/v1/jobs/{id}/metrics`` hides the reserved ones, so its contract is unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from coadapt.controller.store import Store
from coadapt.protocol import GoodputRecord, MetricRecord, ProgressRecord

PREFIX = "coadapt/"

#: record type -> (record field -> series name)
FIELDS: dict[type[MetricRecord], dict[str, str]] = {
    ProgressRecord: {
        "step": "step",
        "epoch": "epoch",
        "batch_size": "batch_size",
        "local_bsz": "local_bsz",
        "accum_steps": "accum_steps",
        "replicas": "replicas",
        "lr_scale": "lr_scale",
        "pgns": "pgns",
        "loss": "loss",
    },
    GoodputRecord: {"current_goodput": "goodput", "best_goodput": "best_goodput", "pgns": "pgns"},
}


def is_series(name: str) -> bool:
    """True for the reserved names this module writes (hidden from the public metrics list)."""
    return name.startswith(PREFIX)


def _value(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def record_series(store: Store, job_id: str, record: MetricRecord, now: float) -> None:
    """Append the plottable figures of one ingested record (no-op for other kinds)."""
    fields = FIELDS.get(type(record))
    if not fields:
        return
    step = getattr(record, "step", None)
    values = {PREFIX + name: _value(getattr(record, key)) for key, name in fields.items()}
    present = {name: value for name, value in values.items() if value is not None}
    if present:
        store.add_metrics(job_id, present, step, now)
