"""Pollux-specific behaviour: fitness versus the GA, fairness at p = -1, re-allocation cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo, Policy
from coadapt.policies.pollux import PolluxUnawarePolicy
from coadapt.policies.pollux_ga import PolluxGAPolicy
from coadapt.policies.pollux_problem import MAX_PRIORITY_LEVEL, PolluxProblem, priority_weights
from tests.policies.builders import random_snapshot

SCALABLE = GoodputModel(PerfParams(0.1, 0.001, 0.01, 0.0, 0.02, 0.0, 1.0), GradParams(1, 500), 32)
LIMITS = BatchLimits(32, 8192, 8, 256)


def _job(name: str, **kw: object) -> JobInfo:
    base = dict(submit_time=0.0, goodput=SCALABLE, limits=LIMITS, max_gpus_held=16)
    base.update(kw)
    return JobInfo(name=name, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("gpus", "jobs", "seed"), [(16, 6, 1), (32, 12, 2), (32, 40, 3)])
def test_fitness_at_least_the_genetic_algorithm(gpus: int, jobs: int, seed: int) -> None:
    snap = random_snapshot(seed, gpus // 4, jobs)
    fast = PolluxUnawarePolicy()
    ga = PolluxGAPolicy(population=40, generations=40)
    fast_fit = fast.optimize(snap, {}, np.random.default_rng(0)).diagnostics["fitness"]
    ga_fit = ga.optimize(snap, {}, np.random.default_rng(0)).diagnostics["fitness"]
    assert fast_fit >= ga_fit - 1e-9


def test_reported_fitness_is_the_problem_fitness_of_the_decision() -> None:
    snap = random_snapshot(5, 4, 8)
    policy = PolluxUnawarePolicy()
    decision = policy.optimize(snap, {}, np.random.default_rng(0))
    allocs = decision.allocations
    problem = PolluxProblem(snap)
    state = np.array([allocs.get(n, (0,) * 4) for n in problem.names])
    fitness = decision.diagnostics["fitness"]
    assert fitness == pytest.approx(float(problem.fitness(state[None])[0]))


def test_fair_p_gives_every_job_a_gpu_before_anyone_gets_two() -> None:
    nodes = (NodeInfo("a", 4), NodeInfo("b", 4))
    jobs = {f"j{i}": _job(f"j{i}") for i in range(8)}
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs)
    allocs = PolluxUnawarePolicy(p=-1).optimize(snap, {}, np.random.default_rng(0)).allocations
    assert sorted(sum(a) for a in allocs.values()) == [1] * 8


def test_single_job_takes_the_cluster_when_it_scales() -> None:
    nodes = (NodeInfo("a", 4), NodeInfo("b", 4))
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs={"j": _job("j")})
    allocs = PolluxUnawarePolicy().optimize(snap, {}, np.random.default_rng(0)).allocations
    assert sum(allocs["j"]) == 8


def test_exploration_cap_limits_a_new_job() -> None:
    nodes = (NodeInfo("a", 4), NodeInfo("b", 4))
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs={"j": _job("j", max_gpus_held=2)})
    allocs = PolluxUnawarePolicy().optimize(snap, {}, np.random.default_rng(0)).allocations
    assert sum(allocs["j"]) == 4


def test_restart_penalty_keeps_a_young_job_in_place() -> None:
    """A job that just started and restarted often stays put rather than grow a little."""
    nodes = (NodeInfo("a", 4), NodeInfo("b", 4))
    jobs = {
        "old": _job("old", submit_time=0.0, num_restarts=0),
        "young": _job("young", submit_time=3500.0, num_restarts=3),
    }
    current = {"old": (4, 0), "young": (0, 3)}
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs, current=current)
    allocs = PolluxUnawarePolicy().optimize(snap, {}, np.random.default_rng(0)).allocations
    assert allocs["young"] == (0, 3)


def test_interference_rule_two_distributed_jobs_never_share_a_node() -> None:
    nodes = tuple(NodeInfo(f"n{i}", 4) for i in range(3))
    jobs = {f"j{i}": _job(f"j{i}", max_gpus_held=4) for i in range(2)}
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs)
    allocs = PolluxUnawarePolicy().optimize(snap, {}, np.random.default_rng(0)).allocations
    multi = [a for a in allocs.values() if sum(1 for x in a if x) > 1]
    shared = np.sum([np.asarray(a) > 0 for a in multi], axis=0) if multi else np.zeros(3)
    assert np.all(shared <= 1)


def test_las_admission_runs_least_served_jobs_when_gpus_are_scarce() -> None:
    nodes = (NodeInfo("a", 2),)
    jobs = {
        f"j{i}": _job(f"j{i}", attained_service=float(1000 * (4 - i)), max_gpus_held=1)
        for i in range(4)
    }
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs)
    allocs = (
        PolluxUnawarePolicy(admission="las")
        .optimize(snap, {}, np.random.default_rng(0))
        .allocations
    )
    assert sorted(allocs) == ["j2", "j3"]  # the two with the least attained service
    with pytest.raises(ValueError, match="admission"):
        PolluxUnawarePolicy(admission="random")


def test_fair_reference_changes_the_speedup_normaliser() -> None:
    nodes = tuple(NodeInfo(f"n{i}", 4) for i in range(4))
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs={"j": _job("j")})
    packed = PolluxProblem(snap, fair_reference="packed")
    spread = PolluxProblem(snap, fair_reference="spread")
    assert packed.fair == (1, 16) and spread.fair == (4, 16)
    # One node is the best case for 16 GPUs: speedups against it are lower.
    assert packed.speedup(0, 4, 16, changed=False) < spread.speedup(0, 4, 16, changed=False)
    with pytest.raises(ValueError, match="fair_reference"):
        PolluxProblem(snap, fair_reference="wide")


def _scarce(priorities: dict[str, int]) -> ClusterSnapshot:
    """Four jobs (submitted j0 first) on two GPUs: not everyone can run."""
    nodes = (NodeInfo("a", 2),)
    jobs = {
        name: _job(name, submit_time=float(i), priority=priorities.get(name, 0))
        for i, name in enumerate(["j0", "j1", "j2", "j3"])
    }
    return ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs)


@pytest.mark.parametrize(
    "policy",
    [PolluxUnawarePolicy(), PolluxGAPolicy(population=30, generations=30)],
    ids=lambda p: p.name,
)
def test_higher_priority_jobs_are_admitted_first_when_gpus_are_scarce(policy: Policy) -> None:
    snap = _scarce({"j2": 1, "j3": 1})  # the two youngest outrank the two oldest
    allocs = policy.optimize(snap, {}, np.random.default_rng(0)).allocations
    assert {k for k, a in allocs.items() if sum(a) > 0} == {"j2", "j3"}
    # Without priorities the same optimiser runs other jobs: the priority made the difference.
    plain = policy.optimize(_scarce({}), {}, np.random.default_rng(0)).allocations
    assert {k for k, a in plain.items() if sum(a) > 0} != {"j2", "j3"}


def test_lower_priority_jobs_share_what_higher_ones_leave() -> None:
    nodes = (NodeInfo("a", 4), NodeInfo("b", 4))
    jobs = {f"j{i}": _job(f"j{i}", priority=1 if i < 2 else 0) for i in range(4)}
    snap = ClusterSnapshot(now=3600.0, nodes=nodes, jobs=jobs)
    allocs = PolluxUnawarePolicy().optimize(snap, {}, np.random.default_rng(0)).allocations
    held = {k: sum(allocs.get(k, ())) for k in jobs}
    assert all(held[k] >= 1 for k in jobs)  # enough GPUs: nobody starves
    assert min(held["j0"], held["j1"]) >= max(held["j2"], held["j3"])  # priority sizes up


def test_equal_priorities_change_nothing() -> None:
    """Only the order of priorities counts: all equal (whatever the value) is eq. 15 itself."""
    snap = random_snapshot(7, 4, 10)
    same = ClusterSnapshot(
        now=snap.now,
        nodes=snap.nodes,
        jobs={k: replace(j, priority=7) for k, j in snap.jobs.items()},
        current=snap.current,
    )
    assert PolluxProblem(same).weights is None
    for policy in (PolluxUnawarePolicy(), PolluxGAPolicy(population=20, generations=10)):
        a = policy.optimize(snap, {}, np.random.default_rng(3))
        b = policy.optimize(same, {}, np.random.default_rng(3))
        assert a.allocations == b.allocations and a.diagnostics == b.diagnostics


def test_priority_weights_follow_the_rank_not_the_value() -> None:
    weights = priority_weights([5, 1000, 5, -3])
    assert weights is not None and weights.tolist() == [2.0, 4.0, 2.0, 1.0]
    many = priority_weights(list(range(100)))
    assert many is not None and many.max() == 2.0**MAX_PRIORITY_LEVEL
    assert priority_weights([3, 3]) is None and priority_weights([]) is None
