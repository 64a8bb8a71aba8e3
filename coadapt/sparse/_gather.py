"""Copy the embedding columns of table rows out of the row arena: one pass, rows prefetched.

Why: ``EmbeddingTable.weights`` gathers whole rows (embedding + optimizer state) into a scratch
buffer and then copies the embedding columns out: two passes over the batch, the first one a
cache miss per row. This kernel reads each row's ``dim`` columns straight into the output and
prefetches the rows a few positions ahead, so several misses are in flight at once.
``None`` without numba (or with ``COADAPT_NO_JIT=1``): the caller keeps the numpy path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from coadapt._jit import kernel
from coadapt.sparse._probe import _prefetch2

__all__ = ["gather_embeddings"]

_AHEAD = 8
"""Rows prefetched ahead of the copy (a row of 64 floats + state spans 4-5 cache lines)."""


@kernel()
def _gather(arena: Any, idx: Any, out: Any, dim: int) -> None:  # pragma: no cover - compiled
    n = idx.size
    for i in range(-_AHEAD, n):
        if i + _AHEAD < n:
            nxt = idx[i + _AHEAD]
            for c in range(0, dim, 16):  # a prefetch per 64 bytes of the embedding, and its
                _prefetch2(arena, nxt, c)  # last column: rows need not start on a line
            _prefetch2(arena, nxt, dim - 1)
        if i < 0:
            continue
        s = idx[i]
        for c in range(dim):
            out[i, c] = arena[s, c]


def gather_embeddings(
    arena: npt.NDArray[np.float32], idx: npt.NDArray[np.int64], out: npt.NDArray[np.float32]
) -> bool:
    """``out[:] = arena[idx, :out.shape[1]]`` when the compiled kernel exists and the arrays
    have the layout it needs (float32, C-contiguous rows, in-range int64 indices); False
    (nothing written) otherwise, so the caller takes the numpy path."""
    if _gather is None or _prefetch2 is None:
        return False
    if (
        arena.dtype != np.float32
        or arena.ndim != 2
        or not arena.flags.c_contiguous
        or out.dtype != np.float32
        or out.ndim != 2
        or out.shape[0] != idx.size
        or out.shape[1] > arena.shape[1]
        or idx.dtype != np.int64
    ):
        return False
    if idx.size == 0:
        return True  # nothing to copy (and an empty array's strides say nothing)
    if out.strides[1] != 4:
        return False
    if idx.min() < 0 or idx.max() >= arena.shape[0]:
        raise IndexError(f"row indices out of range [0, {arena.shape[0]}) for the row arena")
    _gather(arena, idx, out, out.shape[1])
    return True
