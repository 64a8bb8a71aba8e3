"""``/metrics`` series of sparse (parameter-server) jobs, read from what their workers report.

A sparse job's lead worker (:mod:`coadapt.sparse.online`) reports ``samples_per_s`` and, per
progress period, ``sparse/rows/shard<i>`` (rows each shard server holds), ``sparse/rows`` and
``sparse/pushed_bytes`` (push bytes on the wire since the worker started) as job metrics; the
store keeps the latest value of each in the job's report. These families expose them:

* ``coadapt_job_samples_per_s{job,tenant}`` — training throughput (any job that reports it);
* ``coadapt_sparse_rows{job,tenant,shard}`` — rows per shard server;
* ``coadapt_sparse_pushed_bytes{job,tenant}`` — push bytes sent.

Kept apart from :mod:`coadapt.controller.prom` so that module stays about the cluster.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.core import GaugeMetricFamily

__all__ = ["SPARSE_PREFIX", "add_sparse_samples", "sparse_families"]

SPARSE_PREFIX = "sparse/"
"""Equal to ``coadapt.sparse.client.SPARSE_METRIC_PREFIX`` (tested; not imported, so the
controller does not load numpy for a string)."""
_SHARD = SPARSE_PREFIX + "rows/shard"


def sparse_families() -> dict[str, GaugeMetricFamily]:
    labels = ["job", "tenant"]
    return {
        "job_samples_per_s": GaugeMetricFamily(
            "coadapt_job_samples_per_s",
            "The job's last reported training throughput (samples/s).",
            labels=labels,
        ),
        "sparse_rows": GaugeMetricFamily(
            "coadapt_sparse_rows",
            "Embedding rows held by each shard server of a sparse job.",
            labels=[*labels, "shard"],
        ),
        "sparse_pushed_bytes": GaugeMetricFamily(
            "coadapt_sparse_pushed_bytes",
            "Gradient push bytes a sparse job's lead worker sent since it (re)started.",
            labels=labels,
        ),
    }


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def add_sparse_samples(
    fams: dict[str, Any], metrics: dict[str, Any] | None, labels: list[str]
) -> None:
    """Add one job's samples (``metrics``: the latest value per reported metric name)."""
    metrics = metrics or {}
    rate = _num(metrics.get("samples_per_s"))
    if rate is not None:
        fams["job_samples_per_s"].add_metric(labels, rate)
    pushed = _num(metrics.get(SPARSE_PREFIX + "pushed_bytes"))
    if pushed is not None:
        fams["sparse_pushed_bytes"].add_metric(labels, pushed)
    shards = []
    for name, value in metrics.items():
        v = _num(value)
        digits = name[len(_SHARD) :] if isinstance(name, str) and name.startswith(_SHARD) else ""
        if digits.isdigit() and v is not None:
            shards.append((int(digits), v))
    for shard, v in sorted(shards):
        fams["sparse_rows"].add_metric([*labels, str(shard)], v)
