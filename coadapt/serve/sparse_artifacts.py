"""Sparse model versions: one file per parameter-server shard, full or incremental, manifest last.

A sparse version is a dense version (``dense.bin``: the torch parameters, e.g. an MLP) plus one
shard export file per parameter-server shard (:mod:`coadapt.sparse.export`), every file with its
sha256 and size in ``manifest.json``, whose ``sparse`` section says::

    tables       [{name, dim}]             the embedding tables (only the embedding columns)
    inputs       [{name, dtype, shape}]    the arrays a request carries, in forward order
    num_shards   N                         rows are routed by coadapt.sparse.server.shard_of
    shards       [{file, rows: {table: n}}]
    export_id    this export's id on the shards; a delta names its base's id
    base_export  the parent's export id (a delta), else null
    chain        sha256(parent's chain + this version's file digests): the identity of the
                 whole resolved state, so a delta is applied only on the state it was cut from
    rows         {table: rows after this version}

A **full** version holds every row (each shard's table slot image, loaded at file-read speed);
an **incremental** one holds the rows written, created or deleted since its parent, which the
shards know from their change logs (:mod:`coadapt.sparse.changes`), plus the dense tensors that
changed. As for dense versions, the manifest is written last and atomically: a version is
complete or invisible. Lineage (job, step, stream offset) is the manifest's ``lineage``.

:func:`publish_sparse` is what a trainer calls (from any process that holds the store: a
:class:`~coadapt.sparse.client.PSClient` makes every shard server write its own file, in
parallel). :func:`load_version` and :func:`read_delta` are what a server calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coadapt.atomicfile import atomic_write, fsync_dir
from coadapt.serve import artifacts
from coadapt.serve.artifacts import (
    DTYPES,
    MANIFEST,
    ArtifactError,
    FileEntry,
    InputSpec,
    IntegrityError,
    Lineage,
    Manifest,
)
from coadapt.sparse.changes import UnknownBaseError
from coadapt.sparse.client import LocalStore, PSClient
from coadapt.sparse.export import DeltaTable, ExportError, export_shard, read_shard
from coadapt.sparse.server import OP_EXPORT
from coadapt.sparse.table import EmbeddingTable

__all__ = [
    "INPUT_DTYPES",
    "BuiltSparse",
    "SparseInput",
    "SparseTables",
    "build_sparse_model",
    "dense_state",
    "inputs_of",
    "load_tables",
    "publish_sparse",
    "read_delta",
    "resolve_path",
    "verify_version",
]

INPUT_DTYPES = ("float32", "int64", "uint64")


@dataclass(frozen=True)
class SparseInput:
    """One array of a request: its name, dtype and per-row shape (``uint64``/``int64``: IDs)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


def inputs_of(m: Manifest) -> list[SparseInput]:
    """The request arrays of a sparse version."""
    if m.sparse is None:
        raise ArtifactError(f"version {m.version} is not a sparse version")
    return [
        SparseInput(str(d["name"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]))
        for d in m.sparse["inputs"]
    ]


# ----------------------------------------------------------------------------- publish


def export_store(
    store: LocalStore | PSClient,
    directory: str | os.PathLike[str],
    export_id: str,
    base: str | None = None,
    expire_now: float | None = None,
) -> list[dict[str, Any]]:
    """Every shard of ``store`` writes its file into ``directory``, all in parallel (shard
    servers each in their own process; an in-process store directly); their results in shard
    order. Waits for the trainer's pending push first, so the export holds every update the
    trainer has made. Raises :class:`UnknownBaseError` if any shard has no record of ``base``."""
    if isinstance(store, LocalStore):
        st = store.state
        return [
            export_shard(st.specs, st.tables, st.changes, st.shard, st.num_shards, directory,
                         export_id, base, expire_now)
        ]  # fmt: skip
    store.wait()
    body = json.dumps(
        {"directory": str(Path(directory).resolve()), "export_id": export_id, "base": base,
         "expire_now": expire_now}
    ).encode()  # fmt: skip

    def one(conn: Any) -> dict[str, Any]:
        try:
            out: dict[str, Any] = json.loads(bytes(conn.call(OP_EXPORT, [], [body])))
        except RuntimeError as exc:
            if "UnknownBaseError" in str(exc):
                raise UnknownBaseError(str(exc)) from None
            raise
        return out

    with ThreadPoolExecutor(max(1, len(store.conns))) as pool:
        return list(pool.map(one, store.conns))


def _sparse_manifest(root: Path, version: str) -> Manifest:
    m = artifacts.read_manifest(root, version)
    if m.sparse is None:
        raise ArtifactError(
            f"version {version} in {root} is dense: a sparse delta needs a sparse base"
        )
    return m


def _chain(parent_chain: str, files: Sequence[FileEntry]) -> str:
    h = hashlib.sha256(parent_chain.encode())
    for fe in files:
        h.update(f"\0{fe.path}\0{fe.sha256}".encode())
    return h.hexdigest()


def publish_sparse(
    model: torch.nn.Module,
    store: LocalStore | PSClient,
    root: str | os.PathLike[str],
    *,
    factory: str,
    factory_kwargs: Mapping[str, Any] | None = None,
    inputs: Sequence[SparseInput | tuple[str, str, Sequence[int]]],
    incremental: bool = False,
    lineage: Lineage | None = None,
    expire_now: float | None = None,
) -> Manifest:
    """Write a new version of a sparse model under ``root``; its manifest.

    ``model`` is the trainer's module (its ``state_dict`` is the dense part), ``store`` the
    parameter servers (or in-process store) holding its tables. ``factory(**factory_kwargs,
    store=...)`` must rebuild the module around a store (every :mod:`coadapt.sparse.models`
    model does). ``incremental=True`` writes only what changed since the newest complete
    version; it falls back to a full version when there is no sparse parent or a shard has no
    record of the parent's export (it restarted): the manifest's ``kind`` says which was
    written. ``expire_now`` drops rows of TTL tables untouched since ``now - ttl`` first
    (clock units of the store: the trainer's step); they are deletions of this version.
    """
    root = Path(root)
    if ":" not in factory:
        raise ArtifactError(f"factory {factory!r} must look like 'package.module:callable'")
    ins = [
        i if isinstance(i, SparseInput) else SparseInput(i[0], i[1], tuple(i[2])) for i in inputs
    ]
    if not ins:
        raise ArtifactError(
            "a sparse model needs at least one input: inputs=[(name, dtype, shape)]"
        )
    for i in ins:
        if i.dtype not in INPUT_DTYPES:
            raise ArtifactError(
                f"input {i.name!r}: dtype must be one of {INPUT_DTYPES}, not {i.dtype!r}"
            )
    state = artifacts._as_state(model)
    artifacts.check_finite(state, "publish")
    parent: Manifest | None = None
    if incremental:
        versions = artifacts.list_versions(root)
        if versions:
            last = artifacts.read_manifest(root, versions[-1])
            parent = last if last.sparse is not None else None
    vdir = artifacts._claim_version_dir(root)
    export_id = f"{root.resolve()}/{vdir.name}"
    try:
        try:
            base = None if parent is None else str(parent.sparse["export_id"])  # type: ignore[index]
            shards = export_store(store, vdir, export_id, base, expire_now)
        except UnknownBaseError:
            parent = None  # the shard forgot the base (restarted): everything goes out
            shards = export_store(store, vdir, export_id, None, expire_now)
        if parent is not None:
            base_state = dense_state(root, parent.version)
            to_write = {k: t for k, t in state.items()
                        if k not in base_state or not torch.equal(t, base_state[k])}  # fmt: skip
            if set(base_state) != set(state):
                raise ArtifactError(
                    f"the model's dense tensors differ in names from version {parent.version}: "
                    "publish a full version (incremental=False)"
                )
        else:
            to_write = state
        dense_entry, tensors = artifacts._write_dense(vdir, to_write)
    except BaseException:
        shutil.rmtree(vdir, ignore_errors=True)
        raise
    files = (dense_entry, *(FileEntry(s["file"], s["sha256"], int(s["size"])) for s in shards))
    names = [t["name"] for t in shards[0]["tables"]]
    rows = {n: sum(int(s["tables"][i]["rows"]) for s in shards) for i, n in enumerate(names)}
    parent_chain = "" if parent is None else str(parent.sparse["chain"])  # type: ignore[index]
    sparse = {
        "tables": [{"name": t["name"], "dim": t["dim"]} for t in shards[0]["tables"]],
        "inputs": [i.to_json() for i in ins],
        "num_shards": len(shards),
        "shards": [
            {
                "file": s["file"],
                "rows": {t["name"]: t["rows"] for t in s["tables"]},
                "upserts": sum(int(t.get("upserts", t["rows"])) for t in s["tables"]),
                "deletes": sum(int(t.get("deletes", 0)) for t in s["tables"]),
                "seconds": s["seconds"],
            }
            for s in shards
        ],
        "export_id": export_id,
        "base_export": None if parent is None else parent.sparse["export_id"],  # type: ignore[index]
        "chain": _chain(parent_chain, files),
        "rows": rows,
        "change_log_bytes": sum(int(s["change_log_bytes"]) for s in shards),
    }
    first = ins[0]
    manifest = Manifest(
        version=vdir.name,
        kind="full" if parent is None else "delta",
        parent=None if parent is None else parent.version,
        factory=factory,
        factory_kwargs=dict(factory_kwargs or {}),
        inputs=InputSpec(first.dtype, first.shape),
        files=files,
        tensors=tensors,
        state_sha256=artifacts.state_digest(state),
        lineage=lineage or Lineage(),
        created_at=time.time(),
        sparse=sparse,
    )
    atomic_write(vdir / MANIFEST, manifest.to_json().encode())  # last: now it is visible
    fsync_dir(root)
    return manifest


# ----------------------------------------------------------------------------- dense part


def _check_file(vdir: Path, fe: FileEntry, m: Manifest) -> bytes:
    path = vdir / fe.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing; republish version {m.version}") from None
    if len(data) != fe.size:
        raise IntegrityError(f"{path}: {len(data)} bytes, the manifest says {fe.size}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != fe.sha256:
        raise IntegrityError(
            f"{path}: sha256 {digest[:12]}… does not match the manifest's {fe.sha256[:12]}… "
            f"(corrupt or tampered file); republish version {m.version}"
        )
    return data


def _own_dense(root: Path, m: Manifest) -> dict[str, torch.Tensor]:
    vdir = root / m.version
    blobs: dict[str, bytearray] = {}
    for fe in m.files:
        if any(te.file == fe.path for te in m.tensors):
            blobs[fe.path] = bytearray(_check_file(vdir, fe, m))
    out: dict[str, torch.Tensor] = {}
    for te in m.tensors:
        if te.dtype not in DTYPES:
            raise IntegrityError(f"{vdir}: tensor {te.name!r} has unknown dtype {te.dtype!r}")
        dtype = DTYPES[te.dtype]
        numel = 1
        for d in te.shape:
            numel *= d
        buf = blobs.get(te.file)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if buf is None or te.nbytes != numel * itemsize or te.offset + te.nbytes > len(buf):
            raise IntegrityError(f"{vdir}: tensor {te.name!r} does not fit {te.file}")
        out[te.name] = (
            torch.empty(te.shape, dtype=dtype)
            if numel == 0
            else torch.frombuffer(buf, dtype=dtype, count=numel, offset=te.offset).reshape(te.shape)
        )
    return out


def dense_state(
    root: str | os.PathLike[str],
    version: str,
    base: tuple[str, Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """The verified dense tensors of a sparse ``version`` (through its parents; ``base`` is a
    state in memory to apply a delta on), without reading any shard file."""
    root = Path(root)
    m = _sparse_manifest(root, version)
    own = _own_dense(root, m)
    if m.kind == "full":
        state = own
    else:
        if m.parent is None:
            raise ArtifactError(f"version {version}: an incremental version needs a parent")
        parent = (
            dict(base[1])
            if base is not None and base[0] == m.parent
            else dense_state(root, m.parent)
        )
        state = {**parent, **own}
    artifacts.check_finite(state, f"version {version}")
    if artifacts.state_digest(state) != m.state_sha256:
        raise IntegrityError(
            f"version {version}: resolved dense state differs from its manifest (wrong parent "
            "or corrupt delta)"
        )
    return state


# ----------------------------------------------------------------------------- tables


@dataclass
class SparseTables:
    """A resolved sparse state: per table name, one EmbeddingTable per shard (rows are routed
    to their shard by ``shard_of``), plus the identity (chain) of the version they hold."""

    version: str
    chain: str
    num_shards: int
    dims: dict[str, int]
    shards: dict[str, list[EmbeddingTable]]

    def rows(self) -> dict[str, int]:
        return {n: sum(len(t) for t in ts) for n, ts in self.shards.items()}

    def nbytes(self) -> int:
        return sum(t.nbytes() for ts in self.shards.values() for t in ts)

    def raw_bytes(self) -> int:
        return sum(len(t) * t.raw_bytes_per_row() for ts in self.shards.values() for t in ts)


def _shard_entries(m: Manifest) -> list[FileEntry]:
    assert m.sparse is not None
    by = {fe.path: fe for fe in m.files}
    out = []
    for s in m.sparse["shards"]:
        fe = by.get(s["file"])
        if fe is None:
            raise IntegrityError(
                f"version {m.version}: shard file {s['file']} has no checksum entry"
            )
        out.append(fe)
    return out


def _read_all(
    root: Path, m: Manifest, shards: Sequence[int] | None = None, packed: bool = False
) -> list[Any]:
    """The shard files of ``m`` (every one, or those numbered in ``shards``), read and verified
    in parallel (one thread per file)."""
    vdir = root / m.version
    entries = _shard_entries(m)
    if shards is not None:
        bad = [s for s in shards if not 0 <= s < len(entries)]
        if bad:
            raise ArtifactError(
                f"version {m.version} has {len(entries)} shard file(s); no shard {bad[0]}"
            )
        entries = [entries[s] for s in shards]

    def one(fe: FileEntry) -> Any:
        path = vdir / fe.path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(f"{path} is missing; republish version {m.version}") from None
        if size != fe.size:
            raise IntegrityError(f"{path}: {size} bytes, the manifest says {fe.size}")
        try:
            return read_shard(path, fe.sha256, packed)
        except ExportError as exc:
            raise IntegrityError(f"{exc}; republish version {m.version}") from None

    with ThreadPoolExecutor(max(1, len(entries))) as pool:
        return list(pool.map(one, entries))


def resolve_path(root: str | os.PathLike[str], version: str, have: str | None) -> list[str]:
    """The versions to apply, in order, to go from ``have`` (a version in memory, or None) to
    ``version``: a full version first unless the chain passes through ``have``."""
    root = Path(root)
    path = [version]
    m = _sparse_manifest(root, version)
    while m.kind == "delta":
        if m.parent is None:
            raise ArtifactError(f"version {m.version}: an incremental version needs a parent")
        if m.parent == have:
            return list(reversed(path))
        path.append(m.parent)
        m = _sparse_manifest(root, m.parent)
    return list(reversed(path))


def load_tables(
    root: str | os.PathLike[str], version: str, shards: Sequence[int] | None = None,
    *, packed: bool = False,
) -> SparseTables:  # fmt: skip
    """Load a *full* sparse version's tables (shards read in parallel, checksums verified).
    ``shards``: only these shard files (a table-shard process holds its part of the model);
    the tables' shard lists then follow that order. ``packed``: segments laid end to end in
    huge pages (:meth:`EmbeddingTable.packed`), for a server, whose base tables never grow
    (rows a delta adds go to separate tables); not for :func:`apply_delta_offline`."""
    root = Path(root)
    m = _sparse_manifest(root, version)
    if m.kind != "full":
        raise ArtifactError(f"version {version} is incremental: resolve it with resolve_path")
    files = _read_all(root, m, shards, packed)
    assert m.sparse is not None
    dims = {str(t["name"]): int(t["dim"]) for t in m.sparse["tables"]}
    tables: dict[str, list[EmbeddingTable]] = {n: [] for n in dims}
    numbers = list(range(len(files))) if shards is None else list(shards)
    for i, sf in zip(numbers, files, strict=True):
        if sf.header.get("kind") != "full" or sf.header.get("shard") != i:
            raise IntegrityError(
                f"version {version}: shard file {i} is not shard {i}'s full export"
            )
        for n in dims:
            if n not in sf.full:
                raise IntegrityError(f"version {version}: shard {i} lacks table {n!r}")
            tables[n].append(sf.full[n])
    total = len(_shard_entries(m))
    return SparseTables(version, str(m.sparse["chain"]), total, dims, tables)


@dataclass
class Delta:
    """A delta version's rows, per table and shard, and the state it must be applied on."""

    version: str
    parent: str
    parent_chain: str
    chain: str
    parts: dict[str, list[DeltaTable]]  # table -> per shard


def read_delta(
    root: str | os.PathLike[str], version: str, shards: Sequence[int] | None = None
) -> Delta:
    """Read and verify an incremental version's shard files (or those numbered in ``shards``;
    the parts then follow that order)."""
    root = Path(root)
    m = _sparse_manifest(root, version)
    if m.kind != "delta" or m.parent is None:
        raise ArtifactError(f"version {version} is not incremental")
    parent = _sparse_manifest(root, m.parent)
    files = _read_all(root, m, shards)
    assert m.sparse is not None and parent.sparse is not None
    if _chain(str(parent.sparse["chain"]), m.files) != m.sparse["chain"]:
        raise IntegrityError(f"version {version}: its chain digest does not follow its parent's")
    parts: dict[str, list[DeltaTable]] = {str(t["name"]): [] for t in m.sparse["tables"]}
    numbers = list(range(len(files))) if shards is None else list(shards)
    for i, sf in zip(numbers, files, strict=True):
        if sf.header.get("kind") != "delta" or sf.header.get("shard") != i:
            raise IntegrityError(f"version {version}: shard file {i} is not shard {i}'s delta")
        for n in parts:
            if n not in sf.delta:
                raise IntegrityError(f"version {version}: shard {i} lacks table {n!r}")
            parts[n].append(sf.delta[n])
    return Delta(version, m.parent, str(parent.sparse["chain"]), str(m.sparse["chain"]), parts)


def apply_delta_offline(tables: SparseTables, delta: Delta) -> None:
    """Apply ``delta`` to tables that serve nothing yet (a freshly loaded base)."""
    if tables.chain != delta.parent_chain:
        raise IntegrityError(
            f"version {delta.version} is a delta on {delta.parent}, but the state held is "
            f"version {tables.version}: refusing a delta on the wrong base"
        )
    for name, parts in delta.parts.items():
        for s, part in enumerate(parts):
            t = tables.shards[name][s]
            if part.keys.size:
                t.assign(part.keys, part.rows)
            if part.deleted.size:
                t.delete(part.deleted)
            if len(t) != part.rows_after:
                raise IntegrityError(
                    f"version {delta.version}: table {name!r} shard {s} holds {len(t)} rows "
                    f"after the delta, the publisher had {part.rows_after} (wrong base)"
                )
    tables.version, tables.chain = delta.version, delta.chain


@dataclass
class BuiltSparse:
    """A servable sparse version: module, manifest, dense state and tables."""

    module: torch.nn.Module
    manifest: Manifest
    dense: dict[str, torch.Tensor]
    tables: SparseTables


def build_sparse_model(root: str | os.PathLike[str], version: str) -> BuiltSparse:
    """Load ``version`` from files alone (its full base, then each delta) into a serving
    module: the factory's module with its sparse embeddings reading the loaded tables."""
    from coadapt.serve.sparse_model import SparseView, serving_module

    root = Path(root)
    path = resolve_path(root, version, None)
    tables = load_tables(root, path[0])
    for v in path[1:]:
        apply_delta_offline(tables, read_delta(root, v))
    m = artifacts.read_manifest(root, version)
    dense = dense_state(root, version)
    module = serving_module(m, dense, SparseView.of(tables))
    return BuiltSparse(module, m, dict(module.state_dict()), tables)


def verify_version(root: str | os.PathLike[str], version: str) -> dict[str, Any]:
    """The integrity gate of a sparse version without loading its tables: every file's size
    and sha256 (files hashed in parallel), the dense part resolved (NaN/Inf, digest), and the
    delta chain. What was checked, or an :class:`IntegrityError` naming the file."""
    root = Path(root)
    m = _sparse_manifest(root, version)
    vdir = root / version

    def one(fe: FileEntry) -> int:
        path = vdir / fe.path
        h = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb", buffering=0) as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise IntegrityError(f"{path} is missing; republish version {version}") from None
        if size != fe.size or h.hexdigest() != fe.sha256:
            raise IntegrityError(
                f"{path}: size or sha256 does not match the manifest (corrupt or tampered "
                f"file); republish version {version}"
            )
        return size

    with ThreadPoolExecutor(max(1, min(8, len(m.files)))) as pool:
        total = sum(pool.map(one, m.files))
    dense_state(root, version)
    if m.kind == "delta" and m.parent is not None:
        parent = _sparse_manifest(root, m.parent)
        assert m.sparse is not None and parent.sparse is not None
        if _chain(str(parent.sparse["chain"]), m.files) != m.sparse["chain"]:
            raise IntegrityError(f"version {version}: its chain digest does not follow its parent")
    return {"version": version, "files": len(m.files), "bytes": total, "kind": m.kind}
