"""The job's throughput profile: (nodes, replicas, m, s) → typical T_iter and T_grad.

Rows survive restarts (they are part of the checkpoint), so a job that has run at 1, 2 and 4
replicas fits θ_sys on all of them, as the PolluxAgent does (seed 000 §4.1).

A row's time is the **lower quartile of its last** ``RECENT`` steps, not the mean of all of
them (issue 19). A few slow steps (the first fit importing SciPy on a background thread holds
the GIL, a garbage collection) made the first batch size's mean 2.5x its typical step, the fit
read "the fixed cost is everything" and the job jumped to 16x its batch, measured that as slow
and fell back. On a loaded machine (load 8-10 on 2 cores) the other processes' time slices
land more often in long steps than in short ones, so even the median made a larger batch look
per-sample dearer than it is; once the job had shrunk back, that stale row kept it small for
good. The lower quartile is what a step costs when it is not interrupted, for every row alike.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from coadapt.goodput import Observations

Key = tuple[int, int, int, int]  # (nodes, replicas, local_bsz, accum_steps)
#: Steps per row whose lower quartile is the row's time (older ones only count in the totals).
RECENT = 32
#: The quantile of the recent steps taken as the row's time.
QUANTILE = 25.0
#: Fewer recent steps than this: the row's time is the mean of all its steps.
MIN_RECENT = 3


class Profile:
    """Running sums of iteration and micro-batch times per configuration."""

    def __init__(self) -> None:
        self.rows: dict[Key, list[float]] = {}  # [n_iter, sum_iter, n_grad, sum_grad]
        # the last RECENT iteration and micro-batch times of each row
        self._recent: dict[Key, tuple[deque[float], deque[float]]] = {}
        # (key, 0 = iteration / 1 = micro-batch) -> typical time, until the row records again:
        # a re-tune reads every row several times (fit, agent, metrics), and at a sub-ms step
        # np.percentile made half of its cost, which RETUNE_BUDGET turns into steps between
        # re-tunes (issue 19).
        self._typical_cache: dict[tuple[Key, int], float] = {}

    def _row(self, key: Key) -> list[float]:
        if key not in self._recent:
            self._recent[key] = (deque(maxlen=RECENT), deque(maxlen=RECENT))
        return self.rows.setdefault(key, [0.0, 0.0, 0.0, 0.0])

    def record_iter(self, key: Key, seconds: float) -> None:
        row = self._row(key)
        row[0] += 1
        row[1] += seconds
        self._recent[key][0].append(seconds)
        self._typical_cache.pop((key, 0), None)

    def record_grad(self, key: Key, seconds: float) -> None:
        row = self._row(key)
        row[2] += 1
        row[3] += seconds
        self._recent[key][1].append(seconds)
        self._typical_cache.pop((key, 1), None)

    def iter_time(self, key: Key) -> float:
        """The row's typical seconds per optimizer step (NaN when it has none)."""
        return self._typical(key, 0)

    def grad_time(self, key: Key) -> float:
        """The row's typical seconds per micro-batch pass (NaN when it has none)."""
        return self._typical(key, 1)

    def _typical(self, key: Key, which: int) -> float:
        cached = self._typical_cache.get((key, which))
        if cached is not None:
            return cached
        row = self.rows.get(key)
        if row is None or row[2 * which] <= 0:
            return float("nan")
        recent = self._recent.get(key, ((), ()))[which]
        if len(recent) >= MIN_RECENT:
            value = _quantile(sorted(recent), QUANTILE / 100.0)
        else:
            value = row[2 * which + 1] / row[2 * which]
        self._typical_cache[(key, which)] = value
        return value

    def observations(self) -> Observations | None:
        """The rows with at least one timed step or micro-batch, as :class:`Observations`
        (None until some optimizer step is timed). A row with micro-batch times only (the
        halves of split measuring steps) has a NaN ``iter_time``."""
        keys = [k for k, r in self.rows.items() if r[0] > 0 or r[2] > 0]
        if not any(self.rows[k][0] > 0 for k in keys):
            return None
        arr = np.array(keys, dtype=np.float64)
        it = np.array([self.iter_time(k) for k in keys])
        gt = np.array([self.grad_time(k) for k in keys])
        return Observations.build(
            arr[:, 0], arr[:, 1], arr[:, 2], it, accum_steps=arr[:, 3], grad_time=gt
        )

    def table(self) -> list[dict[str, float]]:
        """Rows with timed steps as plain dictionaries (for the metrics channel: the
        controller fits θ_sys on whole steps; micro-batch-only rows stay in the job)."""
        out = []
        for (n, k, m, s), r in self.rows.items():
            if r[0] <= 0:
                continue
            out.append(
                {
                    "nodes": n,
                    "replicas": k,
                    "local_bsz": m,
                    "accum_steps": s,
                    "iter_time": self.iter_time((n, k, m, s)),
                    "grad_time": self.grad_time((n, k, m, s)),
                    "count": r[0],
                }
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": [[*k, *v] for k, v in self.rows.items()],
            "recent": [[*k, list(it), list(gt)] for k, (it, gt) in self._recent.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = {
            (int(r[0]), int(r[1]), int(r[2]), int(r[3])): [float(x) for x in r[4:8]]
            for r in state["rows"]
        }
        self._recent = {}
        self._typical_cache = {}
        for r in state.get("recent", []):  # absent in checkpoints from before issue 19
            key = (int(r[0]), int(r[1]), int(r[2]), int(r[3]))
            self._recent[key] = (
                deque((float(x) for x in r[4]), maxlen=RECENT),
                deque((float(x) for x in r[5]), maxlen=RECENT),
            )


def _quantile(ordered: list[float], q: float) -> float:
    """``np.percentile``'s default (linear) quantile of a sorted list, in plain Python: for
    the ≤ ``RECENT`` values of a row it is ~20x cheaper than building an array."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])
