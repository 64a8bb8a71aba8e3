"""Tiresias (NSDI'19) as configured in the Pollux artifact: discretised 2D-LAS, 2 queues.

Jobs run with the GPUs and batch they were submitted with (:attr:`BatchMode.FIXED`). A job's
priority is its attained service, executed time × requested GPUs: below ``threshold`` it sits
in the high-priority queue 0, above it is demoted to the end of queue 1. Within a queue jobs
are FIFO. Each round jobs are admitted greedily in queue order while their GPUs fit (smaller
later jobs may pass a blocked one); admitted jobs keep their placement, newly admitted ones
are placed on the nodes with most free GPUs, and jobs no longer admitted are preempted.

The policy keeps its own queues and executed-time counters across rounds, measured in whole
seconds of the snapshot clock, as the reference implementation does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from coadapt.policies.base import Allocation, BatchMode, ClusterSnapshot
from coadapt.policies.greedy import free_gpus, place_greedy, requested_gpus

#: Queue-0 threshold: 16 GPU-hours of attained service, in GPU-seconds.
DEFAULT_THRESHOLD = 16 * 3600


class _Status(str, Enum):
    PENDING = "pending"
    RUNNING = "running"


@dataclass
class TiresiasPolicy:
    """Two-queue discretised 2D-LAS (see the module docstring)."""

    threshold: float = DEFAULT_THRESHOLD
    name: str = "tiresias"
    batch_mode: BatchMode = BatchMode.FIXED
    _queues: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    _status: dict[str, _Status] = field(default_factory=dict)
    _executed: dict[str, int] = field(default_factory=dict)  # seconds admitted
    _last_check: dict[str, int] = field(default_factory=dict)

    def optimize(
        self, snapshot: ClusterSnapshot, rng: np.random.Generator
    ) -> dict[str, Allocation]:
        del rng  # deterministic
        now = int(snapshot.now)
        jobs = snapshot.jobs
        q0, q1 = self._queues
        q0[:] = [k for k in q0 if k in jobs]
        q1[:] = [k for k in q1 if k in jobs]
        for table in (self._status, self._executed, self._last_check):
            for k in [k for k in table if k not in jobs]:
                del table[k]
        requested = {k: requested_gpus(j) for k, j in jobs.items()}
        # A running job keeps its GPUs only if they are the ones it asked for.
        allocations = {
            k: a for k, a in snapshot.current.items() if k in jobs and sum(a) == requested[k]
        }
        for key in jobs:
            if key not in self._status:
                self._status[key] = _Status.PENDING
                q0.append(key)
        # Account the time since the last round and demote jobs past the threshold.
        for key in jobs:
            if self._status[key] is _Status.RUNNING:
                since = now - self._last_check.get(key, 0)
                self._executed[key] = self._executed.get(key, 0) + since
                gpus = requested[key] or 0
                if key in q0 and self._executed[key] * gpus >= self.threshold:
                    q0.remove(key)
                    q1.append(key)
            self._last_check[key] = now
        # Admit greedily in queue order.
        budget = snapshot.total_gpus
        for key in (*q0, *q1):
            want = requested[key]
            if want is not None and want <= budget:
                self._status[key] = _Status.RUNNING
                budget -= want
            else:
                self._status[key] = _Status.PENDING
                allocations.pop(key, None)
        free = free_gpus(snapshot, allocations)
        for key in (*q0, *q1):
            want = requested[key]
            if self._status[key] is _Status.RUNNING and key not in allocations and want:
                allocations[key] = place_greedy(free, want)
        return allocations
