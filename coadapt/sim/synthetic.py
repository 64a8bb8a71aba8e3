"""A generated workload of many one-GPU jobs, where GPU sharing (packing) can matter.

The artifact's workloads have few one-GPU jobs (only ncf, at a batch too large to share a
GPU), so :func:`packing_workload` draws jobs from the artifact's applications at small
batches instead: arrivals are Poisson, applications and batches are drawn from
:data:`PACKING_MIX`, all from one seeded generator, so the same arguments give the same jobs.
"""

from __future__ import annotations

import numpy as np

from coadapt.sim.errors import SimInputError
from coadapt.sim.workload import Workload, WorkloadJob

#: (application, total batch, weight): one-GPU configurations of the artifact's applications.
#: All but bert fit the sharing memory rule (batch <= half the largest traced per-GPU batch).
PACKING_MIX: tuple[tuple[str, int, float], ...] = (
    ("cifar10", 128, 0.3),
    ("ncf", 256, 0.3),
    ("deepspeech2", 20, 0.15),
    ("cifar10", 256, 0.15),
    ("bert", 12, 0.1),
)


def packing_workload(
    num_jobs: int = 96, hours: float = 4.0, seed: int = 0, name: str = "packing"
) -> Workload:
    """``num_jobs`` one-GPU jobs arriving over ``hours`` (Poisson), mixed per PACKING_MIX."""
    if num_jobs < 1:
        raise SimInputError(f"num_jobs: {num_jobs} is invalid; accepted: an integer >= 1")
    if not hours > 0:
        raise SimInputError(f"hours: {hours} is invalid; accepted: a number > 0")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(hours * 3600.0 / num_jobs, size=num_jobs)
    times = np.floor(np.cumsum(gaps) - gaps[0])
    weights = np.array([w for _, _, w in PACKING_MIX])
    picks = rng.choice(len(PACKING_MIX), size=num_jobs, p=weights / weights.sum())
    jobs = []
    for i, (t, k) in enumerate(zip(times, picks, strict=True)):
        app, batch, _ = PACKING_MIX[int(k)]
        jobs.append(WorkloadJob(f"{app}-{i}", float(t), app, 1, batch))
    return Workload(name, tuple(jobs))
