"""Optimus (EuroSys'18) with an oracle throughput model, as in the Pollux artifact.

Jobs keep their submitted batch (:attr:`BatchMode.FIXED_BATCH`); the policy picks GPU counts.
Every job gets one GPU (its ``min_replicas`` if more; higher ``JobInfo.priority`` first when
they are scarce), then GPUs go one at a time to the job
whose predicted remaining time drops most, ``(step_time(k) - step_time(k + 1)) * remaining``,
up to each job's ``max_replicas``. Jobs whose count did not change keep their placement; the
others are placed, fewest GPUs first, on the nodes with most free GPUs. The simulator supplies
``step_time`` from the traces (the "oracle"); a live controller would supply a fitted model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coadapt.policies.base import (
    BatchMode,
    ClusterSnapshot,
    Decision,
    JobInfo,
    PolicyError,
    PolicyState,
)
from coadapt.policies.greedy import free_gpus, place_greedy


def _gain(job: JobInfo, replicas: int) -> float:
    """Predicted seconds saved by giving ``job`` one more GPU than ``replicas``."""
    assert job.step_time is not None  # checked in optimize
    remaining = job.remaining_iterations if job.remaining_iterations is not None else 1.0
    return (job.step_time(replicas) - job.step_time(replicas + 1)) * remaining


@dataclass
class OptimusPolicy:
    """Greedy marginal-gain GPU allocation (see the module docstring)."""

    name: str = "optimus"
    batch_mode: BatchMode = BatchMode.FIXED_BATCH

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del state, rng  # stateless, deterministic
        jobs = snapshot.jobs
        for key, job in jobs.items():
            if job.step_time is None:
                raise PolicyError(f"optimus needs a step_time model for job {key!r}")
        budget = snapshot.total_gpus
        replicas: dict[str, int] = {}
        gain: dict[str, float] = {}
        start = {k: max(1, j.min_replicas) for k, j in jobs.items()}
        # First GPUs: higher priority first, then smaller minimum (stable: submission order).
        for key in sorted(jobs, key=lambda k: (-jobs[k].priority, start[k])):
            job = jobs[key]
            if start[key] > budget or start[key] > job.max_replicas:
                replicas[key], gain[key] = 0, 0.0
                continue
            replicas[key] = start[key]
            budget -= start[key]
            can_grow = replicas[key] + 1 <= job.max_replicas and budget >= 1
            gain[key] = _gain(job, replicas[key]) if can_grow else 0.0
        while budget > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=gain.__getitem__)  # first of equals: submission order
            job = jobs[key]
            replicas[key] += 1
            can_grow = replicas[key] + 1 <= job.max_replicas and budget >= 1
            gain[key] = _gain(job, replicas[key]) if can_grow else 0.0
            budget -= 1
        allocations = {
            k: a
            for k, a in snapshot.current.items()
            if k in jobs and any(a) and sum(a) == replicas[k]
        }
        free = free_gpus(snapshot, allocations)
        for key in sorted(jobs, key=replicas.__getitem__):
            if replicas[key] > 0 and key not in allocations:
                allocations[key] = place_greedy(free, replicas[key])
        return Decision(allocations)
