"""The job's throughput profile: (nodes, replicas, m, s) → mean T_iter and T_grad.

Rows survive restarts (they are part of the checkpoint), so a job that has run at 1, 2 and 4
replicas fits θ_sys on all of them, as the PolluxAgent does (seed 000 §4.1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coadapt.goodput import Observations

Key = tuple[int, int, int, int]  # (nodes, replicas, local_bsz, accum_steps)


class Profile:
    """Running sums of iteration and micro-batch times per configuration."""

    def __init__(self) -> None:
        self.rows: dict[Key, list[float]] = {}  # [n_iter, sum_iter, n_grad, sum_grad]

    def _row(self, key: Key) -> list[float]:
        return self.rows.setdefault(key, [0.0, 0.0, 0.0, 0.0])

    def record_iter(self, key: Key, seconds: float) -> None:
        row = self._row(key)
        row[0] += 1
        row[1] += seconds

    def record_grad(self, key: Key, seconds: float) -> None:
        row = self._row(key)
        row[2] += 1
        row[3] += seconds

    def observations(self) -> Observations | None:
        """The rows with at least one timed step, as :class:`Observations` (or None)."""
        keys = [k for k, r in self.rows.items() if r[0] > 0]
        if not keys:
            return None
        arr = np.array(keys, dtype=np.float64)
        it = np.array([self.rows[k][1] / self.rows[k][0] for k in keys])
        gt = np.array(
            [self.rows[k][3] / self.rows[k][2] if self.rows[k][2] > 0 else np.nan for k in keys]
        )
        return Observations.build(
            arr[:, 0], arr[:, 1], arr[:, 2], it, accum_steps=arr[:, 3], grad_time=gt
        )

    def table(self) -> list[dict[str, float]]:
        """Rows as plain dictionaries (for the metrics channel)."""
        out = []
        for (n, k, m, s), r in self.rows.items():
            out.append(
                {
                    "nodes": n,
                    "replicas": k,
                    "local_bsz": m,
                    "accum_steps": s,
                    "iter_time": r[1] / r[0] if r[0] else float("nan"),
                    "grad_time": r[3] / r[2] if r[2] else float("nan"),
                    "count": r[0],
                }
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [[*k, *v] for k, v in self.rows.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = {
            (int(r[0]), int(r[1]), int(r[2]), int(r[3])): [float(x) for x in r[4:8]]
            for r in state["rows"]
        }
