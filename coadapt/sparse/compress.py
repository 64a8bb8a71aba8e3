"""Push-side compression of sparse embedding gradients, with worker-side error feedback.

A worker pushes ``(n, dim)`` float32 gradients for ``n`` unique 64-bit ids. Uncompressed that
costs ``n * (8 + 4*dim)`` bytes (:func:`raw_nbytes`). :class:`GradientCompressor` shrinks it:

* values: ``fp32`` (exact), ``int8`` (per-row scale ``max|g|/127``, round to nearest) or
  ``ternary`` (TernGrad: per-row scale ``max|g|``, values in {-1, 0, +1} packed 4 per byte;
  stochastic with a seeded rng — unbiased — or deterministic rounding);
* sparsification: ``topk`` keeps the ``density`` fraction of *rows* with the largest L2 norm;
  ``threshold`` keeps the *elements* with ``|g| >= threshold`` (a per-row bitmap says which).
  Top-k works on rows on purpose: every sent row costs an 8-byte id, so at 1 % density
  element-wise selection would spend more on ids and indices than the 99 % target allows.

Error feedback: whatever is not delivered (unsent rows, masked elements, rounding error) is
kept in a per-id residual and added to that id's next gradient, so no gradient mass is lost,
only delayed. Residuals live in :class:`ResidualTable`, bounded by ``residual_capacity`` rows:
when full, the least recently touched residuals are evicted — ``on_evict="flush"`` sends them
exactly (fp32) in the same message (lossless, costs bytes), ``"drop"`` discards them and counts
the discarded mass in :attr:`GradientCompressor.dropped_l1`.

Wire format (little-endian, no pickle), produced by :meth:`GradientCompressor.encode` and read
by :func:`decode`::

    header  "<4sBBHIIII": magic b"CGC1", codec (0 fp32, 1 int8, 2 ternary), flags (bit 0:
            element bitmap present), reserved, dim, n_rows, n_values, n_flush
    ids     uint64[n_rows]
    scales  float32[n_rows]                  (int8 / ternary only)
    bitmap  uint8[n_rows, ceil(dim / 8)]     (flag bit 0; little bit order)
    values  float32 | int8 [n_values], or uint8[ceil(n_values / 4)] for ternary (2-bit codes)
    flush   uint64[n_flush] ids, then float32[n_flush, dim] exact residuals
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "CompressionConfig",
    "GradientCompressor",
    "ResidualTable",
    "ShardCompressor",
    "decode",
    "decode_shard",
    "is_empty",
    "raw_nbytes",
]

_MAGIC = b"CGC1"
_HEADER = struct.Struct("<4sBBHIIII")
_CODECS = {"fp32": 0, "int8": 1, "ternary": 2}
_CODEC_NAMES = {v: k for k, v in _CODECS.items()}
_FLAG_MASK = 1

ValueCodec = Literal["fp32", "int8", "ternary"]
Sparsifier = Literal["none", "topk", "threshold"]
EvictPolicy = Literal["flush", "drop"]
KRounding = Literal["ceil", "stochastic"]
Scope = Literal["shard", "table"]


def raw_nbytes(n_rows: int, dim: int) -> int:
    """Bytes of the uncompressed push: an 8-byte id and ``dim`` float32 values per row."""
    return n_rows * (8 + 4 * dim)


@dataclass(frozen=True)
class CompressionConfig:
    """How pushes are compressed; see the module docstring for the meaning of each knob."""

    values: ValueCodec = "int8"
    sparsify: Sparsifier = "none"
    density: float = 0.01
    threshold: float = 0.0
    stochastic: bool = False
    error_feedback: bool = True
    residual_capacity: int = 1_000_000
    on_evict: EvictPolicy = "flush"
    seed: int = 0
    k_rounding: KRounding = "ceil"
    scope: Scope = "shard"  # one payload + one top-k budget per shard push, or per table

    def __post_init__(self) -> None:
        if self.values not in _CODECS:
            raise ValueError(f"values must be one of {sorted(_CODECS)}, got {self.values!r}")
        if self.sparsify not in ("none", "topk", "threshold"):
            raise ValueError(
                f"sparsify must be 'none', 'topk' or 'threshold', got {self.sparsify!r}"
            )
        if not 0 < self.density <= 1:
            raise ValueError(
                f"density must be in (0, 1] (fraction of rows kept), got {self.density}"
            )
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be a finite number >= 0, got {self.threshold}")
        if self.residual_capacity < 0:
            raise ValueError(f"residual_capacity must be >= 0 rows, got {self.residual_capacity}")
        if self.k_rounding not in ("ceil", "stochastic"):
            raise ValueError(f"k_rounding must be 'ceil' or 'stochastic', got {self.k_rounding!r}")
        if self.scope not in ("shard", "table"):
            raise ValueError(f"scope must be 'shard' or 'table', got {self.scope!r}")
        if self.on_evict not in ("flush", "drop"):
            raise ValueError(f"on_evict must be 'flush' or 'drop', got {self.on_evict!r}")


class ResidualTable:
    """Per-id residual rows with a hard bound on memory.

    Keys are a sorted ``uint64`` array (vectorised ``searchsorted`` lookups, no per-id Python
    objects); rows live in a float32 buffer that grows by doubling up to ``capacity`` rows. Memory
    is at most ``capacity * (4*dim + 24)`` bytes: the row, its key, slot index and last-touch
    stamp.
    """

    def __init__(self, dim: int, capacity: int) -> None:
        self.dim = dim
        self.capacity = capacity
        self._keys = np.empty(0, dtype=np.uint64)
        self._slots = np.empty(0, dtype=np.int64)
        self._buf = np.empty((0, dim), dtype=np.float32)
        self._stamp = np.empty(0, dtype=np.int64)
        self._free = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._keys.size)

    @property
    def nbytes(self) -> int:
        """Bytes held now (buffers included)."""
        return int(
            self._keys.nbytes
            + self._slots.nbytes
            + self._buf.nbytes
            + self._stamp.nbytes
            + self._free.nbytes
        )

    def pop(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Remove the residuals of ``ids``; returns (positions in ``ids`` that had one, rows)."""
        size = self._keys.size
        if size == 0 or ids.size == 0:
            return np.empty(0, dtype=np.int64), np.empty((0, self.dim), dtype=np.float32)
        pos = np.minimum(np.searchsorted(self._keys, ids), size - 1)
        hit = self._keys[pos] == ids
        where = pos[hit]
        return np.flatnonzero(hit), self._remove(where)

    def insert(self, ids: np.ndarray, rows: np.ndarray, stamp: int) -> None:
        """Add residuals for ids that are not in the table (the caller popped them first)."""
        if ids.size == 0:
            return
        order = np.argsort(ids, kind="stable")
        ids, rows = ids[order], rows[order]
        slots = self._take_slots(ids.size)
        self._buf[slots] = rows
        self._stamp[slots] = stamp
        at = np.searchsorted(self._keys, ids)
        self._keys = np.insert(self._keys, at, ids)
        self._slots = np.insert(self._slots, at, slots)

    def evict_oldest(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the ``count`` least recently touched residuals (ties: smaller id first)."""
        if count <= 0:
            return np.empty(0, dtype=np.uint64), np.empty((0, self.dim), dtype=np.float32)
        order = np.lexsort((self._keys, self._stamp[self._slots]))[:count]
        where = np.sort(order)
        ids = self._keys[where].copy()
        return ids, self._remove(where)

    def total(self) -> np.ndarray:
        """Sum of all residual rows, float64 (dim,): the mass not delivered yet."""
        return self._buf[self._slots].sum(axis=0, dtype=np.float64)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, rows), ids sorted; copies."""
        return self._keys.copy(), self._buf[self._slots].copy()

    def _remove(self, where: np.ndarray) -> np.ndarray:
        slots = self._slots[where]
        rows = self._buf[slots].copy()
        keep = np.ones(self._keys.size, dtype=bool)
        keep[where] = False
        self._keys = self._keys[keep]
        self._slots = self._slots[keep]
        self._free = np.concatenate([self._free, slots])
        return rows

    def _take_slots(self, m: int) -> np.ndarray:
        if self._free.size < m:
            have = self._buf.shape[0]
            need = have + (m - self._free.size)
            new = min(max(need, 2 * have, 1024), max(self.capacity, need))
            buf = np.empty((new, self.dim), dtype=np.float32)
            buf[:have] = self._buf
            stamp = np.zeros(new, dtype=np.int64)
            stamp[:have] = self._stamp
            self._buf, self._stamp = buf, stamp
            self._free = np.concatenate([self._free, np.arange(have, new, dtype=np.int64)])
        slots, self._free = self._free[:m], self._free[m:]
        return slots


def _as_ids(ids: np.ndarray) -> np.ndarray:
    """Integer ids as uint64; signed int64 (what torch hands out) is reinterpreted bit-for-bit."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(
            f"ids must be a 1-D integer array of feature ids, got {arr.dtype} {arr.shape}"
        )
    if arr.dtype.kind == "i":
        return arr.astype(np.int64, copy=False).view(np.uint64)
    return arr.astype(np.uint64, copy=False)


class GradientCompressor:
    """Compress one worker's pushes for one table; keeps that table's residuals."""

    def __init__(self, dim: int, config: CompressionConfig | None = None) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.config = config or CompressionConfig()
        self.residuals = ResidualTable(dim, self.config.residual_capacity)
        self._rng = np.random.default_rng(self.config.seed)
        self.pushes = 0
        self.bytes_raw = 0
        self.bytes_sent = 0
        self.flushed_rows = 0
        self.dropped_l1 = 0.0

    @property
    def ratio(self) -> float:
        """Bytes sent / raw bytes over all pushes so far (0.01 means 99 % fewer bytes)."""
        return self.bytes_sent / self.bytes_raw if self.bytes_raw else 0.0

    def encode(self, ids: np.ndarray, grads: np.ndarray) -> bytes:
        """Compress the gradients of unique ``ids``; returns the wire bytes for :func:`decode`."""
        cfg = self.config
        ids = _as_ids(ids)
        if (
            not isinstance(grads, np.ndarray)
            or grads.dtype != np.float32
            or grads.shape != (ids.size, self.dim)
        ):
            raise ValueError(
                f"grads must be float32 ({ids.size}, {self.dim}), got "
                f"{getattr(grads, 'dtype', type(grads).__name__)} {getattr(grads, 'shape', '?')}"
            )
        if np.unique(ids).size != ids.size:
            raise ValueError("ids must be unique: sum the gradients of repeated ids before pushing")
        self.pushes += 1
        acc = grads.copy()
        if cfg.error_feedback:
            at, rows = self.residuals.pop(ids)
            acc[at] += rows

        sel, mask = self._select(acc)
        codes, scales, sent = self._quantise(acc[sel], None if mask is None else mask[sel])

        flush_ids = np.empty(0, dtype=np.uint64)
        flush_rows = np.empty((0, self.dim), dtype=np.float32)
        if cfg.error_feedback:
            residual = acc
            residual[sel] -= sent
            keep = np.flatnonzero(np.any(residual != 0, axis=1))
            flush_ids, flush_rows = self._store(ids[keep], residual[keep])

        payload = self._pack(ids[sel], scales, mask if mask is None else mask[sel], codes)
        payload += flush_ids.astype("<u8").tobytes() + flush_rows.astype("<f4").tobytes()
        # n_flush lives in the header; patch it now that it is known.
        header = bytearray(payload[: _HEADER.size])
        struct.pack_into("<I", header, _HEADER.size - 4, flush_ids.size)
        out = bytes(header) + payload[_HEADER.size :]
        self.bytes_raw += raw_nbytes(ids.size, self.dim)
        self.bytes_sent += len(out)
        return out

    def flush(self) -> bytes:
        """Send every pending residual exactly (e.g. before a checkpoint); empties the table."""
        ids, rows = self.residuals.evict_oldest(len(self.residuals))
        header = _HEADER.pack(_MAGIC, _CODECS["fp32"], 0, 0, self.dim, 0, 0, ids.size)
        out = header + ids.astype("<u8").tobytes() + rows.astype("<f4").tobytes()
        self.flushed_rows += ids.size
        self.bytes_sent += len(out)
        return out

    def _select(self, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        cfg, n = self.config, acc.shape[0]
        if cfg.sparsify == "topk":
            if cfg.k_rounding == "stochastic":  # E[k] = density * n; may be 0 (send nothing)
                k = min(n, math.floor(cfg.density * n + self._rng.random()))
            else:
                k = min(n, max(1, math.ceil(cfg.density * n))) if n else 0
            if k == n:
                return np.arange(n), None
            if k == 0:
                return np.zeros(0, np.int64), None
            norms = np.einsum("ij,ij->i", acc, acc)
            top = np.argpartition(-norms, k - 1)[:k]
            return np.sort(top), None
        if cfg.sparsify == "threshold":
            mask = np.abs(acc) >= np.float32(cfg.threshold)
            mask &= acc != 0
            return np.flatnonzero(mask.any(axis=1)), mask
        return np.arange(n), None

    def _quantise(
        self, x: np.ndarray, mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return (codes of the kept elements, per-row scales, decoded rows as the server sees)."""
        codec = self.config.values
        kept = x if mask is None else np.where(mask, x, np.float32(0))
        if codec == "fp32":
            codes = kept if mask is None else kept[mask]
            return np.ascontiguousarray(codes, dtype=np.float32), np.empty(0, np.float32), kept
        amax = np.abs(kept).max(axis=1) if kept.shape[0] else np.empty(0, np.float32)
        levels = np.float32(127.0 if codec == "int8" else 1.0)
        scales = (amax / levels).astype(np.float32)
        safe = np.where(scales > 0, scales, np.float32(1.0))[:, None]
        y = kept / safe
        if codec == "int8":
            q = np.clip(np.rint(y), -127, 127)
        elif self.config.stochastic:
            u = self._rng.random(y.shape, dtype=np.float32)
            q = np.sign(y) * (u < np.abs(y))
        else:
            q = np.sign(y) * (np.abs(y) >= np.float32(0.5))
        q = q.astype(np.int8)
        decoded = q.astype(np.float32) * scales[:, None]
        codes = q.reshape(-1) if mask is None else q[mask]
        return codes, scales, decoded

    def _store(self, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keep residuals within capacity; returns what must be flushed in this message."""
        table, cap = self.residuals, self.config.residual_capacity
        excess_new = max(0, ids.size - cap)
        out_ids: list[np.ndarray] = []
        out_rows: list[np.ndarray] = []
        if excess_new:  # more new residuals than the table can ever hold: the smallest go.
            norms = np.einsum("ij,ij->i", rows, rows)
            order = np.lexsort((ids, norms))
            out_ids.append(ids[order[:excess_new]])
            out_rows.append(rows[order[:excess_new]])
            ids, rows = ids[order[excess_new:]], rows[order[excess_new:]]
        over = len(table) + ids.size - cap
        if over > 0:
            old_ids, old_rows = table.evict_oldest(over)
            out_ids.append(old_ids)
            out_rows.append(old_rows)
        table.insert(ids, rows, self.pushes)
        if not out_ids:
            return np.empty(0, dtype=np.uint64), np.empty((0, self.dim), dtype=np.float32)
        ev_ids, ev_rows = np.concatenate(out_ids), np.concatenate(out_rows)
        if self.config.on_evict == "drop":
            self.dropped_l1 += float(np.abs(ev_rows).sum(dtype=np.float64))
            return np.empty(0, dtype=np.uint64), np.empty((0, self.dim), dtype=np.float32)
        self.flushed_rows += ev_ids.size
        return ev_ids, ev_rows

    def _pack(
        self, ids: np.ndarray, scales: np.ndarray, mask: np.ndarray | None, codes: np.ndarray
    ) -> bytes:
        codec = _CODECS[self.config.values]
        flags = _FLAG_MASK if mask is not None else 0
        parts = [
            _HEADER.pack(_MAGIC, codec, flags, 0, self.dim, ids.size, codes.size, 0),
            ids.astype("<u8").tobytes(),
        ]
        if codec != _CODECS["fp32"]:
            parts.append(scales.astype("<f4").tobytes())
        if mask is not None:
            parts.append(np.packbits(mask, axis=1, bitorder="little").tobytes())
        if codec == _CODECS["fp32"]:
            parts.append(codes.astype("<f4").tobytes())
        elif codec == _CODECS["int8"]:
            parts.append(codes.astype(np.int8).tobytes())
        else:
            parts.append(_pack2(codes))
        return b"".join(parts)


def _pack2(q: np.ndarray) -> bytes:
    """Ternary {-1, 0, 1} → 2-bit codes {0, 1, 2}, four per byte (first value in the low bits)."""
    c = (q.astype(np.int16) + 1).astype(np.uint8)
    pad = (-c.size) % 4
    if pad:
        c = np.concatenate([c, np.ones(pad, dtype=np.uint8)])
    c = c.reshape(-1, 4)
    packed = c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)
    return packed.astype(np.uint8).tobytes()


def _unpack2(buf: np.ndarray, count: int) -> np.ndarray:
    c = np.stack([(buf >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)[:count]
    if c.size and c.max() > 2:
        raise ValueError("corrupt ternary payload: 2-bit code 3 is not a valid value")
    return c.astype(np.int8) - 1


class _Reader:
    def __init__(self, payload: bytes) -> None:
        self.buf = memoryview(payload)
        self.pos = _HEADER.size

    def take(self, dtype: str, count: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if self.pos + size > len(self.buf):
            raise ValueError(
                f"truncated gradient payload: needs {self.pos + size} bytes, has {len(self.buf)}"
            )
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += size
        return arr


def is_empty(payload: bytes) -> bool:
    """True when a payload carries no rows and no flushed residuals (need not be sent)."""
    _, _, _, _, _, n_rows, _, n_flush = _HEADER.unpack_from(payload)
    return n_rows == 0 and n_flush == 0


def decode(payload: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Decode one push into (unique uint64 ids, float32 (n, dim) gradients) for the server.

    Rows appearing twice (a sent row whose residual was also flushed) are summed.
    """
    if len(payload) < _HEADER.size:
        raise ValueError(f"not a gradient payload: {len(payload)} bytes, header is {_HEADER.size}")
    magic, codec, flags, _, dim, n_rows, n_values, n_flush = _HEADER.unpack_from(payload)
    if magic != _MAGIC:
        raise ValueError(f"not a gradient payload: magic {magic!r}, expected {_MAGIC!r}")
    if codec not in _CODEC_NAMES:
        raise ValueError(f"unknown value codec {codec} in gradient payload")
    r = _Reader(payload)
    ids = r.take("<u8", n_rows)
    scales = r.take("<f4", n_rows) if codec != _CODECS["fp32"] else None
    mask: np.ndarray | None = None
    if flags & _FLAG_MASK:
        nb = (dim + 7) // 8
        bits = r.take("u1", n_rows * nb).reshape(n_rows, nb)
        mask = np.unpackbits(bits, axis=1, count=dim, bitorder="little").astype(bool)
        if int(mask.sum()) != n_values:
            raise ValueError("corrupt gradient payload: bitmap and value count disagree")
    elif n_values != n_rows * dim:
        raise ValueError("corrupt gradient payload: value count is not n_rows * dim")
    if codec == _CODECS["fp32"]:
        vals = r.take("<f4", n_values)
    elif codec == _CODECS["int8"]:
        vals = r.take("i1", n_values).astype(np.float32)
    else:
        vals = _unpack2(r.take("u1", (n_values + 3) // 4), n_values).astype(np.float32)
    rows = np.zeros((n_rows, dim), dtype=np.float32)
    if mask is None:
        rows[:] = vals.reshape(n_rows, dim)
    else:
        rows[mask] = vals
    if scales is not None:
        rows *= scales[:, None]
    f_ids = r.take("<u8", n_flush)
    f_rows = r.take("<f4", n_flush * dim).reshape(n_flush, dim)
    if r.pos != len(payload):
        raise ValueError(f"corrupt gradient payload: {len(payload) - r.pos} trailing bytes")
    if n_flush == 0:
        return ids, rows
    all_ids = np.concatenate([ids, f_ids])
    uniq, inv = np.unique(all_ids, return_inverse=True)
    out = np.zeros((uniq.size, dim), dtype=np.float32)
    np.add.at(out, inv, np.concatenate([rows, f_rows]))
    return uniq, out


# ---------------------------------------------------------------------- one payload per shard

_SHARD_MAGIC = 0xC7
_SHARD_HEAD = struct.Struct("<BBB")  # magic, codec, flags (bit 0: element bitmaps present)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even; error feedback keeps the rest."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u += np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))
    return (u >> np.uint64(16)).astype(np.uint16)


def _from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class ShardCompressor:
    """Compress one worker's push to one shard: every table in one payload, one top-k budget.

    Why not a :class:`GradientCompressor` per table: a push of a steep-Zipf batch carries ~40
    rows per table, so per-table framing (24-byte header, 6-byte part entry) and per-table
    "at least one row" floors alone cost more than 1 % of the raw bytes. Here a push to a shard
    is one payload: a 3-byte header, a table bitmap, two varints per present table; top-k
    (``density`` of all rows of all tables) competes across tables, so the budget goes to the
    largest accumulated gradients wherever they are. Per-row scales travel as bfloat16 (the
    rounding is part of what error feedback re-sends). Decoded by :func:`decode_shard`.

    Layout: header; ``ceil(T/8)``-byte bitmap of the tables present; per present table
    ``varint n_rows, varint n_flush``; per present table its ids (uint64), scales (bf16, not for
    fp32) and element bitmaps (threshold only); every table's codes in one block (float32, int8
    or 2-bit ternary packed once); per present table its flushed (fp32) residuals: ids, rows.
    """

    def __init__(self, dims: list[int], config: CompressionConfig | None = None) -> None:
        if not dims or min(dims) <= 0:
            raise ValueError(f"dims must be positive embedding widths, one per table, got {dims}")
        self.dims = list(dims)
        self.config = config or CompressionConfig()
        self._parts = [GradientCompressor(d, self.config) for d in dims]  # residuals, quantiser
        self._rng = np.random.default_rng(self.config.seed)
        self.pushes = 0
        self.bytes_raw = 0
        self.bytes_sent = 0
        self.rows_sent = 0

    @property
    def residual_rows(self) -> int:
        return sum(len(p.residuals) for p in self._parts)

    @property
    def flushed_rows(self) -> int:
        return sum(p.flushed_rows for p in self._parts)

    @property
    def dropped_l1(self) -> float:
        return sum(p.dropped_l1 for p in self._parts)

    def residual_total(self, t: int) -> np.ndarray:
        """Gradient mass of table ``t`` not delivered yet, float64 (dim,)."""
        return self._parts[t].residuals.total()

    def encode(self, pushes: dict[int, tuple[np.ndarray, np.ndarray]]) -> bytes:
        """One payload for ``{table index: (unique ids, float32 (n, dim) grads)}``; ``b""``
        when nothing is to be sent (every row stayed in the residuals)."""
        cfg = self.config
        tables = sorted(pushes)
        accs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t in tables:
            if not 0 <= t < len(self.dims):
                raise ValueError(f"table index {t} out of range ({len(self.dims)} tables)")
            ids, grads = pushes[t]
            ids = _as_ids(ids)
            dim = self.dims[t]
            if (
                not isinstance(grads, np.ndarray)
                or grads.dtype != np.float32
                or grads.shape != (ids.size, dim)
            ):
                raise ValueError(
                    f"table {t}: grads must be float32 ({ids.size}, {dim}), got "
                    f"{getattr(grads, 'dtype', type(grads).__name__)} "
                    f"{getattr(grads, 'shape', '?')}"
                )
            if np.unique(ids).size != ids.size:
                raise ValueError(f"table {t}: ids must be unique: sum repeated ids' gradients")
            acc = grads.copy()
            if cfg.error_feedback:
                at, rows = self._parts[t].residuals.pop(ids)
                acc[at] += rows
            accs[t] = (ids, acc)
            self.bytes_raw += raw_nbytes(ids.size, dim)
        self.pushes += 1
        sel = self._select(accs)
        heads: list[tuple[int, int, int]] = []
        id_parts: list[bytes] = []
        codes: list[np.ndarray] = []
        flush_parts: list[bytes] = []
        mask_any = cfg.sparsify == "threshold"
        for t in tables:
            ids, acc = accs[t]
            part = self._parts[t]
            part.pushes += 1  # residual age stamps
            rows_sel, mask = sel[t]
            x = acc[rows_sel]
            m = None if mask is None else mask[rows_sel]
            if cfg.values == "fp32":
                sent = x if m is None else np.where(m, x, np.float32(0))
                q = sent.reshape(-1) if m is None else x[m]
            else:  # per-row scale max|g| in bf16; the server decodes with it, so do we
                kept = x if m is None else np.where(m, x, np.float32(0))
                amax = np.abs(kept).max(axis=1) if x.shape[0] else np.empty(0, np.float32)
                b16 = _bf16(amax)
                q, sent = self._requantise(x, m, _from_bf16(b16))
            f_ids = np.empty(0, dtype=np.uint64)
            f_rows = np.empty((0, self.dims[t]), dtype=np.float32)
            if cfg.error_feedback:
                acc[rows_sel] -= sent
                keep = np.flatnonzero(np.any(acc != 0, axis=1))
                f_ids, f_rows = part._store(ids[keep], acc[keep])
            if rows_sel.size == 0 and f_ids.size == 0:
                continue
            heads.append((t, rows_sel.size, f_ids.size))
            id_parts.append(ids[rows_sel].astype("<u8").tobytes())
            if cfg.values != "fp32":
                id_parts.append(b16.astype("<u2").tobytes())
            if m is not None:
                id_parts.append(np.packbits(m, axis=1, bitorder="little").tobytes())
            codes.append(q)
            if f_ids.size:
                flush_parts.append(f_ids.astype("<u8").tobytes() + f_rows.astype("<f4").tobytes())
            self.rows_sent += rows_sel.size
        if not heads:
            return b""
        out = self._frame(heads, mask_any, id_parts, codes, flush_parts)
        self.bytes_sent += len(out)
        return out

    def flush(self) -> bytes:
        """Every pending residual, exactly (fp32), in one payload (e.g. before a checkpoint)."""
        heads: list[tuple[int, int, int]] = []
        flush_parts: list[bytes] = []
        for t, part in enumerate(self._parts):
            ids, rows = part.residuals.evict_oldest(len(part.residuals))
            if ids.size:
                part.flushed_rows += ids.size
                heads.append((t, 0, ids.size))
                flush_parts.append(ids.astype("<u8").tobytes() + rows.astype("<f4").tobytes())
        if not heads:
            return b""
        out = self._frame(heads, False, [], [], flush_parts)
        self.bytes_sent += len(out)
        return out

    def _requantise(
        self, x: np.ndarray, mask: np.ndarray | None, scales: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Codes against the bf16 scales the server will use, and the rows it will decode."""
        kept = x if mask is None else np.where(mask, x, np.float32(0))
        levels = np.float32(127.0 if self.config.values == "int8" else 1.0)
        safe = np.where(scales > 0, scales / levels, np.float32(1.0))[:, None]
        y = kept / safe
        if self.config.values == "int8":
            q = np.clip(np.rint(y), -127, 127)
        elif self.config.stochastic:
            u = self._rng.random(y.shape, dtype=np.float32)
            q = np.sign(y) * (u < np.abs(y))
        else:
            q = np.sign(y) * (np.abs(y) >= np.float32(0.5))
        q = q.astype(np.int8)
        sent = q.astype(np.float32) * (scales / levels)[:, None]
        return (q.reshape(-1) if mask is None else q[mask]), sent

    def _select(
        self, accs: dict[int, tuple[np.ndarray, np.ndarray]]
    ) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        cfg = self.config
        out: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        if cfg.sparsify == "threshold":
            for t, (_, acc) in accs.items():
                mask = (np.abs(acc) >= np.float32(cfg.threshold)) & (acc != 0)
                out[t] = (np.flatnonzero(mask.any(axis=1)), mask)
            return out
        if cfg.sparsify == "none":
            return {t: (np.arange(acc.shape[0]), None) for t, (_, acc) in accs.items()}
        norms = [np.einsum("ij,ij->i", acc, acc) for _, acc in accs.values()]
        n = sum(x.size for x in norms)
        if cfg.k_rounding == "stochastic":
            k = min(n, math.floor(cfg.density * n + self._rng.random()))
        else:
            k = min(n, max(1, math.ceil(cfg.density * n))) if n else 0
        flat = np.concatenate(norms) if norms else np.empty(0, np.float32)
        chosen = np.zeros(n, dtype=bool)
        if k >= n:
            chosen[:] = True
        elif k > 0:
            chosen[np.argpartition(-flat, k - 1)[:k]] = True
        pos = 0
        for t, x in zip(accs, norms, strict=True):
            out[t] = (np.flatnonzero(chosen[pos : pos + x.size]), None)
            pos += x.size
        return out

    def _frame(
        self,
        heads: list[tuple[int, int, int]],
        mask_any: bool,
        id_parts: list[bytes],
        codes: list[np.ndarray],
        flush_parts: list[bytes],
    ) -> bytes:
        codec = _CODECS[self.config.values]
        bitmap = np.zeros(len(self.dims), dtype=bool)
        bitmap[[h[0] for h in heads]] = True
        parts = [
            _SHARD_HEAD.pack(_SHARD_MAGIC, codec, _FLAG_MASK if mask_any else 0),
            np.packbits(bitmap, bitorder="little").tobytes(),
            b"".join(_varint(r) + _varint(f) for _, r, f in heads),
            *id_parts,
        ]
        allc = np.concatenate(codes) if codes else np.empty(0, np.int8)
        if codec == _CODECS["fp32"]:
            parts.append(allc.astype("<f4").tobytes())
        elif codec == _CODECS["int8"]:
            parts.append(allc.astype(np.int8).tobytes())
        else:
            parts.append(_pack2(allc))
        parts += flush_parts
        return b"".join(parts)


def decode_shard(payload: bytes, dims: list[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Decode a :class:`ShardCompressor` payload into ``(table, unique ids, grads)`` per table
    (a row sent and also flushed in the same payload is summed)."""
    buf = memoryview(payload)
    if len(buf) < _SHARD_HEAD.size:
        raise ValueError(f"not a shard push payload: {len(buf)} bytes")
    magic, codec, flags = _SHARD_HEAD.unpack_from(buf)
    if magic != _SHARD_MAGIC:
        raise ValueError(f"not a shard push payload: magic {magic:#x}, expected {_SHARD_MAGIC:#x}")
    if codec not in _CODEC_NAMES:
        raise ValueError(f"unknown value codec {codec} in shard push payload")
    pos = _SHARD_HEAD.size
    nbm = (len(dims) + 7) // 8

    def take(dtype: str, count: int) -> np.ndarray:
        nonlocal pos
        size = np.dtype(dtype).itemsize * count
        if pos + size > len(buf):
            raise ValueError(f"truncated shard push payload: needs {pos + size} bytes")
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=pos)
        pos += size
        return arr

    def varint() -> int:
        nonlocal pos
        n = shift = 0
        while True:
            if pos >= len(buf):
                raise ValueError("truncated shard push payload: varint runs past the end")
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    bits = np.unpackbits(take("u1", nbm), count=len(dims), bitorder="little")
    tables = np.flatnonzero(bits).tolist()
    counts = [(varint(), varint()) for _ in tables]
    sent: list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = []
    n_values = 0
    for t, (nr, _) in zip(tables, counts, strict=True):
        ids = take("<u8", nr)
        scales = _from_bf16(take("<u2", nr)) if codec != _CODECS["fp32"] else None
        mask = None
        if flags & _FLAG_MASK:
            nb = (dims[t] + 7) // 8
            raw = take("u1", nr * nb).reshape(nr, nb)
            mask = np.unpackbits(raw, axis=1, count=dims[t], bitorder="little").astype(bool)
            n_values += int(mask.sum())
        else:
            n_values += nr * dims[t]
        sent.append((ids, scales, mask))
    if codec == _CODECS["fp32"]:
        vals = take("<f4", n_values).astype(np.float32)
    elif codec == _CODECS["int8"]:
        vals = take("i1", n_values).astype(np.float32)
    else:
        vals = _unpack2(take("u1", (n_values + 3) // 4), n_values).astype(np.float32)
    out: list[tuple[int, np.ndarray, np.ndarray]] = []
    vpos = 0
    for t, (nr, _), (ids, scales, mask) in zip(tables, counts, sent, strict=True):
        dim = dims[t]
        rows = np.zeros((nr, dim), dtype=np.float32)
        nv = nr * dim if mask is None else int(mask.sum())
        if mask is None:
            rows[:] = vals[vpos : vpos + nv].reshape(nr, dim)
        else:
            rows[mask] = vals[vpos : vpos + nv]
        vpos += nv
        if scales is not None:
            levels = np.float32(127.0 if codec == _CODECS["int8"] else 1.0)
            rows *= (scales / levels)[:, None]
        out.append((t, ids.copy(), rows))
    for i, (t, (_, nf)) in enumerate(zip(tables, counts, strict=True)):
        f_ids = take("<u8", nf)
        f_rows = take("<f4", nf * dims[t]).reshape(nf, dims[t])
        if nf:
            _, ids, rows = out[i]
            all_ids = np.concatenate([ids, f_ids])
            uniq, inv = np.unique(all_ids, return_inverse=True)
            merged = np.zeros((uniq.size, dims[t]), dtype=np.float32)
            np.add.at(merged, inv, np.concatenate([rows, f_rows]))
            out[i] = (t, uniq, merged)
    if pos != len(buf):
        raise ValueError(f"corrupt shard push payload: {len(buf) - pos} trailing bytes")
    return out
