"""The compiled embedding gather equals numpy's fancy indexing, and refuses what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.sparse._gather import _gather, gather_embeddings

needs_jit = pytest.mark.skipif(_gather is None, reason="numba missing or COADAPT_NO_JIT")


@needs_jit
@pytest.mark.parametrize(("width", "dim"), [(65, 64), (17, 16), (3, 1), (8, 8), (48, 16)])
@pytest.mark.parametrize("n", [0, 1, 5, 1000])
def test_gather_equals_fancy_indexing(width: int, dim: int, n: int) -> None:
    rng = np.random.default_rng(width * 1000 + n)
    arena = rng.standard_normal((500, width)).astype(np.float32)
    idx = rng.integers(0, 500, n).astype(np.int64)  # repeats included
    out = np.full((n, dim), np.nan, np.float32)
    assert gather_embeddings(arena, idx, out)
    np.testing.assert_array_equal(out, arena[idx, :dim])


@needs_jit
def test_gather_writes_into_a_slice_of_a_joined_buffer() -> None:
    arena = np.arange(40, dtype=np.float32).reshape(10, 4)
    joined = np.zeros((6, 2), np.float32)
    assert gather_embeddings(arena, np.array([9, 0, 3], np.int64), joined[2:5])
    np.testing.assert_array_equal(joined[2:5], arena[[9, 0, 3], :2])
    assert not joined[[0, 1, 5]].any()


@needs_jit
def test_out_of_range_rows_are_an_error_not_a_wild_read() -> None:
    arena = np.zeros((10, 4), np.float32)
    with pytest.raises(IndexError, match=r"out of range \[0, 10\)"):
        gather_embeddings(arena, np.array([3, 10], np.int64), np.empty((2, 4), np.float32))


def test_layouts_the_kernel_cannot_take_fall_back() -> None:
    arena = np.zeros((10, 4), np.float32)
    idx = np.array([1, 2], np.int64)
    assert not gather_embeddings(arena.astype(np.float64), idx, np.empty((2, 4), np.float32))
    assert not gather_embeddings(arena, idx.astype(np.int32), np.empty((2, 4), np.float32))
    assert not gather_embeddings(arena, idx, np.empty((2, 5), np.float32))  # wider than a row
    assert not gather_embeddings(arena, idx, np.empty((4, 2), np.float32).T)  # strided columns
