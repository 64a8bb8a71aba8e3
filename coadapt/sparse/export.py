"""Shard export files: a parameter-server shard's rows as a serving model version needs them.

Each shard writes its own file (shards export in parallel); :mod:`coadapt.serve.sparse_artifacts`
lists the files, with their sha256, in a version's manifest. Only the embedding columns are
written (the optimizer state stays with the trainer). Two kinds:

* **full** — the table's slot image: per segment, its keys and rows exactly as they lie in the
  shard's :class:`~coadapt.sparse.table.EmbeddingTable` (empty slots included, their rows
  zeroed). A server loads it by reading the bytes straight into a table of the same geometry:
  no hashing, no insertion, at the speed of a file read (re-inserting 50M keys one batch at a
  time runs at ~0.2-0.7M keys/s, minutes instead of seconds).
* **delta** — the rows changed since a base export (:class:`~coadapt.sparse.changes.ChangeLog`):
  upserted keys with their rows, then deleted keys (expired, or removed otherwise).

Layout, little-endian: ``MAGIC``, u64 header length, the JSON header (kind, shard, export id,
base, and per table its name, dim, row count after the export and either its geometry
(segments, max_rows, per-segment bucket counts, levels and sizes) or its upsert/delete counts),
then each table's payload in header order, then ``END``. The writer hashes what it writes, so
the sha256 costs no second pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import numpy.typing as npt

from coadapt.sparse.changes import ChangeLog
from coadapt.sparse.table import BUCKET, EmbeddingTable

__all__ = [
    "DeltaTable",
    "ExportError",
    "ShardFile",
    "export_shard",
    "read_shard",
    "shard_export_name",
]

MAGIC = b"CXSPARSE-SHARD\x00\x01"
END = b"CXSPARSE-END"
_CHUNK = 1 << 22
U64 = npt.NDArray[np.uint64]
F32 = npt.NDArray[np.float32]


class _Spec(Protocol):
    """What an export needs of a table spec (coadapt.sparse.server.TableSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def ttl(self) -> float | None: ...


class ExportError(ValueError):
    """A shard file that cannot be used: corrupt, truncated, or of another table geometry."""


def shard_export_name(shard: int, num_shards: int) -> str:
    """One file per shard in a version directory."""
    return f"shard-{shard:03d}-of-{num_shards:03d}.rows"


class _HashingWriter:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> None:
        mv = memoryview(data)
        if mv.nbytes == 0:
            return
        mv = mv.cast("B")
        self.f.write(mv)
        self.h.update(mv)
        self.size += mv.nbytes


class _HashingReader:
    def __init__(self, f: IO[bytes], name: str) -> None:
        self.f = f
        self.name = name
        self.h = hashlib.sha256()

    def readinto(self, buf: Any) -> None:
        mv = memoryview(buf).cast("B")
        got = 0
        while got < mv.nbytes:
            n = self.f.readinto(mv[got : got + _CHUNK])  # type: ignore[attr-defined]
            if not n:
                raise ExportError(f"{self.name}: truncated shard file")
            self.h.update(mv[got : got + n])
            got += n

    def read(self, n: int) -> bytes:
        buf = bytearray(n)
        self.readinto(buf)
        return bytes(buf)

    def array(self, dtype: Any, count: int) -> np.ndarray:
        out = np.empty(count, dtype)
        if count:
            self.readinto(out)
        return out


# ----------------------------------------------------------------------------- writing


def _write_full(w: _HashingWriter, table: EmbeddingTable, dim: int) -> None:
    """The slot image of ``table``'s embedding columns, segment by segment."""
    t = table
    for s in range(t.segments):
        base = s * t._seg_slots
        cap = int(t._nb[s]) * BUCKET
        keys = t._keys[base : base + cap]
        rows = np.ascontiguousarray(t.row_arena()[base : base + cap, :dim])
        rows[keys == 0] = 0.0  # dead slots may hold stale rows: never ship them
        w.write(keys)
        w.write(rows)


def _write_delta(w: _HashingWriter, table: EmbeddingTable, dim: int, keys: U64) -> None:
    idx = table.lookup(keys) if keys.size else np.zeros(0, np.int64)
    live = idx >= 0
    up_keys = np.ascontiguousarray(keys[live])
    rows = table.weights(idx[live]) if up_keys.size else np.zeros((0, dim), np.float32)
    gone = np.ascontiguousarray(keys[~live])
    w.write(up_keys)
    w.write(np.ascontiguousarray(rows, np.float32))
    w.write(gone)


def export_shard(
    specs: Sequence[_Spec],
    tables: Sequence[EmbeddingTable],
    changes: Sequence[ChangeLog],
    shard: int,
    num_shards: int,
    directory: str | os.PathLike[str],
    export_id: str,
    base: str | None = None,
    expire_now: float | None = None,
) -> dict[str, Any]:
    """Write this shard's file into ``directory`` (full when ``base`` is None, else the rows
    changed since export ``base``) and seal the change logs; what was written.

    ``expire_now`` first drops rows of TTL tables untouched since ``now - ttl`` (they become
    deletions of this export). Raises :class:`~coadapt.sparse.changes.UnknownBaseError` when the
    shard has no record of ``base``; nothing is written or sealed then. The caller holds the
    shard's lock: the rows must not change while they are written."""
    t0 = time.perf_counter()
    expired = 0
    if expire_now is not None:
        for spec, table, log in zip(specs, tables, changes, strict=True):
            if spec.ttl is not None:
                removed: list[U64] = []
                expired += table.expire(expire_now, removed=removed)
                for k in removed:
                    log.record(k)
    delta_keys = [log.since(base) for log in changes] if base is not None else None
    path = Path(directory) / shard_export_name(shard, num_shards)
    entries: list[dict[str, Any]] = []
    for i, (spec, table) in enumerate(zip(specs, tables, strict=True)):
        e: dict[str, Any] = {"name": spec.name, "dim": spec.dim, "rows": len(table)}
        e.update(_geometry(table) if delta_keys is None else _delta_counts(table, delta_keys[i]))
        entries.append(e)
    head = {
        "kind": "full" if base is None else "delta",
        "shard": shard,
        "num_shards": num_shards,
        "export_id": export_id,
        "base": base,
        "tables": entries,
    }
    with open(path, "wb") as f:
        w = _HashingWriter(f)
        blob = json.dumps(head).encode()
        w.write(MAGIC + struct.pack("<Q", len(blob)) + blob)
        for i, (spec, table) in enumerate(zip(specs, tables, strict=True)):
            if delta_keys is None:
                _write_full(w, table, spec.dim)
            else:
                _write_delta(w, table, spec.dim, delta_keys[i])
        w.write(END)
        f.flush()
        os.fsync(f.fileno())
    for i, log in enumerate(changes):
        log.seal(export_id, base, None if delta_keys is None else delta_keys[i])
    return {
        "shard": shard,
        "file": path.name,
        "sha256": w.h.hexdigest(),
        "size": w.size,
        "kind": head["kind"],
        "tables": entries,
        "expired": expired,
        "seconds": time.perf_counter() - t0,
        "change_log_bytes": sum(log.nbytes() for log in changes),
    }


def _geometry(table: EmbeddingTable) -> dict[str, Any]:
    return {
        "segments": table.segments,
        "max_rows": table.max_rows,
        "seg_buckets": table._seg_buckets,
        "nb": table._nb.tolist(),
        "level": table._level.tolist(),
        "size": table._size.tolist(),
    }


def _delta_counts(table: EmbeddingTable, keys: U64) -> dict[str, Any]:
    live = int(np.count_nonzero(table.lookup(keys) >= 0)) if keys.size else 0
    return {"upserts": live, "deletes": int(keys.size) - live}


# ----------------------------------------------------------------------------- reading


@dataclass
class DeltaTable:
    """One table's part of a delta: rows to upsert and keys to delete."""

    name: str
    dim: int
    rows_after: int
    keys: U64
    rows: F32
    deleted: U64


@dataclass
class ShardFile:
    """A shard file as read: its header, full tables or delta parts, and its sha256."""

    header: dict[str, Any]
    full: dict[str, EmbeddingTable]
    delta: dict[str, DeltaTable]
    sha256: str


def _load_full(r: _HashingReader, e: dict[str, Any], name: str, packed: bool) -> EmbeddingTable:
    dim, segs = int(e["dim"]), int(e["segments"])
    table = EmbeddingTable(dim, dim, max_rows=int(e["max_rows"]), segments=segs)
    if table._seg_buckets != int(e["seg_buckets"]) or len(e["nb"]) != segs:
        raise ExportError(f"{name}: table {e['name']!r} has a geometry this coadapt cannot map")
    nb = np.asarray(e["nb"], np.int64)
    if (nb < 1).any() or (nb > table._seg_buckets).any():
        raise ExportError(f"{name}: table {e['name']!r} has bucket counts out of range")
    if packed:  # segments end to end, all in huge pages (EmbeddingTable.packed)
        table = EmbeddingTable(
            dim, dim, max_rows=int(e["max_rows"]), segments=segs, huge_pages="whole",
            stride_buckets=EmbeddingTable.packed_stride(nb),
        )  # fmt: skip
    table.commit_geometry(nb)  # before the slots are written: huge pages from the first write
    for s in range(segs):
        base = s * table._seg_slots
        cap = int(nb[s]) * BUCKET
        r.readinto(table._keys[base : base + cap])
        rows = table.row_arena()[base : base + cap]
        r.readinto(rows)
        if not np.isfinite(rows).all():
            raise ExportError(f"{name}: table {e['name']!r} holds NaN or Inf rows")
        if int(np.count_nonzero(table._keys[base : base + cap])) != int(e["size"][s]):
            raise ExportError(f"{name}: table {e['name']!r} segment {s} key count mismatch")
    table._nb[:] = nb
    table._level[:] = np.asarray(e["level"], np.int64)
    table._size[:] = np.asarray(e["size"], np.int64)
    table._touched = np.maximum(table._touched, table._nb)
    table.generation += 1
    if len(table) != int(e["rows"]):
        raise ExportError(f"{name}: table {e['name']!r} holds {len(table)} rows, not {e['rows']}")
    return table


def _read_delta(r: _HashingReader, e: dict[str, Any], name: str) -> DeltaTable:
    dim, n, m = int(e["dim"]), int(e["upserts"]), int(e["deletes"])
    keys = r.array(np.uint64, n)
    rows = r.array(np.float32, n * dim).reshape(n, dim)
    deleted = r.array(np.uint64, m)
    if not np.isfinite(rows).all():
        raise ExportError(f"{name}: table {e['name']!r} delta holds NaN or Inf rows")
    return DeltaTable(str(e["name"]), dim, int(e["rows"]), keys, rows, deleted)


def read_shard(
    path: str | os.PathLike[str], sha256: str | None = None, packed: bool = False
) -> ShardFile:
    """Read (and with ``sha256``, verify) one shard file. A full file becomes one table per
    name (``packed``: laid out as :meth:`EmbeddingTable.packed`, for tables that will not
    grow); a delta file its parts. Any mismatch raises :class:`ExportError` naming the file;
    a file whose checksum differs is reported as such even when its damage breaks the parse."""
    try:
        return _read_shard(path, sha256, packed)
    except ExportError:
        if sha256 is not None:
            _check_digest(str(path), _file_digest(path), sha256)
        raise


def _file_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_digest(name: str, digest: str, sha256: str) -> None:
    if digest != sha256:
        raise ExportError(
            f"{name}: sha256 {digest[:12]}… does not match the manifest's {sha256[:12]}… "
            "(corrupt or tampered file)"
        )


def _read_shard(path: str | os.PathLike[str], sha256: str | None, packed: bool) -> ShardFile:
    name = str(path)
    with open(path, "rb", buffering=0) as f:
        r = _HashingReader(f, name)
        if r.read(len(MAGIC)) != MAGIC:
            raise ExportError(f"{name}: not a shard export file")
        (hlen,) = struct.unpack("<Q", r.read(8))
        if hlen > 1 << 26:
            raise ExportError(f"{name}: header length {hlen} is implausible (corrupt file)")
        try:
            head = json.loads(r.read(hlen))
            kind = head["kind"]
            entries = list(head["tables"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{name}: corrupt header ({exc})") from None
        full: dict[str, EmbeddingTable] = {}
        delta: dict[str, DeltaTable] = {}
        try:
            for e in entries:
                if kind == "full":
                    full[str(e["name"])] = _load_full(r, e, name, packed)
                else:
                    delta[str(e["name"])] = _read_delta(r, e, name)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ExportError):
                raise
            raise ExportError(f"{name}: corrupt table entry ({exc!r})") from None
        if r.read(len(END)) != END or f.read(1):
            raise ExportError(f"{name}: corrupt trailer (extra or missing bytes)")
    digest = r.h.hexdigest()
    if sha256 is not None:
        _check_digest(name, digest, sha256)
    return ShardFile(head, full, delta, digest)
