"""``Levers.leap``: the optimiser's growth steps may look past one node's worth of GPUs.

The fixture is a real round of the artifact's workload 1 (``pollux-1`` at 0.93 h under the
default ``pollux``): an ImageNet job early in training (φ ≈ 950 samples) holds 3 GPUs of an
otherwise idle 16×4 cluster. Growing it by up to a node (4 → 8 GPUs) is worth less than
staying, once the restart's re-allocation factor is paid; 32 GPUs are worth 40-60% more. Steps
of at most a node never see that, so 61 GPUs stayed idle for half an hour.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from coadapt.policies import ClusterSnapshot, JobInfo, NodeInfo, validate_allocations
from coadapt.policies.pollux import PolluxPolicy
from coadapt.policies.pollux_problem import Levers, PolluxProblem

RNG = np.random.default_rng(0)


def _young_imagenet_round() -> ClusterSnapshot:
    perf = PerfParams(
        alpha_grad=0.07606824129797572,
        beta_grad=0.0044681344568250625,
        alpha_local=0.005931525512791344,
        beta_local=1.5357295298275167e-07,
        alpha_node=0.27937880310364405,
        beta_node=0.0036896313318624386,
        gamma=1.0180744971801827,
    )
    job = JobInfo(
        name="imagenet-11",
        submit_time=1604.0,
        attained_service=6240.0,
        num_restarts=3,
        max_replicas=64,
        max_gpus_held=8,
        goodput=GoodputModel(perf, GradParams(1.145230015683041, 5.412640991318982), 200),
        limits=BatchLimits(200, 12800, 20, 200),
        progress=0.008288807031867858,
    )
    nodes = tuple(NodeInfo(f"n{i}", 4) for i in range(16))
    held = tuple(3 if i == 13 else 0 for i in range(16))
    return ClusterSnapshot(
        now=3360.0,
        nodes=nodes,
        jobs={job.name: job},
        current={job.name: held},
        restart_delay=30.0,
    )


def test_a_growth_that_pays_only_when_large_is_found_with_leap() -> None:
    snap = _young_imagenet_round()
    stuck = PolluxPolicy(leap=False).optimize(snap, {}, RNG)
    assert sum(stuck.allocations["imagenet-11"]) == 3  # node-sized steps: stays
    grown = PolluxPolicy(leap=True).optimize(snap, {}, RNG)
    validate_allocations(snap, grown.allocations, grown.packed)
    assert sum(grown.allocations["imagenet-11"]) >= 16
    # The objective is the same; only the search differs, and it finds a far better state.
    assert grown.diagnostics["fitness"] > 1.3 * stuck.diagnostics["fitness"]
    assert PolluxPolicy().optimize(snap, {}, RNG).allocations == grown.allocations  # default


def test_leap_off_tries_every_count_up_to_a_node_only() -> None:
    assert Levers().growth_sizes(1, 4, 40, 4) == [1, 2, 3, 4]
    assert Levers(leap=True).growth_sizes(1, 4, 30, 4) == [1, 2, 3, 4, *range(8, 30, 4), 30]
    assert Levers(leap=True).growth_sizes(2, 5, 16, 4) == [2, 3, 4, 5, 8, 12, 16]
    assert Levers(leap=True).growth_sizes(1, 4, 4, 4) == [1, 2, 3, 4]


def test_phi_growth_prices_a_young_job_at_a_larger_noise_scale() -> None:
    """``Levers.phi_growth`` (screened, off by default): φ × (1 + g (1 − progress)) in the
    speedups, so large allocations look better for a young job; unknown progress: unchanged."""
    job = _young_imagenet_round().jobs["imagenet-11"]
    assert job.goodput is not None
    model = Levers(phi_growth=4.0).anticipated(job)
    assert model is not None
    growth = model.grad.pgns(200) / job.goodput.grad.pgns(200)
    assert growth == pytest.approx(1.0 + 4.0 * (1.0 - job.progress))  # type: ignore[operator]
    assert Levers().anticipated(job) is job.goodput
    assert Levers(phi_growth=4.0).anticipated(replace(job, progress=None)) is job.goodput
    snap = _young_imagenet_round()
    plain = PolluxProblem(snap).speedup_fns[0]
    grown = PolluxProblem(snap, levers=Levers(phi_growth=4.0)).speedup_fns[0]
    # 32 GPUs against 4: worth more relative to the small allocation once φ is anticipated.
    ratio_plain = plain.scalar(8, 32) / plain.scalar(1, 4)
    assert grown.scalar(8, 32) / grown.scalar(1, 4) > 1.2 * ratio_plain
