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
    allocs = policy.optimize(_snap(60, {"a": 6, "b": 4, "c": 2}), {}, RNG).allocations
    assert sum(allocs["a"]) == 6 and sum(allocs["c"]) == 2 and "b" not in allocs
    # Most-free node first: a fills node 0 and takes 2 on node 1; c gets the rest of node 1.
    assert allocs["a"] == (4, 2) and allocs["c"] == (0, 2)


def test_running_jobs_keep_placement() -> None:
    policy = TiresiasPolicy()
    d1 = policy.optimize(_snap(60, {"a": 2}), {}, RNG)
    first = d1.allocations
    second = policy.optimize(_snap(120, {"a": 2, "b": 2}, current=first), d1.state, RNG).allocations
    assert second["a"] == first["a"]
    assert sum(second["b"]) == 2


def test_demotion_after_threshold_preempts_for_new_jobs() -> None:
    policy = TiresiasPolicy(threshold=4 * 600)  # 4 GPUs × 600 s
    d = policy.optimize(_snap(0, {"old": 8}), {}, RNG)
    d = policy.optimize(_snap(600, {"old": 8}, d.allocations), d.state, RNG)  # 600 s × 8: demoted
    assert sum(d.allocations["old"]) == 8  # nobody else waits, it keeps running
    assert d.state["queues"] == [[], ["old"]]
    d = policy.optimize(_snap(660, {"old": 8, "new": 4}, d.allocations), d.state, RNG)
    assert "old" not in d.allocations and sum(d.allocations["new"]) == 4  # queue 0 goes first


def test_never_overcommits_and_completed_jobs_are_forgotten() -> None:
    policy = TiresiasPolicy()
    jobs = {f"j{i}": r for i, r in enumerate([1, 2, 4, 3, 1, 2])}
    d = policy.optimize(_snap(60, jobs), {}, RNG)
    assert sum(sum(a) for a in d.allocations.values()) <= 8
    d = policy.optimize(_snap(120, {"j5": 2}, d.allocations), d.state, RNG)
    assert set(d.allocations) == {"j5"}
    assert d.state["queues"] == [["j5"], []] and set(d.state["executed"]) <= {"j5"}
    assert set(d.state["last_check"]) == {"j5"}


def test_state_survives_a_json_round_trip_and_does_not_live_on_the_policy() -> None:
    """A controller restart rebuilds the policy and reloads its state from the database: the
    demotion must survive that (it lives in the state, not on the object)."""
    from coadapt.policies import state_from_json, state_to_json

    d = TiresiasPolicy(threshold=4 * 600).optimize(_snap(0, {"old": 8}), {}, RNG)
    d = TiresiasPolicy(threshold=4 * 600).optimize(
        _snap(600, {"old": 8}, d.allocations), d.state, RNG
    )
    state = state_from_json(state_to_json(d.state))
    fresh = TiresiasPolicy(threshold=4 * 600)
    after = fresh.optimize(_snap(660, {"old": 8, "new": 4}, d.allocations), state, RNG)
    assert "old" not in after.allocations and sum(after.allocations["new"]) == 4
    # Without the state, "old" would be new to queue 0 again and keep its GPUs.
    amnesic = fresh.optimize(_snap(660, {"old": 8, "new": 4}, d.allocations), {}, RNG)
    assert sum(amnesic.allocations["old"]) == 8


def test_higher_priority_is_admitted_first_within_a_queue() -> None:
    snap = _snap(60, {"a": 6, "b": 4})
    jobs = dict(snap.jobs)
    jobs["b"] = JobInfo(name="b", submit_time=0.0, requested_replicas=4, max_replicas=4, priority=1)
    snap = ClusterSnapshot(now=60, nodes=snap.nodes, jobs=jobs)
    allocs = TiresiasPolicy().optimize(snap, {}, RNG).allocations
    assert set(allocs) == {"b"}  # b (priority 1) goes before a, which then does not fit
