"""FIFO: submission order, requested GPUs, head-of-line blocking, no preemption."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from coadapt.policies import BatchMode, ClusterSnapshot, JobInfo, NodeInfo, make_policy
from coadapt.policies.fifo import FifoPolicy

RNG = np.random.default_rng(0)


def _snap(
    jobs: list[tuple[str, float, int]], current: Mapping[str, tuple[int, ...]] | None = None
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=100.0,
        nodes=(NodeInfo("n0", 4), NodeInfo("n1", 4)),
        jobs={n: JobInfo(name=n, submit_time=t, requested_replicas=r) for n, t, r in jobs},
        current=current or {},
    )


def test_declares_fixed_mode() -> None:
    policy = make_policy("fifo")
    assert isinstance(policy, FifoPolicy) and policy.batch_mode is BatchMode.FIXED


def test_head_of_line_blocks_later_jobs() -> None:
    allocs = (
        FifoPolicy().optimize(_snap([("a", 0, 6), ("b", 1, 4), ("c", 2, 1)]), {}, RNG).allocations
    )
    assert set(allocs) == {"a"} and sum(allocs["a"]) == 6


def test_running_jobs_are_never_preempted() -> None:
    current = {"late": (4, 0)}
    allocs = (
        FifoPolicy()
        .optimize(_snap([("early", 0, 8), ("late", 5, 4)], current), {}, RNG)
        .allocations
    )
    assert allocs == {"late": (4, 0)}


def test_admits_in_submission_order_while_it_fits() -> None:
    allocs = (
        FifoPolicy().optimize(_snap([("b", 1, 2), ("a", 0, 4), ("c", 2, 2)]), {}, RNG).allocations
    )
    assert {k: sum(v) for k, v in allocs.items()} == {"a": 4, "b": 2, "c": 2}
    assert allocs["a"] == (4, 0)


def test_higher_priority_jumps_the_queue() -> None:
    snap = _snap([("a", 0, 6), ("b", 1, 4)])
    jobs = dict(snap.jobs)
    jobs["b"] = JobInfo(name="b", submit_time=1, requested_replicas=4, priority=2)
    snap = ClusterSnapshot(now=100.0, nodes=snap.nodes, jobs=jobs)
    allocs = FifoPolicy().optimize(snap, {}, RNG).allocations
    assert set(allocs) == {"b"}  # b first; a (6 GPUs) then blocks on the 4 left
