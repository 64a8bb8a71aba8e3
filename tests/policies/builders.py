"""Test-data builders for scheduling snapshots (like Kueue's MakeWorkload(...).Obj())."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.policies import Allocation, ClusterSnapshot, JobInfo, NodeInfo


def random_model(rng: np.random.Generator) -> tuple[GoodputModel, BatchLimits]:
    perf = PerfParams(
        alpha_grad=float(rng.uniform(0.01, 0.1)),
        beta_grad=float(rng.uniform(1e-4, 1e-3)),
        alpha_local=float(rng.uniform(0.01, 0.1)),
        beta_local=float(rng.uniform(0.0, 0.01)),
        alpha_node=float(rng.uniform(0.05, 0.5)),
        beta_node=float(rng.uniform(0.0, 0.05)),
        gamma=float(rng.uniform(1.0, 3.0)),
    )
    m0 = int(rng.choice([32, 64, 128]))
    model = GoodputModel(perf, GradParams(1.0, float(rng.uniform(0.5, 50.0))), m0)
    limits = BatchLimits(m0, m0 * int(rng.choice([4, 16, 32])), 8, 256)
    return model, limits


def _step_time(work: float) -> Callable[[int], float]:
    """Seconds per iteration on k GPUs: the work splits, the all-reduce grows with k."""
    return lambda k: work / k + 0.02 * k


def random_snapshot(
    seed: int,
    num_nodes: int,
    num_jobs: int,
    gpus_per_node: int = 4,
    running_fraction: float = 0.5,
    now: float = 10_000.0,
) -> ClusterSnapshot:
    """A feasible snapshot with mixed jobs: some fitted, some new, some running."""
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeInfo(f"node-{i}", gpus_per_node) for i in range(num_nodes))
    free = np.full(num_nodes, gpus_per_node)
    jobs: dict[str, JobInfo] = {}
    current: dict[str, Allocation] = {}
    for j in range(num_jobs):
        name = f"job-{j}"
        fitted = rng.random() < 0.8
        model, limits = random_model(rng)
        held = int(rng.choice([0, 1, 2, 4, 8])) if fitted else 0
        requested = int(rng.choice([1, 2, 4, 8]))
        jobs[name] = JobInfo(
            name=name,
            submit_time=now - float(rng.uniform(60, 20_000)),
            attained_service=float(rng.uniform(0, 100_000)),
            num_restarts=int(rng.integers(0, 4)),
            min_replicas=int(rng.choice([0, 0, 0, 2])),
            max_replicas=int(rng.choice([4, 16, 64])),
            max_gpus_held=held,
            goodput=model if fitted else None,
            limits=limits,
            requested_replicas=requested,
            step_time=_step_time(float(rng.uniform(0.1, 1.0))),
            remaining_iterations=float(rng.uniform(100, 10_000)),
        )
        if fitted and held and rng.random() < running_fraction:
            want = min(held, int(free.sum()))
            alloc = np.zeros(num_nodes, dtype=np.int64)
            for n in np.argsort(-free, kind="stable"):
                take = min(int(free[n]), want - int(alloc.sum()))
                alloc[n] += take
                if alloc.sum() == want:
                    break
            if alloc.sum() > 0 and (np.count_nonzero(alloc) == 1 or alloc.sum() == want):
                free -= alloc
                current[name] = tuple(int(x) for x in alloc)
    return ClusterSnapshot(now=now, nodes=nodes, jobs=jobs, current=current)
