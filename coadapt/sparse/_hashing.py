"""Bijective 64-bit mixing shared by the embedding table and the data generator.

The table stores mixed keys so that bucket and segment choices come from well-spread bits, and
it must recover the original feature ID for save/iteration — hence a *bijective* mixer
(the splitmix64 finaliser) together with its exact inverse.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U64Array = npt.NDArray[np.uint64]

_M64 = (1 << 64) - 1
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_C1_ = np.uint64(_C1)
_C2_ = np.uint64(_C2)
_I1 = np.uint64(pow(_C1, -1, 1 << 64))
_I2 = np.uint64(pow(_C2, -1, 1 << 64))


def _unxorshift(z: U64Array, shift: int) -> U64Array:
    """Invert ``z ^= z >> shift``."""
    out = z.copy()
    k = shift
    while k < 64:
        out ^= z >> np.uint64(k)
        k += shift
    return out


def mix64(x: npt.ArrayLike) -> U64Array:
    """splitmix64 finaliser: a bijection on uint64 with good avalanche (vectorised)."""
    z = np.array(x, dtype=np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= _C1_
    z ^= z >> np.uint64(27)
    z *= _C2_
    z ^= z >> np.uint64(31)
    return z


def unmix64(z: npt.ArrayLike) -> U64Array:
    """Exact inverse of :func:`mix64`."""
    x = np.array(z, dtype=np.uint64, copy=True)
    x = _unxorshift(x, 31)
    x *= _I2
    x = _unxorshift(x, 27)
    x *= _I1
    return _unxorshift(x, 30)


def as_u64_keys(keys: npt.ArrayLike, what: str = "keys") -> U64Array:
    """Validate a 1-D integer array of feature IDs and view it as uint64.

    Signed int64 IDs (what torch hands out) are reinterpreted bit-for-bit, so -1 and
    2**64-1 are the same feature ID.
    """
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(
            f"{what} must be a 1-D array of integer feature IDs, got shape {arr.shape}"
        )
    if arr.dtype == np.uint64:
        return arr
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{what} must be integer feature IDs (uint64/int64), got dtype {arr.dtype}; "
            "hash string features to 64-bit integers first"
        )
    if np.issubdtype(arr.dtype, np.signedinteger):
        return arr.astype(np.int64).view(np.uint64)
    return arr.astype(np.uint64)
