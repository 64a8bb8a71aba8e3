"""First-in-first-out with the submitted configuration and no preemption.

The simplest baseline: jobs start in submission order with the GPUs they asked for, placed on
the nodes with most free GPUs, and run to completion. A job that does not fit blocks every
later job (no backfilling), which is what makes FIFO a lower bound worth comparing to. A job
of higher ``JobInfo.priority`` is first in line whatever its submission time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coadapt.policies.base import BatchMode, ClusterSnapshot, Decision, PolicyState
from coadapt.policies.greedy import free_gpus, place_greedy, requested_gpus


@dataclass
class FifoPolicy:
    """Strict FIFO admission (see the module docstring)."""

    name: str = "fifo"
    batch_mode: BatchMode = BatchMode.FIXED

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del state, rng  # stateless, deterministic
        jobs = snapshot.jobs
        requested = {k: requested_gpus(j) for k, j in jobs.items()}
        allocations = {
            k: a for k, a in snapshot.current.items() if k in jobs and sum(a) == requested[k]
        }
        free = free_gpus(snapshot, allocations)
        # Higher priority first, then submission time (stable: snapshot order).
        for key in sorted(jobs, key=lambda k: (-jobs[k].priority, jobs[k].submit_time)):
            if key in allocations:
                continue
            need = requested[key]
            if need is None:
                continue  # can never run at its requested size; do not block the queue
            if need > sum(free):
                break  # head-of-line blocking: nobody overtakes the oldest waiting job
            allocations[key] = place_greedy(free, need)
        return Decision(allocations)
