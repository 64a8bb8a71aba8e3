"""The shared suite every scheduling policy passes (like Optuna's BasicSamplerTestCase).

Invariants, not exact outputs: capacity, known jobs, min/max replicas, the 2x exploration
cap for goodput-adaptive policies, requested sizes for fixed policies, the interference rule
for policies that claim it, and determinism for a given seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coadapt.goodput import exploration_cap
from coadapt.policies import (
    POLICY_NAMES,
    BatchMode,
    ClusterSnapshot,
    Policy,
    make_policy,
    state_from_json,
    state_to_json,
    validate_allocations,
)
from tests.policies.builders import random_hetero_snapshot, random_snapshot

FAST_OPTIONS: dict[str, dict[str, Any]] = {"pollux-ga": {"population": 12, "generations": 4}}


def _make(name: str) -> Policy:
    return make_policy(name, **FAST_OPTIONS.get(name, {}))


def check_invariants(
    policy: Policy,
    snap: ClusterSnapshot,
    allocs: dict[str, Any],
    packed: dict[str, str] | None = None,
) -> None:
    validate_allocations(snap, allocs, packed)
    cap = getattr(policy, "growth_cap", exploration_cap)  # a policy may declare its own
    for name, alloc in allocs.items():
        job = snap.jobs[name]
        k = sum(alloc)
        if k == 0:
            continue
        assert k <= job.max_replicas, (name, k, job.max_replicas)
        assert k >= job.min_replicas, (name, k, job.min_replicas)
        if policy.batch_mode is BatchMode.ADAPTIVE:
            assert k <= cap(job.max_gpus_held, job.max_replicas), (name, k)
        if getattr(policy, "type_aware", False):
            types = {snap.nodes[i].gpu_type for i, x in enumerate(alloc) if x > 0}
            assert len(types) == 1 and job.allows(types.pop()), (name, alloc)
        if policy.batch_mode is BatchMode.FIXED and job.requested_replicas is not None:
            assert k == job.requested_replicas, (name, k, job.requested_replicas)
    if getattr(policy, "avoid_interference", False):
        per_node = np.zeros(len(snap.nodes), dtype=np.int64)
        for alloc in allocs.values():
            if sum(1 for x in alloc if x > 0) > 1:
                per_node += np.asarray(alloc) > 0
        assert np.all(per_node <= 1), per_node


snapshots = st.builds(
    random_snapshot,
    seed=st.integers(0, 10_000),
    num_nodes=st.integers(1, 6),
    num_jobs=st.integers(0, 14),
    gpus_per_node=st.sampled_from([1, 2, 4]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(POLICY_NAMES), snap=snapshots, seed=st.integers(0, 2**31))
def test_invariants_hold_for_every_policy(name: str, snap: ClusterSnapshot, seed: int) -> None:
    policy = _make(name)
    allocs = policy.optimize(snap, {}, np.random.default_rng(seed)).allocations
    check_invariants(policy, snap, allocs)


hetero_snapshots = st.builds(
    random_hetero_snapshot,
    seed=st.integers(0, 10_000),
    types=st.sampled_from([("v100", "k80"), ("v100", "p100", "k80"), ("a100",)]),
    nodes_per_type=st.integers(1, 2),
    num_jobs=st.integers(0, 10),
    gpus_per_node=st.sampled_from([1, 2, 4]),
    packing=st.booleans(),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(POLICY_NAMES), snap=hetero_snapshots, seed=st.integers(0, 2**31))
def test_invariants_hold_on_heterogeneous_snapshots(
    name: str, snap: ClusterSnapshot, seed: int
) -> None:
    policy = _make(name)
    decision = policy.optimize(snap, {}, np.random.default_rng(seed))
    check_invariants(policy, snap, decision.allocations, decision.packed)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(POLICY_NAMES), snap=snapshots, seed=st.integers(0, 2**31))
def test_same_seed_same_decision(name: str, snap: ClusterSnapshot, seed: int) -> None:
    first = _make(name).optimize(snap, {}, np.random.default_rng(seed))
    second = _make(name).optimize(snap, {}, np.random.default_rng(seed))
    assert first == second


def test_policies_over_several_rounds_stay_valid() -> None:
    """Stateful policies (GA population, Tiresias queues) remain valid as jobs come and go,
    their state is JSON, and a fresh policy object given the stored state decides the same
    (nothing the next round needs lives on the object)."""
    for name in POLICY_NAMES:
        policy = _make(name)
        state: dict[str, Any] = {}
        for round_ in range(4):
            snap = random_snapshot(
                seed=round_, num_nodes=4, num_jobs=6 + 2 * round_, now=10_000.0 + 60 * round_
            )
            stored = state_from_json(state_to_json(state))
            decision = policy.optimize(snap, state, np.random.default_rng([7, round_]))
            check_invariants(policy, snap, decision.allocations)
            again = _make(name).optimize(snap, stored, np.random.default_rng([7, round_]))
            assert again == decision, (name, round_)
            state = decision.state


def test_unknown_policy_lists_accepted_names() -> None:
    import pytest

    from coadapt.policies import PolicyError

    with pytest.raises(PolicyError, match="pollux, pollux-unaware, pollux-ga, tiresias"):
        make_policy("gandiva")
