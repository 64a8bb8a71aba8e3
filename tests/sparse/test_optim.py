from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coadapt.sparse.optim import (
    SGD,
    AdaGrad,
    Adam,
    Ftrl,
    RowOptimizer,
    RowwiseAdaGrad,
    make_row_optimizer,
    row_optimizer_names,
)


def _rows(opt: RowOptimizer, n: int, dim: int, seed: int = 0) -> np.ndarray:
    rows = np.empty((n, dim + opt.state_width(dim)), dtype=np.float32)
    opt.init_rows(rows, dim, np.random.default_rng(seed))
    return rows


def test_every_optimizer_follows_the_protocol_and_is_bit_deterministic() -> None:
    dim = 8
    for name in row_optimizer_names():
        opt = make_row_optimizer(name)
        assert isinstance(opt, RowOptimizer)
        results = []
        for _ in range(2):
            rows = _rows(opt, 50, dim, seed=3)
            rng = np.random.default_rng(9)
            for step in range(1, 6):
                grads = rng.standard_normal((50, dim)).astype(np.float32)
                opt.apply(rows, grads, dim, step)
            results.append(rows.tobytes())
        assert results[0] == results[1], name
        assert np.isfinite(np.frombuffer(results[0], dtype=np.float32)).all(), name


def test_elementwise_adagrad_matches_torch() -> None:
    dim, n = 16, 40
    opt = AdaGrad(lr=0.05, initial_accumulator_value=0.1)
    rows = _rows(opt, n, dim, seed=1)
    param = torch.nn.Parameter(torch.from_numpy(rows[:, :dim].copy()))
    ref = torch.optim.Adagrad([param], lr=0.05, initial_accumulator_value=0.1, eps=1e-10)
    rng = np.random.default_rng(2)
    for step in range(1, 21):
        grads = rng.standard_normal((n, dim)).astype(np.float32)
        opt.apply(rows, grads, dim, step)
        param.grad = torch.from_numpy(grads.copy())
        ref.step()
    np.testing.assert_allclose(rows[:, :dim], param.detach().numpy(), rtol=0, atol=1e-6)
    state_sum = ref.state[param]["sum"].numpy()
    np.testing.assert_allclose(rows[:, dim:], state_sum, rtol=1e-6, atol=1e-6)


def test_rowwise_adagrad_matches_hand_computation() -> None:
    dim = 4
    opt = RowwiseAdaGrad(lr=0.5, eps=0.0 + 1e-10, init_scale=0.0)
    rows = _rows(opt, 1, dim)
    assert rows.shape == (1, 5) and not rows.any()
    g1 = np.array([[1.0, -1.0, 2.0, 0.0]], dtype=np.float32)
    opt.apply(rows, g1, dim, 1)
    acc = (1 + 1 + 4 + 0) / 4  # 1.5
    w = -0.5 * g1[0] / math.sqrt(acc)
    assert rows[0, dim] == pytest.approx(acc)
    np.testing.assert_allclose(rows[0, :dim], w, rtol=1e-6)
    g2 = np.array([[0.0, 2.0, 0.0, 2.0]], dtype=np.float32)
    opt.apply(rows, g2, dim, 2)
    acc += (4 + 4) / 4  # 3.5
    w = w - 0.5 * g2[0] / math.sqrt(acc)
    assert rows[0, dim] == pytest.approx(acc)
    np.testing.assert_allclose(rows[0, :dim], w, rtol=1e-6)


def _ftrl_reference(
    grads: list[float], alpha: float, beta: float, l1: float, l2: float
) -> tuple[float, float, float]:
    """Algorithm 1 of McMahan et al. 2013 for one coordinate, in float64."""
    z = n = w = 0.0
    for g in grads:
        sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / alpha
        z += g - sigma * w
        n += g * g
        if abs(z) <= l1:
            w = 0.0
        else:
            w = -(z - math.copysign(l1, z)) / ((beta + math.sqrt(n)) / alpha + l2)
    return z, n, w


def test_ftrl_matches_closed_form_on_one_coordinate() -> None:
    alpha, beta, l1, l2 = 0.1, 1.0, 0.3, 0.2
    opt = Ftrl(alpha=alpha, beta=beta, l1=l1, l2=l2)
    rows = _rows(opt, 1, 1)
    gs = [0.5, -0.2, 0.9, 0.4, -1.0, 0.7]
    for step, g in enumerate(gs, start=1):
        opt.apply(rows, np.array([[g]], dtype=np.float32), 1, step)
        z, n, w = _ftrl_reference(gs[:step], alpha, beta, l1, l2)
        assert rows[0, 1] == pytest.approx(z, rel=1e-5, abs=1e-6)
        assert rows[0, 2] == pytest.approx(n, rel=1e-5)
        assert rows[0, 0] == pytest.approx(w, rel=1e-5, abs=1e-7)
    # First step by hand: n = 0.25, sigma = 0.5/0.1 = 5, z = 0.5, |z| > l1 →
    # w = -(0.5 - 0.3) / ((1 + 0.5)/0.1 + 0.2) = -0.2/15.2.
    z1, n1, w1 = _ftrl_reference(gs[:1], alpha, beta, l1, l2)
    assert (z1, n1) == (0.5, 0.25) and w1 == pytest.approx(-0.2 / 15.2)


def test_ftrl_l1_puts_exact_zeros_in_weak_coordinates() -> None:
    dim, n = 10, 200
    opt = Ftrl(alpha=0.1, beta=1.0, l1=1.0)
    rows = _rows(opt, n, dim)
    rng = np.random.default_rng(0)
    # Coordinates 0..4 get a consistent signal, 5..9 only small zero-mean noise.
    signal = np.array([1.0] * 5 + [0.0] * 5, dtype=np.float32)
    for step in range(1, 31):
        noise = rng.normal(0, 0.05, size=(n, dim)).astype(np.float32)
        opt.apply(rows, signal + noise, dim, step)
    w = rows[:, :dim]
    assert (w[:, 5:] == 0.0).all()
    assert (w[:, :5] < 0).all()
    # Without L1 the weak coordinates are small but not exactly zero.
    dense = Ftrl(alpha=0.1, beta=1.0, l1=0.0)
    rows2 = _rows(dense, n, dim)
    rng = np.random.default_rng(0)
    for step in range(1, 31):
        noise = rng.normal(0, 0.05, size=(n, dim)).astype(np.float32)
        dense.apply(rows2, signal + noise, dim, step)
    assert (rows2[:, 5:dim] != 0.0).mean() > 0.9


def test_ftrl_random_init_is_reproduced_by_its_state() -> None:
    opt = Ftrl(alpha=0.1, l1=0.01, l2=0.5, init_scale=0.1)
    rows = _rows(opt, 20, 4, seed=5)
    w0 = rows[:, :4].copy()
    assert np.abs(w0).max() > 0
    # A zero gradient leaves n at 0 and z unchanged, so the recomputed weights equal the init.
    opt.apply(rows, np.zeros((20, 4), dtype=np.float32), 4, 1)
    np.testing.assert_allclose(rows[:, :4], w0, rtol=1e-5, atol=1e-7)


def test_sgd_and_adam_match_torch() -> None:
    dim, n = 6, 10
    rng = np.random.default_rng(4)
    grads_seq = [rng.standard_normal((n, dim)).astype(np.float32) for _ in range(5)]
    for opt, make_ref in (
        (SGD(lr=0.1), lambda p: torch.optim.SGD([p], lr=0.1)),
        (Adam(lr=0.01), lambda p: torch.optim.Adam([p], lr=0.01)),
    ):
        rows = _rows(opt, n, dim, seed=8)
        param = torch.nn.Parameter(torch.from_numpy(rows[:, :dim].copy()))
        ref = make_ref(param)
        for step, g in enumerate(grads_seq, start=1):
            opt.apply(rows, g, dim, step)
            param.grad = torch.from_numpy(g.copy())
            ref.step()
        np.testing.assert_allclose(rows[:, :dim], param.detach().numpy(), atol=1e-6)


def test_factory_errors_are_clear() -> None:
    with pytest.raises(ValueError, match=r"unknown row optimizer 'lbfgs'.*adagrad"):
        make_row_optimizer("lbfgs")
    with pytest.raises(ValueError, match=r"no hyper-parameter.*momentum.*accepts lr"):
        make_row_optimizer("adagrad", momentum=0.9)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        make_row_optimizer("sgd", lr=-1.0)
    with pytest.raises(ValueError, match="beta and l2 are both 0"):
        make_row_optimizer("ftrl", beta=0.0)
    assert make_row_optimizer("Adagrad-Rowwise", lr=0.1).name == "rowwise_adagrad"


def test_shape_and_dtype_mistakes_are_reported() -> None:
    opt = AdaGrad()
    with pytest.raises(ValueError, match="dim \\+ state_width = 8"):
        opt.apply(np.zeros((2, 5), np.float32), np.zeros((2, 4), np.float32), 4, 1)
    with pytest.raises(ValueError, match="grads must be float32 with shape \\(2, 4\\)"):
        opt.apply(np.zeros((2, 8), np.float32), np.zeros((2, 4), np.float64), 4, 1)
    with pytest.raises(TypeError, match="float32"):
        opt.apply(np.zeros((2, 8), np.float64), np.zeros((2, 4), np.float32), 4, 1)
