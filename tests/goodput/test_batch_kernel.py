"""The compiled batch choice (``coadapt.goodput._batch_kernel``) gives what the numpy path
gives, query by query: the same micro-batch and accumulation, and the same goodput to the last
bits (bit for bit where numpy's ``pow`` is the C library's; on AVX-512 CPUs numpy uses a SIMD
``pow`` that may round the last bit differently, so goodput is compared within ``MAX_ULP``)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from coadapt._jit import ENV_NO_JIT
from coadapt.goodput import model as goodput_model
from coadapt.goodput._batch_kernel import compiled
from coadapt.goodput.model import (
    COLUMN_CHUNK,
    BatchColumns,
    _optimize_slice,
    optimize_columns,
)
from tests.policies.builders import random_model

needs_numba = pytest.mark.skipif(
    os.environ.get(ENV_NO_JIT, "") not in ("", "0"), reason=f"{ENV_NO_JIT} is set"
)


def _columns(seed: int, jobs: int = 40) -> tuple[BatchColumns, np.ndarray, np.ndarray]:
    """Queries of varied jobs: free, pinned, without accumulation, accumulating to measure,
    and some shapes no batch fits (0 GPUs, more GPUs than micro-batches)."""
    rng = np.random.default_rng(seed)
    models, limits, counts = [], [], []
    for i in range(jobs):
        m, lim = random_model(rng)
        kind = i % 4
        if kind == 1:
            lim = replace(lim, pinned_batch=lim.max_batch_size)
        elif kind == 2:
            lim = replace(lim, accumulation=False)
        elif kind == 3:
            lim = replace(lim, max_local_bsz=64, accumulate_to_measure=False)
        models.append(m)
        limits.append(lim)
        counts.append(int(rng.integers(20, 90)))
    cols = BatchColumns.of(models, limits, counts)
    q = sum(counts)
    reps = rng.integers(0, 200, q)
    nodes = np.where(rng.random(q) < 0.5, 1, np.maximum(-(-reps // 4), 1))
    return cols, nodes, reps


MAX_ULP = 4
"""Seen here: <= 2 ulp between numpy's AVX-512 ``pow`` and the C library's."""


def _assert_same_choice(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    good, *choices = got
    want_good, *want_choices = want
    for a, b in zip(choices, want_choices, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.isnan(good), np.isnan(want_good))
    finite = ~np.isnan(want_good)
    np.testing.assert_array_max_ulp(good[finite], want_good[finite], maxulp=MAX_ULP)


def _numpy(cols: BatchColumns, nodes: np.ndarray, reps: np.ndarray) -> list[np.ndarray]:
    parts = [
        _optimize_slice(cols.columns(a, a + COLUMN_CHUNK), nodes[a : a + 512], reps[a : a + 512])
        for a in range(0, reps.size, COLUMN_CHUNK)
    ]
    return [np.concatenate(p) for p in zip(*parts, strict=True)]


@pytest.fixture
def always_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled pass for calls of any size (small ones stay on numpy otherwise)."""
    monkeypatch.setattr(goodput_model, "COMPILED_MIN_QUERIES", 0)


@needs_numba
@pytest.mark.parametrize("seed", range(4))
def test_compiled_choice_is_the_numpy_one(seed: int, always_compiled: None) -> None:
    assert compiled() is not None  # numba is a core dependency
    cols, nodes, reps = _columns(seed)
    got = optimize_columns(cols, nodes, reps)
    want = _numpy(cols, nodes, reps)
    assert (want[0] == 0).any() and (want[0] > 0).any()  # both feasible and infeasible queries
    _assert_same_choice(got, want)


@needs_numba
def test_a_nan_model_gives_the_first_nan_as_numpy_argmax_does(always_compiled: None) -> None:
    cols, nodes, reps = _columns(7, jobs=4)
    cols.perf[6, :30] = np.nan  # gamma
    cols.var[30:60] = np.nan
    got = optimize_columns(cols, nodes, reps)
    want = _numpy(cols, nodes, reps)
    assert np.isnan(want[0]).any()
    _assert_same_choice(got, want)


def test_without_numba_the_slices_are_the_whole_numpy_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(goodput_model, "compiled_choice", lambda: None)
    cols, nodes, reps = _columns(3)
    assert reps.size > 2 * COLUMN_CHUNK
    whole = _optimize_slice(cols, nodes, reps)
    for a, b in zip(optimize_columns(cols, nodes, reps), whole, strict=True):
        np.testing.assert_array_equal(a, b)


def test_small_calls_stay_on_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call below COMPILED_MIN_QUERIES never asks for the kernel (no numba import or
    compile in a small cluster's controller); a larger one does."""
    asked: list[bool] = []

    def kernel() -> None:
        asked.append(True)

    monkeypatch.setattr(goodput_model, "compiled_choice", kernel)
    cols, nodes, reps = _columns(1, jobs=2)
    small = goodput_model.COMPILED_MIN_QUERIES - 1
    optimize_columns(cols.columns(0, small), nodes[:small], reps[:small])
    assert not asked
    cols, nodes, reps = _columns(1, jobs=40)
    optimize_columns(cols, nodes, reps)
    assert asked
