"""A sparse model as a server runs it: read-only sharded tables behind the trainer's own module.

The module is the trainer's (its factory, its dense weights); its
:class:`~coadapt.sparse.embedding.SparseEmbedding` / ``SparseEmbeddingCollection`` children are
swapped for :class:`ServingEmbedding` / :class:`ServingEmbeddingCollection`, which read rows
from the loaded tables directly: no deduplication by sorting (a 200 x 500 request has 100k IDs;
sorting them costs more than looking each one up), but the IDs every item of a request repeats
(user and context features) are looked up once (:func:`_item_blocks`); no autograd, and the same
torch ops on the same values as training, so predictions are bit-for-bit the trainer's. An ID
without a row gets the zero embedding, as an ID that is not admitted yet does in training. The
rows are not put back in request order: :meth:`ShardedTable.take` copies each shard's found
rows once into one buffer (with a zero row at its end) and ``embedding_bag`` reads them through
the positions it returns; a sum-pooled embedding copies no row at all
(:meth:`ShardedTable.pool_sum` sums them straight from the tables, bit for bit the same).

**Live deltas.** A :class:`SparseView` is what one served version sees: per table, the shards'
base tables and, while a delta is being merged, an *overlay* per shard holding the delta's rows
(and its deletions as flagged rows). A delta goes live in three steps: (1) off the serving path,
read it, build the overlays and check it fits the live state (chain digest, row counts); (2)
one pointer assignment makes the new version (new view: base + overlays, new dense module)
the one the next batch runs on; (3) the overlays are merged into the shared base tables in
small chunks *between* batches, never beside one, and finally dropped. Every lookup under the
new view consults the overlay first, so the merge changes no answer: each batch sees exactly
one version, old or new, never a mix (the consistency the server gives).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from coadapt.serve.artifacts import ArtifactError, IntegrityError, Manifest, _import_factory
from coadapt.sparse import _probe, _serve_lookup
from coadapt.sparse._hashing import as_u64_keys
from coadapt.sparse.embedding import SparseEmbedding, SparseEmbeddingCollection, ids_to_numpy
from coadapt.sparse.export import DeltaTable
from coadapt.sparse.server import SHARD_SALT, shard_of
from coadapt.sparse.table import EmbeddingTable

__all__ = [
    "MERGE_CHUNK",
    "MERGE_PAUSE",
    "Overlay",
    "PendingMerge",
    "RowSource",
    "ServingEmbedding",
    "ServingEmbeddingCollection",
    "ShardedTable",
    "SparseView",
    "TableStore",
    "TableView",
    "merge_now",
    "prepare_delta",
    "serving_module",
]

U64 = npt.NDArray[np.uint64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
MERGE_CHUNK = 8192
"""Rows merged into a base table per step between batches (bounds the pause a batch sees)."""
FILTER_BITS_PER_KEY = 16
"""Bits of an overlay's key filter per key, at least (its words are a power of two)."""
MERGE_PAUSE = 3.0
"""After each merge step the merger waits this many times the step's duration (a 25 % duty
cycle): requests arriving meanwhile see at most one step, and the merge takes at most a
quarter of the core while it lasts (measured at 50 %: p99 during a delta rose towards 2x
from the merge alone, as an 800 KB body's reads interleave with the steps)."""


_NO_BACK: I64 = np.empty(0, np.int64)  # pool_sum's "positions are the keys themselves"

EXTRA_SEGMENTS = 1024
"""Segments of a shard's table of added rows: a growth step re-places 1/1024 of it."""


def _extras(base: EmbeddingTable, rows: int = 0) -> EmbeddingTable:
    """An extras table pre-sized for ``rows`` rows (no growth step until it holds them)."""
    return EmbeddingTable(
        base.dim, base.dim, max_rows=max(base.max_rows, 2 * rows), segments=EXTRA_SEGMENTS,
        initial_rows=rows,
    )  # fmt: skip


def _resized_extras(
    base: EmbeddingTable, old: EmbeddingTable | None, need: int
) -> tuple[EmbeddingTable, int]:
    """A copy of ``old`` with room for ``need`` rows and as many again (built off the serving
    path: a live table is never grown between batches); the table and the rows it has room for."""
    room = max(1 << 12, 2 * need)
    new = _extras(base, room)
    if old is not None:
        for keys, rows in old.iter_chunks():
            new.assign(keys, rows)
    return new, room


def _by_shard(keys: U64, nsh: int) -> list[I64]:
    """Positions of ``keys`` per shard (``shard_of``), ascending: one compiled counting sort
    when the kernels are available, else ``shard_of`` and a ``flatnonzero`` per shard."""
    if _probe.split_shards is None:
        sh = shard_of(keys, nsh)
        return [np.flatnonzero(sh == s) for s in range(nsh)]
    order = np.empty(keys.size, np.int64)
    starts = np.zeros(nsh + 1, np.int64)
    _probe.split_shards(np.ascontiguousarray(as_u64_keys(keys)), SHARD_SALT, nsh, order, starts)
    return [order[starts[s] : starts[s + 1]] for s in range(nsh)]


def _rows_at(buf: F32, pos: I64) -> F32:
    """``buf[pos]`` with one memcpy per row (whole rows as opaque items, not element by
    element)."""
    row = np.dtype((np.void, buf.dtype.itemsize * buf.shape[1]))
    out = np.empty((pos.size, buf.shape[1]), np.float32)
    np.take(buf.view(row).reshape(-1), pos, out=out.view(row).reshape(-1))
    return out


class RowSource(Protocol):
    """What a serving embedding reads rows from: tables in this process (:class:`ShardedTable`)
    or table-shard processes (:mod:`coadapt.serve.table_shards`)."""

    @property
    def dim(self) -> int: ...

    def gather(self, keys: U64) -> F32:
        """Rows of ``keys`` in order (duplicates fine); zero rows for keys without one."""
        ...


class TableView(Protocol):
    """The tables one served version reads, by name."""

    @property
    def tables(self) -> Mapping[str, RowSource]: ...


class Overlay:
    """A delta's rows while it is merged: keys sorted once (one argsort, ~50 ms for 500k keys,
    where inserting them into a hash table costs seconds of the worker's CPU beside the batches)
    and looked up with a binary search; ``dim`` columns + a deleted flag, as one row array.

    A request's keys are nearly all absent from a 1 % delta, and a binary search of each
    (numpy's ``searchsorted``: 10-24 ms for the 100k IDs of a 200 x 500 request, measured)
    cost the request more than the whole look-up of its rows. So the overlay keeps a filter of
    its keys, 16-32 bits a key in 64-bit words, two bits a key in one word (1-2 MB for 500k
    keys, built off the serving path); only the ~2 % of absent keys it lets through are
    searched for."""

    def __init__(self, keys: U64, rows: F32) -> None:
        keys = as_u64_keys(keys)
        order = np.argsort(keys, kind="stable")
        self.keys = np.ascontiguousarray(keys[order])
        self._rows = np.ascontiguousarray(rows[order])
        words = int(self.keys.size * FILTER_BITS_PER_KEY // 64 - 1).bit_length()
        self.width = np.uint64(min(max(4, words), 52))  # the bits' shifts need width <= 52
        self.words = np.zeros(1 << int(self.width), np.uint64)
        word, need = self._hash(self.keys)
        np.bitwise_or.at(self.words, word, need)

    def _hash(self, keys: U64) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """Each key's filter word and the two bits it sets there (:data:`~coadapt.sparse.
        _serve_lookup.FILTER_MULT`)."""
        h = keys * _serve_lookup.FILTER_MULT  # wraps mod 2**64, as meant
        w, one, low = self.width, np.uint64(1), np.uint64(63)
        bits = (one << ((h >> (np.uint64(58) - w)) & low)) | (
            one << ((h >> (np.uint64(52) - w)) & low)
        )
        return h >> (np.uint64(64) - w), bits

    def lookup(self, keys: U64) -> npt.NDArray[np.int64]:
        """Row index per key, -1 where absent."""
        keys = as_u64_keys(keys)
        out = np.full(keys.size, -1, np.int64)
        word, need = self._hash(keys)
        maybe = np.flatnonzero(self.words[word] & need == need)
        if maybe.size:
            k = keys[maybe]
            pos = np.searchsorted(self.keys, k)
            pos[pos >= self.keys.size] = 0
            hit = self.keys[pos] == k
            out[maybe[hit]] = pos[hit]
        return out

    def point(self, keys: U64, refs: I64) -> None:
        """``refs[i]`` = address of ``keys[i]``'s row here where this overlay holds the key, 0
        where it deletes it; the rest unchanged (:func:`~coadapt.sparse._serve_lookup.
        overlay_rows`; the caller has checked that the kernels exist)."""
        kern = _serve_lookup.overlay_rows
        assert kern is not None
        rows = self._rows
        dim = rows.shape[1] - 1
        kern(keys, self.width, self.words, self.keys, rows.ctypes.data, rows.strides[0], dim, refs)

    def rows(self, idx: npt.NDArray[np.int64]) -> F32:
        return self._rows[idx]


class ShardedTable:
    """One table as served. Per shard: the *base* (a full version's table, loaded as its slot
    image), the *extras* (rows added by later deltas) and, while a delta is being merged, an
    *overlay* (the delta's rows, ``dim`` columns + a deleted flag).

    Why rows added by a delta go to a separate table: inserting into the big base table would
    now and then grow one of its segments, which re-places 1/64 of the shard's rows (hundreds
    of milliseconds at 25M rows) between two batches. Updates of existing rows are written in
    place and deletions clear a slot; neither moves any row. The extras table is sized *before*
    a delta goes live (off the serving path: when the delta's new rows would not fit, a copy
    with twice the room is built beside the live one), so the merge never grows a table."""

    def __init__(
        self, name: str, dim: int, bases: list[EmbeddingTable],
        extras: list[EmbeddingTable | None] | None = None,
        overlays: list[Overlay | None] | None = None,
        room: list[int] | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.dim = dim
        self.bases = bases
        # created at the first added row; shared (the same list) by every view of these tables
        self.extras: list[EmbeddingTable | None] = (
            extras if extras is not None else [None] * len(bases)
        )
        self.overlays: list[Overlay | None] = overlays or [None] * len(bases)
        self.room = room if room is not None else [0] * len(bases)  # rows each extras fits

    def rows(self, s: int) -> int:
        """Rows held for shard ``s`` (base + extras)."""
        extra = self.extras[s]
        return len(self.bases[s]) + (0 if extra is None else len(extra))

    def take(self, keys: U64) -> tuple[F32, I64]:
        """The rows of ``keys`` as ``(buf, pos)``: key ``i``'s row is ``buf[pos[i]]`` and the last
        row of ``buf`` is zeros (keys without a row, deletions). A serving embedding hands
        ``pos`` to ``embedding_bag`` as its indices, so the rows are never put back in request
        order and no row is zero-filled or masked: each shard's found rows are copied once,
        whole, into consecutive rows of ``buf`` (measured, 200 x 500 IDs, 5M rows, interleaved
        A/B: forward 1.16x faster at p50 than zero-filling, masking and scattering rows back in
        request order; the hash look-up left is two thirds of the request)."""
        n = keys.size
        buf = np.empty((n + 1, self.dim), np.float32)
        buf[n] = 0.0
        pos = np.full(n, n, np.int64)
        nsh = len(self.bases)
        if nsh == 1:
            self._take_shard(0, keys, None, buf, pos, 0)
            return buf, pos
        off = 0
        for s, sel in enumerate(_by_shard(keys, nsh)):
            if sel.size:
                off = self._take_shard(s, keys[sel], sel, buf, pos, off)
        return buf, pos

    def _take_shard(
        self, s: int, keys: U64, at: I64 | None, buf: F32, pos: I64, off: int
    ) -> int:  # fmt: skip
        """Rows of ``keys`` (all of shard ``s``, at positions ``at`` of the request; None: all)
        appended to ``buf`` from row ``off``, their rows' numbers written to ``pos``; the next
        free row of ``buf``. Order of precedence: the overlay (a delta being merged), then the
        base table, then the extras (rows added by earlier deltas)."""
        ov = self.overlays[s]
        if ov is not None:
            oi = ov.lookup(keys)
            hit = np.flatnonzero(oi >= 0)
            if hit.size:
                r = ov.rows(oi[hit])
                live = np.flatnonzero(r[:, self.dim] == 0.0)  # flagged rows are deletions
                buf[off : off + live.size] = r[live, : self.dim]
                where = hit[live] if at is None else at[hit[live]]
                pos[where] = np.arange(off, off + live.size)
                off += live.size
                rest = np.ones(keys.size, bool)
                rest[hit] = False
                keys = keys[rest]
                at = np.flatnonzero(rest) if at is None else at[rest]
        if keys.size == 0:
            return off
        off, miss = self._take_from(self.bases[s], keys, at, buf, pos, off)
        extra = self.extras[s]
        if miss.size and extra is not None and len(extra):
            sub = miss if at is None else at[miss]
            off, _ = self._take_from(extra, keys[miss], sub, buf, pos, off)
        return off

    @staticmethod
    def _take_from(
        table: EmbeddingTable, keys: U64, at: I64 | None, buf: F32, pos: I64, off: int
    ) -> tuple[int, I64]:  # fmt: skip
        """One table's rows of ``keys`` into ``buf`` from row ``off``; the next free row and
        the indices (into ``keys``) of the keys it has no row for (one compiled pass when the
        kernels are available: :meth:`EmbeddingTable.take_found`)."""
        return table.take_found(keys, buf, pos, off, at)

    def pool_sum(self, keys: U64, back: I64, bag: int) -> F32 | None:
        """``embedding_bag(mode="sum")`` of this table's rows, bit for bit, without copying a
        row: position ``p`` (of ``back.size`` positions, or ``keys.size`` when ``back`` is
        empty) reads the row of ``keys[back[p]]`` (``keys[p]``), and bag ``b`` sums positions
        ``b * bag`` to ``b * bag + bag - 1``. None where the compiled kernels are absent: the
        caller takes :meth:`take`'s path then.

        Why: one compiled pass finds every key's row in its shard's base table, with ~32
        cache misses in flight and no split by shard, and the pooling reads each row once
        from the table (:mod:`coadapt.sparse._serve_lookup`; figures in docs/serve.md). Keys
        absent from a base table are then looked for in their shard's extras (rows added by
        deltas), and while a delta is merged its overlays' rows replace what was found
        (:meth:`Overlay.point`), the order of precedence of :meth:`_take_shard`. Until the
        overlays took this path, every batch of a merge ran through :meth:`take` at 3.3x the
        time (5M rows, measured): the slow window of a hot swap."""
        probe, pool = _serve_lookup.probe_rows, _serve_lookup.pool_rows
        n = back.size if back.size else keys.size
        if probe is None or pool is None or bag < 1 or n == 0 or n % bag:
            return None
        arenas = [b.row_arena() for b in self.bases]
        if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arenas):
            return None  # pragma: no cover - every table's row array is C-contiguous float32
        k = np.ascontiguousarray(as_u64_keys(keys))  # int64 IDs: the same bits
        geo = self._geometry()
        refs = np.empty(k.size, np.int64)
        # the tables stay alive and unchanged during the call: rows are read by address
        missing = probe(k, SHARD_SALT, len(self.bases), *geo, refs)
        if missing and any(e is not None and len(e) for e in self.extras):
            self._refs_from_extras(k, refs)
        for ov in self.overlays:  # a delta being merged: its rows answer first
            if ov is not None:
                ov.point(k, refs)  # holds only its shard's keys: a hit is of that shard
        out = np.empty((n // bag, self.dim), np.float32)
        pool(refs, np.ascontiguousarray(back, np.int64), bag, self.dim, out)
        return out

    def _geometry(self) -> tuple[I64, I64, I64, I64, I64, I64, I64, I64]:
        """What :func:`~coadapt.sparse._serve_lookup.probe_rows` needs of the base tables:
        addresses of their slot keys and rows, row strides, every table's bucket counts
        (concatenated) and where each table's begin, bucket strides, shifts, second-bucket
        bits."""
        bs = self.bases
        nb = [b._nb for b in bs]
        at = np.cumsum([0] + [x.size for x in nb[:-1]])
        return (
            np.array([b._keys.ctypes.data for b in bs], np.int64),
            np.array([b.row_arena().ctypes.data for b in bs], np.int64),
            np.array([b.row_arena().strides[0] for b in bs], np.int64),
            np.ascontiguousarray(np.concatenate(nb), np.int64),
            np.asarray(at, np.int64),
            np.array([b._seg_buckets for b in bs], np.int64),
            np.array([b._shift for b in bs], np.int64),
            np.array([b._b2_bits for b in bs], np.int64),
        )

    def _refs_from_extras(self, keys: U64, refs: I64) -> None:
        """Row addresses, in each shard's extras, of the keys without a base row
        (``refs == 0``)."""
        miss = np.flatnonzero(refs == 0)
        nsh = len(self.bases)
        sh = shard_of(keys[miss], nsh) if nsh > 1 else np.zeros(miss.size, np.int64)
        for s, extra in enumerate(self.extras):
            if extra is None or not len(extra):
                continue
            sel = miss[sh == s]
            idx = extra.lookup(keys[sel])
            hit = idx >= 0
            arena = extra.row_arena()
            refs[sel[hit]] = arena.ctypes.data + idx[hit] * arena.strides[0]

    def _one(self, s: int, keys: U64) -> F32:
        buf = np.empty((keys.size + 1, self.dim), np.float32)
        buf[keys.size] = 0.0
        pos = np.full(keys.size, keys.size, np.int64)
        self._take_shard(s, keys, None, buf, pos, 0)
        return _rows_at(buf, pos)

    def shard_rows(self, s: int, keys: U64) -> F32:
        """Rows of ``keys`` that all belong to shard ``s`` (a table-shard process's look-up)."""
        return self._one(s, keys)

    def gather(self, keys: U64) -> F32:
        """Rows of ``keys`` (any order, duplicates fine); zero rows for keys without one."""
        return _rows_at(*self.take(keys))

    def present(self, s: int, keys: U64) -> int:
        """How many of ``keys`` (distinct) have a row in shard ``s``."""
        if keys.size == 0:
            return 0
        hit = self.bases[s].lookup(keys) >= 0
        extra = self.extras[s]
        if extra is not None and len(extra) and not hit.all():
            hit[~hit] = extra.lookup(keys[~hit]) >= 0
        return int(np.count_nonzero(hit))

    def upsert(self, s: int, keys: U64, rows: F32) -> None:
        """Rows of existing keys written in place; new keys into the extras."""
        idx = self.bases[s].lookup(keys)
        inb = idx >= 0
        if inb.any():
            self.bases[s].write_rows(idx[inb], rows[inb])
        if not inb.all():
            extra = self.extras[s]
            if extra is None:
                extra = self.extras[s] = _extras(self.bases[s])
            extra.assign(keys[~inb], rows[~inb])

    def delete(self, s: int, keys: U64) -> None:
        self.bases[s].delete(keys)
        extra = self.extras[s]
        if extra is not None and len(extra):
            extra.delete(keys)


@dataclass
class SparseView:
    """The tables one served version reads."""

    tables: dict[str, ShardedTable]

    @classmethod
    def of(cls, loaded: Any) -> SparseView:
        """A view of a :class:`~coadapt.serve.sparse_artifacts.SparseTables` (no overlays);
        compiles (or loads from the disk cache) the probe kernels before the first request."""
        _probe.warm()
        view = cls({n: ShardedTable(n, loaded.dims[n], ts) for n, ts in loaded.shards.items()})
        for t in view.tables.values():  # the pooling kernels, typed for this shard count
            t.pool_sum(np.zeros(1, np.uint64), _NO_BACK, 1)
        return view


class TableStore:
    """The read-only store a served module is built around (the SparseStore protocol)."""

    def __init__(self, view: TableView) -> None:
        self.view = view
        self.step = 0

    def dim(self, table: str) -> int:
        try:
            return self.view.tables[table].dim
        except KeyError:
            raise KeyError(f"no sparse table {table!r} in this version") from None

    def pull(self, ids: Mapping[str, U64]) -> dict[str, F32]:
        return {n: self.view.tables[n].gather(np.asarray(k, np.uint64)) for n, k in ids.items()}

    def push(self, grads: Mapping[str, Any]) -> None:
        raise RuntimeError("a served model is read-only: it cannot be trained")


def _rows_and_positions(table: RowSource, keys: U64) -> tuple[F32, I64]:
    """``(buf, pos)`` with key ``i``'s row at ``buf[pos[i]]``: a local table's unordered rows
    (:meth:`ShardedTable.take`, no reordering pass), else the source's rows in order."""
    if isinstance(table, ShardedTable):
        return table.take(keys)
    return table.gather(keys), np.arange(keys.size, dtype=np.int64)


MAX_BLOCK_ROWS = 64
"""Longest item (in rows of the IDs a serving embedding sees) searched for shared IDs."""
MIN_SHARED = 0.1
"""Share of an item's IDs that must repeat in every item of the batch for the dedup to run."""


def _item_blocks(ids: U64) -> tuple[U64, I64] | None:
    """The IDs every item of a batch repeats at the same place, looked up once: ``(keys,
    back)`` with ``ids.reshape(-1) == keys[back]``, or None when no such share is found.

    A ranking request scores many candidate items for one user: the user and context features
    are the same IDs in every item. The embedding sees the items as consecutive blocks of ``k``
    rows (the model's reshape of ``(items, features)``); ``k`` is found by comparing the first
    two blocks for each divisor of the row count (a few small compares: ~0.1 ms for 200 x 500
    IDs when nothing repeats), then the positions equal in *every* block are taken once. Exact:
    a repeated ID is the same row, and the rows reach ``embedding_bag`` in the same order.
    Several requests batched together differ in their users: their blocks share less and the
    dedup usually does not run (each batch still scores exactly)."""
    r, width = ids.shape
    for k in range(1, min(r // 2, MAX_BLOCK_ROWS) + 1):
        if r % k:
            continue
        need = max(1, round(MIN_SHARED * k * width))
        if np.count_nonzero(ids[:k] == ids[k : 2 * k]) < need:
            continue
        blocks = ids.reshape(r // k, k * width)
        same = (blocks == blocks[0]).all(axis=0)
        ns = int(np.count_nonzero(same))
        if ns < need:
            continue
        own = ~same
        keys = np.concatenate([blocks[0, same], blocks[:, own].reshape(-1)])
        back = np.empty(blocks.shape, np.int64)
        back[:, same] = np.arange(ns)
        back[:, own] = np.arange(ns, keys.size).reshape(r // k, -1)
        return keys, back.reshape(-1)
    return None


class ServingEmbedding(nn.Module):
    """:class:`SparseEmbedding`'s forward on served tables (same ops, no dedupe, no autograd)."""

    def __init__(self, table: RowSource, mode: str) -> None:
        super().__init__()
        self.table = table
        self.dim = table.dim
        self.mode = mode

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        arr = ids_to_numpy(ids)
        flat = arr.reshape(-1)
        shared = _item_blocks(arr) if ids.dim() == 2 and offsets is None else None
        if ids.dim() == 2 and offsets is None and self.mode == "sum" and ids.shape[1]:
            # no row copied, no index array: probe and pool in compiled passes (exact)
            pooled = self._pooled(flat, shared, ids.shape[1])
            if pooled is not None:
                return torch.from_numpy(pooled)
        if shared is None:
            buf, at = _rows_and_positions(self.table, flat)
        else:  # IDs repeated by every item looked up once
            keys, back = shared
            buf, at = _rows_and_positions(self.table, keys)
            at = at[back]
        rows, pos = torch.from_numpy(buf), torch.from_numpy(at)
        if offsets is not None:
            return F.embedding_bag(pos, rows, offsets, mode=self.mode)
        if ids.dim() == 1:
            return rows if buf.shape[0] == flat.size else rows[pos]
        if ids.dim() == 2:
            return F.embedding_bag(pos.view(ids.shape), rows, mode=self.mode)
        raise ValueError(f"ids must be (B,), (B, L) or 1-D with offsets, got {tuple(ids.shape)}")

    def _pooled(self, flat: U64, shared: tuple[U64, I64] | None, bag: int) -> F32 | None:
        """The sum of each bag of ``bag`` IDs by :meth:`ShardedTable.pool_sum`; None where it
        does not apply (rows from table-shard processes, no kernels)."""
        if not isinstance(self.table, ShardedTable):
            return None
        keys, back = (flat, _NO_BACK) if shared is None else shared
        return self.table.pool_sum(keys, back, bag)


class ServingEmbeddingCollection(nn.Module):
    """:class:`SparseEmbeddingCollection`'s forward on served tables."""

    def __init__(self, tables: list[RowSource], mode: str) -> None:
        super().__init__()
        self.tables = tables
        self.dim = tables[0].dim
        self.mode = mode

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        nf = len(self.tables)
        if ids.dim() not in (2, 3) or ids.shape[1] != nf:
            raise ValueError(f"ids must be (B, {nf}) or (B, {nf}, L), got {tuple(ids.shape)}")
        arr = ids_to_numpy(ids)
        b = ids.shape[0]
        per = [
            t.gather(np.ascontiguousarray(arr[:, f]).reshape(-1)) for f, t in enumerate(self.tables)
        ]
        if ids.dim() == 2:
            return torch.from_numpy(np.stack(per, axis=1))  # (B, F, dim): what F.embedding gathers
        rows = torch.from_numpy(np.concatenate(per))  # field-major, as the trainer's bags index
        lf = ids.shape[2]
        pos = torch.arange(b * nf * lf).view(nf, b, lf).transpose(0, 1).reshape(b * nf, lf)
        return F.embedding_bag(pos, rows, mode=self.mode).view(b, nf, self.dim)


def _swap_embeddings(module: nn.Module, view: TableView) -> int:
    """Replace every sparse embedding child with its serving twin; how many were replaced."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, SparseEmbeddingCollection):
            tables = [_table(view, t, child.dim) for t in child.table_names]
            setattr(module, name, ServingEmbeddingCollection(tables, child.mode))
            n += 1
        elif isinstance(child, SparseEmbedding):
            setattr(
                module,
                name,
                ServingEmbedding(_table(view, child.table_name, child.dim), child.mode),
            )
            n += 1
        else:
            n += _swap_embeddings(child, view)
    return n


def _table(view: TableView, name: str, dim: int) -> RowSource:
    t = view.tables.get(name)
    if t is None:
        raise ArtifactError(
            f"the model reads sparse table {name!r}, the version has {sorted(view.tables)}"
        )
    if t.dim != dim:
        raise IntegrityError(
            f"sparse table {name!r}: the model wants dim {dim}, the version has {t.dim}"
        )
    return t


def serving_module(m: Manifest, dense: Mapping[str, torch.Tensor], view: TableView) -> nn.Module:
    """The factory's module around ``view``, with ``dense`` loaded, in eval mode (the probe
    kernels warmed: the first request pays no compile)."""
    _probe.warm()
    module = _import_factory(m.factory)(**m.factory_kwargs, store=TableStore(view))
    if not isinstance(module, nn.Module):
        raise ArtifactError(f"factory {m.factory!r} returned {type(module).__name__}, no Module")
    _swap_embeddings(module, view)
    try:
        module.load_state_dict(dict(dense), strict=True)
    except RuntimeError as exc:
        raise IntegrityError(f"version {m.version} does not fit {m.factory}: {exc}") from exc
    return module.eval()


# ----------------------------------------------------------------------------- live deltas


@dataclass
class PendingMerge:
    """A delta made visible through overlays, still to be merged into the base tables."""

    view: SparseView
    parts: dict[str, list[DeltaTable]]

    def steps(self) -> Iterator[Callable[[], None]]:
        """Small merge steps; run each between batches, then :meth:`finish`."""
        for name, parts in self.parts.items():
            t = self.view.tables[name]
            for s, part in enumerate(parts):
                for i in range(0, part.keys.size, MERGE_CHUNK):
                    k, r = part.keys[i : i + MERGE_CHUNK], part.rows[i : i + MERGE_CHUNK]
                    yield functools.partial(t.upsert, s, k, r)
                for i in range(0, part.deleted.size, MERGE_CHUNK):
                    yield functools.partial(t.delete, s, part.deleted[i : i + MERGE_CHUNK])

    def finish(self) -> list[str]:
        """Drop the overlays (the tables now hold the same rows); problems found, if any."""
        problems = []
        for name, parts in self.parts.items():
            t = self.view.tables[name]
            for s, part in enumerate(parts):
                if t.rows(s) != part.rows_after:
                    problems.append(
                        f"table {name!r} shard {s}: {t.rows(s)} rows after the merge, "
                        f"the publisher had {part.rows_after}"
                    )
            t.overlays = [None] * len(t.bases)
        return problems


def prepare_delta(
    live: SparseView, parts: dict[str, list[DeltaTable]], version: str
) -> PendingMerge:
    """Step (1) of a live delta, off the serving path (reads of the live tables only): check it
    fits (row counts after it), build the overlays; the returned merge's view is the new one."""
    tables: dict[str, ShardedTable] = {}
    for name, t in live.tables.items():
        ps = parts.get(name)
        if ps is None or len(ps) != len(t.bases):
            raise IntegrityError(
                f"version {version}: delta lacks table {name!r} or has another shard count"
            )
        overlays: list[Overlay | None] = []
        extras, room = list(t.extras), list(t.room)
        for s, part in enumerate(ps):
            added = part.keys.size - t.present(s, part.keys)
            expect = t.rows(s) + added - t.present(s, part.deleted)
            if expect != part.rows_after:
                raise IntegrityError(
                    f"version {version}: table {name!r} shard {s} would hold {expect} rows, the "
                    f"publisher had {part.rows_after}: the delta does not fit the live state"
                )
            held = 0 if extras[s] is None else len(extras[s])  # type: ignore[arg-type]
            if added and held + added > room[s]:  # grow it here, not between batches
                extras[s], room[s] = _resized_extras(t.bases[s], extras[s], held + added)
            n = part.keys.size + part.deleted.size
            if n == 0:
                overlays.append(None)
                continue
            vals = np.zeros((n, t.dim + 1), np.float32)
            vals[: part.keys.size, : t.dim] = part.rows
            vals[part.keys.size :, t.dim] = 1.0
            overlays.append(Overlay(np.concatenate([part.keys, part.deleted]), vals))
        tables[name] = ShardedTable(name, t.dim, t.bases, extras, overlays, room)
    return PendingMerge(SparseView(tables), parts)


def merge_now(view: SparseView, parts: dict[str, list[DeltaTable]], version: str) -> SparseView:
    """Apply a delta at once to tables nothing serves yet (a version being built from files);
    the view that holds the result (updates in place, added rows in the pre-sized extras: no
    base table grows, unlike re-inserting every row)."""
    pending = prepare_delta(view, parts, version)
    for step in pending.steps():
        step()
    problems = pending.finish()
    if problems:
        raise IntegrityError(f"version {version}: " + "; ".join(problems))
    return pending.view
