"""The fused optimizer kernels give the numpy path's rows (gather, update, scatter)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from coadapt.sparse._optim_kernels import fused_apply, fused_available
from coadapt.sparse.optim import SGD, AdaGrad, Adam, Ftrl, RowwiseAdaGrad

pytestmark = pytest.mark.skipif(not fused_available(), reason="numba missing or COADAPT_NO_JIT")

OPTS: list[Any] = [
    SGD(lr=0.05),
    AdaGrad(lr=0.1, initial_accumulator_value=0.1),
    RowwiseAdaGrad(lr=0.1),
    Ftrl(alpha=0.1, beta=1.0, l1=0.05, l2=0.01, init_scale=0.01),
]


def _arena(opt: Any, n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arena = np.empty((n, dim + opt.state_width(dim)), np.float32)
    opt.init_rows(arena, dim, rng)
    return arena


def _numpy_reference(
    opt: Any, arena: np.ndarray, slots: np.ndarray, grads: np.ndarray, dim: int, step: int
) -> None:
    rows = arena[slots]  # gather
    opt._numpy(rows, grads, dim, step)
    arena[slots] = rows  # scatter: the last duplicate wins


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
@pytest.mark.parametrize("dup", [False, True], ids=["unique", "duplicates"])
def test_kernel_equals_numpy(opt: Any, dup: bool) -> None:
    dim, n_rows = 16, 500
    ref = _arena(opt, n_rows, dim, seed=1)
    got = ref.copy()
    rng = np.random.default_rng(2)
    for step in range(1, 6):
        if dup:
            slots = rng.integers(0, 60, size=200).astype(np.int64)  # many repeats
        else:
            slots = rng.permutation(n_rows)[:200].astype(np.int64)
        grads = rng.normal(0, 1, size=(slots.size, dim)).astype(np.float32)
        _numpy_reference(opt, ref, slots, grads, dim, step)
        assert fused_apply(opt, got, slots, grads, dim, step, unique=not dup)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(got, _arena(opt, n_rows, dim, seed=1))  # something moved


def test_ftrl_l1_sparsity_matches() -> None:
    opt = Ftrl(alpha=0.1, l1=2.0)  # strong L1: most weights must be exactly 0
    dim = 8
    ref = _arena(opt, 100, dim, seed=3)
    got = ref.copy()
    rng = np.random.default_rng(4)
    for step in range(1, 4):
        slots = np.arange(100, dtype=np.int64)
        grads = (rng.normal(0, 0.5, size=(100, dim)) + 0.3).astype(np.float32)
        _numpy_reference(opt, ref, slots, grads, dim, step)
        assert fused_apply(opt, got, slots, grads, dim, step)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    zeros = got[:, :dim] == 0
    assert zeros.mean() > 0.5
    assert np.array_equal(zeros, ref[:, :dim] == 0)


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_apply_uses_same_math(opt: Any) -> None:
    """``opt.apply`` (kernel on gathered rows) equals ``opt._numpy`` on a copy."""
    dim = 64
    rows = _arena(opt, 300, dim, seed=5)
    ref = rows.copy()
    grads = np.random.default_rng(6).normal(0, 1, size=(300, dim)).astype(np.float32)
    opt.apply(rows, grads, dim, 1)
    opt._numpy(ref, grads, dim, 1)
    np.testing.assert_allclose(rows, ref, rtol=1e-6, atol=1e-7)


def test_unsupported_falls_back() -> None:
    dim = 4
    adam = Adam()
    arena = _arena(adam, 10, dim, seed=0)
    grads = np.ones((2, dim), np.float32)
    slots = np.array([1, 2], np.int64)
    assert not fused_apply(adam, arena, slots, grads, dim, 1)  # no Adam kernel
    sgd = SGD()
    a2 = _arena(sgd, 10, dim, seed=0)
    assert not fused_apply(sgd, a2, slots, grads.astype(np.float64), dim, 1)  # wrong dtype
    assert not fused_apply(sgd, a2[:, :2], slots, grads[:, :2], 2, 1)  # not contiguous


def test_out_of_range_slot_is_an_error() -> None:
    sgd = SGD()
    arena = _arena(sgd, 10, 4, seed=0)
    with pytest.raises(IndexError, match="slots out of range"):
        fused_apply(sgd, arena, np.array([10], np.int64), np.ones((1, 4), np.float32), 4, 1)
