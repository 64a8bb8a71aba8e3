"""Compiled one-pass probe of the embedding table (``EmbeddingTable._find`` per key, fused).

Why: the numpy probe makes ~20 passes over a batch (mix, segment, two fastrange buckets, two
64-byte gathers, compares, flag tricks), each writing a batch-sized temporary; for the 100k IDs
of a CTR request that was two thirds of the request. One loop per key does the same arithmetic
in registers and touches memory only for the (one or two) key buckets and the row it copies.

Every kernel here reproduces the numpy path bit for bit: splitmix64 (``_hashing.mix64``), the
segment from the high bits, the stored value (segment bits swapped for the flag), fastrange on
two disjoint bit fields with ``b2 = (b1 + 1) % nb`` when both choices coincide, the first
bucket before the second, the lowest matching slot. ``tests/sparse/test_probe.py`` compares the
two paths. The kernels are ``None`` when numba is absent or ``COADAPT_NO_JIT=1`` (see ``_jit``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from coadapt._jit import jit_available, kernel

__all__ = ["probe_keys", "probe_stored", "split_shards", "take_found", "warm"]

_BUCKET = 8
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_FLAG = np.uint64(1 << 63)
_LOW32 = np.uint64(0xFFFFFFFF)
_S27 = np.uint64(27)
_S30 = np.uint64(30)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_ONE = np.uint64(1)


def _make_prefetch() -> tuple[Any, Any]:
    """``prefetch(vector, i)`` and ``prefetch2(matrix, i, j)``: an x86 ``prefetcht0`` / ARM
    ``prfm`` of that element (LLVM's ``llvm.prefetch``); None without numba. Unlike a load, a
    prefetch retires at once, so a block's cache misses overlap without filling the reorder
    buffer."""
    if not jit_available():
        return None, None
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, aryty, ary, list(args[1:]), wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    @intrinsic
    def prefetch(typingctx: Any, arr: Any, i: Any) -> Any:
        if not isinstance(arr, types.Array) or arr.ndim != 1:
            return None
        return types.void(arr, i), codegen

    @intrinsic
    def prefetch2(typingctx: Any, arr: Any, i: Any, j: Any) -> Any:
        if not isinstance(arr, types.Array) or arr.ndim != 2:
            return None
        return types.void(arr, i, j), codegen

    return prefetch, prefetch2


_prefetch, _prefetch2 = _make_prefetch()

H = TypeVar("H", bound=Callable[..., Any])


def _helper(fn: H) -> H:
    """A kernel that only other kernels call: compiled when they are, else the plain function
    (never called then: every public kernel is None)."""
    compiled = kernel()(fn)
    return fn if compiled is None else compiled


_BLOCK = 32
"""Keys hashed (and their buckets prefetched) ahead of the scan: the scan's branch on the
matching slot mispredicts about once a key, which stops the CPU from running ahead to the next
key's cache miss; prefetching a block's buckets (then its rows) first keeps many misses in
flight instead of one (figures in docs/serve.md)."""


@_helper
def _bucket_pair(  # pragma: no cover - compiled; exercised through the kernels
    stored: Any, seg: Any, n: Any, seg_buckets: Any, b2_bits: Any
) -> tuple[Any, Any]:
    """First slots of both candidate buckets of one stored value, segment ``seg`` holding
    ``n`` buckets: ``EmbeddingTable._buckets`` (also the serving look-up's,
    :mod:`coadapt.sparse._serve_lookup`)."""
    lo1 = np.int64(stored & _LOW32)
    lo2 = np.int64((stored >> _S32) & ((_ONE << np.uint64(b2_bits)) - _ONE))
    b1 = (lo1 * n) >> 32
    b2 = (lo2 * n) >> b2_bits
    if b1 == b2 and n > 1:
        b2 = (b1 + 1) % n
    base = seg * seg_buckets
    return (base + b1) * _BUCKET, (base + b2) * _BUCKET


@_helper
def _buckets(  # pragma: no cover - compiled; exercised through the kernels below
    stored: Any, seg: Any, nb: Any, seg_buckets: int, b2_bits: int
) -> tuple[Any, Any]:
    """:func:`_bucket_pair` with segment ``seg``'s bucket count read from ``nb``."""
    return _bucket_pair(stored, seg, nb[seg], seg_buckets, b2_bits)


@_helper
def _scan(stored: Any, g1: Any, g2: Any, table: Any) -> Any:  # pragma: no cover - compiled
    """Lowest matching slot of the first bucket, else of the second, else -1 (``_match``)."""
    for j in range(_BUCKET):
        if table[g1 + j] == stored:
            return g1 + j
    for j in range(_BUCKET):
        if table[g2 + j] == stored:
            return g2 + j
    return -1


@_helper
def _splitmix(x: Any) -> Any:  # pragma: no cover - compiled
    """splitmix64's finaliser of one uint64 (``_hashing.mix64``)."""
    z = x
    z ^= z >> _S30
    z *= _C1
    z ^= z >> _S27
    z *= _C2
    z ^= z >> _S31
    return z


@_helper
def _mix_split(x: Any, shift: int) -> tuple[Any, Any]:  # pragma: no cover - compiled
    """splitmix64 of one ID -> (stored value, segment): ``EmbeddingTable._prepare``."""
    z = _splitmix(x)
    sh = np.uint64(shift)
    low = (_ONE << sh) - _ONE
    return (z & low) | _FLAG, np.int64(z >> sh)


@_helper
def _hash_block(  # pragma: no cover - compiled
    keys: Any, a: int, m: int, table: Any, nb: Any, seg_buckets: int, shift: int, b2_bits: int,
    st: Any, g1: Any, g2: Any,
) -> None:  # fmt: skip
    """Stored values and both bucket starts of ``keys[a:a + m]`` into ``st``, ``g1``, ``g2``,
    each bucket prefetched: the first half of every raw-ID kernel's block."""
    for j in range(m):
        stored, seg = _mix_split(keys[a + j], shift)
        st[j] = stored
        g1[j], g2[j] = _buckets(stored, seg, nb, seg_buckets, b2_bits)
        _prefetch(table, g1[j])
        _prefetch(table, g2[j])


@kernel()
def probe_keys(  # pragma: no cover - compiled
    keys: Any, table: Any, nb: Any, seg_buckets: int, shift: int, b2_bits: int, out: Any
) -> None:
    """``out[i]`` = slot of raw ID ``keys[i]`` or -1 (``_prepare`` + ``_find`` in one pass)."""
    st = np.empty(_BLOCK, np.uint64)
    g1 = np.empty(_BLOCK, np.int64)
    g2 = np.empty(_BLOCK, np.int64)
    n = keys.size
    for a in range(0, n, _BLOCK):
        m = min(_BLOCK, n - a)
        _hash_block(keys, a, m, table, nb, seg_buckets, shift, b2_bits, st, g1, g2)
        for j in range(m):
            out[a + j] = _scan(st[j], g1[j], g2[j], table)


@kernel()
def probe_stored(  # pragma: no cover - compiled
    stored: Any, seg: Any, table: Any, nb: Any, seg_buckets: int, b2_bits: int, out: Any
) -> None:
    """``out[i]`` = slot of an already prepared ``(stored[i], seg[i])`` or -1 (``_find``)."""
    g1 = np.empty(_BLOCK, np.int64)
    g2 = np.empty(_BLOCK, np.int64)
    n = stored.size
    for a in range(0, n, _BLOCK):
        m = min(_BLOCK, n - a)
        for j in range(m):
            g1[j], g2[j] = _buckets(stored[a + j], seg[a + j], nb, seg_buckets, b2_bits)
            _prefetch(table, g1[j])
            _prefetch(table, g2[j])
        for j in range(m):
            out[a + j] = _scan(stored[a + j], g1[j], g2[j], table)


@kernel()
def take_found(  # pragma: no cover - compiled
    keys: Any, at: Any, table: Any, nb: Any, seg_buckets: int, shift: int, b2_bits: int,
    rows: Any, dim: int, buf: Any, pos: Any, off: int, miss: Any,
) -> tuple[int, int]:  # fmt: skip
    """Probe and copy in one pass: each found key's first ``dim`` columns go to the next free
    row of ``buf`` (from ``off``) and its number to ``pos[at[i]]`` (``pos[i]`` when ``at`` is
    empty); the indices of keys without a row go to ``miss``. Returns (next free row, misses).
    Per block of keys: hash them and prefetch their buckets, scan and prefetch the found rows,
    then copy the rows (``g1`` is reused for the slots)."""
    st = np.empty(_BLOCK, np.uint64)
    g1 = np.empty(_BLOCK, np.int64)
    g2 = np.empty(_BLOCK, np.int64)
    nmiss = 0
    direct = at.size == 0
    n = keys.size
    for a in range(0, n, _BLOCK):
        m = min(_BLOCK, n - a)
        _hash_block(keys, a, m, table, nb, seg_buckets, shift, b2_bits, st, g1, g2)
        for j in range(m):
            s = _scan(st[j], g1[j], g2[j], table)
            g1[j] = s
            if s >= 0:
                _prefetch2(rows, s, 0)
        for j in range(m):
            s = g1[j]
            if s < 0:
                miss[nmiss] = a + j
                nmiss += 1
                continue
            for c in range(dim):
                buf[off, c] = rows[s, c]
            pos[a + j if direct else at[a + j]] = off
            off += 1
    return off, nmiss


@kernel()
def split_shards(  # pragma: no cover - compiled
    keys: Any, salt: np.uint64, nsh: int, order: Any, starts: Any
) -> None:
    """Group request positions by shard, ``mix64(key ^ salt) % nsh`` (``server.shard_of``):
    shard ``s``'s positions, ascending, are ``order[starts[s]:starts[s + 1]]`` (``starts`` holds
    ``nsh + 1`` zeros on entry). A counting sort: two passes, where ``shard_of`` and one
    ``flatnonzero`` per shard make ~8 + ``nsh`` passes."""
    n = keys.size
    sh = np.empty(n, np.int64)
    m = np.uint64(nsh)
    for i in range(n):
        s = np.int64(_splitmix(keys[i] ^ salt) % m)
        sh[i] = s
        starts[s + 1] += 1
    for t in range(nsh):
        starts[t + 1] += starts[t]
    fill = starts[:nsh].copy()
    for i in range(n):
        order[fill[sh[i]]] = i
        fill[sh[i]] += 1


@cache
def warm() -> bool:
    """Compile (or load from the on-disk cache) every kernel on tiny inputs so a serving
    worker's first request pays no compile (once per process); False when the kernels are
    unavailable."""
    if probe_keys is None or probe_stored is None or take_found is None or split_shards is None:
        return False
    table = np.zeros(2 * _BUCKET, np.uint64)
    nb = np.ones(2, np.int64)
    keys = np.arange(3, dtype=np.uint64)
    out = np.empty(3, np.int64)
    probe_keys(keys, table, nb, 1, 63, 31, out)
    probe_stored(keys | _FLAG, np.zeros(3, np.int64), table, nb, 1, 31, out)
    rows = np.zeros((2 * _BUCKET, 1), np.float32)
    buf = np.empty((4, 1), np.float32)
    no_at: npt.NDArray[np.int64] = np.empty(0, np.int64)
    take_found(keys, no_at, table, nb, 1, 63, 31, rows, 1, buf, out, 0, np.empty(3, np.int64))
    at = np.arange(3, dtype=np.int64)
    take_found(keys, at, table, nb, 1, 63, 31, rows, 1, buf, out, 0, np.empty(3, np.int64))
    starts = np.zeros(3, np.int64)
    split_shards(keys, np.uint64(1), 2, out, starts)
    return True
