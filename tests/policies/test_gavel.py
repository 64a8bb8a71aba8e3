"""The Gavel-style baseline: the max-min LP, its rounding to whole GPUs, rounds, packing."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.policies import (
    POLICY_NAMES,
    BatchMode,
    ClusterSnapshot,
    JobInfo,
    NodeInfo,
    make_policy,
    state_to_json,
    validate_allocations,
)
from coadapt.policies.gavel import GavelPolicy, max_min_shares, throughput_matrix

RNG = np.random.default_rng(0)
PERF = PerfParams(0.05, 0.002, 0.01, 0.001, 0.05, 0.005, 1.5)
LIMITS = BatchLimits(64, 64, 8, 64, pinned_batch=64)


def _model(speed: float) -> GoodputModel:
    perf = PerfParams(
        PERF.alpha_grad / speed, PERF.beta_grad / speed, *PERF.as_array()[2:].tolist()
    )
    return GoodputModel(perf, GradParams(1.0, 1.0), 64)


def _job(name: str, gpus: int, speeds: dict[str, float] | None = None, **kw: object) -> JobInfo:
    by_type = {t: _model(s) for t, s in speeds.items()} if speeds else None
    return JobInfo(
        name=name,
        submit_time=0.0,
        requested_replicas=gpus,
        max_replicas=gpus,
        limits=LIMITS,
        goodput_by_type=by_type,
        **kw,  # type: ignore[arg-type]
    )


def _snap(
    jobs: list[JobInfo],
    now: float = 600.0,
    current: dict[str, tuple[int, ...]] | None = None,
    colocation: dict[tuple[str, str], tuple[float, float]] | None = None,
) -> ClusterSnapshot:
    nodes = (NodeInfo("v0", 4, "v100"), NodeInfo("k0", 4, "k80"), NodeInfo("k1", 4, "k80"))
    return ClusterSnapshot(
        now=now,
        nodes=nodes,
        jobs={j.name: j for j in jobs},
        current=current or {},
        colocation=colocation or {},
    )


def test_registered_and_fixed_mode() -> None:
    assert "gavel" in POLICY_NAMES
    policy = make_policy("gavel")
    assert isinstance(policy, GavelPolicy) and policy.batch_mode is BatchMode.FIXED


def test_lp_sends_each_job_where_it_gains_most() -> None:
    tput = np.array([[10.0, 1.0], [1.0, 1.0]])
    x = max_min_shares(tput, np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    assert x == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-6)


def test_lp_respects_capacity_and_time_and_equalises_normalised_throughput() -> None:
    rng = np.random.default_rng(4)
    tput = rng.uniform(0.5, 5.0, size=(6, 3))
    want = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 4.0])
    cap = np.array([4.0, 4.0, 8.0])
    x = max_min_shares(tput, want, cap)
    assert np.all(x >= -1e-9) and np.all(x.sum(axis=1) <= 1 + 1e-6)
    assert np.all(want @ x <= cap + 1e-6)
    share = min(1.0, cap.sum() / want.sum())
    equal = share * (tput * cap / cap.sum()).sum(axis=1)
    normalised = (x * tput).sum(axis=1) / equal
    assert normalised.min() >= 1.0 - 1e-6  # max-min never does worse than an equal share


def test_forbidden_pairs_get_no_share() -> None:
    tput = np.array([[0.0, 2.0], [3.0, 1.0]])
    x = max_min_shares(tput, np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    assert x[0, 0] == 0.0


def test_throughput_matrix_prices_per_type_and_masks_what_cannot_run() -> None:
    jobs = [
        _job("fast-on-v", 2, {"v100": 4.0, "k80": 1.0}),
        _job("new", 2),
        _job("k80-only", 2, {"v100": 4.0, "k80": 1.0}, gpu_types=("k80",)),
        _job("huge", 6, {"v100": 4.0, "k80": 1.0}),
    ]
    snap = _snap(jobs)
    names = [j.name for j in jobs]
    m = throughput_matrix(snap, names, {j.name: j.requested_replicas or 0 for j in jobs})
    k80, v100 = snap.gpu_types.index("k80"), snap.gpu_types.index("v100")
    assert m[0, v100] > 2.0 * m[0, k80] > 0
    assert m[1, v100] == m[1, k80] == 1.0  # unknown: priced alike
    assert m[2, v100] == 0.0 and m[2, k80] > 0
    assert m[3, v100] == 0.0 and m[3, k80] > 0  # 6 GPUs: only the K80s have room


def test_allocations_are_valid_whole_requests_on_one_type() -> None:
    jobs = [_job(f"j{i}", g, {"v100": 3.0, "k80": 1.0}) for i, g in enumerate([1, 2, 4, 4, 2, 1])]
    snap = _snap(jobs)
    decision = GavelPolicy().optimize(snap, {}, RNG)
    validate_allocations(snap, decision.allocations, decision.packed)
    for name, alloc in decision.allocations.items():
        assert sum(alloc) == snap.jobs[name].requested_replicas
        assert len({snap.nodes[i].gpu_type for i, x in enumerate(alloc) if x}) == 1
    state_to_json(decision.state)


def test_between_rounds_running_jobs_keep_their_gpus() -> None:
    policy = GavelPolicy(round_s=360.0)
    jobs = [_job("a", 4, {"v100": 3.0, "k80": 1.0}), _job("b", 4, {"v100": 3.0, "k80": 1.0})]
    first = policy.optimize(_snap(jobs, now=0.0), {}, RNG)
    assert first.state["round_at"] == 0.0
    second = policy.optimize(_snap(jobs, now=60.0, current=first.allocations), first.state, RNG)
    assert second.allocations == first.allocations and second.state["round_at"] == 0.0
    third = policy.optimize(_snap(jobs, now=360.0, current=second.allocations), second.state, RNG)
    assert third.state["round_at"] == 360.0


def test_time_on_each_type_is_accounted() -> None:
    policy = GavelPolicy()
    jobs = [_job("a", 4, {"v100": 3.0, "k80": 1.0})]
    d = policy.optimize(_snap(jobs, now=0.0), {}, RNG)
    d = policy.optimize(_snap(jobs, now=60.0, current=d.allocations), d.state, RNG)
    kind = "v100" if d.allocations["a"][0] else "k80"
    assert d.state["received"]["a"] == {kind: 60.0}


def test_packs_a_waiting_one_gpu_job_on_a_lone_one_gpu_job_when_it_pays() -> None:
    nodes = (NodeInfo("v0", 1, "v100"),)
    jobs = {
        "a": _job("a", 1, packing_key="x"),
        "b": _job("b", 1, packing_key="y"),
        "c": _job("c", 1),  # no packing key: never shares
    }
    good = {("x", "y"): (0.7, 0.6), ("y", "x"): (0.6, 0.7)}
    snap = ClusterSnapshot(now=0.0, nodes=nodes, jobs=jobs, colocation=good)
    d = GavelPolicy().optimize(snap, {}, RNG)
    assert len(d.packed) == 1
    guest, host = next(iter(d.packed.items()))
    assert {guest, host} == {"a", "b"} and d.allocations[guest] == d.allocations[host]
    validate_allocations(snap, d.allocations, d.packed)
    bad = {("x", "y"): (0.4, 0.5), ("y", "x"): (0.5, 0.4)}  # sum < 1: sharing loses
    snap = ClusterSnapshot(now=0.0, nodes=nodes, jobs=jobs, colocation=bad)
    assert GavelPolicy().optimize(snap, {}, RNG).packed == {}
    assert (
        GavelPolicy(packing=False)
        .optimize(ClusterSnapshot(now=0.0, nodes=nodes, jobs=jobs, colocation=good), {}, RNG)
        .packed
        == {}
    )
