"""Test-data builders for scheduling snapshots (like Kueue's MakeWorkload(...).Obj())."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.policies import Allocation, ClusterSnapshot, JobInfo, NodeInfo


def toy_model(slow: float = 1.0) -> GoodputModel:
    """A fixed goodput model; ``slow`` scales its compute time (a slower GPU type)."""
    perf = PerfParams(0.05 * slow, 5e-4 * slow, 0.02, 0.001, 0.2, 0.01, 2.0)
    return GoodputModel(perf, GradParams(1.0, 20.0), 64)


def toy_job(name: str, **kw: object) -> JobInfo:
    """A 4-GPU-capable job on :func:`toy_model` that has run before; ``kw`` overrides fields."""
    base = JobInfo(
        name=name,
        submit_time=0.0,
        max_gpus_held=4,
        goodput=toy_model(),
        limits=BatchLimits(64, 4096, 8, 256),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


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


#: Per-type slowdown ranges of the compute terms (V100 fastest), like Gavel's measurements.
HETERO_SLOWDOWN = {"v100": (1.0, 1.0), "p100": (1.3, 2.5), "k80": (2.5, 6.0)}


def random_hetero_snapshot(
    seed: int,
    types: tuple[str, ...] = ("v100", "p100", "k80"),
    nodes_per_type: int = 2,
    num_jobs: int = 8,
    gpus_per_node: int = 4,
    now: float = 10_000.0,
    packing: bool = False,
) -> ClusterSnapshot:
    """A snapshot on nodes of several GPU types: per-type models (the compute terms slowed per
    type, per job), some jobs restricted to some types, about half running on one type; with
    ``packing``, 1-GPU packing keys and co-location fractions for some pairs."""
    rng = np.random.default_rng(seed)
    nodes = tuple(
        NodeInfo(f"{t}-{i}", gpus_per_node, t) for t in types for i in range(nodes_per_type)
    )
    free = np.full(len(nodes), gpus_per_node)
    keys = ("a", "b", "c")
    jobs: dict[str, JobInfo] = {}
    current: dict[str, Allocation] = {}
    for j in range(num_jobs):
        name = f"job-{j}"
        model, limits = random_model(rng)
        by_type: dict[str, GoodputModel] = {}
        for t in types:
            lo, hi = HETERO_SLOWDOWN.get(t, (1.0, 3.0))
            slow = float(rng.uniform(lo, hi))
            perf = model.perf
            by_type[t] = GoodputModel(
                PerfParams(
                    alpha_grad=perf.alpha_grad * slow,
                    beta_grad=perf.beta_grad * slow,
                    alpha_local=perf.alpha_local,
                    beta_local=perf.beta_local,
                    alpha_node=perf.alpha_node,
                    beta_node=perf.beta_node,
                    gamma=perf.gamma,
                ),
                model.grad,
                model.init_batch_size,
            )
        allowed: tuple[str, ...] | None = None
        if rng.random() < 0.3:
            allowed = tuple(sorted(rng.choice(types, size=max(1, len(types) - 1), replace=False)))
        held = int(rng.choice([0, 1, 2, 4]))
        small = packing and rng.random() < 0.6
        jobs[name] = JobInfo(
            name=name,
            submit_time=now - float(rng.uniform(60, 20_000)),
            attained_service=float(rng.uniform(0, 100_000)),
            num_restarts=int(rng.integers(0, 3)),
            max_replicas=1 if small else int(rng.choice([4, 16])),
            max_gpus_held=held,
            goodput=model if held else None,
            limits=limits,
            requested_replicas=1,
            step_time=_step_time(float(rng.uniform(0.1, 1.0))),
            remaining_iterations=float(rng.uniform(100, 10_000)),
            gpu_types=allowed,
            goodput_by_type=by_type if held else None,
            packing_key=str(rng.choice(keys)) if small else None,
        )
        if held and rng.random() < 0.5:
            t = str(rng.choice(allowed if allowed is not None else types))
            want = 1 if small else held
            for n in np.flatnonzero([node.gpu_type == t for node in nodes]):
                if free[n] >= want:
                    alloc = [0] * len(nodes)
                    alloc[n] = want
                    free[n] -= want
                    current[name] = tuple(alloc)
                    break
    colocation: dict[tuple[str, str], tuple[float, float]] = {}
    if packing:
        for a in keys:
            for b in keys:
                if a <= b and rng.random() < 0.7:
                    colocation[(a, b)] = (
                        float(rng.uniform(0.5, 0.95)),
                        float(rng.uniform(0.5, 0.95)),
                    )
    return ClusterSnapshot(now=now, nodes=nodes, jobs=jobs, current=current, colocation=colocation)
