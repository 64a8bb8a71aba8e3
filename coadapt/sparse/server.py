"""Parameter-server shard: embedding tables + server-side row optimizers behind a TCP socket.

Why this transport: a length-prefixed binary protocol over plain TCP carries numpy buffers with
no pickling and no per-ID objects — the ids and rows of a whole batch travel as two contiguous
arrays, sent with one ``sendmsg`` (scatter-gather, no concatenation copy) and received with
``recv_into`` straight into the destination buffer. It works unchanged across nodes, needs no
extra dependency and no rendezvous (torch.distributed RPC needs a world known up front, which a
parameter server whose workers come and go does not have). ``benchmarks/sparse_bench.py`` measures
one pull + push round trip of a 2048 x 26 batch.

Partitioning (shared with :mod:`coadapt.sparse.client`): feature ID ``k`` of *every* table lives on
shard ``mix64(k ^ SHARD_SALT) % num_shards`` (:func:`shard_of`). The salt keeps the shard choice
independent of the hash bits the table uses for its own segments and buckets, so each shard's
tables stay evenly loaded. The rule is stable: it depends only on the ID and ``num_shards``.

Wire format (little-endian). Request: ``u32 body_len`` then the body ``<BBHQ`` (op, flags,
n_parts, step), ``n_parts`` x ``<HI`` (table index, count) and the payload:

* ``PULL``: uint64 ids of every part, concatenated. Reply: float32 (count, dim) rows per part,
  concatenated; an ID that is not admitted yet gets a zero row. Pull creates admitted rows.
* ``PUSH``: the ids, then the float32 (count, dim) gradients, concatenated; ids must be unique
  per part (the client sums per ID). With flag 1 every part is a :mod:`compress` payload and
  count is its byte length; with flags 1 | 2 there are no parts and the payload is one
  :class:`~coadapt.sparse.compress.ShardCompressor` payload carrying every table (a few bytes
  of framing per table instead of a part entry and a 24-byte header). Gradients of IDs without
  a row are dropped and counted in stats.
* ``SAVE``: optional JSON metadata (e.g. a stream offset) stored with the checkpoint; with an
  integer ``seq`` in it the file is generation ``seq``'s (:mod:`coadapt.sparse.checkpoint`).
* ``COUNT``: uint64 ids then uint32 clicks, one per occurrence: exposure/click counters.
* ``LOAD``: JSON ``{"seq": n}``: replace the state by generation ``n``'s file (a rollback to the
  last complete checkpoint).
* ``STATS``: optional JSON ``{"light": true}`` (rows per table only: no counter scan); JSON
  reply.
* ``HELLO`` / ``PING`` / ``SHUTDOWN``: no payload; JSON reply.

Reply: ``u32 body_len``, ``u8 status`` (0 ok, 1 error with a UTF-8 message) and the body.

One process = one shard; requests run one at a time under a lock (tables are not thread-safe),
each connection on its own thread so that socket I/O of other workers overlaps the work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from coadapt.atomicfile import atomic_writer
from coadapt.sparse._gather import gather_embeddings
from coadapt.sparse._hashing import as_u64_keys, mix64
from coadapt.sparse._optim_kernels import fused_apply
from coadapt.sparse.changes import ChangeLog
from coadapt.sparse.checkpoint import read_manifest, shard_file
from coadapt.sparse.compress import decode, decode_shard
from coadapt.sparse.optim import RowOptimizer, make_row_optimizer
from coadapt.sparse.table import EmbeddingTable

__all__ = [
    "FLAG_COMPRESSED",
    "FLAG_SHARD_PAYLOAD",
    "OP_HELLO",
    "OP_PING",
    "OP_PULL",
    "OP_PUSH",
    "OP_SAVE",
    "OP_SHUTDOWN",
    "OP_STATS",
    "SHARD_SALT",
    "CallerMemo",
    "ServerConfig",
    "ServerProcess",
    "ShardState",
    "TableSpec",
    "checkpoint_path",
    "launch_servers",
    "recv_exact",
    "running_servers",
    "send_frame",
    "serve",
    "shard_of",
]

SHARD_SALT = np.uint64(0x5A4D_C0DE_D15C_0B01)
OP_PULL, OP_PUSH, OP_SAVE, OP_STATS, OP_HELLO, OP_PING, OP_SHUTDOWN = 1, 2, 3, 4, 5, 6, 7
OP_COUNT, OP_LOAD = 8, 9
OP_EXPORT = 10  # JSON {directory, export_id, base, expire_now}: see coadapt.sparse.export
FLAG_COMPRESSED = 1
FLAG_SHARD_PAYLOAD = 2  # with FLAG_COMPRESSED: no parts, the body is one ShardCompressor payload
REQ = struct.Struct("<BBHQ")
PART = struct.Struct("<HI")
LEN = struct.Struct("<I")
REPLY = struct.Struct("<IB")
_MAGIC = b"COADAPT-PSSHARD\x01"
_MAX_FRAME = (1 << 32) - 1


def shard_of(ids: npt.ArrayLike, num_shards: int) -> npt.NDArray[np.int64]:
    """Shard of each feature ID: ``mix64(id ^ SHARD_SALT) % num_shards`` (stable, documented)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    keys = as_u64_keys(ids, "ids")
    if num_shards == 1:
        return np.zeros(keys.size, np.int64)
    return (mix64(keys ^ SHARD_SALT) % np.uint64(num_shards)).astype(np.int64)


@dataclass(frozen=True)
class TableSpec:
    """One sparse feature table: name, embedding dim, server-side optimizer and store knobs."""

    name: str
    dim: int
    optimizer: str = "rowwise_adagrad"
    hparams: dict[str, float] = field(default_factory=dict)
    admit_after: int = 1
    ttl: float | None = None
    max_rows: int = 1 << 24
    counters: bool = False  # per-row exposure/click counters (COUNT requests)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("table spec: name must be a non-empty string")
        if self.dim < 1:
            raise ValueError(f"table spec {self.name!r}: dim must be >= 1, got {self.dim}")
        make_row_optimizer(self.optimizer, **self.hparams)  # validates name and hparams

    def make_optimizer(self) -> RowOptimizer:
        return make_row_optimizer(self.optimizer, **self.hparams)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableSpec:
        allowed = {
            "name",
            "dim",
            "optimizer",
            "hparams",
            "admit_after",
            "ttl",
            "max_rows",
            "counters",
        }
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise ValueError(
                f"table spec has unknown field(s) {', '.join(unknown)}; allowed: "
                f"{', '.join(sorted(allowed))}"
            )
        return cls(**d)


def _specs_json(specs: Sequence[TableSpec]) -> list[dict[str, Any]]:
    return [asdict(s) for s in specs]


def checkpoint_path(ckpt_dir: str | os.PathLike[str], shard: int, num_shards: int) -> Path:
    """One file per shard: ``shard-<i>-of-<n>.ckpt``."""
    return Path(ckpt_dir) / f"shard-{shard:03d}-of-{num_shards:03d}.ckpt"


class CallerMemo:
    """What one caller (a connection, a local store) reuses between its requests.

    * The row indices of its last pull of each table: the push that follows with the same IDs
      (``s = 0`` training pushes exactly the IDs it pulled) skips the hash lookup. They are
      valid only while the table object and its ``generation`` are unchanged — any insert,
      move, growth, deletion or expiry (by any caller) bumps it — and only for identical IDs.
    * Scratch buffers that grow and are reused: a fresh multi-MB numpy array costs a page fault
      per 4 KiB page on first touch, more than the row gather itself.
    """

    def __init__(self) -> None:
        self._last: dict[int, tuple[EmbeddingTable, int, npt.NDArray[np.uint64], Any]] = {}
        self._bufs: dict[str, bytearray] = {}

    def remember(
        self, t: int, table: EmbeddingTable, ids: npt.NDArray[np.uint64], idx: Any
    ) -> None:
        self._last[t] = (table, table.generation, ids.copy(), idx)

    def recall(self, t: int, table: EmbeddingTable, ids: npt.NDArray[np.uint64]) -> Any:
        """The remembered indices of ``ids`` if still valid, else ``None`` (used once)."""
        hit = self._last.pop(t, None)
        if hit is None or hit[0] is not table or hit[1] != table.generation:
            return None
        return hit[3] if np.array_equal(hit[2], ids) else None

    def buffer(self, name: str, nbytes: int) -> memoryview:
        """A reusable writable buffer of ``nbytes`` (contents undefined)."""
        buf = self._bufs.get(name)
        if buf is None or len(buf) < nbytes:
            buf = bytearray(max(nbytes, 2 * len(buf) if buf is not None else 0))
            self._bufs[name] = buf
        return memoryview(buf)[:nbytes]

    def floats(self, name: str, shape: tuple[int, int]) -> npt.NDArray[np.float32]:
        n = shape[0] * shape[1]
        return np.frombuffer(self.buffer(name, 4 * n), np.float32, n).reshape(shape)


class ShardState:
    """The tables and optimizers of one shard; also the store of local (in-process) mode."""

    def __init__(
        self, specs: Sequence[TableSpec], shard: int = 0, num_shards: int = 1, seed: int = 0
    ) -> None:
        if not specs:
            raise ValueError("a shard needs at least one table spec")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
        self.specs = list(specs)
        self.shard = shard
        self.num_shards = num_shards
        self.seed = seed
        self.opts = [s.make_optimizer() for s in specs]
        self.tables = [
            EmbeddingTable(
                s.dim,
                s.dim + o.state_width(s.dim),
                ttl=s.ttl,
                admit_after=s.admit_after,
                max_rows=s.max_rows,
                counters=s.counters,
                seed=seed,
            )
            for s, o in zip(specs, self.opts, strict=True)
        ]
        self.rngs = [np.random.default_rng([seed, shard, t]) for t in range(len(specs))]
        self.steps = [0] * len(specs)
        self.pulled_rows = 0
        self.pushed_rows = 0
        self.dropped_grad_rows = 0
        # pulls and pushes of *different* tables may run on several threads (LocalStore): the
        # tables are independent, these shared counters are not
        self._stats_lock = threading.Lock()
        self.meta: dict[str, Any] = {}
        # keys of rows changed since the last model exports (coadapt.sparse.changes)
        self.changes = [ChangeLog() for _ in specs]

    def index(self, name: str) -> int:
        for i, s in enumerate(self.specs):
            if s.name == name:
                return i
        raise KeyError(f"no sparse table {name!r}; tables: {[s.name for s in self.specs]}")

    def pull(
        self,
        t: int,
        ids: npt.NDArray[np.uint64],
        now: float | None = None,
        out: npt.NDArray[np.float32] | None = None,
        memo: CallerMemo | None = None,
    ) -> np.ndarray:
        """Weights of ``ids`` (zero rows for IDs not admitted yet); creates admitted rows.
        Written into ``out`` ((n, dim) float32) when given; ``memo`` remembers the indices
        for the caller's next push and lends scratch space."""
        spec, table, opt, rng = self.specs[t], self.tables[t], self.opts[t], self.rngs[t]
        dim = spec.dim
        idx, new = table.lookup_or_insert(
            ids,
            now=now if spec.ttl is not None else None,
            init=lambda r: opt.init_rows(r, dim, rng),
        )
        if new.any():
            self.changes[t].record(ids[new])
        with self._stats_lock:
            self.pulled_rows += ids.size
        if out is None:
            out = np.empty((ids.size, dim), np.float32)
        if memo is not None:
            memo.remember(t, table, ids, idx)
        if idx.size and idx.min() >= 0 and gather_embeddings(table.row_arena(), idx, out):
            return out  # compiled: the embedding columns straight out of the arena
        scratch = None if memo is None else memo.floats("gather", (ids.size, table.width))
        if idx.size and idx.min() >= 0:
            return table.weights(idx, out, scratch)
        ok = idx >= 0
        out[~ok] = 0.0
        out[ok] = table.weights(idx[ok], None, scratch)
        return out

    def push(
        self,
        t: int,
        ids: npt.NDArray[np.uint64],
        grads: np.ndarray,
        now: float | None = None,
        memo: CallerMemo | None = None,
    ) -> None:
        """Apply summed gradients of unique ``ids``: look up, read, update, write back at once.

        With a ``memo`` holding this caller's pull of exactly these IDs at the table's current
        generation, the lookup is skipped (the rows cannot have moved since)."""
        spec, table = self.specs[t], self.tables[t]
        if grads.shape != (ids.size, spec.dim):
            raise ValueError(
                f"table {spec.name!r}: gradients must be ({ids.size}, {spec.dim}), got "
                f"{grads.shape}"
            )
        tnow = now if spec.ttl is not None else None
        idx = None if memo is None else memo.recall(t, table, ids)
        if idx is None:
            idx = table.lookup(ids, now=tnow)
        elif tnow is not None:
            table.touch(idx, tnow)
        ok = idx >= 0
        self.changes[t].record(ids if ok.all() else ids[ok])
        if not ok.all():
            with self._stats_lock:
                self.dropped_grad_rows += int(ok.size - np.count_nonzero(ok))
            idx, grads = idx[ok], grads[ok]
        if idx.size == 0:
            return
        self.steps[t] += 1
        g32 = np.ascontiguousarray(grads, np.float32)
        # compiled: update the rows in place in the arena, one pass (``_optim_kernels``)
        # IDs in strictly increasing order (a client's dedupe) are distinct, so are their
        # slots (and those of any subset): the kernel needs no pass for last occurrences
        unique = ids.size < 2 or bool(np.all(ids[1:] > ids[:-1]))
        arena = table.row_arena()
        if not fused_apply(self.opts[t], arena, idx, g32, spec.dim, self.steps[t], unique=unique):
            buf = None if memo is None else memo.floats("rows", (idx.size, table.width))
            rows = table.rows(idx, buf)
            self.opts[t].apply(rows, g32, spec.dim, self.steps[t])
            table._write_rows_unchecked(idx, rows)  # idx came from a lookup at this generation
        with self._stats_lock:
            self.pushed_rows += idx.size

    def count(self, t: int, ids: npt.NDArray[np.uint64], clicks: np.ndarray) -> None:
        """One exposure per occurrence in ``ids`` and ``clicks`` per occurrence, on present rows."""
        self.tables[t].count(ids, clicks)

    def counter_totals(self) -> dict[str, list[int]]:
        """[exposures, clicks] summed over the rows of each table that keeps counters."""
        out: dict[str, list[int]] = {}
        for s, tb in zip(self.specs, self.tables, strict=True):
            if s.counters:
                tot = np.zeros(2, np.int64)
                for occ, _ in tb._iter_slots(1 << 16):
                    tot += tb.counters(occ).sum(axis=0, dtype=np.int64)
                out[s.name] = [int(tot[0]), int(tot[1])]
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "num_shards": self.num_shards,
            "tables": {
                s.name: {"rows": len(tb), "nbytes": tb.nbytes(), "step": st}
                for s, tb, st in zip(self.specs, self.tables, self.steps, strict=True)
            },
            "pulled_rows": self.pulled_rows,
            "pushed_rows": self.pushed_rows,
            "dropped_grad_rows": self.dropped_grad_rows,
            "counters": self.counter_totals(),
            "seq": self.meta.get("seq"),
        }

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> Path:
        """Write every table of this shard into one file, atomically (temp + fsync + rename)."""
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if meta is not None:
            self.meta = dict(meta)
        header = {
            "shard": self.shard,
            "num_shards": self.num_shards,
            "seed": self.seed,
            "specs": _specs_json(self.specs),
            "steps": self.steps,
            "rng": [r.bit_generator.state for r in self.rngs],
            "meta": self.meta,
        }
        blob = json.dumps(header).encode()
        with atomic_writer(dest) as f:
            f.write(_MAGIC + struct.pack("<Q", len(blob)) + blob)
            for table in self.tables:
                # EmbeddingTable.save writes one atomic file; stream it into ours.
                fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
                os.close(fd)
                try:
                    table.save(tmp)
                    size = os.path.getsize(tmp)
                    f.write(struct.pack("<Q", size))
                    with open(tmp, "rb") as src:
                        while chunk := src.read(1 << 22):
                            f.write(chunk)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        return dest

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ShardState:
        """Read a file written by :meth:`save` (rows, optimizer state, steps and init rng)."""
        name = str(path)
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                raise ValueError(f"{name}: not a shard checkpoint written by ShardState.save")
            (hlen,) = struct.unpack("<Q", f.read(8))
            hdr = json.loads(f.read(hlen))
            specs = [TableSpec.from_dict(d) for d in hdr["specs"]]
            state = cls(specs, hdr["shard"], hdr["num_shards"], hdr["seed"])
            for t in range(len(specs)):
                (size,) = struct.unpack("<Q", f.read(8))
                start = f.tell()
                state.tables[t] = EmbeddingTable._load_stream(f, name, specs[t].max_rows)
                if f.tell() != start + size:
                    raise ValueError(f"{name}: table {specs[t].name!r} has a corrupt length")
                state.rngs[t].bit_generator.state = hdr["rng"][t]
            state.steps = [int(s) for s in hdr["steps"]]
            state.meta = dict(hdr.get("meta") or {})
        return state


# ---------------------------------------------------------------------- socket helpers


def recv_exact(sock: socket.socket, n: int, into: memoryview | None = None) -> memoryview:
    """Receive exactly ``n`` bytes (into ``into`` when given); EOF mid-frame is an error."""
    # np.empty, not bytearray: a reply of rows is 10+ MB, and zero-filling it is a wasted pass
    buf = into if into is not None else np.empty(n, np.uint8).data
    got = 0
    while got < n:
        k = sock.recv_into(buf[got:], n - got)
        if k == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {n} bytes")
        got += k
    return buf


def send_frame(sock: socket.socket, head: bytes, buffers: Sequence[Any]) -> None:
    """Send ``u32 len`` + head + buffers with scatter-gather (no concatenation copy)."""
    views = [memoryview(b).cast("B") for b in buffers if memoryview(b).nbytes]
    total = len(head) + sum(len(v) for v in views)
    if total > _MAX_FRAME:
        raise ValueError(f"message of {total} bytes exceeds the 4 GiB frame limit; split the batch")
    parts: list[memoryview] = [memoryview(LEN.pack(total) + head), *views]
    while parts:
        sent = sock.sendmsg(parts[:512])
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        memo = CallerMemo()  # this connection's pull indices and reusable buffers
        while True:
            try:
                (blen,) = LEN.unpack(recv_exact(sock, 4))
            except ConnectionError:
                return
            # the request buffer is reused: dispatch's replies never alias it
            body = recv_exact(sock, blen, memo.buffer("request", blen))
            try:
                out = self.server.dispatch(body, memo)
                status = 0
            except Exception as exc:  # reported to the client, never kills the server
                out = [f"{type(exc).__name__}: {exc}".encode()]
                status = 1
            send_frame(sock, struct.pack("<B", status), out)
            if self.server.stopping:
                return


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], state: ShardState, ckpt_dir: str | None) -> None:
        super().__init__(addr, _Handler)
        self.state = state
        self.ckpt_dir = ckpt_dir
        self.lock = threading.Lock()
        self.stopping = False

    def dispatch(self, body: memoryview, memo: CallerMemo | None = None) -> list[Any]:
        """Run one request; ``memo`` is the connection's (its buffers back the pull reply,
        which is sent before the connection's next request is read)."""
        op, flags, n_parts, step = REQ.unpack_from(body)
        off = REQ.size
        parts = [PART.unpack_from(body, off + i * PART.size) for i in range(n_parts)]
        off += n_parts * PART.size
        st = self.state
        for t, _ in parts:
            if t >= len(st.specs):
                raise ValueError(f"table index {t} out of range ({len(st.specs)} tables)")
        if op == OP_PULL:
            total = sum(c for _, c in parts)
            ids = np.frombuffer(body, np.uint64, total, off)
            width = sum(c * st.specs[t].dim for t, c in parts)
            reply = (
                np.empty(width, np.float32)
                if memo is None
                else np.frombuffer(memo.buffer("reply", 4 * width), np.float32, width)
            )
            out: list[Any] = []
            pos = roff = 0
            with self.lock:
                for t, c in parts:
                    dim = st.specs[t].dim
                    dst = reply[roff : roff + c * dim].reshape(c, dim)
                    out.append(st.pull(t, ids[pos : pos + c], now=step, out=dst, memo=memo))
                    pos += c
                    roff += c * dim
            return out
        if op == OP_PUSH:
            with self.lock:
                if flags & FLAG_COMPRESSED and flags & FLAG_SHARD_PAYLOAD:
                    dims = [sp.dim for sp in st.specs]
                    for t, cids, cgrads in decode_shard(bytes(body[off:]), dims):
                        st.push(t, cids, cgrads, now=step)
                elif flags & FLAG_COMPRESSED:
                    for t, c in parts:
                        cids, cgrads = decode(bytes(body[off : off + c]))
                        st.push(t, cids, cgrads, now=step)
                        off += c
                else:
                    total = sum(c for _, c in parts)
                    ids = np.frombuffer(body, np.uint64, total, off)
                    goff = off + 8 * total
                    pos = 0
                    for t, c in parts:
                        dim = st.specs[t].dim
                        g = np.frombuffer(body, np.float32, c * dim, goff).reshape(c, dim)
                        st.push(t, ids[pos : pos + c], g, now=step, memo=memo)
                        pos += c
                        goff += 4 * c * dim
            return []
        if op == OP_SAVE:
            if self.ckpt_dir is None:
                raise RuntimeError("this server has no checkpoint directory; start it with --ckpt")
            meta = json.loads(bytes(body[off:])) if len(body) > off else None
            seq = meta.get("seq") if isinstance(meta, dict) else None
            with self.lock:
                t0 = time.perf_counter()
                dest = (
                    checkpoint_path(self.ckpt_dir, st.shard, st.num_shards)
                    if not isinstance(seq, int)
                    else shard_file(self.ckpt_dir, st.shard, st.num_shards, seq)
                )
                path = st.save(dest, meta)
                secs = time.perf_counter() - t0
            return [json.dumps({"path": str(path), "seconds": secs}).encode()]
        if op == OP_COUNT:
            total = sum(c for _, c in parts)
            ids = np.frombuffer(body, np.uint64, total, off)
            clicks = np.frombuffer(body, np.uint32, total, off + 8 * total)
            pos = 0
            with self.lock:
                for t, c in parts:
                    st.count(t, ids[pos : pos + c], clicks[pos : pos + c])
                    pos += c
            return []
        if op == OP_LOAD:
            if self.ckpt_dir is None:
                raise RuntimeError("this server has no checkpoint directory; start it with --ckpt")
            want = json.loads(bytes(body[off:]))["seq"]
            with self.lock:
                self.state = st = _load_generation(self.ckpt_dir, st, int(want))
            return [json.dumps({"seq": want}).encode()]
        if op == OP_EXPORT:
            from coadapt.sparse.export import export_shard

            req = json.loads(bytes(body[off:]))
            with self.lock:
                res = export_shard(
                    st.specs, st.tables, st.changes, st.shard, st.num_shards,
                    req["directory"], req["export_id"], req.get("base"), req.get("expire_now"),
                )  # fmt: skip
            return [json.dumps(res).encode()]
        if op == OP_STATS:
            opts = json.loads(bytes(body[off:])) if len(body) > off else {}
            with self.lock:
                if opts.get("light"):  # no counter totals: they scan every row
                    rows = {s.name: len(tb) for s, tb in zip(st.specs, st.tables, strict=True)}
                    return [json.dumps({"shard": st.shard, "rows": rows}).encode()]
                return [json.dumps(dict(st.stats(), pid=os.getpid())).encode()]
        if op == OP_HELLO:
            hello = {
                "shard": st.shard,
                "num_shards": st.num_shards,
                "specs": _specs_json(st.specs),
                "meta": st.meta,
                "pid": os.getpid(),
            }
            return [json.dumps(hello).encode()]
        if op == OP_PING:
            return []
        if op == OP_SHUTDOWN:
            self.stopping = True
            threading.Thread(target=self.shutdown, daemon=True).start()
            return []
        raise ValueError(f"unknown op {op}")


# ---------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ServerConfig:
    """What one shard process needs; written as JSON and passed with ``--config``."""

    tables: list[TableSpec]
    shard: int = 0
    num_shards: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    ckpt_dir: str | None = None
    seed: int = 0

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        d = json.loads(text)
        d["tables"] = [TableSpec.from_dict(t) for t in d["tables"]]
        return cls(**d)


def _load_generation(ckpt_dir: str, current: ShardState, seq: int) -> ShardState:
    """This shard's file of generation ``seq``, checked against the running shard's layout."""
    path = shard_file(ckpt_dir, current.shard, current.num_shards, seq)
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: generation {seq} has no file for shard {current.shard}; the manifest "
            "names a generation whose shard files were removed"
        )
    state = ShardState.load(path)
    if state.meta.get("seq") != seq:
        raise ValueError(f"{path}: header says generation {state.meta.get('seq')}, not {seq}")
    if [asdict(s) for s in state.specs] != [asdict(s) for s in current.specs]:
        raise ValueError(
            f"{path}: checkpoint table specs differ from this server's config; use a new "
            "checkpoint directory or the original table specs"
        )
    return state


def serve(cfg: ServerConfig, port_file: str | None = None) -> None:
    """Run one shard until SHUTDOWN or SIGTERM; resumes from its checkpoint file if present."""
    state: ShardState | None = None
    committed = read_manifest(cfg.ckpt_dir) if cfg.ckpt_dir is not None else None
    if cfg.ckpt_dir is not None and committed is not None:
        fresh = ShardState(cfg.tables, cfg.shard, cfg.num_shards, cfg.seed)
        state = _load_generation(cfg.ckpt_dir, fresh, committed.seq)
    elif cfg.ckpt_dir is not None:
        ck = checkpoint_path(cfg.ckpt_dir, cfg.shard, cfg.num_shards)
        if ck.exists():
            state = ShardState.load(ck)
            if [asdict(s) for s in state.specs] != [asdict(s) for s in cfg.tables]:
                raise ValueError(
                    f"{ck}: checkpoint table specs differ from this server's config; use a new "
                    "checkpoint directory or the original table specs"
                )
    if state is None:
        state = ShardState(cfg.tables, cfg.shard, cfg.num_shards, cfg.seed)
    srv = _TCPServer((cfg.host, cfg.port), state, cfg.ckpt_dir)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    if port_file:
        with atomic_writer(port_file) as f:
            f.write(str(srv.server_address[1]).encode())
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()


@dataclass
class ServerProcess:
    """A shard server running as a child process; stopped by its PID."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    shard: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM by PID, wait; SIGKILL if it does not exit in ``timeout`` seconds."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        return int(self.proc.returncode)


def launch_servers(
    tables: Sequence[TableSpec],
    num_shards: int,
    workdir: str | os.PathLike[str],
    *,
    ckpt_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    host: str = "127.0.0.1",
    start_timeout: float = 60.0,
    only: Sequence[int] | None = None,
) -> list[ServerProcess]:
    """Start ``num_shards`` shard processes on ``host`` (ephemeral ports) and wait until each
    listens. Reuses each shard's checkpoint in ``ckpt_dir`` when present. ``only`` starts just
    those shards (restarting a dead one)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    out: list[ServerProcess] = []
    try:
        for i in range(num_shards) if only is None else only:
            cfg = ServerConfig(
                list(tables),
                i,
                num_shards,
                host,
                0,
                None if ckpt_dir is None else str(ckpt_dir),
                seed,
            )
            cfg_path = work / f"shard-{i}.json"
            cfg_path.write_text(cfg.to_json())
            port_file = work / f"shard-{i}.port"
            port_file.unlink(missing_ok=True)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "coadapt.sparse.server",
                    "--config",
                    str(cfg_path),
                    "--port-file",
                    str(port_file),
                ],
            )
            out.append(ServerProcess(proc, host, 0, i))
        deadline = time.monotonic() + start_timeout
        for sp in out:
            port_file = work / f"shard-{sp.shard}.port"
            while not port_file.exists():
                if sp.proc.poll() is not None:
                    raise RuntimeError(
                        f"shard {sp.shard} server exited with code {sp.proc.returncode} before "
                        "listening; see its stderr above"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"shard {sp.shard} server did not listen in {start_timeout}s"
                    )
                time.sleep(0.02)
            sp.port = int(port_file.read_text())
    except BaseException:
        for sp in out:
            sp.stop()
        raise
    return out


@contextlib.contextmanager
def running_servers(
    tables: Sequence[TableSpec], num_shards: int, workdir: str | os.PathLike[str], **kw: Any
) -> Iterator[list[ServerProcess]]:
    """``launch_servers`` that stops every server (by PID) on exit."""
    procs = launch_servers(tables, num_shards, workdir, **kw)
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one coadapt sparse parameter-server shard.")
    ap.add_argument("--config", required=True, help="ServerConfig JSON file")
    ap.add_argument("--port-file", help="write the listening port here once ready")
    args = ap.parse_args(argv)
    serve(ServerConfig.from_json(Path(args.config).read_text()), args.port_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
