"""Summaries of a simulation: JCT statistics, makespan, restarts, GPU time, utilisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from coadapt.sim.engine import JobRecord, SimResult


@dataclass(frozen=True)
class PolicySummary:
    """The numbers one policy scored on one workload (times in seconds)."""

    policy: str
    workload: str
    cluster: str
    num_jobs: int
    completed: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    makespan_s: float  # latest completion time, as the artifact's plots compute it
    restarts: int
    gpu_hours: float
    avg_queue_s: float  # mean time from submission to first allocation
    sim_wall_s: float  # measured by the caller, outside the simulation
    utilisation: tuple[tuple[float, float], ...]
    jobs: tuple[JobRecord, ...]
    # Busy GPU-seconds / capacity over the run (a GPU shared by a packed pair counts once).
    gpu_util: float = float("nan")
    effective_util: float = float("nan")  # isolated-equivalent GPU work / capacity

    def jcts(self) -> list[float]:
        return [j.jct for j in self.jobs if j.jct is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "workload": self.workload,
            "cluster": self.cluster,
            "num_jobs": self.num_jobs,
            "completed": self.completed,
            "avg_jct_s": self.avg_jct_s,
            "p50_jct_s": self.p50_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "makespan_s": self.makespan_s,
            "restarts": self.restarts,
            "gpu_hours": self.gpu_hours,
            "avg_queue_s": self.avg_queue_s,
            "sim_wall_s": self.sim_wall_s,
            "gpu_util": self.gpu_util,
            "effective_util": self.effective_util,
            "utilisation": [[t, u] for t, u in self.utilisation],
            "jobs": [
                {
                    "name": j.name,
                    "application": j.application,
                    "submit_s": j.submit_time,
                    "completion_s": j.completion_time,
                    "jct_s": j.jct,
                    "queue_s": j.queueing_delay,
                    "restarts": j.restarts,
                    "gpu_hours": j.gpu_seconds / 3600.0,
                }
                for j in self.jobs
            ],
        }


def _stat(values: list[float], fn: str, q: float = 50.0) -> float:
    if not values:
        return float("nan")
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()) if fn == "mean" else float(np.percentile(arr, q))


def summarise(result: SimResult, sim_wall_s: float = 0.0) -> PolicySummary:
    """Reduce a :class:`SimResult` to its headline numbers."""
    jcts = [j.jct for j in result.jobs if j.jct is not None]
    done = [j.completion_time for j in result.jobs if j.completion_time is not None]
    queue = [j.queueing_delay for j in result.jobs if j.queueing_delay is not None]
    return PolicySummary(
        policy=result.policy,
        workload=result.workload,
        cluster=result.cluster,
        num_jobs=len(result.jobs),
        completed=len(done),
        avg_jct_s=_stat(jcts, "mean"),
        p50_jct_s=_stat(jcts, "pct", 50.0),
        p99_jct_s=_stat(jcts, "pct", 99.0),
        makespan_s=max(done) if done else float("nan"),
        restarts=sum(j.restarts for j in result.jobs),
        gpu_hours=sum(j.gpu_seconds for j in result.jobs) / 3600.0,
        avg_queue_s=_stat(queue, "mean"),
        sim_wall_s=sim_wall_s,
        utilisation=result.utilisation,
        jobs=result.jobs,
        # Each round's fraction holds for one scheduling interval, so the mean is the share of
        # GPU-seconds that were busy.
        gpu_util=_stat([u for _, u in result.utilisation], "mean"),
        effective_util=_stat(list(result.effective_utilisation), "mean"),
    )
