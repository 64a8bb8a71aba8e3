"""Did co-adaptation pay? The job's training time so far vs the user's fixed batch (issue 19).

A job that lets coadapt choose its batch trains with batch M_t at noise scale φ_t. From its
progress history and its fitted goodput model this computes, for the progress it has made,
how long the **user's initial batch M0, fixed**, on the same replicas, would have needed:

* each interval between two progress records of one allocation did Δsteps · M_t samples,
  worth Δsteps · M_t · EFFICIENCY_t(M_t) samples at batch M0 (eq. 7, with the φ_t the job
  reported then), i.e. that many / M0 steps at M0;
* a step at M0 on K replicas takes T_iter(K, M0/K, 0) by the job's θ_sys (eq. 12).

Both sides are read off the same model, so its errors largely cancel: ``fixed_model_s`` is
the model's time at M0, ``adaptive_model_s`` the model's time for the steps the job really
took, and ``speedup`` their ratio; ``elapsed_s`` is the wall time of the same intervals, for
reference (it includes what the model does not see: data loading, evaluation, load). Intervals
that span a restart are left out on both sides: a rescale is not a batch-size choice.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from coadapt.goodput import PerfParams, iter_time

#: Series the computation reads (``coadapt/<name>`` rows of one progress record).
NEEDED = ("step", "batch_size", "replicas")


def _records(rows: Sequence[Any], prefix: str) -> list[tuple[float, int, dict[str, float]]]:
    """(time, step, {series: value}) per progress record, oldest first."""
    by_record: dict[tuple[float, int], dict[str, float]] = {}
    for r in rows:
        if r.step is None or r.value is None or not r.name.startswith(prefix):
            continue
        by_record.setdefault((r.time, r.step), {})[r.name[len(prefix) :]] = float(r.value)
    return sorted((t, step, v) for (t, step), v in by_record.items() if all(k in v for k in NEEDED))


def efficiency(pgns: float | None, init_batch: float, batch: float) -> float:
    """EFFICIENCY(M) = (φ + M0) / (φ + M) (eq. 7); 1 where φ is unknown or not finite."""
    if pgns is None or not math.isfinite(pgns) or pgns < 0:
        return 1.0
    return (pgns + init_batch) / (pgns + batch)


def tta_view(
    rows: Sequence[Any],
    alloc_times: Sequence[float],
    perf: PerfParams | None,
    init_batch: int | None,
    nodes_at: Callable[[float], int],
    prefix: str = "coadapt/",
) -> dict[str, Any] | None:
    """The job's time so far vs the fixed initial batch's (None without a model or M0).

    ``rows`` are the job's metric rows (``time``, ``step``, ``name``, ``value``), ``alloc_times``
    the times its allocation changed (a restart), ``nodes_at(t)`` the nodes it held at t.
    Returns the totals and ``points``: [time, adaptive_model_s, fixed_model_s, elapsed_s]
    cumulated at every progress record, for a chart.
    """
    if perf is None or not init_batch or init_batch < 1:
        return None
    records = _records(rows, prefix)
    adaptive = fixed = elapsed = 0.0
    equivalent = 0.0  # M0-equivalent samples so far
    points: list[list[float]] = []
    for (t0, s0, v0), (t1, s1, v1) in itertools.pairwise(records):
        k = int(v1["replicas"])
        if s1 <= s0 or t1 <= t0 or k < 1 or int(v0["replicas"]) != k:
            continue
        if any(t0 < a <= t1 for a in alloc_times):
            continue
        steps = s1 - s0
        batch = v1["batch_size"]
        m = max(int(v1.get("local_bsz", 0)) or math.ceil(batch / k), 1)
        acc = int(v1.get("accum_steps", 0))
        n = nodes_at(t1)
        done = steps * batch * efficiency(v1.get("pgns"), init_batch, batch)
        equivalent += done
        adaptive += steps * float(iter_time(perf, n, k, m, acc))
        m0 = max(math.ceil(init_batch / k), 1)
        fixed += done / init_batch * float(iter_time(perf, n, k, m0, 0))
        elapsed += t1 - t0
        points.append([t1, adaptive, fixed, elapsed])
    if not points:
        return None
    return {
        "init_batch": init_batch,
        "adaptive_model_s": adaptive,
        "fixed_model_s": fixed,
        "elapsed_s": elapsed,
        "equivalent_samples": equivalent,
        "speedup": fixed / adaptive if adaptive > 0 else None,
        "points": points,
    }
