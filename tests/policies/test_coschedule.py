"""The co-scheduling wrapper: serving first, training on the rest, never over-committed."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.policies import (
    ClusterSnapshot,
    NodeInfo,
    make_policy,
    state_from_json,
    state_to_json,
    validate_allocations,
)
from coadapt.policies.autoscale import (
    DemandWindow,
    Deployment,
    DeploymentError,
    SloAutoscaler,
    StaticAutoscaler,
)
from coadapt.policies.base import PolicyError
from coadapt.policies.coschedule import CoSchedulePolicy, reservations_of, training_snapshot
from coadapt.policies.queueing import pooled_capacity
from tests.policies.builders import random_snapshot

CAP = 1000.0


class ConstantDemand:
    """A DemandSource with a fixed request rate per deployment (an input, not a product)."""

    def __init__(self, rates: dict[str, float], replicas: int = 1) -> None:
        self.rates = rates
        self.replicas = replicas

    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        n = max(int(end - start), 0)
        return DemandWindow(end, (self.rates[deployment],) * n, (), self.replicas)


def dep(name: str, priority: int = 0, **kw: object) -> Deployment:
    return Deployment(name=name, capacity_rps=CAP, priority=priority, **kw)  # type: ignore[arg-type]


def serving_rows(snapshot: ClusterSnapshot, state: dict[str, object]) -> np.ndarray:
    index = {n.name: i for i, n in enumerate(snapshot.nodes)}
    held = np.zeros(len(snapshot.nodes), dtype=np.int64)
    for res in reservations_of(state).values():
        for node, k in res.placement.items():
            held[index[node]] += k
    return held


@pytest.mark.parametrize("inner", ["pollux", "fifo", "tiresias"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_never_gets_reserved_slots(inner: str, seed: int) -> None:
    snap = random_snapshot(seed, num_nodes=6, num_jobs=8)
    demand = ConstantDemand({"a": 5300.0, "b": 2100.0})  # asks for 6 + 3 slots
    policy = CoSchedulePolicy(
        make_policy(inner),
        [dep("a", 1), dep("b")],
        SloAutoscaler(min_headroom=0.0, max_headroom=0.0, pooled=False),  # per-replica counts
        demand,
    )
    decision = policy.optimize(snap, {}, np.random.default_rng(seed))
    validate_allocations(snap, decision.allocations, decision.packed)
    held = serving_rows(snap, decision.state)
    assert held.sum() == 9
    used = held.copy()
    for job, alloc in decision.allocations.items():
        if job not in decision.packed:
            used += np.asarray(alloc)
    assert np.all(used <= [n.gpus for n in snap.nodes])
    # the state is JSON and a second round keeps the warm slots where they were
    state = state_from_json(state_to_json(decision.state))
    again = policy.optimize(snap, state, np.random.default_rng(seed))
    assert reservations_of(again.state) == reservations_of(decision.state)


def test_priority_and_shedding_when_serving_exceeds_the_cluster() -> None:
    nodes = tuple(NodeInfo(f"n{i}", 4) for i in range(2))  # 8 slots
    snap = random_snapshot(5, num_nodes=2, num_jobs=3)
    snap = ClusterSnapshot(snap.now, nodes, snap.jobs, snap.current)
    demand = ConstantDemand({"hi": 6000.0, "lo": 4000.0})  # 6 + 4 slots wanted, 8 exist
    policy = CoSchedulePolicy(
        make_policy("pollux"),
        [dep("lo", priority=0), dep("hi", priority=5)],
        SloAutoscaler(min_headroom=0.0, max_headroom=0.0, pooled=False),  # per-replica counts
        demand,
    )
    decision = policy.optimize(snap, {}, np.random.default_rng(0))
    res = reservations_of(decision.state)
    assert (res["hi"].slots, res["hi"].admit_rps) == (6, None)  # served in full
    assert (res["lo"].desired, res["lo"].slots) == (4, 2)
    assert res["lo"].admit_rps == pytest.approx(2 * CAP)  # the rest gets 503 + Retry-After
    assert res["lo"].retry_after_s == pytest.approx(60.0 + 20.0)  # a round + a cold start
    assert all(not any(a) for a in decision.allocations.values())  # training waits
    validate_allocations(snap, decision.allocations)


def test_a_capped_pool_is_admitted_at_its_own_pooled_capacity() -> None:
    """Pooled replicas (the gateway's least-outstanding routing) serve more each the larger
    the pool: a deployment granted fewer than it asked is admitted at what the smaller pool
    serves within the SLO, not at the per-replica capacity of the pool it wanted."""
    nodes = tuple(NodeInfo(f"n{i}", 4) for i in range(2))  # 8 slots
    snap = random_snapshot(5, num_nodes=2, num_jobs=3)
    snap = ClusterSnapshot(snap.now, nodes, snap.jobs, snap.current)
    demand = ConstantDemand({"hi": 6000.0, "lo": 12000.0})
    scaler = SloAutoscaler(min_headroom=0.0, max_headroom=0.0)
    policy = CoSchedulePolicy(
        make_policy("pollux"), [dep("lo", priority=0), dep("hi", priority=5)], scaler, demand
    )
    decision = policy.optimize(snap, {}, np.random.default_rng(0))
    res = reservations_of(decision.state)
    lo = res["lo"]
    assert lo.slots == 8 - res["hi"].slots and lo.desired > lo.slots > 0
    d = dep("lo")
    mu = scaler.service_rate(d, {})
    assert lo.admit_rps == pytest.approx(pooled_capacity(mu, lo.slots, d.slo_s, 0.99))
    wanted_each = pooled_capacity(mu, lo.desired, d.slo_s, 0.99) / lo.desired
    assert lo.admit_rps < lo.slots * wanted_each


def test_static_partition_holds_its_size_whatever_the_demand() -> None:
    snap = random_snapshot(3, num_nodes=4, num_jobs=5)
    for rate in (0.0, 500.0, 9000.0):
        policy = CoSchedulePolicy(
            make_policy("pollux"),
            [dep("a", min_replicas=0)],
            StaticAutoscaler({"a": 6}),
            ConstantDemand({"a": rate}),
        )
        d = policy.optimize(snap, {}, np.random.default_rng(0))
        assert reservations_of(d.state)["a"].slots == 6
        assert sum(sum(a) for a in d.allocations.values()) <= snap.total_gpus - 6


def test_decisions_are_deterministic() -> None:
    snap = random_snapshot(7, num_nodes=5, num_jobs=9)
    out = []
    for _ in range(2):
        policy = CoSchedulePolicy(
            make_policy("pollux"), [dep("a")], SloAutoscaler(), ConstantDemand({"a": 7200.0})
        )
        d = policy.optimize(snap, {}, np.random.default_rng(4))
        out.append((d.allocations, state_to_json(d.state)))
    assert out[0] == out[1]


def test_shrinking_training_clips_latest_jobs_first() -> None:
    snap = random_snapshot(1, num_nodes=3, num_jobs=6, running_fraction=1.0)
    held = np.array([snap.nodes[0].gpus, 0, 0])  # node 0 goes to serving entirely
    reduced = training_snapshot(snap, held)
    assert reduced.nodes[0].gpus == 0
    for alloc in reduced.current.values():
        assert alloc[0] == 0
    validate_allocations(reduced, reduced.current)
    with pytest.raises(PolicyError, match="exceed"):
        training_snapshot(snap, held + 10)


def test_duplicate_deployments_are_refused() -> None:
    with pytest.raises(DeploymentError, match="repeated: a"):
        CoSchedulePolicy(
            make_policy("fifo"), [dep("a"), dep("a")], SloAutoscaler(), ConstantDemand({})
        )
