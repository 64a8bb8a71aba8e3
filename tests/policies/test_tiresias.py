"""Tiresias: 2D-LAS queues, demotion, greedy admission, placement stickiness."""

from __future__ import annotations

import numpy as np

from coadapt.policies import BatchMode, ClusterSnapshot, JobInfo, NodeInfo, make_policy
from coadapt.policies.tiresias import TiresiasPolicy

RNG = np.random.default_rng(0)


def _snap(
    now: float,
    jobs: dict[str, int],
    current: dict[str, tuple[int, ...]] | None = None,
    nodes: int = 2,
    gpus: int = 4,
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=now,
        nodes=tuple(NodeInfo(f"n{i}", gpus) for i in range(nodes)),
        jobs={
            k: JobInfo(name=k, submit_time=0.0, requested_replicas=r, max_replicas=r)
            for k, r in jobs.items()
        },
        current=current or {},
    )


def test_declares_fixed_mode() -> None:
    policy = make_policy("tiresias")
    assert isinstance(policy, TiresiasPolicy) and policy.batch_mode is BatchMode.FIXED


def test_admits_in_queue_order_and_lets_small_jobs_pass() -> None:
    policy = TiresiasPolicy()
    allocs = policy.optimize(_snap(60, {"a": 6, "b": 4, "c": 2}), RNG)
    assert sum(allocs["a"]) == 6 and sum(allocs["c"]) == 2 and "b" not in allocs
    # Most-free node first: a fills node 0 and takes 2 on node 1; c gets the rest of node 1.
    assert allocs["a"] == (4, 2) and allocs["c"] == (0, 2)


def test_running_jobs_keep_placement() -> None:
    policy = TiresiasPolicy()
    first = policy.optimize(_snap(60, {"a": 2}), RNG)
    second = policy.optimize(_snap(120, {"a": 2, "b": 2}, current=first), RNG)
    assert second["a"] == first["a"]
    assert sum(second["b"]) == 2


def test_demotion_after_threshold_preempts_for_new_jobs() -> None:
    policy = TiresiasPolicy(threshold=4 * 600)  # 4 GPUs × 600 s
    allocs = policy.optimize(_snap(0, {"old": 8}), RNG)
    allocs = policy.optimize(_snap(600, {"old": 8}, allocs), RNG)  # 600 s × 8 GPUs: demoted
    assert sum(allocs["old"]) == 8  # nobody else waits, it keeps running
    allocs = policy.optimize(_snap(660, {"old": 8, "new": 4}, allocs), RNG)
    assert "old" not in allocs and sum(allocs["new"]) == 4  # queue 0 goes first


def test_never_overcommits_and_completed_jobs_are_forgotten() -> None:
    policy = TiresiasPolicy()
    jobs = {f"j{i}": r for i, r in enumerate([1, 2, 4, 3, 1, 2])}
    allocs = policy.optimize(_snap(60, jobs), RNG)
    assert sum(sum(a) for a in allocs.values()) <= 8
    allocs = policy.optimize(_snap(120, {"j5": 2}, allocs), RNG)
    assert set(allocs) == {"j5"}
    assert set(policy._status) == {"j5"}
