"""Each equation of the goodput model against hand-computed values (seed 000 eq. 5-14)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    efficiency,
    grad_time,
    iter_time,
    should_adopt,
    sync_time,
    total_batch,
)

PERF = PerfParams(
    alpha_grad=0.1,
    beta_grad=0.01,
    alpha_local=0.05,
    beta_local=0.02,
    alpha_node=0.3,
    beta_node=0.05,
    gamma=1.0,
)


def test_grad_time_is_linear_in_micro_batch() -> None:
    assert grad_time(PERF, 10) == pytest.approx(0.2)
    np.testing.assert_allclose(grad_time(PERF, [0, 100]), [0.1, 1.1])


@pytest.mark.parametrize(
    ("nodes", "replicas", "expected"),
    [
        (1, 1, 0.0),  # one GPU: nothing to synchronise
        (1, 2, 0.05),  # two GPUs on a node: alpha_local only
        (1, 4, 0.05 + 0.02 * 2),  # retrogression beyond two replicas
        (2, 2, 0.3),  # across nodes: alpha_node
        (2, 8, 0.3 + 0.05 * 6),
    ],
)
def test_sync_time_by_placement(nodes: int, replicas: int, expected: float) -> None:
    assert float(sync_time(PERF, nodes, replicas)) == pytest.approx(expected)


def test_iter_time_eq12_no_overlap_and_overlap() -> None:
    # gamma = 1: T = s*Tg + Tg + Ts ; Tg(10) = 0.2, Ts(1 node, 2 GPUs) = 0.05
    assert float(iter_time(PERF, 1, 2, 10, 0)) == pytest.approx(0.25)
    assert float(iter_time(PERF, 1, 2, 10, 3)) == pytest.approx(3 * 0.2 + 0.25)
    # gamma = 2 with Tg = 0.3, Ts = 0.4: (0.09 + 0.16) ** 0.5 = 0.5
    p = PerfParams(0.3, 0.0, 0.4, 0.0, 0.4, 0.0, 2.0)
    assert float(iter_time(p, 1, 2, 7, 0)) == pytest.approx(0.5)
    assert float(iter_time(p, 1, 2, 7, 2)) == pytest.approx(0.6 + 0.5)
    # gamma -> large approaches max(Tg, Ts)
    p10 = PerfParams(0.3, 0.0, 0.4, 0.0, 0.4, 0.0, 10.0)
    assert float(iter_time(p10, 1, 2, 7, 0)) == pytest.approx(0.4, rel=0.01)


def test_total_batch_and_throughput_eq8() -> None:
    assert float(total_batch(4, 16, 1)) == 128.0
    model = GoodputModel(PERF, GradParams(1.0, 0.0), 32)
    # 4 GPUs, m = 16, s = 1 -> M = 128, T = 0.26 + (0.26 + 0.09) = 0.61
    assert float(model.throughput(1, 4, 16, 1)) == pytest.approx(128 / 0.61)


def test_efficiency_eq7_matches_pgns_form() -> None:
    grad = GradParams(sqr=1.0, var=4.0)  # phi = M0 * var / sqr = 40 for M0 = 10
    assert grad.pgns(10) == pytest.approx(40.0)
    assert float(efficiency(grad, 10, 10)) == pytest.approx(1.0)
    assert float(efficiency(grad, 10, 30)) == pytest.approx(50.0 / 70.0)
    # noiseless gradient: efficiency is M0 / M; pure noise: 1
    assert float(efficiency(GradParams(1.0, 0.0), 10, 40)) == pytest.approx(0.25)
    assert float(efficiency(GradParams(0.0, 1.0), 10, 40)) == pytest.approx(1.0)
    assert float(efficiency(GradParams(0.0, 0.0), 10, 40)) == pytest.approx(0.25)


def test_goodput_eq5_is_throughput_times_efficiency() -> None:
    model = GoodputModel(PERF, GradParams(1.0, 4.0), 10)
    tp = float(model.throughput(2, 8, 5, 0))
    eff = float(efficiency(GradParams(1.0, 4.0), 10, 40))
    assert float(model.goodput(2, 8, 5, 0)) == pytest.approx(tp * eff)


def _brute_force_best(model: GoodputModel, nodes: int, replicas: int, lim: BatchLimits) -> float:
    best = 0.0
    upper = lim.upper_local_bsz
    for batch in range(
        max(lim.init_batch_size, replicas * lim.min_local_bsz), lim.max_batch_size + 1
    ):
        local = batch / replicas
        s = max(math.ceil(local / upper - 1e-8) - 1, 0)
        if replicas == 1 and local > lim.init_batch_size:
            s = max(s, 1)
        m = math.ceil(local / (s + 1) - 1e-8)
        if lim.min_local_bsz <= m <= upper:
            best = max(best, float(model.goodput(nodes, replicas, m, s)))
    return best


@pytest.mark.parametrize(("nodes", "replicas"), [(1, 1), (1, 4), (2, 8), (4, 16)])
def test_optimize_eq14_is_near_brute_force(nodes: int, replicas: int) -> None:
    model = GoodputModel(PERF, GradParams(1.0, 20.0), 32)
    lim = BatchLimits(32, 2048, min_local_bsz=4, max_local_bsz=64)
    choice = model.optimize(nodes, replicas, lim)
    brute = _brute_force_best(model, nodes, replicas, lim)
    assert float(choice.goodput) <= brute * (1 + 1e-9)
    assert float(choice.goodput) >= brute * 0.98  # a 50-point geometric grid
    m, s = int(choice.local_bsz), int(choice.accum_steps)
    assert 4 <= m <= 64
    assert float(model.goodput(nodes, replicas, m, s)) == pytest.approx(float(choice.goodput))


def test_optimize_single_gpu_growing_past_m0_accumulates() -> None:
    noisy = GoodputModel(PERF, GradParams(1.0, 1000.0), 32)
    choice = noisy.optimize(1, 1, BatchLimits(32, 1024, 1, 512))
    assert int(choice.local_bsz) * (int(choice.accum_steps) + 1) > 32
    assert int(choice.accum_steps) >= 1


def test_optimize_pinned_batch_keeps_total() -> None:
    model = GoodputModel(PERF, GradParams(1.0, 20.0), 32)
    lim = BatchLimits(32, 4096, 1, 64, pinned_batch=512)
    choice = model.optimize([1, 1, 2], [1, 4, 8], lim)
    totals = choice.total_batch
    assert np.all(totals >= 512) and np.all(totals < 512 * 1.15)
    assert np.all(choice.local_bsz <= 64)


def test_optimize_infeasible_allocation_has_zero_goodput() -> None:
    model = GoodputModel(PERF, GradParams(1.0, 20.0), 32)
    # 16 GPUs x min micro-batch 8 = 128 > max batch 64
    choice = model.optimize(4, 16, BatchLimits(32, 64, min_local_bsz=8))
    assert float(choice.goodput) == 0.0


def test_optimize_is_vectorised_like_scalar_calls() -> None:
    model = GoodputModel(PERF, GradParams(1.0, 20.0), 32)
    lim = BatchLimits(32, 2048, 4, 64)
    nodes, reps = np.array([1, 1, 2, 4]), np.array([1, 4, 8, 16])
    vec = model.optimize(nodes, reps, lim).goodput
    one = [
        float(model.optimize(int(n), int(r), lim).goodput) for n, r in zip(nodes, reps, strict=True)
    ]
    np.testing.assert_allclose(vec, one)


def test_batch_limits_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchLimits(init_batch_size=64, max_batch_size=32)
    with pytest.raises(ValueError, match="max_local_bsz"):
        BatchLimits(init_batch_size=8, max_batch_size=64, min_local_bsz=16, max_local_bsz=8)


def test_should_adopt_threshold() -> None:
    assert not should_adopt(100.0, 104.0)
    assert should_adopt(100.0, 106.0)
    assert should_adopt(0.0, 1.0)
