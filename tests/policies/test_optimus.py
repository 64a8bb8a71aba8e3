"""Optimus: greedy marginal gain, max_replicas cap, placement of changed jobs only."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from coadapt.policies import BatchMode, ClusterSnapshot, JobInfo, NodeInfo, make_policy
from coadapt.policies.optimus import OptimusPolicy

RNG = np.random.default_rng(0)


def _job(name: str, work: float, remaining: float, max_replicas: int = 64) -> JobInfo:
    return JobInfo(
        name=name,
        submit_time=0.0,
        max_replicas=max_replicas,
        step_time=lambda k: work / k + 0.01 * k,
        remaining_iterations=remaining,
    )


def _snap(
    jobs: list[JobInfo], current: Mapping[str, tuple[int, ...]] | None = None, nodes: int = 2
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=60.0,
        nodes=tuple(NodeInfo(f"n{i}", 4) for i in range(nodes)),
        jobs={j.name: j for j in jobs},
        current=current or {},
    )


def test_declares_fixed_batch_mode() -> None:
    policy = make_policy("optimus")
    assert isinstance(policy, OptimusPolicy) and policy.batch_mode is BatchMode.FIXED_BATCH


def test_gpus_go_to_largest_remaining_time_reduction() -> None:
    allocs = (
        OptimusPolicy()
        .optimize(_snap([_job("long", 1.0, 10_000), _job("short", 1.0, 10)]), {}, RNG)
        .allocations
    )
    assert sum(allocs["short"]) == 1
    assert sum(allocs["long"]) == 7


def test_max_replicas_caps_growth_and_gpus_may_stay_idle() -> None:
    allocs = (
        OptimusPolicy().optimize(_snap([_job("a", 1.0, 1000, max_replicas=3)]), {}, RNG).allocations
    )
    assert sum(allocs["a"]) == 3


def test_every_job_gets_one_gpu_first() -> None:
    jobs = [_job(f"j{i}", 1.0, 100 * (i + 1)) for i in range(8)]
    allocs = OptimusPolicy().optimize(_snap(jobs), {}, RNG).allocations
    assert all(sum(allocs[j.name]) == 1 for j in jobs)


def test_unchanged_counts_keep_placement() -> None:
    jobs = [_job("a", 1.0, 10), _job("b", 1.0, 10_000)]
    current = {"a": (0, 1)}
    allocs = OptimusPolicy().optimize(_snap(jobs, current), {}, RNG).allocations
    assert allocs["a"] == (0, 1)
    assert sum(allocs["b"]) == 7
