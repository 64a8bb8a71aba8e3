"""``pollux``'s use of a job's declared progress (``JobInfo.progress``): the remaining-work
weight and the settle factor, their invariants, and the contract when progress is unknown."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from coadapt.policies import ClusterSnapshot, NodeInfo, validate_allocations
from coadapt.policies.pollux import PolluxPolicy
from coadapt.policies.pollux_problem import Levers, PolluxProblem, remaining_work
from coadapt.policies.pollux_types import type_snapshot
from coadapt.policies.snapshot import JobFacts, build_snapshot, clamp_progress
from tests.policies.builders import random_hetero_snapshot, random_snapshot, toy_job

RNG = np.random.default_rng(0)


def _with_progress(snap: ClusterSnapshot, seed: int) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    jobs = {}
    for k, j in snap.jobs.items():
        f = None if rng.random() < 0.3 else float(rng.uniform(0.0, 1.0))
        jobs[k] = replace(j, progress=f)
    return replace(snap, jobs=jobs)


def test_remaining_work_extrapolates_service_and_treats_unknown_as_unknown() -> None:
    job = toy_job("a", attained_service=3600.0, progress=0.25)
    assert remaining_work(job, 99.0) == pytest.approx(3 * 3600.0)
    assert remaining_work(replace(job, progress=1.0), 99.0) == 0.0
    for unknown in (replace(job, progress=None), replace(job, progress=0.0)):
        assert remaining_work(unknown, 99.0) == 99.0
    assert remaining_work(replace(job, attained_service=0.0), 99.0) == 99.0


def test_job_near_its_end_gets_the_gpus_when_they_are_scarce() -> None:
    """Two equal jobs, GPUs for one's fair share: the one with less work left gets more."""
    nodes = (NodeInfo("n0", 4),)
    jobs = {
        # ~1000 GPU-h left vs ~0.1 GPU-h: weights ~0.1 vs ~1.
        "long": toy_job("long", attained_service=10 * 3600.0, progress=0.01),
        "short": toy_job("short", attained_service=10 * 3600.0, progress=0.99),
    }
    snap = ClusterSnapshot(now=7200.0, nodes=nodes, jobs=jobs, current={})
    decision = PolluxPolicy().optimize(snap, {}, RNG)
    got = {k: sum(a) for k, a in decision.allocations.items()}
    assert got.get("short", 0) > got.get("long", 0)
    # Without the lever (or without progress) they are alike and split evenly.
    even = PolluxPolicy(remaining_power=0.0, srpt_q=0.0).optimize(snap, {}, RNG)
    assert sorted(sum(a) for a in even.allocations.values()) == [2, 2]


def test_srpt_ranks_only_the_long_jobs_by_heSRPTs_shares() -> None:
    """Long jobs (> ``srpt_long`` GPU-s left), largest first, get heSRPT's shares scaled so
    the next rank is 1; shorter jobs and jobs of unknown length keep weight 1."""
    levers = Levers(srpt_q=0.5, srpt_long=100.0)  # e = 2: shares 1, 3, 5 over the next, 7
    jobs = [
        toy_job("mid", attained_service=100.0, progress=0.25),  # 300 GPU-s left
        toy_job("short", attained_service=50.0, progress=0.5),  # 50: not long
        toy_job("big", attained_service=100.0, progress=0.1),  # 900
        toy_job("unknown", attained_service=100.0),  # unknown: never long
        toy_job("small", attained_service=100.0, progress=0.5),  # 100: not above the bar
        toy_job("least", attained_service=100.0, progress=0.4),  # 150
    ]
    w = levers.srpt_weights(jobs)
    assert w is not None
    np.testing.assert_allclose(w, [3 / 7, 1.0, 1 / 7, 1.0, 1.0, 5 / 7])
    # equal remaining work: equal weights (the mean of their ranks' shares)
    twins = [toy_job(n, attained_service=100.0, progress=0.1) for n in "ab"]
    np.testing.assert_allclose(levers.srpt_weights(twins), [2 / 5, 2 / 5])
    # nothing long, or the lever off: no weight at all
    assert levers.srpt_weights(jobs[1:2]) is None
    assert Levers(srpt_q=0.0).srpt_weights(jobs) is None


def test_srpt_serves_the_shorter_of_two_long_jobs_first() -> None:
    """GPUs for one: of two long jobs alike but for their remaining work, the one with less
    left gets more; the remaining-work weight alone barely tells them apart."""
    nodes = (NodeInfo("n0", 4),)
    jobs = {
        "longer": toy_job("longer", attained_service=50 * 3600.0, progress=0.4),  # 75 GPU-h
        "shorter": toy_job("shorter", attained_service=50 * 3600.0, progress=0.45),  # 61
    }
    snap = ClusterSnapshot(now=7200.0, nodes=nodes, jobs=jobs, current={})
    got = {k: sum(a) for k, a in PolluxPolicy().optimize(snap, {}, RNG).allocations.items()}
    assert got.get("shorter", 0) > got.get("longer", 0)


def test_unknown_progress_everywhere_changes_nothing() -> None:
    """No job declared its length: every weight is the same, so the decision is the one the
    policy takes without the remaining-work lever."""
    for seed in range(6):
        snap = random_snapshot(seed, num_nodes=4, num_jobs=10)
        assert all(j.progress is None for j in snap.jobs.values())
        on = PolluxPolicy().optimize(snap, {}, RNG)
        off = PolluxPolicy(remaining_power=0.0, settle=0.0).optimize(snap, {}, RNG)
        assert on.allocations == off.allocations


@pytest.mark.parametrize("seed", range(8))
def test_allocations_stay_valid_and_deterministic_with_progress(seed: int) -> None:
    snap = _with_progress(random_snapshot(seed, num_nodes=6, num_jobs=14), seed)
    policy = PolluxPolicy()
    first = policy.optimize(snap, {}, np.random.default_rng(1))
    validate_allocations(snap, first.allocations, first.packed)
    again = PolluxPolicy().optimize(snap, {}, np.random.default_rng(2))
    assert again.allocations == first.allocations


@pytest.mark.parametrize("seed", range(4))
def test_typed_allocations_stay_valid_with_progress(seed: int) -> None:
    snap = _with_progress(random_hetero_snapshot(seed, num_jobs=10), seed)
    decision = PolluxPolicy().optimize(snap, {}, RNG)
    validate_allocations(snap, decision.allocations, decision.packed)
    for name, alloc in decision.allocations.items():
        kinds = {n.gpu_type for n, k in zip(snap.nodes, alloc, strict=True) if k}
        assert len(kinds) <= 1, name
    assert PolluxPolicy().optimize(snap, {}, RNG).allocations == decision.allocations


def test_settle_keeps_a_job_that_cannot_recoup_a_restart() -> None:
    """A running job with less time left than δ is never worth moving (factor 0); one with
    unknown length or a long way to go keeps Pollux's factor."""
    nodes = (NodeInfo("n0", 4), NodeInfo("n1", 4))
    jobs = {
        # 1 GPU-s left on 2 GPUs: 0.5 s of remaining time, far below δ = 30 s.
        "ending": toy_job("ending", attained_service=10_000.0, progress=10_000.0 / 10_001.0),
        "long": toy_job("long", attained_service=10_000.0, progress=0.01),
        "unknown": toy_job("unknown", attained_service=10_000.0),
    }
    current = {"ending": (2, 0), "long": (0, 2), "unknown": (1, 0)}
    snap = ClusterSnapshot(now=20_000.0, nodes=nodes, jobs=jobs, current=current)
    plain = PolluxProblem(snap, levers=Levers())
    settled = PolluxProblem(snap, levers=Levers(settle=1.0))
    f_plain = dict(zip(plain.names, plain.realloc_factor, strict=True))
    f_settled = dict(zip(settled.names, settled.realloc_factor, strict=True))
    assert f_settled["ending"] == 0.0
    assert f_settled["unknown"] == f_plain["unknown"]
    # ~990,000 GPU-s left on 2 GPUs: the restart costs 30 s of ~5.7 days.
    assert f_settled["long"] == pytest.approx(f_plain["long"] * (1 - 30.0 / 495_000.0))


def test_progress_reaches_the_policy_clamped_and_bad_values_read_as_unknown() -> None:
    nodes = (NodeInfo("n0", 4),)
    facts = [
        JobFacts("ok", 0.0, progress=0.4),
        JobFacts("over", 0.0, progress=1.7),
        JobFacts("under", 0.0, progress=-0.2),
        JobFacts("nan", 0.0, progress=math.nan),
        JobFacts("none", 0.0),
    ]
    jobs = build_snapshot(facts, nodes, 1.0, 30.0).jobs
    assert [jobs[k].progress for k in ("ok", "over", "under", "nan", "none")] == [
        0.4,
        1.0,
        0.0,
        None,
        None,
    ]
    assert clamp_progress(math.inf) is None


def test_p_is_the_papers_until_a_job_declares_its_length() -> None:
    """The default's p = +0.5 pays only beside the remaining-work weight: a snapshot where no
    job reports progress is solved with p = -1 (exactly the policy with p = -1), one where a
    job does with p = +0.5."""
    policy = PolluxPolicy()
    for seed in range(4):
        snap = random_snapshot(seed, num_nodes=4, num_jobs=10)
        assert policy.problem(snap).p == -1.0
        paper = PolluxPolicy(p=-1.0, p_undeclared=None).optimize(snap, {}, RNG)
        assert policy.optimize(snap, {}, RNG).allocations == paper.allocations
        declared = _with_progress(snap, seed)
        assert policy.problem(declared).p == 0.5
    assert PolluxPolicy(p_undeclared=None).problem(snap).p == 0.5


def test_every_type_is_solved_with_the_whole_snapshots_p() -> None:
    """The one job reporting progress may run only on one type: every type's problem (and the
    fitness summed over them) still uses the whole snapshot's p = +0.5."""
    snap = random_hetero_snapshot(1, num_jobs=8)
    first = next(iter(snap.jobs))
    jobs = {k: replace(j, progress=None) for k, j in snap.jobs.items()}
    jobs[first] = replace(jobs[first], progress=0.5, gpu_types=("v100",))
    snap = replace(snap, jobs=jobs)
    built: list[float] = []

    class Recording(PolluxPolicy):
        def problem(
            self, snapshot: ClusterSnapshot, fair_share: int | None = None, p: float | None = None
        ) -> PolluxProblem:
            pb = super().problem(snapshot, fair_share, p)
            built.append(pb.p)
            return pb

    policy = Recording()
    assert policy.problem(type_snapshot(snap, "k80")).p == -1.0  # alone, k80 declares nothing
    built.clear()
    validate_allocations(snap, policy.optimize(snap, {}, RNG).allocations)
    assert len(built) >= len(snap.gpu_types) and set(built) == {0.5}
