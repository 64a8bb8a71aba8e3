"""A sparse model's tables spread over *table-shard processes*, looked up in parallel.

Why: a model whose tables exceed one process's memory cannot be copied into every serving
worker. With ``--table-shards N`` the supervisor starts N shard processes
(``python -m coadapt.serve _table_shard``); process ``p`` holds the export shard files ``i``
with ``i % N == p`` (the partition the trainer's parameter servers export, by
``coadapt.sparse.server.shard_of``: no re-hashing, each process reads only its own files), so
each holds about 1/N of the rows. Workers keep only the dense part; their serving embeddings
read rows through :class:`RemoteTable`, which splits a batch's IDs by shard, sends every
shard's look-up before reading any answer (the shards work in parallel), and assembles the rows
in request order: the same rows as the unsharded server, so the same scores, bit for bit.

**Wire format** (unix stream socket per shard process, little-endian): a request is ``u32
length`` + ``u8 op, u8 model, u16 table, u32 version, u32 export shard, u32 count`` + payload
(``count`` uint64 IDs for ``LOOKUP``); an answer is ``u32 length`` + ``u8 status, 3 pad, u32
count`` + payload (``count x dim`` float32 rows; JSON for ``STATUS``; a UTF-8 message for an
error). A connection carries one request at a time per direction, answered in order.

**Versions: version-tagged look-ups.** Each shard process follows the model's ``LIVE`` pointer
itself and holds at most two versions: the one served and the next. A full version is loaded
beside the old one; a delta is prepared as overlays on the shared base tables
(:func:`~coadapt.serve.sparse_model.prepare_delta`: in the shard process, off every worker's
core). A worker switches to the newest version that *every* shard holds, then says ``USING`` on
each connection; every look-up names its version, and a shard answers from exactly that one.
A shard drops the old version (and only then merges a delta's overlays into its base tables,
chunk by chunk between look-ups) once every connection uses the new one; a connection that has
not said ``USING`` pins the oldest version held when it asked for ``STATUS``. So each batch is
scored by one version across all shards, never a mix.

**Bounded tail: a per-look-up deadline plus one retry, no replicas.** A replica per shard
doubles the memory, which is what sharding exists to save. Every look-up of a batch shares one
deadline (``--shard-timeout-ms``); a shard that does not answer in time fails the batch with
:class:`ShardUnavailableError` (HTTP 503) and its connection is dropped (a late answer must not
be read as the next one). A broken connection (the shard died or restarted) is retried once on
a fresh connection within the same deadline; a dead shard answers 503 at once, never a hang,
and the supervisor restarts it, loading the live version from its files.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from coadapt.serve import artifacts, sparse_artifacts
from coadapt.serve.sparse_model import (
    MERGE_PAUSE,
    PendingMerge,
    SparseView,
    merge_now,
    prepare_delta,
)
from coadapt.sparse.server import recv_exact, send_frame, shard_of

__all__ = [
    "RemoteTable",
    "RemoteView",
    "ShardSet",
    "ShardUnavailableError",
    "TableShardServer",
    "common_version",
    "export_shards_of",
    "socket_path",
    "table_shard_main",
]

U64 = npt.NDArray[np.uint64]
F32 = npt.NDArray[np.float32]
HEAD = struct.Struct("<BBHIII")  # op, model, table, version, export shard, count
ANSWER = struct.Struct("<BxxxI")  # status, count
LEN = struct.Struct("<I")
OP_LOOKUP, OP_STATUS, OP_USING = 1, 2, 3
ST_OK, ST_ERROR, ST_NO_VERSION = 0, 1, 2
SWITCH_INTERVAL_S = 0.0005


class ShardUnavailableError(RuntimeError):
    """A table shard did not answer (dead, restarting, too slow, or without the version the
    batch runs on): the batch fails with 503, the client may retry."""


def socket_path(directory: str | os.PathLike[str], index: int) -> str:
    """Where table-shard process ``index`` listens."""
    return str(Path(directory) / f"table-shard-{index}.sock")


def export_shards_of(index: int, count: int, num_shards: int) -> list[int]:
    """The export shard files process ``index`` of ``count`` holds for a version with
    ``num_shards`` files (none when there are more processes than files)."""
    return [i for i in range(num_shards) if i % count == index]


def common_version(held: Sequence[Sequence[str]]) -> str | None:
    """The most recently loaded version every shard holds (lists in load order), or None."""
    if not held:
        return None
    for v in reversed(held[0]):
        if all(v in h for h in held[1:]):
            return v
    return None


# ----------------------------------------------------------------------------- the process


@dataclass
class Held:
    """One version as a shard process holds it: its part of every table."""

    version: str
    chain: str
    num_shards: int  # export shard files of the version
    tables: list[str]  # manifest order: a look-up names a table by its position
    mine: dict[int, int]  # export shard number -> position in the view's shard lists
    view: SparseView
    merge: PendingMerge | None = None


@dataclass
class ShardModel:
    """One model's versions in a shard process, and the connections' pins on them."""

    name: str
    root: Path
    index: int
    count: int
    held: list[Held] = field(default_factory=list)  # load order: [served] or [served, next]
    refused: dict[str, str] = field(default_factory=dict)
    refused_stamp: dict[str, float] = field(default_factory=dict)
    pins: dict[int, str | None] = field(default_factory=dict)  # connection -> version
    said_using: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, version: int) -> Held | None:
        for h in self.held:
            if int(h.version) == version:
                return h
        return None

    def status(self) -> dict[str, Any]:
        with self.lock:
            newest = self.held[-1] if self.held else None
            rows: dict[str, int] = {}
            nbytes = raw = 0
            if newest is not None:
                for n, t in newest.view.tables.items():
                    rows[n] = sum(t.rows(s) for s in range(len(t.bases)))
                    for b in (*t.bases, *t.extras):
                        if b is not None:
                            nbytes += b.nbytes()
                            raw += len(b) * b.raw_bytes_per_row()
            return {
                "pid": os.getpid(),
                "held": [h.version for h in self.held],
                "refused": dict(self.refused),
                "export_shards": sorted(newest.mine) if newest else [],
                "rows": rows,
                "nbytes": nbytes,
                "raw_bytes": raw,
                "merging": bool(newest and newest.merge is not None),
            }

    def _target(self) -> str | None:
        want = artifacts.live_version(self.root)
        if want is None or (self.held and want == self.held[-1].version):
            return None
        if want in self.refused:
            try:
                stamp = (self.root / want / artifacts.MANIFEST).stat().st_mtime
            except FileNotFoundError:
                return None
            if stamp == self.refused_stamp.get(want):
                return None
        return want

    def _refuse(self, version: str, why: str) -> None:
        self.refused[version] = why
        try:
            self.refused_stamp[version] = (self.root / version / artifacts.MANIFEST).stat().st_mtime
        except FileNotFoundError:
            self.refused_stamp[version] = -1.0
        print(f"table-shard[{self.index}]: refused {self.name} version {version}: {why}",
              file=sys.stderr, flush=True)  # fmt: skip

    def _load(self, version: str, m: artifacts.Manifest, cur: Held | None) -> Held:
        """``version`` beside ``cur``: a full version from its files, a delta as overlays on
        ``cur``'s tables (or, with nothing held, the whole chain applied offline)."""
        assert m.sparse is not None
        total = int(m.sparse["num_shards"])
        mine = export_shards_of(self.index, self.count, total)
        names = [str(t["name"]) for t in m.sparse["tables"]]
        local = {s: k for k, s in enumerate(mine)}
        if cur is None:  # the full base, then each delta merged at once (nothing serves yet)
            path = sparse_artifacts.resolve_path(self.root, version, None)
            tables = sparse_artifacts.load_tables(self.root, path[0], mine, packed=True)
            view, chain = SparseView.of(tables), tables.chain
            for v in path[1:]:
                delta = sparse_artifacts.read_delta(self.root, v, mine)
                if delta.parent_chain != chain:
                    raise artifacts.IntegrityError(f"version {v}: its chain does not follow")
                view, chain = merge_now(view, delta.parts, v), delta.chain
            return Held(version, chain, total, names, local, view)
        if m.kind == "full":
            tables = sparse_artifacts.load_tables(self.root, version, mine, packed=True)
            return Held(version, tables.chain, total, names, local, SparseView.of(tables))
        if total != cur.num_shards:
            raise artifacts.IntegrityError(
                f"version {version} has {total} shard files, its parent {cur.num_shards}"
            )
        delta = sparse_artifacts.read_delta(self.root, version, mine)
        if delta.parent_chain != cur.chain:
            raise artifacts.IntegrityError(
                f"version {version} is a delta on a state this shard does not hold: wrong base"
            )
        pending = prepare_delta(cur.view, delta.parts, version)
        return Held(version, delta.chain, total, names, local, pending.view, pending)

    def step(self) -> None:
        """One round of the shard's own version work: release the old version once every
        connection uses the new one (then merge a delta), else load the next step to ``LIVE``."""
        with self.lock:
            held = list(self.held)
            pins = list(self.pins.values())
        if len(held) == 2:
            new = held[1]
            if any(p is not None and p != new.version for p in pins):
                if new.version in pins or not self._abandoned(held[0], new):
                    return  # a worker may still send look-ups for the old version
                # nobody adopted the next version and LIVE moved past it (another shard
                # refused it, say): drop it; its overlays never touched the base tables
                with self.lock:
                    self.held = [held[0]]
                held = [held[0]]
            else:
                with self.lock:
                    self.held = [new]
                if new.merge is not None:
                    self._merge(new, new.merge)
                return
        target = self._target()
        if target is None:
            return
        cur = held[-1] if held else None
        try:
            step = sparse_artifacts.resolve_path(self.root, target, cur.version if cur else None)[0]
            m = artifacts.read_manifest(self.root, step)
            if m.sparse is None:
                return  # a dense model: the workers serve it themselves
            nxt = self._load(target if cur is None else step, m, cur)
        except (ValueError, OSError, RuntimeError, KeyError, TypeError) as exc:
            self._refuse(target, str(exc))
            return
        with self.lock:
            self.held.append(nxt)
            if cur is None:  # nothing was served: nothing to wait for
                self.held = [nxt]

    def _abandoned(self, served: Held, nxt: Held) -> bool:
        """Whether ``LIVE`` no longer leads through ``nxt`` (loaded beside ``served``)."""
        target = artifacts.live_version(self.root)
        if target is None or target == nxt.version:
            return False
        try:
            return nxt.version not in sparse_artifacts.resolve_path(
                self.root, target, served.version
            )
        except (ValueError, OSError):
            return True

    def _merge(self, held: Held, pending: PendingMerge) -> None:
        """Merge a delta's overlays into the base tables in small steps, each under the lock
        and followed by a pause ``MERGE_PAUSE`` times as long (look-ups keep flowing)."""
        for step in pending.steps():
            t0 = time.perf_counter()
            with self.lock:
                step()
            time.sleep(MERGE_PAUSE * (time.perf_counter() - t0))
        with self.lock:
            problems = pending.finish()
            held.merge = None
        if problems:  # cannot happen when the pre-check passed: say so loudly
            self._refuse(held.version, "merged state differs: " + "; ".join(problems))


class _Handler(socketserver.BaseRequestHandler):
    server: TableShardServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        conn = id(self)
        srv = self.server
        for sm in srv.models:
            with sm.lock:
                sm.pins[conn] = sm.held[0].version if sm.held else None
        try:
            while True:
                try:
                    (blen,) = LEN.unpack(recv_exact(sock, 4))
                    body = recv_exact(sock, blen)
                except (ConnectionError, OSError):
                    return
                try:
                    status, payload = srv.dispatch(conn, body)
                except Exception as exc:  # reported to the worker (a 503), never kills the shard
                    status, payload = ST_ERROR, [f"{type(exc).__name__}: {exc}".encode()]
                send_frame(sock, ANSWER.pack(status, _count(payload)), payload)
        except (ConnectionError, OSError):
            return
        finally:
            for sm in srv.models:
                with sm.lock:
                    sm.pins.pop(conn, None)
                    sm.said_using.discard(conn)


def _count(payload: list[Any]) -> int:
    return sum(memoryview(p).nbytes for p in payload)


class TableShardServer(socketserver.ThreadingUnixStreamServer):
    """Shard ``index`` of ``count``: its part of every sparse model's tables, on a unix socket."""

    daemon_threads = True

    def __init__(
        self, path: str, models: Mapping[str, str], index: int, count: int, poll_s: float
    ) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a restarted shard takes over its predecessor's address
        super().__init__(path, _Handler)
        self.models = [ShardModel(n, Path(d), index, count) for n, d in models.items()]
        self.poll_s = poll_s
        self.stopping = threading.Event()

    def dispatch(self, conn: int, body: memoryview) -> tuple[int, list[Any]]:
        if len(body) < HEAD.size:
            return ST_ERROR, [b"short request"]
        op, model, table, version, shard, count = HEAD.unpack_from(body)
        if model >= len(self.models):
            return ST_ERROR, [f"no model {model}: this shard serves {len(self.models)}".encode()]
        sm = self.models[model]
        if op == OP_LOOKUP:
            keys = np.frombuffer(body, np.uint64, count, HEAD.size)
            with sm.lock:
                h = sm.find(version)
                if h is None:
                    held = [x.version for x in sm.held]
                    return ST_NO_VERSION, [
                        f"table shard {sm.index} holds {held} of model {sm.name}, not "
                        f"{version:08d}".encode()
                    ]
                local = h.mine.get(shard)
                if local is None or table >= len(h.tables):
                    return ST_ERROR, [f"shard {sm.index} holds no export shard {shard} / "
                                      f"table {table}".encode()]  # fmt: skip
                rows = h.view.tables[h.tables[table]].shard_rows(local, keys)
            return ST_OK, [rows]
        if op == OP_STATUS:
            with sm.lock:
                if conn not in sm.said_using:
                    sm.pins[conn] = sm.held[0].version if sm.held else None
            return ST_OK, [json.dumps(sm.status()).encode()]
        if op == OP_USING:
            with sm.lock:
                sm.pins[conn] = f"{version:08d}"
                sm.said_using.add(conn)
            return ST_OK, []
        return ST_ERROR, [f"unknown op {op}".encode()]

    def follow(self) -> None:
        """The version loop (a thread): each model's :meth:`ShardModel.step`, every poll. An
        unexpected error ends the process (the supervisor restarts it from the files) rather
        than leaving a shard that answers but never follows ``LIVE`` again."""
        while not self.stopping.is_set():
            try:
                for sm in self.models:
                    sm.step()
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(70)
            self.stopping.wait(self.poll_s)


def table_shard_main(
    models: Mapping[str, str], index: int, count: int, directory: str, poll_s: float,
    ready_fd: int,
) -> int:  # fmt: skip
    """A table-shard process: listen, load the live versions, answer until SIGTERM."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):  # die with the supervisor
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the loader thread must not starve look-ups
    srv = TableShardServer(socket_path(directory, index), models, index, count, poll_s)

    def stop(signum: int, frame: object) -> None:
        srv.stopping.set()
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for sm in srv.models:  # load before saying ready (a restart answers 503 meanwhile)
        sm.step()
    if ready_fd >= 0:
        with contextlib.suppress(BrokenPipeError):
            os.write(ready_fd, f"ready {index} {os.getpid()}\n".encode())
        os.close(ready_fd)
    follower = threading.Thread(target=srv.follow, daemon=True)
    follower.start()
    srv.serve_forever(poll_interval=0.2)
    srv.server_close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- the worker


class _Conn:
    """A worker's connection to one shard process (one request in flight at a time)."""

    def __init__(self, index: int, path: str) -> None:
        self.index = index
        self.path = path
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def open(self, timeout: float) -> socket.socket:
        if self.sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(max(timeout, 1e-3))
            try:
                s.connect(self.path)
            except OSError:
                s.close()
                raise
            self.sock = s
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def _read_answer(
    sock: socket.socket, deadline: float, into: memoryview | None = None
) -> tuple[int, memoryview]:
    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
    (blen,) = LEN.unpack(recv_exact(sock, 4))
    status, count = ANSWER.unpack(recv_exact(sock, ANSWER.size))
    if count != blen - ANSWER.size:
        raise ConnectionError(f"malformed answer: {blen} bytes framing {count}")
    if status == ST_OK and into is not None and into.nbytes == count:
        return status, recv_exact(sock, count, into)
    return status, recv_exact(sock, count)


class ShardSet:
    """A worker's connections to the N shard processes, and the parallel look-up."""

    def __init__(self, directory: str, count: int, timeout_s: float) -> None:
        self.conns = [_Conn(i, socket_path(directory, i)) for i in range(count)]
        self.timeout_s = timeout_s

    def _exchange(
        self, jobs: dict[int, list[tuple[bytes, list[Any], memoryview | None]]]
    ) -> dict[int, list[tuple[int, memoryview]]]:
        """Send every process its requests, then read every answer (the shards work in
        parallel); one retry of the whole exchange on a broken connection, one deadline."""
        deadline = time.monotonic() + self.timeout_s
        order = sorted(jobs)
        for attempt in (0, 1):
            for p in order:
                self.conns[p].lock.acquire()
            current = order[0]
            try:
                for p in order:
                    current = p
                    sock = self.conns[p].open(deadline - time.monotonic())
                    for head, payload, _ in jobs[p]:
                        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                        send_frame(sock, head, payload)
                out: dict[int, list[tuple[int, memoryview]]] = {}
                for p in order:
                    current = p
                    sock = self.conns[p].open(deadline - time.monotonic())
                    out[p] = [_read_answer(sock, deadline, into) for _, _, into in jobs[p]]
                return out
            except TimeoutError:
                for p in order:
                    self.conns[p].close()  # answers still in flight must not be read later
                raise ShardUnavailableError(
                    f"table shard {current} did not answer within {self.timeout_s * 1e3:.0f} ms"
                ) from None
            except OSError as exc:  # ConnectionError, refused, missing socket: dead shard
                for p in order:
                    self.conns[p].close()
                if attempt == 1 or time.monotonic() >= deadline:
                    raise ShardUnavailableError(
                        f"table shard {current} is unavailable ({exc}); the server restarts it"
                    ) from None
            finally:
                for p in order:
                    self.conns[p].lock.release()
        raise AssertionError("unreachable")

    def control(self, op: int, model: int, version: int = 0) -> list[dict[str, Any]]:
        """``STATUS`` (each shard's JSON) or ``USING`` on every shard process."""
        head = HEAD.pack(op, model, 0, version, 0, 0)
        jobs: dict[int, list[tuple[bytes, list[Any], memoryview | None]]] = {
            c.index: [(head, [], None)] for c in self.conns
        }
        out = []
        for p, answers in sorted(self._exchange(jobs).items()):
            status, body = answers[0]
            if status != ST_OK:
                raise ShardUnavailableError(f"table shard {p}: {bytes(body).decode()}")
            out.append(json.loads(bytes(body)) if op == OP_STATUS else {})
        return out

    def gather(
        self, model: int, table: int, version: int, num_shards: int, dim: int, keys: U64
    ) -> F32:
        """Rows of ``keys`` (any order, duplicates fine) from the shards that hold them."""
        out = np.empty((keys.size, dim), np.float32)
        if keys.size == 0:
            return out
        row = np.dtype((np.void, 4 * dim))
        flat = out.view(row).reshape(-1)
        n = len(self.conns)
        sh = shard_of(keys, num_shards) if num_shards > 1 else None
        jobs: dict[int, list[tuple[bytes, list[Any], memoryview | None]]] = {}
        sels: dict[int, list[tuple[npt.NDArray[np.int64] | None, F32]]] = {}
        for s in range(num_shards):
            sel = None if sh is None else np.flatnonzero(sh == s)
            part = keys if sel is None else keys[sel]
            if part.size == 0:
                continue
            buf = out if sel is None else np.empty((part.size, dim), np.float32)
            head = HEAD.pack(OP_LOOKUP, model, table, version, s, part.size)
            into = memoryview(buf.data).cast("B")
            jobs.setdefault(s % n, []).append((head, [np.ascontiguousarray(part)], into))
            sels.setdefault(s % n, []).append((sel, buf))
        answers = self._exchange(jobs)
        for p, got in answers.items():
            for (status, body), (sel, buf) in zip(got, sels[p], strict=True):
                if status != ST_OK:
                    raise ShardUnavailableError(f"table shard {p}: {bytes(body).decode()}")
                if body.nbytes != buf.nbytes:
                    raise ShardUnavailableError(
                        f"table shard {p} answered {body.nbytes} bytes, expected {buf.nbytes}"
                    )
                if sel is not None:
                    flat[sel] = buf.view(row).reshape(-1)
        return out

    def close(self) -> None:
        for c in self.conns:
            c.close()


@dataclass
class RemoteTable:
    """One table of one served version, read from the shard processes (a RowSource)."""

    shards: ShardSet
    model: int
    table: int
    version: int
    num_shards: int
    dim: int

    def gather(self, keys: U64) -> F32:
        return self.shards.gather(
            self.model, self.table, self.version, self.num_shards, self.dim, keys
        )


@dataclass
class RemoteView:
    """The tables one served version reads, all remote (a TableView)."""

    tables: dict[str, RemoteTable]

    @classmethod
    def of(cls, m: artifacts.Manifest, shards: ShardSet, model: int) -> RemoteView:
        if m.sparse is None:
            raise artifacts.ArtifactError(f"version {m.version} has no sparse tables")
        num = int(m.sparse["num_shards"])
        return cls({
            str(t["name"]): RemoteTable(shards, model, i, int(m.version), num, int(t["dim"]))
            for i, t in enumerate(m.sparse["tables"])
        })  # fmt: skip
