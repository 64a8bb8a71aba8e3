"""Dynamic embedding table: exact uint64 feature IDs -> float32 rows within 1.2x raw bytes.

Design (measured in ``benchmarks/sparse_bench.py``, explained in ``docs/sparse.md``):

* **Bucketized cuckoo hashing, rows co-located with their slot.** Each key has two candidate
  buckets of 8 slots; a slot holds the (mixed) key and the row lives at the same index of the row
  arena, so there is no separate index of row ids (an int32 id per row would alone cost 20 % of
  an FTRL row). Two choices x 8 slots stay insertable far above 96 % load, lookups are two
  vectorised 64-byte gathers, and deletion just clears a slot (no tombstones, no shifting).
* **No empty-key sentinel problem.** A key is stored as its splitmix64 image with the segment
  bits replaced by a flag bit, so a stored value is never 0; 0 marks an empty slot and every
  uint64 ID (including 0 and 2**64-1) is a valid, exact key.
* **Growth without a 2x spike.** The table is split into ``segments`` by the high hash bits.
  Each segment owns a fixed range of one large *reserved* (``MAP_NORESERVE``) virtual mapping per
  array: pages are committed only when touched, so growing a segment never reallocates or copies
  the table and row indices stay plain offsets into one array (one numpy gather per batch).
  A segment grows by 6.25 % (rehashing only itself: a transient of ~1/segments of the table) and
  the segments' size ladders are staggered by ``g**(s/segments)`` so they never grow in lockstep;
  the table's overall load stays near 0.90 at every moment instead of sawing between 0.48 and 0.96.
* **Transparent huge pages** (``huge_pages=``): each segment's committed range is advised
  ``MADV_HUGEPAGE`` (by default only the 2 MiB pages wholly inside it: no byte more held), so
  a random probe of a multi-GB table mostly hits the TLB; :meth:`EmbeddingTable.packed` lays a
  table that will not grow (a served version) end to end, every slot in a huge page.
* **Row indices are slot numbers**: valid until the next mutating call (insert, delete, expire,
  load), because cuckoo displacement and segment rehashing move rows. Gather, update and write
  back within one call sequence; look keys up again after any insert.

Not thread-safe: one table per shard, one thread mutating it.
"""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, cast

import numpy as np
import numpy.typing as npt

from coadapt.atomicfile import atomic_writer
from coadapt.sparse._hashing import as_u64_keys, mix64, unmix64
from coadapt.sparse._place import MAX_KICKS, place_items
from coadapt.sparse._probe import probe_keys, probe_stored
from coadapt.sparse._probe import take_found as _take_found

__all__ = [
    "HUGE_PAGE_MODES",
    "CountMinSketch",
    "EmbeddingTable",
    "TableFullError",
    "huge_page_bytes",
]

BUCKET = 8
"""Slots per cuckoo bucket: one 64-byte cache line of keys."""
MAX_LOAD = 0.96
"""A segment grows when an insert would push it above this load."""
GROWTH = 1.0625
"""Segment growth factor; small so that one growth step adds little slack (6.25 %: a segment
sits between 0.90 and 0.96 load, ~0.93 on average, so a dim-1 row costs ~1.13x raw)."""
_EVICT_ROUNDS = 64
"""Cuckoo displacement rounds before a segment is grown instead."""
_SEG_ALIGN_BUCKETS = 512
"""Segment strides are multiples of 4096 slots so every array's segment starts on a page."""
_CHUNK = 1 << 13
"""Keys per vectorised pass of lookup and placement: bounds the numpy temporaries (~200 bytes
a key) to a few MB whatever the caller's batch or the size of a segment being rehashed."""
_FLAG = np.uint64(1 << 63)
_PAGE = mmap.PAGESIZE
_MAGIC = b"COADAPT-EMBTABLE\x01"
_END = b"COADAPT-EMBTABLE-END"

I64Array = npt.NDArray[np.int64]
F32Array = npt.NDArray[np.float32]


class TableFullError(MemoryError):
    """A segment outgrew the address range reserved for it at construction."""


def _reserve(nbytes: int) -> mmap.mmap:
    """Reserve address space; the kernel commits pages only when they are first written."""
    size = max(int(nbytes), _PAGE)
    try:
        if hasattr(mmap, "MAP_ANONYMOUS"):
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            if sys.platform.startswith("linux"):
                flags |= getattr(mmap, "MAP_NORESERVE", 0x4000)
            return mmap.mmap(-1, size, flags=flags)
        return mmap.mmap(-1, size)  # pragma: no cover - Windows
    except (OSError, OverflowError, ValueError) as exc:
        raise MemoryError(
            f"could not reserve {size} bytes of address space for an embedding table ({exc}); "
            "construct the table with a smaller max_rows"
        ) from exc


def _huge_page_size() -> int:
    """The PMD huge-page size transparent huge pages use (2 MiB on x86-64 and 4K-page ARM)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


_HUGE = _huge_page_size()
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


HUGE_PAGE_MODES = ("off", "inside", "whole")
"""``EmbeddingTable(huge_pages=...)``: none; the huge pages wholly inside each segment's
committed range (no byte of slack); that range rounded out to huge pages (up to two huge
pages of slack per segment and slot array, for every slot in a huge page)."""


def _advise_huge(m: mmap.mmap, addr: int, lo: int, hi: int, whole: bool) -> bool:
    """``madvise(MADV_HUGEPAGE)`` on bytes ``[lo, hi)`` of ``m`` (mapped at ``addr``), rounded
    in (``whole=False``) or out to huge pages; False where the kernel refuses (no THP).

    Rounded in, a huge page straddling either end of a segment's committed range is never
    advised (it would commit up to 2 MiB of slack when first touched), so those ends stay in
    4 KiB pages and the memory held is exactly what it is without huge pages."""
    if _MADV_HUGEPAGE is None:
        return False
    start, end = addr + lo, addr + hi
    if whole:
        a, b = start // _HUGE * _HUGE, -(-end // _HUGE) * _HUGE
    else:
        a, b = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
    a, b = max(a - addr, 0), min(b - addr, len(m))
    if b <= a:
        return True
    try:
        m.madvise(_MADV_HUGEPAGE, a, b - a)
    except (OSError, ValueError):
        return False
    return True


def huge_page_bytes(pid: int | str = "self") -> int:
    """Bytes of a process's memory held in transparent huge pages (``AnonHugePages`` of
    ``/proc/PID/smaps_rollup``): the proof that a table's huge pages are really used. 0 where
    the kernel does not say."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _libc_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # glibc; absent on musl
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], fn)


_MALLOC_TRIM = _libc_malloc_trim()


def _trim_heap() -> None:
    """Hand freed heap pages back to the kernel after an insert.

    glibc raises its mmap threshold after large frees, so later multi-MB numpy temporaries come
    from the heap and their pages stay resident once freed: measured +70 MB of RSS on a 10M-row
    table (RSS 1.54x raw against 1.18x for the table). Only calls that insert rows trim (the
    steady-state pull/push path does not): ~15 us when there is nothing to give back, plus
    re-faulting the next insert's few MB of temporaries (~1 % of an insert of 64k keys)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _rank_within_groups(groups: I64Array) -> I64Array:
    """For each element, how many earlier elements share its group (stable order)."""
    n = groups.size
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    idx = np.arange(n, dtype=np.int64)
    start = np.ones(n, dtype=bool)
    start[1:] = sorted_groups[1:] != sorted_groups[:-1]
    first = np.maximum.accumulate(np.where(start, idx, 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = idx - first
    return rank


class CountMinSketch:
    """Saturating uint8 count-min sketch with conservative update and periodic halving.

    Counts sightings of IDs that are not rows yet, so admission needs no per-ID memory. It can
    only over-count (an ID may be admitted early, never late); halving every
    ``reset_after`` additions (TinyLFU-style aging) keeps it from saturating on an endless
    stream, so "seen k times" means "k times within roughly the last few windows".
    """

    def __init__(self, width: int = 1 << 18, depth: int = 4, reset_after: int | None = None):
        if width < 16 or width & (width - 1):
            raise ValueError(f"sketch width must be a power of two >= 16, got {width}")
        if not 1 <= depth <= 8:
            raise ValueError(f"sketch depth must be in [1, 8], got {depth}")
        self.width = width
        self.depth = depth
        self.reset_after = reset_after if reset_after is not None else 10 * width
        if self.reset_after < 1:
            raise ValueError(f"reset_after must be >= 1, got {reset_after}")
        self.table = np.zeros((depth, width), dtype=np.uint8)
        self.added = 0

    def _positions(self, keys: npt.NDArray[np.uint64]) -> I64Array:
        h = mix64(keys ^ np.uint64(0x5EED5EED5EED5EED))
        h1 = (h & np.uint64(0xFFFFFFFF)).astype(np.int64)
        h2 = (h >> np.uint64(32)).astype(np.int64) | 1
        d = np.arange(self.depth, dtype=np.int64)[:, None]
        return (h1[None, :] + d * h2[None, :]) & (self.width - 1)

    def estimate(self, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        k = as_u64_keys(keys)
        pos = self._positions(k)
        est = self.table[np.arange(self.depth)[:, None], pos].min(axis=0)
        return est.astype(np.int64)

    def add(
        self, keys: npt.ArrayLike, counts: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.int64]:
        """Record sightings (``counts`` per key, default 1); return the updated estimates."""
        k = as_u64_keys(keys)
        c = np.ones(k.size, np.int64) if counts is None else np.asarray(counts, np.int64)
        if c.shape != k.shape:
            raise ValueError(f"counts shape {c.shape} does not match keys shape {k.shape}")
        if k.size == 0:
            return np.zeros(0, np.int64)
        pos = self._positions(k)
        rows = np.arange(self.depth)[:, None]
        est = self.table[rows, pos].min(axis=0).astype(np.int64)
        new = np.minimum(est + c, 255).astype(np.uint8)
        for d in range(self.depth):
            np.maximum.at(self.table[d], pos[d], new)
        self.added += int(c.sum())
        if self.added >= self.reset_after:
            self.table >>= 1
            self.added = 0
        return new.astype(np.int64)

    def nbytes(self) -> int:
        return int(self.table.nbytes)


class EmbeddingTable:
    """Hash table from uint64 feature IDs to float32 rows of ``width`` columns.

    ``width = dim + optimizer state width``: the first ``dim`` columns are the embedding, the
    rest belong to the optimizer. Rows are created zero-filled (``init`` callback may fill them).

    Args:
        dim: embedding dimension (1 for logistic regression weights).
        width: total float32 columns per row (default ``dim``).
        ttl: expiry horizon in the caller's clock units (steps or seconds); ``None`` disables
            expiry and the per-row age byte.
        age_bits: 8 or 16 bits of per-row last-touch time. The clock is quantised to
            ``ttl / 2**(age_bits-2)`` (exact when ``ttl`` is an integer that small); a row is
            never dropped before ``ttl`` and at most two quanta after it, provided
            ``expire`` runs at least every ``3 * ttl``.
        counters: keep uint32 exposure and click counters per row (counted as raw payload).
        admit_after: an ID becomes a row at its k-th sighting; before that lookups return -1.
        sketch_width, sketch_depth: size of the count-min sketch used for admission.
        max_rows: upper bound the address space is reserved for (virtual only; costs no RAM).
        initial_rows: pre-size for this many rows.
        segments: power of two; more segments = smaller rehash transients, more page slack.
        seed: seeds the cuckoo displacement choices.
        huge_pages: back the committed part of every segment with transparent huge pages
            (``madvise(MADV_HUGEPAGE)``, Linux; a no-op elsewhere or where the kernel has
            them off): a random probe then misses the TLB far less (figures in
            ``docs/sparse.md``). One of :data:`HUGE_PAGE_MODES`: ``"inside"`` advises only
            the huge pages wholly inside a segment's committed range (no byte more held),
            ``"whole"`` rounds that range out (up to two huge pages of slack per segment and
            slot array), ``"off"`` none.
        stride_buckets: buckets reserved per segment (default: room for ``max_rows``). A
            table that will not grow can lay its segments end to end (:meth:`packed`).
    """

    def __init__(
        self,
        dim: int,
        width: int | None = None,
        *,
        ttl: float | None = None,
        age_bits: int = 8,
        counters: bool = False,
        admit_after: int = 1,
        sketch_width: int = 1 << 18,
        sketch_depth: int = 4,
        max_rows: int = 1 << 28,
        initial_rows: int = 0,
        segments: int = 64,
        seed: int = 0,
        huge_pages: str = "inside",
        stride_buckets: int | None = None,
    ) -> None:
        if huge_pages not in HUGE_PAGE_MODES:
            raise ValueError(
                f"huge_pages must be one of {', '.join(map(repr, HUGE_PAGE_MODES))}, "
                f"got {huge_pages!r}"
            )
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        width = dim if width is None else width
        if width < dim:
            raise ValueError(f"width ({width}) must be >= dim ({dim}): width = dim + state width")
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be > 0 (or None to disable expiry), got {ttl}")
        if age_bits not in (8, 16):
            raise ValueError(f"age_bits must be 8 or 16, got {age_bits}")
        if not 1 <= admit_after <= 255:
            raise ValueError(f"admit_after must be in [1, 255], got {admit_after}")
        if segments < 2 or segments > 4096 or segments & (segments - 1):
            raise ValueError(f"segments must be a power of two in [2, 4096], got {segments}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.dim = dim
        self.width = width
        self.ttl = ttl
        self.age_bits = age_bits
        self.has_counters = counters
        self.admit_after = admit_after
        self.segments = segments
        self.max_rows = max_rows
        self._seg_bits = segments.bit_length() - 1
        self._shift = 64 - self._seg_bits
        self._low = np.uint64((1 << self._shift) - 1)
        self._b2_bits = self._shift - 32
        self._b2_mask = np.uint64((1 << self._b2_bits) - 1)
        per_seg = math.ceil(max_rows * 1.25 / (segments * BUCKET * 0.85)) + 8
        if stride_buckets is not None:
            if stride_buckets < 1 or stride_buckets % _SEG_ALIGN_BUCKETS:
                raise ValueError(
                    f"stride_buckets must be a positive multiple of {_SEG_ALIGN_BUCKETS}, "
                    f"got {stride_buckets}"
                )
            per_seg = stride_buckets
        self._seg_buckets = -(-per_seg // _SEG_ALIGN_BUCKETS) * _SEG_ALIGN_BUCKETS
        self._seg_slots = self._seg_buckets * BUCKET
        total = self._seg_slots * segments
        self._maps = [_reserve(total * 8), _reserve(total * 4 * width)]
        self._keys = np.frombuffer(self._maps[0], dtype=np.uint64, count=total)
        self._keys2d = self._keys.reshape(-1, BUCKET)
        self._rows = np.frombuffer(self._maps[1], dtype=np.float32, count=total * width).reshape(
            total, width
        )
        self._age: npt.NDArray[np.unsignedinteger[Any]] | None = None
        self._quantum = 1.0
        self._age_threshold = 0
        if ttl is not None:
            adt = np.uint8 if age_bits == 8 else np.uint16
            self._maps.append(_reserve(total * np.dtype(adt).itemsize))
            self._age = np.frombuffer(self._maps[-1], dtype=adt, count=total)
            steps = 1 << (age_bits - 2)
            if float(ttl).is_integer() and ttl <= steps:
                self._quantum, self._age_threshold = 1.0, int(ttl)
            else:
                self._quantum, self._age_threshold = float(ttl) / steps, steps + 1
        self._cnt: npt.NDArray[np.uint32] | None = None
        if counters:
            self._maps.append(_reserve(total * 8))
            self._cnt = np.frombuffer(self._maps[-1], dtype=np.uint32, count=total * 2).reshape(
                total, 2
            )
        self.sketch = CountMinSketch(sketch_width, sketch_depth) if admit_after > 1 else None
        self._rng = np.random.default_rng(seed)
        self._level = np.zeros(segments, dtype=np.int64)
        self._nb = np.array([self._ladder(s, 0) for s in range(segments)], dtype=np.int64)
        self._size = np.zeros(segments, dtype=np.int64)
        self._touched = self._nb.copy()  # high-water bucket count per segment (committed pages)
        # Bumped whenever a key may change slot (insert, move, grow, delete, expiry): a row
        # index obtained at generation g is still valid while the generation is still g.
        self.generation = 0
        self.huge_pages = huge_pages
        self._addrs = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in self._maps]
        # where the kernel refused the advice (no THP support) it is not asked again
        self._huge_ok = huge_pages != "off" and sys.platform.startswith("linux")
        if initial_rows > 0:
            need = np.full(segments, math.ceil(initial_rows / segments * 1.02) + 1, dtype=np.int64)
            for s in range(segments):
                self._set_level_for(s, int(need[s]))
            self._touched = np.maximum(self._touched, self._nb)
        self._advise(range(segments))

    # ------------------------------------------------------------------ layout & hashing
    def _advise(self, segs: Iterable[int]) -> None:
        """Huge pages for segments ``segs`` up to their committed bucket count (``_touched``):
        called whenever that grows, *before* the new range is first written, so its pages are
        faulted in huge (pages already faulted small stay small until ``khugepaged``)."""
        if not self._huge_ok:
            return
        whole = self.huge_pages == "whole"
        for m, addr, item in zip(self._maps, self._addrs, self._slot_arrays(), strict=True):
            for s in segs:
                lo = s * self._seg_slots * item
                hi = lo + int(self._touched[s]) * BUCKET * item
                if not _advise_huge(m, addr, lo, hi, whole):
                    self._huge_ok = False
                    return

    def commit_geometry(self, nb: npt.ArrayLike) -> None:
        """Make each segment's bucket count at least ``nb[s]`` before its slots are written
        directly (a slot image read from a file: ``coadapt.sparse.export``), so the committed
        range gets its huge pages from the first write."""
        nb_ = np.asarray(nb, np.int64)
        if nb_.shape != (self.segments,) or (nb_ < 1).any() or (nb_ > self._seg_buckets).any():
            raise ValueError(
                f"nb must be {self.segments} bucket counts in [1, {self._seg_buckets}], "
                f"got shape {nb_.shape}"
            )
        self._touched = np.maximum(self._touched, nb_)
        self._advise(range(self.segments))

    @staticmethod
    def packed_stride(nb: npt.ArrayLike) -> int:
        """The smallest segment stride (buckets, page-aligned) that holds bucket counts ``nb``."""
        top = int(np.max(np.asarray(nb, np.int64)))
        return -(-top // _SEG_ALIGN_BUCKETS) * _SEG_ALIGN_BUCKETS

    def packed(self, huge_pages: str = "whole") -> EmbeddingTable:
        """A copy with its segments laid end to end (stride: the largest segment), for a table
        that is only read and updated in place from now on (a served version's base table).

        Why: a segment's range is reserved for ``max_rows`` (~1.5x its size), so huge pages
        either stop short of each segment's ends (``"inside"``: at 25M dim-8 rows a shard's
        key segments are 3.4 MB, 40 % of them in huge pages) or commit up to 2 MiB of slack
        at each end. Packed, ``"whole"`` covers every slot and the slack is the gaps between
        segments (a few % of the table). Inserting more rows than a segment's stride holds
        raises :class:`TableFullError`. Same slots, same answers."""
        t = EmbeddingTable(
            self.dim, self.width, ttl=self.ttl, age_bits=self.age_bits,
            counters=self.has_counters, admit_after=self.admit_after,
            sketch_width=self.sketch.width if self.sketch is not None else 1 << 18,
            sketch_depth=self.sketch.depth if self.sketch is not None else 4,
            max_rows=self.max_rows, segments=self.segments, huge_pages=huge_pages,
            stride_buckets=self.packed_stride(self._nb),
        )  # fmt: skip
        t.commit_geometry(self._nb)
        for s in range(self.segments):
            a, b = s * self._seg_slots, s * self._seg_slots + int(self._nb[s]) * BUCKET
            c = s * t._seg_slots
            pairs: list[tuple[np.ndarray, np.ndarray]] = [
                (t._keys, self._keys),
                (t._rows, self._rows),
            ]
            if t._age is not None and self._age is not None:
                pairs.append((t._age, self._age))
            if t._cnt is not None and self._cnt is not None:
                pairs.append((t._cnt, self._cnt))
            for dst, src in pairs:
                dst[c : c + b - a] = src[a:b]
        t._nb[:] = self._nb
        t._level[:] = self._level
        t._size[:] = self._size
        t._quantum, t._age_threshold = self._quantum, self._age_threshold
        if self.sketch is not None and t.sketch is not None:
            t.sketch.table[:] = self.sketch.table
            t.sketch.added, t.sketch.reset_after = self.sketch.added, self.sketch.reset_after
        t.generation = self.generation + 1
        return t

    def _ladder(self, s: int, level: int) -> int:
        """Bucket count of segment ``s`` at growth step ``level`` (staggered across segments)."""
        return max(1, math.ceil(GROWTH ** (level + s / self.segments)))

    def _set_level_for(self, s: int, items: int) -> None:
        """Raise segment ``s``'s level until ``items`` fit under MAX_LOAD (does not rehash)."""
        lvl = int(self._level[s])
        nb = int(self._nb[s])
        while items > MAX_LOAD * nb * BUCKET:
            lvl += 1
            nb = max(nb + 1, self._ladder(s, lvl))
        if nb > self._seg_buckets:
            raise TableFullError(
                f"embedding table segment {s} needs {nb * BUCKET} slots but only "
                f"{self._seg_slots} were reserved (max_rows={self.max_rows}); "
                "construct the table with a larger max_rows"
            )
        self._level[s] = lvl
        self._nb[s] = nb

    def _prepare(self, keys: npt.ArrayLike) -> tuple[npt.NDArray[np.uint64], I64Array]:
        """Stored values (mixed key, segment bits swapped for the flag) and segment ids."""
        h = mix64(as_u64_keys(keys))
        seg = (h >> np.uint64(self._shift)).astype(np.int64)
        return (h & self._low) | _FLAG, seg

    def _original_keys(
        self, stored: npt.NDArray[np.uint64], seg: I64Array
    ) -> npt.NDArray[np.uint64]:
        h = (stored & self._low) | (seg.astype(np.uint64) << np.uint64(self._shift))
        return unmix64(h)

    def _buckets(self, stored: npt.NDArray[np.uint64], seg: I64Array) -> tuple[I64Array, I64Array]:
        """Global bucket numbers of both cuckoo choices (fastrange on two disjoint bit fields)."""
        nb = self._nb[seg]
        lo1 = (stored & np.uint64(0xFFFFFFFF)).astype(np.int64)
        lo2 = ((stored >> np.uint64(32)) & self._b2_mask).astype(np.int64)
        b1 = (lo1 * nb) >> 32
        b2 = (lo2 * nb) >> self._b2_bits
        same = (b1 == b2) & (nb > 1)
        b2 = np.where(same, (b1 + 1) % nb, b2)
        base = seg * self._seg_buckets
        return base + b1, base + b2

    def _find(self, stored: npt.NDArray[np.uint64], seg: I64Array) -> I64Array:
        if probe_stored is not None:  # compiled: one pass, no temporaries (``_probe``)
            slot = np.empty(stored.size, np.int64)
            probe_stored(
                np.ascontiguousarray(stored), np.ascontiguousarray(seg, np.int64), self._keys,
                self._nb, self._seg_buckets, self._b2_bits, slot,
            )  # fmt: skip
            return slot
        if stored.size <= _CHUNK:
            return self._find_chunk(stored, seg)
        slot = np.empty(stored.size, np.int64)
        for a in range(0, stored.size, _CHUNK):
            slot[a : a + _CHUNK] = self._find_chunk(stored[a : a + _CHUNK], seg[a : a + _CHUNK])
        return slot

    def _find_chunk(self, stored: npt.NDArray[np.uint64], seg: I64Array) -> I64Array:
        g1, g2 = self._buckets(stored, seg)
        hit, pos = self._match(g1, stored)
        slot = np.where(hit, g1 * BUCKET + pos, -1)
        miss = np.flatnonzero(~hit)
        if miss.size:
            hit2, pos2 = self._match(g2[miss], stored[miss])
            sel = miss[hit2]
            slot[sel] = g2[sel] * BUCKET + pos2[hit2]
        return slot

    def _match(
        self, buckets: I64Array, stored: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.bool_], I64Array]:
        """(found, slot within the bucket) of each key in its bucket. The 8 x 8-byte bucket is
        gathered as one 64-byte item, and the 8 match flags are read as one uint64 whose
        lowest set byte is the slot (a key is stored at most once per bucket)."""
        line = np.dtype((np.void, 8 * BUCKET))
        got = np.take(self._keys2d.view(line).reshape(-1), buckets)
        m = got.view(np.uint64).reshape(-1, BUCKET) == stored[:, None]
        if sys.byteorder != "little":  # pragma: no cover - the flag trick needs little-endian
            return m.any(axis=1), m.argmax(axis=1)
        flags = m.view(np.uint64).reshape(-1)
        low = flags & (~flags + np.uint64(1))  # lowest set bit
        return flags != 0, (np.bitwise_count(low - np.uint64(1)) >> 3).astype(np.int64)

    # ------------------------------------------------------------------ placement
    def _payload(
        self, n: int
    ) -> tuple[F32Array, npt.NDArray[Any] | None, npt.NDArray[np.uint32] | None]:
        rows = np.zeros((n, self.width), dtype=np.float32)
        age = None if self._age is None else np.zeros(n, dtype=self._age.dtype)
        cnt = None if self._cnt is None else np.zeros((n, 2), dtype=np.uint32)
        return rows, age, cnt

    def _write(
        self,
        slot: I64Array,
        stored: npt.NDArray[np.uint64],
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        self.generation += 1
        self._keys[slot] = stored
        self._rows[slot] = rows
        if self._age is not None and age is not None:
            self._age[slot] = age
        if self._cnt is not None and cnt is not None:
            self._cnt[slot] = cnt

    def _read(
        self, slot: I64Array
    ) -> tuple[
        npt.NDArray[np.uint64], F32Array, npt.NDArray[Any] | None, npt.NDArray[np.uint32] | None
    ]:
        return (
            self._keys[slot],
            self._rows[slot],
            None if self._age is None else self._age[slot],
            None if self._cnt is None else self._cnt[slot],
        )

    def _extract_segment(
        self, s: int
    ) -> tuple[
        npt.NDArray[np.uint64], F32Array, npt.NDArray[Any] | None, npt.NDArray[np.uint32] | None
    ]:
        """Copy a segment's items out and clear it (the only transient copy: 1/segments).

        Read slice by slice into arrays sized from the segment's count, so no slot-index array
        of the whole segment (8 bytes an item, more than a dim-1 row) exists next to the copy."""
        base = s * self._seg_slots
        cap = int(self._nb[s]) * BUCKET
        n = int(self._size[s])
        keys = np.empty(n, np.uint64)
        rows = np.empty((n, self.width), np.float32)
        age = None if self._age is None else np.empty(n, self._age.dtype)
        cnt = None if self._cnt is None else np.empty((n, 2), np.uint32)
        row = np.dtype((np.void, 4 * self.width))
        got = 0
        for a in range(0, cap, 8 * _CHUNK):
            occ = np.flatnonzero(self._keys[base + a : base + min(cap, a + 8 * _CHUNK)])
            occ += base + a
            end = got + occ.size
            if end > n:
                raise RuntimeError(f"embedding table segment {s} holds more keys than counted")
            np.take(self._keys, occ, out=keys[got:end])
            np.take(self._row_view(), occ, out=rows.view(row).reshape(-1)[got:end])
            if age is not None and self._age is not None:
                np.take(self._age, occ, out=age[got:end])
            if cnt is not None and self._cnt is not None:
                cnt[got:end] = self._cnt[occ]
            got = end
        if got != n:
            raise RuntimeError(f"embedding table segment {s} holds fewer keys than counted")
        items = (keys, rows, age, cnt)
        self.generation += 1
        self._keys[base : base + cap] = 0
        self._size[s] = 0
        return items

    def _grow(self, s: int, incoming: int) -> tuple[Any, ...]:
        items = self._extract_segment(s)
        total = items[0].size + incoming
        self._level[s] += 1
        self._nb[s] = max(int(self._nb[s]) + 1, self._ladder(s, int(self._level[s])))
        self._set_level_for(s, total)
        if int(self._nb[s]) > int(self._touched[s]):
            self._touched[s] = int(self._nb[s])
            self._advise([s])
        return items

    def _place(
        self,
        stored: npt.NDArray[np.uint64],
        seg: I64Array,
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        """Insert absent, distinct items with their payload (cuckoo: compiled item by item,
        else vectorised by rounds); items that find no slot grow their segment."""
        if place_items is not None:
            self._place_compiled(stored, seg, rows, age, cnt)
            return
        rounds = 0
        while stored.size:
            g1, g2 = self._buckets(stored, seg)
            f1 = self._keys2d[g1] == 0
            f2 = self._keys2d[g2] == 0
            c1 = f1.sum(axis=1)
            c2 = f2.sum(axis=1)
            use2 = c2 > c1
            g = np.where(use2, g2, g1)
            cap = np.maximum(c1, c2)
            rank = _rank_within_groups(g)
            ok = rank < cap
            keep = ~ok
            if ok.any():
                free = np.where(use2[ok, None], f2[ok], f1[ok])
                cs = np.cumsum(free, axis=1)
                pos = np.argmax(free & (cs == (rank[ok] + 1)[:, None]), axis=1)
                slot = g[ok] * BUCKET + pos
                self._write(
                    slot,
                    stored[ok],
                    rows[ok],
                    None if age is None else age[ok],
                    None if cnt is None else cnt[ok],
                )
                self._size += np.bincount(seg[ok], minlength=self.segments)
            out: list[tuple[Any, ...]] = []
            stuck = np.flatnonzero(cap == 0)
            if stuck.size:
                r = self._rng.integers(0, 2 * BUCKET, size=stuck.size)
                gb = np.where(r < BUCKET, g1[stuck], g2[stuck])
                eslot = gb * BUCKET + r % BUCKET
                eslot, first = np.unique(eslot, return_index=True)
                ev = stuck[first]
                occ = self._read(eslot)
                self._write(
                    eslot,
                    stored[ev],
                    rows[ev],
                    None if age is None else age[ev],
                    None if cnt is None else cnt[ev],
                )
                keep[ev] = False
                out.append((occ, seg[ev]))
            rounds += 1
            parts = [(stored[keep], rows[keep]), *[(o[0][0], o[0][1]) for o in out]]
            segs = [seg[keep], *[o[1] for o in out]]
            ages = None if age is None else [age[keep], *[o[0][2] for o in out]]
            cnts = None if cnt is None else [cnt[keep], *[o[0][3] for o in out]]
            stored = np.concatenate([p[0] for p in parts])
            rows = np.concatenate([p[1] for p in parts])
            seg = np.concatenate(segs)
            age = None if ages is None else np.concatenate(ages)
            cnt = None if cnts is None else np.concatenate(cnts)
            if stored.size and rounds >= _EVICT_ROUNDS:
                self._grow_and_place(stored, seg, rows, age, cnt)
                return

    def _place_compiled(
        self,
        stored: npt.NDArray[np.uint64],
        seg: I64Array,
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        """``_place`` through the compiled kernel (:mod:`coadapt.sparse._place`)."""
        assert place_items is not None
        n = stored.size
        if n == 0:
            return
        self.generation += 1
        width = self.width
        no_age = np.empty(0, np.uint8 if self._age is None else self._age.dtype)
        no_cnt = np.empty((0, 2), np.uint32)
        t_age = no_age if self._age is None else self._age
        t_cnt = no_cnt if self._cnt is None else self._cnt
        # The items' own ages and counters; a table that keeps them but got none: zeros.
        p_age, p_cnt = no_age, no_cnt
        if self._age is not None:
            p_age = np.zeros(n, self._age.dtype) if age is None else np.ascontiguousarray(age)
        if self._cnt is not None:
            p_cnt = np.zeros((n, 2), np.uint32) if cnt is None else np.ascontiguousarray(cnt)
        left_stored = np.empty(n, np.uint64)
        left_seg = np.empty(n, np.int64)
        left_row = np.empty((n, width), np.float32)
        left_age = np.empty(n if self._age is not None else 0, no_age.dtype)
        left_cnt = np.empty((n if self._cnt is not None else 0, 2), np.uint32)
        n_left = int(
            place_items(
                np.ascontiguousarray(stored), np.ascontiguousarray(seg, np.int64),
                np.ascontiguousarray(rows, np.float32).reshape(n, width), p_age, p_cnt,
                self._keys, self._rows, t_age, t_cnt, self._size,
                self._nb, self._seg_buckets, self._b2_bits,
                np.uint64(self._rng.integers(0, 1 << 63)), MAX_KICKS,
                left_stored, left_seg, left_row, left_age, left_cnt,
            )
        )  # fmt: skip
        if n_left:
            self._grow_and_place(
                left_stored[:n_left],
                left_seg[:n_left],
                left_row[:n_left],
                None if self._age is None else left_age[:n_left],
                None if self._cnt is None else left_cnt[:n_left],
            )

    def _grow_and_place(
        self,
        stored: npt.NDArray[np.uint64],
        seg: I64Array,
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        """Displacement did not converge: grow the crowded segments one at a time (so the
        transient copy stays ~1/segments of the table) and re-place their items and these."""
        for s in np.unique(seg).tolist():
            mine = seg == s
            items = self._grow(int(s), int(np.count_nonzero(mine)))
            self._place_chunked(items[0], int(s), *items[1:])  # no concatenated copy
            del items
            self._place_chunked(
                stored[mine],
                int(s),
                rows[mine],
                None if age is None else age[mine],
                None if cnt is None else cnt[mine],
            )

    def _insert_new(
        self,
        stored: npt.NDArray[np.uint64],
        seg: I64Array,
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        """Grow segments that would exceed MAX_LOAD (one at a time), then place the items."""
        self._grow_for(np.bincount(seg, minlength=self.segments))
        self._place_chunked(stored, seg, rows, age, cnt)

    def _grow_for(self, incoming: I64Array) -> None:
        """Grow (and rehash) each segment that ``incoming`` more items would push over
        MAX_LOAD, one segment at a time, so the transient copy stays ~1/segments."""
        over = np.flatnonzero(self._size + incoming > MAX_LOAD * self._nb * BUCKET)
        for s in over.tolist():
            items = self._grow(int(s), int(incoming[s]))
            self._place_chunked(items[0], int(s), *items[1:])
            del items

    def _place_chunked(
        self,
        stored: npt.NDArray[np.uint64],
        seg: I64Array | int,
        rows: F32Array,
        age: npt.NDArray[Any] | None,
        cnt: npt.NDArray[np.uint32] | None,
    ) -> None:
        """``_place`` in slices of ``_CHUNK`` items (the items are distinct, so slices are
        independent): a rehashed segment or a large batch never makes table-sized temporaries.
        ``seg`` is one segment number for all items (a rehash) or one per item."""
        for a in range(0, stored.size, _CHUNK):
            b = a + _CHUNK
            self._place(
                stored[a:b],
                np.full(stored[a:b].size, seg, np.int64) if isinstance(seg, int) else seg[a:b],
                rows[a:b],
                None if age is None else age[a:b],
                None if cnt is None else cnt[a:b],
            )

    # ------------------------------------------------------------------ clock
    def _tick(self, now: float) -> int:
        return math.floor(now / self._quantum) & ((1 << self.age_bits) - 1)

    def touch(self, idx: I64Array, now: float) -> None:
        """Mark rows as used at ``now`` (resets their expiry clock)."""
        if self._age is None:
            return
        sel = np.asarray(idx, dtype=np.int64)
        self._age[sel[sel >= 0]] = self._tick(now)

    # ------------------------------------------------------------------ public API
    def __len__(self) -> int:
        return int(self._size.sum())

    def _probe_compiled(self, keys: npt.NDArray[np.uint64]) -> I64Array:
        """Slot per key or -1 with the compiled one-pass probe (only when it exists)."""
        assert probe_keys is not None
        k = np.ascontiguousarray(keys)
        idx = np.empty(k.size, np.int64)
        probe_keys(k, self._keys, self._nb, self._seg_buckets, self._shift, self._b2_bits, idx)
        return idx

    def lookup(self, keys: npt.ArrayLike, now: float | None = None) -> I64Array:
        """Row index per key, -1 where absent (not admitted or expired). ``now`` touches hits."""
        if probe_keys is not None:  # compiled: mix + probe per key, one pass (``_probe``)
            idx = self._probe_compiled(as_u64_keys(keys))
        else:
            stored, seg = self._prepare(keys)
            if stored.size == 0:
                return np.zeros(0, np.int64)
            idx = self._find(stored, seg)
        if now is not None:
            self.touch(idx, now)
        return idx

    def contains(self, keys: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        return self.lookup(keys) >= 0

    def take_found(
        self, keys: npt.ArrayLike, buf: F32Array, pos: I64Array, off: int = 0,
        at: I64Array | None = None,
    ) -> tuple[int, I64Array]:  # fmt: skip
        """Copy the embeddings of the keys that have a row into consecutive rows of ``buf``
        from row ``off`` (in key order) and write each one's row number to ``pos[at[i]]``
        (``pos[i]`` without ``at``); returns the next free row of ``buf`` and the indices
        (into ``keys``) of the keys without a row. A server's look-up: with the compiled probe
        it is one pass over the keys (probe, copy ``dim`` floats), no index array at all."""
        k = np.ascontiguousarray(as_u64_keys(keys))
        n = k.size
        if buf.ndim != 2 or buf.shape[1] != self.dim or buf.dtype != np.float32:
            raise ValueError(f"buf must be float32 (rows, {self.dim}), got {buf.dtype} {buf.shape}")
        if off < 0 or buf.shape[0] < off + n:
            raise ValueError(f"buf has {buf.shape[0]} rows, needs {off + n} (off={off})")
        if pos.ndim != 1 or (at is None and pos.size < n):
            raise ValueError(f"pos must be 1-D with at least {n} entries, got shape {pos.shape}")
        if at is not None:
            if at.shape != (n,):
                raise ValueError(f"at must have shape ({n},), got {at.shape}")
            if n and (int(at.min()) < 0 or int(at.max()) >= pos.size):
                raise IndexError(f"at holds positions outside pos (size {pos.size})")
        if _take_found is not None and buf.flags.c_contiguous and pos.dtype == np.int64:
            miss = np.empty(n, np.int64)
            at_ = np.empty(0, np.int64) if at is None else np.ascontiguousarray(at, np.int64)
            end, nmiss = _take_found(
                k, at_, self._keys, self._nb, self._seg_buckets, self._shift, self._b2_bits,
                self._rows, self.dim, buf, pos, off, miss,
            )  # fmt: skip
            return int(end), miss[:nmiss]
        idx = self.lookup(k)
        ok = idx >= 0
        hit = np.flatnonzero(ok)
        end = off + hit.size
        self.weights(idx if hit.size == n else idx[hit], buf[off:end])
        pos[hit if at is None else at[hit]] = np.arange(off, end)
        return end, np.flatnonzero(~ok)

    def lookup_or_insert(
        self,
        keys: npt.ArrayLike,
        now: float | None = None,
        init: Callable[[F32Array], None] | None = None,
    ) -> tuple[I64Array, npt.NDArray[np.bool_]]:
        """Rows for ``keys``, creating admitted missing ones (duplicates allowed).

        Returns ``(idx, new)``: ``idx[i]`` is -1 for an ID that is not admitted yet (the caller
        uses a default embedding); ``new[i]`` marks rows created by this call. ``init`` receives
        the new rows (float32 (n, width), zero-filled) and fills them in place, e.g.
        ``lambda r: opt.init_rows(r, dim, rng)``.
        """
        k = as_u64_keys(keys)
        new = np.zeros(k.size, dtype=bool)
        if k.size == 0:
            return np.zeros(0, np.int64), new
        if probe_keys is not None:
            # steady state (every key has a row): the compiled probe alone, no numpy hashing
            found = self._probe_compiled(k)
            if found.min() >= 0:
                if now is not None:
                    self.touch(found, now)
                return found, new
            del found
        stored, seg = self._prepare(k)
        idx = self._find(stored, seg)
        miss = np.flatnonzero(idx < 0)
        if miss.size:
            del idx  # not held through the insert: found again below
            inserted = self._insert_missing(k, stored, seg, miss, init)
            idx = self._find(stored, seg)  # placement may have moved existing rows
            new[miss] = idx[miss] >= 0
            del stored, seg, miss
            if inserted:
                _trim_heap()  # after the temporaries are gone
        if now is not None:
            self.touch(idx, now)
        return idx, new

    def _insert_missing(
        self,
        k: npt.NDArray[np.uint64],
        stored: npt.NDArray[np.uint64],
        seg: I64Array,
        miss: I64Array,
        init: Callable[[F32Array], None] | None,
    ) -> bool:
        """Insert the admitted keys at positions ``miss`` in slices of ``_CHUNK`` positions;
        returns whether anything was inserted. Slicing bounds the transients (unique, payload,
        the rows handed to ``init``) by the slice, not the caller's batch: at 10M dim-1 rows
        the batch-sized ones were a third of the process peak's excess over the table. A key
        repeated in a later slice is found there (inserted by an earlier slice), not re-added;
        admission counts per slice add up to the same sketch counts as one batch."""
        if self.sketch is None and miss.size > _CHUNK:
            # Grow once for the whole batch (as one unsliced insert would) before placing it
            # slice by slice: growing per slice rehashes small segments several times per call.
            # These batch-sized temporaries are gone before any segment is copied out.
            first = np.unique(stored[miss], return_index=True)[1]
            incoming = np.bincount(seg[miss[first]], minlength=self.segments)
            del first
            self._grow_for(incoming)
        inserted = False
        for a in range(0, miss.size, _CHUNK):
            m = miss[a : a + _CHUNK]
            uniq, first, counts = np.unique(stored[m], return_index=True, return_counts=True)
            useg = seg[m][first]
            if inserted:  # an earlier slice may have inserted some of these keys
                absent = self._find(uniq, useg) < 0
                uniq, useg = uniq[absent], useg[absent]
                first, counts = first[absent], counts[absent]
            if self.sketch is not None:
                seen = self.sketch.add(k[m][first], counts)
                adm = seen >= self.admit_after
                uniq, useg = uniq[adm], useg[adm]
            del first, counts
            if not uniq.size:
                continue
            self._insert_new(uniq, useg, *self._payload(uniq.size))
            inserted = True
            if init is not None:
                nidx = np.sort(self._find(uniq, useg))  # slot order, as one batch's init
                fresh = self._rows[nidx]
                init(fresh)
                self._rows[nidx] = fresh
        return inserted

    def assign(
        self, keys: npt.ArrayLike, rows: npt.ArrayLike, now: float | None = None
    ) -> I64Array:
        """Upsert rows by key, bypassing admission (restores, shard moves, tests)."""
        k = as_u64_keys(keys)
        vals = np.asarray(rows, dtype=np.float32)
        if vals.shape != (k.size, self.width):
            raise ValueError(f"rows must have shape ({k.size}, {self.width}), got {vals.shape}")
        if np.unique(k).size != k.size:
            raise ValueError("assign needs distinct keys; deduplicate them first")
        stored, seg = self._prepare(k)
        idx = self._find(stored, seg)
        miss = idx < 0
        if miss.any():
            _, age, cnt = self._payload(int(miss.sum()))
            self._insert_new(stored[miss], seg[miss], vals[miss], age, cnt)
            idx = self._find(stored, seg)
        self._rows[idx] = vals
        if miss.any():
            _trim_heap()
        if now is not None:
            self.touch(idx, now)
        return idx

    def row_arena(self) -> F32Array:
        """The (capacity, width) float32 row array itself, not a copy: compiled kernels read and
        update rows in place at indices from a lookup of the current ``generation`` (any
        insert, move, growth, deletion or expiry may move rows and makes such indices stale)."""
        return self._rows

    def _row_view(self) -> np.ndarray:
        """The row array seen as one opaque ``width * 4``-byte item per row: a gather or
        scatter of whole rows is then one ``memcpy`` per row (several times faster than 2-D
        fancy indexing, which walks the row element by element)."""
        return self._rows.view(np.dtype((np.void, 4 * self.width))).reshape(-1)

    def rows(self, idx: npt.ArrayLike, out: F32Array | None = None) -> F32Array:
        """Copy of full rows (weights + optimizer state), float32 (n, width); into ``out``
        (C-contiguous (n, width) float32) when given, which spares a fresh allocation."""
        i = np.asarray(idx, dtype=np.int64)
        if out is None:
            out = np.empty((i.size, self.width), np.float32)
        elif out.shape != (i.size, self.width) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 ({i.size}, {self.width}), got {out.shape}")
        if i.size and i.min() < 0:
            raise IndexError("rows got a negative index (-1 marks an ID without a row)")
        flat = out.view(np.dtype((np.void, 4 * self.width))).reshape(-1)
        np.take(self._row_view(), i, out=flat)
        return out

    def weights(
        self, idx: npt.ArrayLike, out: F32Array | None = None, scratch: F32Array | None = None
    ) -> F32Array:
        """Copy of the embedding part, float32 (n, dim), into ``out`` when given. ``scratch``
        (>= n x width float32, C-contiguous) holds the gathered full rows on the way."""
        i = np.asarray(idx, dtype=np.int64)
        if out is None:
            out = np.empty((i.size, self.dim), np.float32)
        if self.width == self.dim:
            return self.rows(i, out)
        need = i.size * self.width
        buf = scratch.reshape(-1)[:need] if scratch is not None and scratch.size >= need else None
        full = self.rows(i, None if buf is None else buf.reshape(i.size, self.width))
        np.copyto(out, full[:, : self.dim])
        return out

    def state(self, idx: npt.ArrayLike) -> F32Array:
        """Copy of the optimizer-state part, float32 (n, width - dim)."""
        return self._rows[np.asarray(idx, dtype=np.int64), self.dim :]

    def write_rows(self, idx: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Write back full rows at ``idx`` (from ``rows``/``lookup`` in the same call sequence)."""
        i = np.asarray(idx, dtype=np.int64)
        v = np.asarray(values, dtype=np.float32)
        if v.shape != (i.size, self.width):
            raise ValueError(f"values must have shape ({i.size}, {self.width}), got {v.shape}")
        if i.size and (i.min() < 0 or not bool(np.all(self._keys[i] != 0))):
            raise IndexError("write_rows got an index that is not a live row (-1 or stale index)")
        self._write_rows_unchecked(i, v)

    def _write_rows_unchecked(self, idx: I64Array, values: F32Array) -> None:
        """``write_rows`` for indices known live (same generation as the lookup that made them)."""
        v = np.ascontiguousarray(values, dtype=np.float32)
        self._row_view()[idx] = v.view(np.dtype((np.void, 4 * self.width))).reshape(-1)

    def delete(self, keys: npt.ArrayLike) -> int:
        """Remove rows by key; returns how many existed. Freed slots are reused by inserts."""
        stored, seg = self._prepare(keys)
        if stored.size == 0:
            return 0
        idx = self._find(stored, seg)
        hit = idx >= 0
        slots, first = np.unique(idx[hit], return_index=True)
        self.generation += 1
        self._keys[slots] = 0
        self._size -= np.bincount(seg[hit][first], minlength=self.segments)
        return int(slots.size)

    def expire(self, now: float, removed: list[npt.NDArray[np.uint64]] | None = None) -> int:
        """Drop rows untouched for ``ttl`` clock units; returns the number dropped. With
        ``removed`` (a list), the dropped IDs are appended to it (an export's deletions)."""
        if self._age is None:
            raise RuntimeError("expire() needs a table built with ttl=...; this one has none")
        mask = (1 << self.age_bits) - 1
        cur = self._tick(now)
        dropped = 0
        for s in range(self.segments):
            base = s * self._seg_slots
            cap = int(self._nb[s]) * BUCKET
            keys = self._keys[base : base + cap]
            ages = self._age[base : base + cap].astype(np.int64)
            dead = (keys != 0) & (((cur - ages) & mask) >= self._age_threshold)
            n = int(np.count_nonzero(dead))
            if n:
                self.generation += 1
                if removed is not None:
                    removed.append(self._original_keys(keys[dead], np.full(n, s, np.int64)))
                keys[dead] = 0
                self._size[s] -= n
                dropped += n
        return dropped

    def count(self, keys: npt.ArrayLike, clicks: npt.ArrayLike | None = None) -> None:
        """Add one exposure per occurrence (and ``clicks``) to the rows of present keys."""
        if self._cnt is None:
            raise RuntimeError("count() needs a table built with counters=True")
        k = as_u64_keys(keys)
        c = np.zeros(k.size, np.int64) if clicks is None else np.asarray(clicks).astype(np.int64)
        if c.shape != k.shape:
            raise ValueError(f"clicks shape {c.shape} does not match keys shape {k.shape}")
        if np.any(c < 0):
            raise ValueError("clicks must be non-negative")
        idx = self.lookup(k)
        hit = idx >= 0
        slots, inv = np.unique(idx[hit], return_inverse=True)
        if slots.size == 0:
            return
        add = np.stack(
            [np.bincount(inv, minlength=slots.size), np.bincount(inv, c[hit], slots.size)], axis=1
        ).astype(np.int64)
        cur = self._cnt[slots].astype(np.int64)
        self._cnt[slots] = np.minimum(cur + add, 0xFFFFFFFF).astype(np.uint32)

    def counters(self, idx: npt.ArrayLike) -> npt.NDArray[np.uint32]:
        """(exposures, clicks) per row, uint32 (n, 2)."""
        if self._cnt is None:
            raise RuntimeError("counters() needs a table built with counters=True")
        return self._cnt[np.asarray(idx, dtype=np.int64)]

    # ------------------------------------------------------------------ memory accounting
    @property
    def load_factor(self) -> float:
        return len(self) / float(self._nb.sum() * BUCKET)

    def raw_bytes_per_row(self) -> int:
        """Key + row (+ the two uint32 counters when enabled: they are payload, not overhead)."""
        return 8 + 4 * self.width + (8 if self._cnt is not None else 0)

    def _slot_arrays(self) -> list[int]:
        sizes = [8, 4 * self.width]
        if self._age is not None:
            sizes.append(self._age.dtype.itemsize)
        if self._cnt is not None:
            sizes.append(8)
        return sizes

    def nbytes(self) -> int:
        """Bytes held: committed pages of every slot array, the sketch and the metadata."""
        total = 0
        slots = self._touched * BUCKET
        whole = self._huge_ok and self.huge_pages == "whole"
        for addr, itemsize in zip(self._addrs, self._slot_arrays(), strict=True):
            if not whole:
                total += int((-(-(slots * itemsize) // _PAGE) * _PAGE).sum())
                continue
            # the committed ranges rounded out to huge pages, overlaps counted once
            lo = addr + np.arange(self.segments, dtype=np.int64) * self._seg_slots * itemsize
            a = lo // _HUGE * _HUGE
            b = -(-(lo + slots * itemsize) // _HUGE) * _HUGE
            end = np.maximum.accumulate(b)
            start = np.maximum(a, np.concatenate([[a[0]], end[:-1]]))
            total += int(np.maximum(end - start, 0).sum())
        total += self._level.nbytes + self._nb.nbytes + self._size.nbytes + self._touched.nbytes
        if self.sketch is not None:
            total += self.sketch.nbytes()
        return total

    def memory_report(self) -> dict[str, float]:
        n = len(self)
        raw = n * self.raw_bytes_per_row()
        return {
            "rows": n,
            "nbytes": self.nbytes(),
            "raw_bytes": raw,
            "ratio": self.nbytes() / raw if raw else math.inf,
            "load_factor": self.load_factor,
            "sketch_bytes": 0 if self.sketch is None else self.sketch.nbytes(),
        }

    # ------------------------------------------------------------------ iteration & persistence
    def _iter_slots(self, chunk_rows: int) -> Iterator[tuple[I64Array, int]]:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        for s in range(self.segments):
            base = s * self._seg_slots
            cap = int(self._nb[s]) * BUCKET
            for start in range(0, cap, chunk_rows):
                stop = min(cap, start + chunk_rows)
                occ = np.flatnonzero(self._keys[base + start : base + stop]) + base + start
                if occ.size:
                    yield occ, s

    def iter_chunks(
        self, chunk_rows: int = 65536
    ) -> Iterator[tuple[npt.NDArray[np.uint64], F32Array]]:
        """Yield ``(keys, rows)`` copies in chunks (do not mutate the table while iterating)."""
        for occ, s in self._iter_slots(chunk_rows):
            yield (
                self._original_keys(self._keys[occ], np.full(occ.size, s, np.int64)),
                self._rows[occ],
            )

    def _config(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "width": self.width,
            "ttl": self.ttl,
            "age_bits": self.age_bits,
            "counters": self.has_counters,
            "admit_after": self.admit_after,
            "sketch_width": 0 if self.sketch is None else self.sketch.width,
            "sketch_depth": 0 if self.sketch is None else self.sketch.depth,
            "segments": self.segments,
            "max_rows": self.max_rows,
        }

    def save(self, path: str | os.PathLike[str], chunk_rows: int = 65536) -> None:
        """Write the table atomically (temp file + fsync + rename) in one streaming file."""
        header = dict(self._config(), rows=len(self), quantum=self._quantum)
        if self.sketch is not None:
            header["sketch_added"] = self.sketch.added
            header["sketch_reset_after"] = self.sketch.reset_after
        blob = json.dumps(header).encode()
        with atomic_writer(path) as f:
            f.write(_MAGIC + struct.pack("<Q", len(blob)) + blob)
            for occ, s in self._iter_slots(chunk_rows):
                f.write(struct.pack("<Q", occ.size))
                keys = self._original_keys(self._keys[occ], np.full(occ.size, s, np.int64))
                f.write(keys.astype("<u8").tobytes())
                f.write(self._rows[occ].astype("<f4").tobytes())
                if self._age is not None:
                    f.write(self._age[occ].astype(self._age.dtype.newbyteorder("<")).tobytes())
                if self._cnt is not None:
                    f.write(self._cnt[occ].astype("<u4").tobytes())
            f.write(struct.pack("<Q", 0))
            if self.sketch is not None:
                f.write(self.sketch.table.tobytes())
            f.write(_END)

    @classmethod
    def load(cls, path: str | os.PathLike[str], max_rows: int | None = None) -> EmbeddingTable:
        """Read a file written by :meth:`save` (ages, counters and sketch included)."""
        with open(path, "rb") as f:
            return cls._load_stream(f, str(path), max_rows)

    @classmethod
    def _load_stream(cls, f: BinaryIO, name: str, max_rows: int | None) -> EmbeddingTable:
        def read(n: int) -> bytes:
            b = f.read(n)
            if len(b) != n:
                raise ValueError(f"{name}: truncated embedding-table file (wanted {n} bytes)")
            return b

        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{name}: not an embedding-table file written by EmbeddingTable.save")
        (hlen,) = struct.unpack("<Q", read(8))
        hdr = json.loads(read(hlen))
        n_rows = int(hdr["rows"])
        table = cls(
            hdr["dim"],
            hdr["width"],
            ttl=hdr["ttl"],
            age_bits=hdr["age_bits"],
            counters=hdr["counters"],
            admit_after=hdr["admit_after"],
            sketch_width=hdr["sketch_width"] or (1 << 18),
            sketch_depth=hdr["sketch_depth"] or 4,
            segments=hdr["segments"],
            max_rows=max(max_rows or hdr["max_rows"], n_rows),
            initial_rows=n_rows,
        )
        width = table.width
        while True:
            (n,) = struct.unpack("<Q", read(8))
            if n == 0:
                break
            keys = np.frombuffer(read(8 * n), dtype="<u8").astype(np.uint64)
            rows = np.frombuffer(read(4 * n * width), dtype="<f4").astype(np.float32)
            age = None
            if table._age is not None:
                adt = table._age.dtype
                age = np.frombuffer(read(adt.itemsize * n), dtype=adt.newbyteorder("<")).astype(adt)
            cnt = None
            if table._cnt is not None:
                cnt = np.frombuffer(read(8 * n), dtype="<u4").astype(np.uint32).reshape(n, 2)
            stored, seg = table._prepare(keys)
            table._insert_new(stored, seg, rows.reshape(n, width), age, cnt)
        if table.sketch is not None:
            sk = table.sketch
            sk.table[:] = np.frombuffer(read(sk.table.nbytes), np.uint8).reshape(sk.table.shape)
            sk.added = int(hdr.get("sketch_added", 0))
            sk.reset_after = int(hdr.get("sketch_reset_after", sk.reset_after))
        if read(len(_END)) != _END:
            raise ValueError(f"{name}: embedding-table file has a corrupt trailer")
        if len(table) != n_rows:
            raise ValueError(f"{name}: header says {n_rows} rows but the file holds {len(table)}")
        return table
