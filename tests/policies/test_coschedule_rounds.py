"""Serving rounds between full rounds, and spare replicas on slots training left idle."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coadapt.policies import (
    ClusterSnapshot,
    Decision,
    Policy,
    PolicyState,
    make_policy,
    state_from_json,
    state_to_json,
    validate_allocations,
)
from coadapt.policies.autoscale import DemandWindow, Deployment, SloAutoscaler
from coadapt.policies.base import PolicyError
from coadapt.policies.coschedule import CoSchedulePolicy, reservations_of
from tests.policies.builders import random_snapshot

CAP = 1000.0


class StepDemand:
    """A DemandSource whose rate the test sets between rounds (an input, not a product)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def window(self, deployment: str, start: float, end: float) -> DemandWindow:
        n = max(int(end - start), 0)
        return DemandWindow(end, (self.rate,) * n, (), 1)


class CountingPolicy:
    """Delegates to a real training policy and counts its rounds."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.batch_mode = inner.batch_mode
        self.calls = 0

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        self.calls += 1
        return self.inner.optimize(snapshot, state, rng)


def exact() -> SloAutoscaler:
    """Asks exactly ceil(rate / CAP): no headroom and no trend, so the tests set the count."""
    return SloAutoscaler(beta=0.0, min_headroom=0.0, max_headroom=0.0, pooled=False)


def dep() -> Deployment:
    return Deployment(name="a", capacity_rps=CAP, min_replicas=1)


def after(snap: ClusterSnapshot, decision: Decision, now: float) -> ClusterSnapshot:
    """The next round's snapshot: the decided allocations are now current."""
    current = {k: a for k, a in decision.allocations.items() if any(a)}
    return dataclasses.replace(snap, now=now, current=current)


def used_slots(snap: ClusterSnapshot, decision: Decision) -> np.ndarray:
    index = {n.name: i for i, n in enumerate(snap.nodes)}
    used = np.zeros(len(snap.nodes), dtype=np.int64)
    for res in reservations_of(decision.state).values():
        for node, k in res.placement.items():
            used[index[node]] += k
    for job, alloc in decision.allocations.items():
        if job not in decision.packed:
            used += np.asarray(alloc, dtype=np.int64)
    return used


def setup(rate: float, spare_share: float = 0.0) -> tuple[CoSchedulePolicy, CountingPolicy]:
    inner = CountingPolicy(make_policy("fifo"))
    demand = StepDemand(rate)
    policy = CoSchedulePolicy(
        inner, [dep()], exact(), demand, round_s=10.0, full_round_s=60.0, spare_share=spare_share
    )
    return policy, inner


def test_a_serving_round_grows_into_free_slots_and_leaves_training_alone() -> None:
    # 4 nodes x 4 and three jobs that fifo gives only what they asked: slots stay free
    snap = random_snapshot(2, num_nodes=4, num_jobs=3, running_fraction=0.0, now=100.0)
    policy, inner = setup(1900.0)
    first = policy.optimize(snap, {}, np.random.default_rng(0))
    assert inner.calls == 1 and reservations_of(first.state)["a"].slots == 2
    free = snap.total_gpus - int(used_slots(snap, first).sum())
    assert free >= 2, "the fixture must leave slots free"
    policy.demand.rate = 1900.0 + CAP * free  # type: ignore[attr-defined]
    state = state_from_json(state_to_json(first.state))
    second = policy.optimize(after(snap, first, 110.0), state, np.random.default_rng(1))
    assert inner.calls == 1  # no full round: training is untouched
    assert second.allocations == {k: a for k, a in first.allocations.items() if any(a)}
    assert second.diagnostics["serving.round"] == 1.0
    assert reservations_of(second.state)["a"].slots == 2 + free
    assert np.all(used_slots(snap, second) <= [n.gpus for n in snap.nodes])


def test_serving_needing_trainings_slots_forces_a_full_round() -> None:
    snap = random_snapshot(2, num_nodes=4, num_jobs=3, running_fraction=0.0, now=100.0)
    policy, inner = setup(900.0)
    first = policy.optimize(snap, {}, np.random.default_rng(0))
    policy.demand.rate = CAP * (snap.total_gpus - 2) - 100.0  # type: ignore[attr-defined]
    second = policy.optimize(after(snap, first, 110.0), first.state, np.random.default_rng(1))
    assert inner.calls == 2
    assert "serving.round" not in second.diagnostics
    assert reservations_of(second.state)["a"].slots == snap.total_gpus - 2
    assert sum(sum(a) for a in second.allocations.values()) <= 2


def test_serving_rounds_never_shrink_and_full_rounds_come_on_time_or_on_a_change() -> None:
    snap = random_snapshot(4, num_nodes=4, num_jobs=3, running_fraction=0.0, now=100.0)
    policy, inner = setup(4900.0)
    d = policy.optimize(snap, {}, np.random.default_rng(0))
    policy.demand.rate = 900.0  # type: ignore[attr-defined]
    d = policy.optimize(after(snap, d, 110.0), d.state, np.random.default_rng(1))
    assert inner.calls == 1 and reservations_of(d.state)["a"].slots == 5  # kept until...
    d = policy.optimize(after(snap, d, 160.0), d.state, np.random.default_rng(2))
    assert inner.calls == 2 and reservations_of(d.state)["a"].slots == 1  # ...the full round
    # a job that completed (or arrived) is decided at once, as the live controller does
    gone = sorted(snap.jobs)[0]
    fewer = dataclasses.replace(
        after(snap, d, 170.0),
        jobs={k: v for k, v in snap.jobs.items() if k != gone},
        current={k: v for k, v in d.allocations.items() if k != gone and any(v)},
    )
    policy.optimize(fewer, d.state, np.random.default_rng(3))
    assert inner.calls == 3


def test_without_full_round_s_every_round_is_full() -> None:
    snap = random_snapshot(2, num_nodes=4, num_jobs=3, now=100.0)
    inner = CountingPolicy(make_policy("fifo"))
    policy = CoSchedulePolicy(inner, [dep()], exact(), StepDemand(1000.0))
    d = policy.optimize(snap, {}, np.random.default_rng(0))
    policy.optimize(after(snap, d, 110.0), d.state, np.random.default_rng(1))
    assert inner.calls == 2
    assert set(d.state) == {"inner", "serving", "last_now"}  # the layout the controller keeps


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_spares_take_only_slots_training_left_idle(seed: int) -> None:
    snap = random_snapshot(seed, num_nodes=4, num_jobs=3, running_fraction=0.0, now=100.0)
    plain, _ = setup(2900.0)
    spared, _ = setup(2900.0, spare_share=1.0)
    a = plain.optimize(snap, {}, np.random.default_rng(seed))
    b = spared.optimize(snap, {}, np.random.default_rng(seed))
    assert b.allocations == a.allocations  # training gets exactly what it got without spares
    validate_allocations(snap, b.allocations, b.packed)
    res = reservations_of(b.state)["a"]
    idle = snap.total_gpus - int(used_slots(snap, a).sum())
    assert res.desired == 3
    assert res.slots == 3 + min(3, idle)  # up to 100 % of the grant, from idle slots only
    assert np.all(used_slots(snap, b) <= [n.gpus for n in snap.nodes])


def test_spares_are_given_back_when_training_wants_the_slots() -> None:
    snap = random_snapshot(0, num_nodes=4, num_jobs=3, running_fraction=0.0, now=100.0)
    policy, _ = setup(1900.0, spare_share=1.0)
    d = policy.optimize(snap, {}, np.random.default_rng(0))
    assert reservations_of(d.state)["a"].slots > 2
    # the spares are not part of the next grant: training (fifo) may use them at once
    first = sorted(snap.jobs, key=lambda k: snap.jobs[k].submit_time)[0]
    wants = {k: snap.total_gpus - 2 if k == first else 1 for k in snap.jobs}
    grown = dataclasses.replace(
        after(snap, d, 160.0),
        jobs={k: dataclasses.replace(v, requested_replicas=wants[k]) for k, v in snap.jobs.items()},
    )
    d2 = policy.optimize(grown, d.state, np.random.default_rng(1))
    assert reservations_of(d2.state)["a"].slots == 2
    assert sum(sum(a) for a in d2.allocations.values()) == snap.total_gpus - 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"full_round_s": 5.0}, "full_round_s"), ({"spare_share": -0.5}, "spare_share")],
)
def test_bad_round_options_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        CoSchedulePolicy(
            make_policy("fifo"),
            [dep()],
            exact(),
            StepDemand(0.0),
            round_s=10.0,
            **kwargs,
        )
