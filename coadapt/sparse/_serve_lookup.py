"""Compiled read-only look-up for serving: probe every shard's table in one pass, then pool.

Why: a 200 x 500 CTR request looks up 100k random IDs in tables of GBs. ``ShardedTable.take``
split the IDs by shard (a pass and a copy of the keys per shard), probed and copied each found
row into a 3.2 MB buffer (``take_found``), and ``embedding_bag`` read that buffer again. Here:

* :func:`probe_rows` hashes each ID, picks its shard (``server.shard_of``) and both candidate
  buckets and prefetches them, ``_D`` IDs ahead of the scan (a software pipeline: ~2 x ``_D``
  cache misses in flight); the scan is branchless (both buckets' 8 slots compared, the lowest
  match of the first bucket taken, else of the second: ``EmbeddingTable``'s answer), because a
  branch on which slot matched mispredicts about once an ID. The answer per ID is the byte
  address of its row (0: no row), so a row of any shard's table is one kind of reference.
* :func:`pool_rows` sums each bag's rows straight from the tables into the output, rows
  prefetched ``_AHEAD`` positions ahead: no row buffer, no index array. The sum is
  ``embedding_bag(mode="sum")``'s: float32, from +0.0, rows added in bag order (torch's CPU
  paths, fbgemm's kernel and the ``axpy`` fallback, both add row after row), so the result is
  bit for bit the same (``tests/sparse/test_serve_lookup.py``). An ID without a row adds
  nothing: ``embedding_bag`` adds a zero row, and ``x + 0.0 == x`` for every ``x`` but
  ``-0.0``, which a sum started at +0.0 never is.

Why raw addresses: numba copies (and reference-counts) an array each time one is picked out of
a tuple by a run-time index; per ID that cost more than the probe itself (measured in a
cache-resident table: 36 vs 25 ns per ID for the probe, 14 vs 6 ns for the pooling). The
caller keeps every table alive and unchanged during the call (a served table changes only
between batches) and passes addresses inside them only. Indices numba cannot prove
non-negative are unsigned: a signed index costs a negative-index fix-up per access (the probe
measured 1.14x faster without, at 50M rows).

``None`` without numba (or with ``COADAPT_NO_JIT=1``): the caller keeps ``take``'s path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coadapt._jit import jit_available, kernel
from coadapt.sparse._probe import (
    _BUCKET,
    _ONE,
    _bucket_pair,
    _helper,
    _mix_split,
    _splitmix,
)

__all__ = ["FILTER_MULT", "overlay_rows", "pool_rows", "probe_rows"]

_D = 16
"""IDs between hashing one (and prefetching its buckets) and scanning it."""
_RING = 64
"""Slots of the pipeline's ring of hashed IDs (a power of two > ``_D``)."""
_AHEAD = 16
"""Rows prefetched ahead of the pooling (positions in bag order)."""
FILTER_MULT = np.uint64(0x9E3779B97F4A7C15)
"""Multiplier of a delta overlay's key filter (odd: the product's top bits mix every bit of
the key). With ``h = key * FILTER_MULT`` (mod 2**64) and ``2**width`` 64-bit words, a key
sets two bits of one word: word ``h >> (64 - width)``, bits ``(h >> (58 - width)) & 63`` and
``(h >> (52 - width)) & 63`` (one memory read per look-up, about 1/3 the false positives of
one bit a key)."""
_LOWEST = np.array([8] + [(m & -m).bit_length() - 1 for m in range(1, 256)], np.int64)
"""Index of the lowest set bit of an 8-bit match mask (8 for none)."""


def _make_memory() -> tuple[Any, Any, Any]:
    """``load_u64(addr)``, ``load_f32(addr)`` and ``prefetch_at(addr)`` for compiled code (an
    ``inttoptr`` + load, and ``llvm.prefetch``); None without numba."""
    if not jit_available():
        return None, None, None
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def loader(ty: Any, llty: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.load(builder.inttoptr(args[0], llty.as_pointer()))

        @intrinsic
        def load(typingctx: Any, addr: Any) -> Any:
            return ty(types.int64), codegen

        return load

    def prefetch_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    @intrinsic
    def prefetch_at(typingctx: Any, addr: Any) -> Any:
        return types.void(types.int64), prefetch_codegen

    return loader(types.uint64, ir.IntType(64)), loader(types.float32, ir.FloatType()), prefetch_at


_load_u64, _load_f32, _prefetch_at = _make_memory()


@_helper
def _match_mask(addr: Any, stored: Any) -> Any:  # pragma: no cover - compiled
    """Bit ``j`` set where slot ``j`` of the bucket at byte address ``addr`` holds ``stored``."""
    m = np.int64(0)
    for j in range(_BUCKET):
        m |= np.int64(_load_u64(addr + 8 * j) == stored) << j
    return m


@kernel()
def probe_rows(  # pragma: no cover - compiled
    keys: Any, salt: Any, nsh: int, key_addr: Any, row_addr: Any, row_stride: Any, nb: Any,
    nb_at: Any, seg_buckets: Any, shifts: Any, b2_bits: Any, out: Any,
) -> int:  # fmt: skip
    """``out[i]`` = byte address of raw ID ``keys[i]``'s row in its shard's table, 0 where it
    has none; returns how many have none. Shard ``s`` (``mix64(key ^ salt) % nsh``; 0 when
    ``nsh == 1``) is an ``EmbeddingTable``: its slot keys at ``key_addr[s]``, row ``j`` at
    ``row_addr[s] + j * row_stride[s]``, its segments' bucket counts ``nb[nb_at[s]:]``, its
    geometry ``seg_buckets[s]``, ``shifts[s]``, ``b2_bits[s]``."""
    n = keys.size
    st = np.empty(_RING, np.uint64)
    g1 = np.empty(_RING, np.int64)
    g2 = np.empty(_RING, np.int64)
    sh = np.empty(_RING, np.uint64)
    m = np.uint64(nsh)
    low = m - _ONE
    pow2 = (nsh & (nsh - 1)) == 0
    ring = np.uint64(_RING - 1)
    missing = 0
    # indices are unsigned where numba cannot tell they are >= 0: no negative-index fix-up
    for a in range(n + _D):
        if a < n:  # hash ID a, prefetch both its buckets
            r = np.uint64(a) & ring
            k = keys[a]
            if nsh == 1:
                s = np.uint64(0)
            elif pow2:  # x % 2**k == x & (2**k - 1)
                s = _splitmix(k ^ salt) & low
            else:
                s = _splitmix(k ^ salt) % m
            stored, seg = _mix_split(k, shifts[s])
            n_seg = nb[np.uint64(nb_at[s] + seg)]
            b1, b2 = _bucket_pair(stored, seg, n_seg, seg_buckets[s], b2_bits[s])
            st[r], g1[r], g2[r], sh[r] = stored, b1, b2, s
            _prefetch_at(key_addr[s] + 8 * b1)
            _prefetch_at(key_addr[s] + 8 * b2)
        b = a - _D
        if b >= 0:  # scan ID b's buckets (fetched meanwhile), no branch on the slot
            r = np.uint64(b) & ring
            s, x, c1, c2 = sh[r], st[r], g1[r], g2[r]
            m1 = _match_mask(key_addr[s] + 8 * c1, x)
            m2 = _match_mask(key_addr[s] + 8 * c2, x)
            p1 = c1 + _LOWEST[np.uint64(m1)]
            p2 = c2 + _LOWEST[np.uint64(m2)]
            slot = p1 if m1 != 0 else (p2 if m2 != 0 else -1)
            if slot >= 0:
                out[b] = row_addr[s] + slot * row_stride[s]
            else:
                out[b] = 0
                missing += 1
    return missing


@kernel()
def pool_rows(refs: Any, back: Any, bag: int, dim: int, out: Any) -> None:  # pragma: no cover
    """``out[o] = sum of the rows of positions o*bag .. o*bag+bag-1``, in order, float32 from
    +0.0; position ``p``'s row is the ``dim`` float32 at byte address ``r = refs[back[p]]``
    (``refs[p]`` when ``back`` is empty), none when ``r == 0``."""
    direct = back.size == 0
    n = refs.size if direct else back.size
    acc = np.empty(dim, np.float32)
    last = 4 * (dim - 1)
    for j in range(min(_AHEAD, n)):
        r = refs[j] if direct else refs[np.uint64(back[j])]
        if r != 0:
            _prefetch_at(r)
            if (r ^ (r + last)) >> 6:  # the row straddles two cache lines
                _prefetch_at(r + last)
    i = 0
    for o in range(n // bag):
        for c in range(dim):
            acc[c] = np.float32(0.0)
        for _ in range(bag):
            j = i + _AHEAD
            if j < n:
                r = refs[j] if direct else refs[np.uint64(back[j])]
                if r != 0:
                    _prefetch_at(r)
                    if (r ^ (r + last)) >> 6:
                        _prefetch_at(r + last)
            r = refs[i] if direct else refs[np.uint64(back[i])]
            i += 1
            if r != 0:
                for c in range(dim):
                    acc[c] += _load_f32(r + 4 * c)
        for c in range(dim):
            out[o, c] = acc[c]


@kernel()
def overlay_rows(  # pragma: no cover - compiled
    keys: Any, width: Any, words: Any, ov_keys: Any, row_addr: int, row_stride: int, dim: int,
    refs: Any,
) -> None:  # fmt: skip
    """``refs[i]`` = address of ``keys[i]``'s row in a delta's overlay where the overlay holds
    it (0 where the overlay deletes it: the flag after the ``dim`` values is non-zero); the
    other entries are left as they are. ``ov_keys`` are the overlay's keys, ascending; ``words``
    its filter (:data:`FILTER_MULT`), so a key the overlay cannot hold, nearly every one of a
    request's, costs one multiply and one read; only the others are searched for."""
    m = ov_keys.size
    s1, s2, s3 = np.uint64(64) - width, np.uint64(58) - width, np.uint64(52) - width
    low = np.uint64(63)
    for i in range(keys.size):
        k = keys[i]
        h = k * FILTER_MULT
        need = (_ONE << ((h >> s2) & low)) | (_ONE << ((h >> s3) & low))
        if words[h >> s1] & need != need:
            continue
        lo, hi = 0, m
        while lo < hi:
            mid = (lo + hi) >> 1
            if ov_keys[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        if lo < m and ov_keys[lo] == k:
            r = row_addr + lo * row_stride
            refs[i] = 0 if _load_f32(r + 4 * dim) != np.float32(0.0) else r
