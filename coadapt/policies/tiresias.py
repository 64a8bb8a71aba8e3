"""Tiresias (NSDI'19) as configured in the Pollux artifact: discretised 2D-LAS, 2 queues.

Jobs run with the GPUs and batch they were submitted with (:attr:`BatchMode.FIXED`). A job's
priority is its attained service, executed time × requested GPUs: below ``threshold`` it sits
in the high-priority queue 0, above it is demoted to the end of queue 1. Within a queue jobs
are FIFO. Each round jobs are admitted greedily in queue order while their GPUs fit (smaller
later jobs may pass a blocked one); admitted jobs keep their placement, newly admitted ones
are placed on the nodes with most free GPUs, and jobs no longer admitted are preempted.

The queues and executed-time counters, measured in whole seconds of the snapshot clock as the
reference implementation does, live in the policy state, so a controller restart keeps them.
Within a queue, a job of higher ``JobInfo.priority`` goes first (FIFO among equals).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coadapt.policies.base import BatchMode, ClusterSnapshot, Decision, PolicyState
from coadapt.policies.greedy import by_priority, free_gpus, place_one_type, requested_gpus

#: Queue-0 threshold: 16 GPU-hours of attained service, in GPU-seconds.
DEFAULT_THRESHOLD = 16 * 3600


@dataclass
class TiresiasPolicy:
    """Two-queue discretised 2D-LAS (see the module docstring).

    State (JSON): ``queues`` (two lists of job names), ``running`` (names admitted last round),
    ``executed`` (whole seconds admitted) and ``last_check`` (the clock of each job's last
    accounting), all of which a controller restart must keep.
    """

    threshold: float = DEFAULT_THRESHOLD
    name: str = "tiresias"
    batch_mode: BatchMode = BatchMode.FIXED

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        del rng  # deterministic
        now = int(snapshot.now)
        jobs = snapshot.jobs
        queues = state.get("queues") or [[], []]
        q0 = [k for k in queues[0] if k in jobs]
        q1 = [k for k in queues[1] if k in jobs]
        known = set(q0) | set(q1)
        running = {k for k in state.get("running", []) if k in jobs}
        executed = {k: int(v) for k, v in state.get("executed", {}).items() if k in jobs}
        last_check = {k: int(v) for k, v in state.get("last_check", {}).items() if k in jobs}
        requested = {k: requested_gpus(j) for k, j in jobs.items()}
        # A running job keeps its GPUs only if they are the ones it asked for.
        allocations = {
            k: a for k, a in snapshot.current.items() if k in jobs and sum(a) == requested[k]
        }
        for key in jobs:
            if key not in known:
                q0.append(key)
        # Account the time since the last round and demote jobs past the threshold.
        for key in jobs:
            if key in running:
                since = now - last_check.get(key, 0)
                executed[key] = executed.get(key, 0) + since
                gpus = requested[key] or 0
                if key in q0 and executed[key] * gpus >= self.threshold:
                    q0.remove(key)
                    q1.append(key)
            last_check[key] = now
        # Admit greedily in queue order (higher job priority first within a queue).
        budget = snapshot.total_gpus
        order = [*by_priority(q0, jobs), *by_priority(q1, jobs)]
        running = set()
        for key in order:
            want = requested[key]
            if want is not None and want <= budget:
                running.add(key)
                budget -= want
            else:
                allocations.pop(key, None)
        free = free_gpus(snapshot, allocations)
        node_types = [n.gpu_type for n in snapshot.nodes]
        for key in order:
            want = requested[key]
            if key in running and key not in allocations and want:
                alloc = place_one_type(free, want, node_types)
                if alloc is None:  # several GPU types, none with room for it alone
                    running.discard(key)
                else:
                    allocations[key] = alloc
        if len(set(node_types)) > 1:  # backfill what the type boundaries left free
            for key in order:
                want = requested[key]
                if key not in running and want:
                    alloc = place_one_type(free, want, node_types)
                    if alloc is not None:
                        running.add(key)
                        allocations[key] = alloc
        new_state: PolicyState = {
            "queues": [q0, q1],
            "running": [k for k in order if k in running],
            "executed": executed,
            "last_check": last_check,
        }
        return Decision(
            allocations, new_state, {"queue0": float(len(q0)), "queue1": float(len(q1))}
        )
