"""Worker side of the parameter server: dedupe, shard, pull/push in parallel, SSP row cache.

A training step touches a batch's IDs of many tables. The client deduplicates them per table,
splits the unique IDs by :func:`~coadapt.sparse.server.shard_of`, sends *one* request per shard
carrying every table (shards in parallel threads: socket I/O releases the GIL) and scatters the
replies back. Pushes carry gradients already summed per unique ID, optionally compressed with
:class:`~coadapt.sparse.compress.GradientCompressor` (one per table and shard, error feedback
included).

Bounded staleness (SSP): with ``staleness = s > 0`` a pulled row is cached with the step it was
fetched at and reused while ``step - fetched <= s``; older or unseen rows are fetched. ``s = 0``
disables the cache: every pull reads the servers, so training is synchronous. The cache does not
replay the worker's own pushes (the server optimizer is non-linear), so a cached row lags the
server by at most ``s`` steps of everyone's updates, own ones included; ``max_staleness`` records
the worst lag actually served. The cache is itself an :class:`EmbeddingTable` whose last column
holds the fetch step (int32 bits), with ``ttl = s + 1`` so dead rows are expired, not hoarded.

With ``s = 0`` a worker may announce the next batch's IDs (:meth:`PSClient.prefetch`): their
pull goes out in the background right behind the current push, on the same connections, and the
next :meth:`PSClient.pull_joined` of exactly those IDs at the same step takes its rows.

:class:`LocalStore` has the same ``pull``/``push`` API over an in-process
:class:`~coadapt.sparse.server.ShardState`: no servers, for tests and single-process runs.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from coadapt.sparse._hashing import as_u64_keys
from coadapt.sparse._optim_kernels import fused_available
from coadapt.sparse.compress import (
    CompressionConfig,
    GradientCompressor,
    ShardCompressor,
    is_empty,
)
from coadapt.sparse.server import (
    FLAG_COMPRESSED,
    FLAG_SHARD_PAYLOAD,
    LEN,
    OP_COUNT,
    OP_HELLO,
    OP_LOAD,
    OP_PING,
    OP_PULL,
    OP_PUSH,
    OP_SAVE,
    OP_SHUTDOWN,
    OP_STATS,
    PART,
    REQ,
    CallerMemo,
    ShardState,
    TableSpec,
    recv_exact,
    send_frame,
    shard_of,
)
from coadapt.sparse.table import EmbeddingTable

__all__ = ["SPARSE_METRIC_PREFIX", "LocalStore", "PSClient", "SparseStore", "dedupe"]

U64 = npt.NDArray[np.uint64]
F32 = npt.NDArray[np.float32]

_SPLIT_MIN_IDS = 8192
"""IDs in a local pull/push below which the tables run on one thread: handing work to a
second thread and joining it costs tens of microseconds, a table of a few hundred rows less."""


def dedupe(ids: npt.ArrayLike) -> tuple[U64, npt.NDArray[np.int64]]:
    """Unique IDs (sorted) and, per input position, the index of its unique ID."""
    keys = as_u64_keys(np.ravel(np.asarray(ids)), "ids")
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, inv.astype(np.int64, copy=False)


class SparseStore(Protocol):
    """What :class:`~coadapt.sparse.embedding.SparseEmbedding` needs from a store."""

    step: int

    def dim(self, table: str) -> int: ...

    def pull(self, ids: Mapping[str, U64]) -> dict[str, F32]: ...

    def push(self, grads: Mapping[str, tuple[U64, F32]]) -> None: ...


class LocalStore:
    """In-process store: one :class:`ShardState` (tables + row optimizers), no sockets.

    ``threads`` > 1 splits a pull or push of many tables over that many threads (table ``t``
    always on thread ``t % threads``, so a push finds its pull's indices in that thread's
    memo). Why: the probe, row gather and optimizer kernels release the GIL and wait on
    memory (random rows of tables far larger than the cache); in-process, they run while
    torch's threads sit idle, so a second thread overlaps their cache misses, as FBGEMM's
    lookups and fused optimizer do. Only with the compiled kernels and at least
    ``_SPLIT_MIN_IDS`` IDs in the call; the result is identical (each table is touched by one
    thread, in the same order).
    """

    def __init__(
        self, tables: Sequence[TableSpec], seed: int = 0, threads: int | None = None
    ) -> None:
        if threads is None:
            threads = min(2, os.cpu_count() or 1)
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.state = ShardState(tables, 0, 1, seed)
        # per thread: pull indices reused by the next push, scratch buffers
        self._memos = [CallerMemo() for _ in range(threads)]
        self._parallel = threads > 1 and fused_available()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (owner pid, pool)
        self._index = {s.name: i for i, s in enumerate(self.state.specs)}
        self.step = 0

    def _t(self, table: str) -> int:
        try:
            return self._index[table]
        except KeyError:
            raise KeyError(
                f"no sparse table {table!r}; this store has {sorted(self._index)}"
            ) from None

    def dim(self, table: str) -> int:
        return self.state.specs[self._t(table)].dim

    def _split(self, work: Sequence[tuple[int, Callable[[CallerMemo], None]]], ids: int) -> None:
        """Run each ``(table, fn)`` as ``fn(memo of its thread)``; tables of one thread in
        order, threads in parallel when the call is large enough to pay for the hand-off."""
        n = len(self._memos)
        groups: list[list[Callable[[CallerMemo], None]]] = [[] for _ in range(n)]
        for t, fn in work:
            groups[t % n].append(fn)

        def run(i: int) -> None:
            for fn in groups[i]:
                fn(self._memos[i])

        if not self._parallel or ids < _SPLIT_MIN_IDS:
            for i in range(n):
                run(i)
            return
        pool = self._executor()
        futures = [pool.submit(run, i) for i in range(1, n) if groups[i]]
        try:
            run(0)
        finally:
            for f in futures:
                f.result()

    def _executor(self) -> ThreadPoolExecutor:
        """The helper threads, created on first use in *this* process: after a fork the
        parent's pool has no threads in the child (its idle count would wait forever)."""
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            workers = len(self._memos) - 1
            self._pool = (pid, ThreadPoolExecutor(workers, thread_name_prefix="coadapt-local"))
        return self._pool[1]

    def pull(self, ids: Mapping[str, U64]) -> dict[str, F32]:
        st, step = self.state, self.step
        out: dict[str, F32] = {}

        def one(name: str, t: int, k: U64) -> Callable[[CallerMemo], None]:
            def fn(memo: CallerMemo) -> None:
                out[name] = st.pull(t, k, now=step, memo=memo)

            return fn

        work = [(t, one(n, t, k)) for n, k in ids.items() for t in [self._t(n)]]
        self._split(work, sum(k.size for k in ids.values()))
        return {n: out[n] for n in ids}

    def pull_joined(self, ids: Mapping[str, U64]) -> F32:
        """Rows of tables of one dim as one (total, dim) array in ``ids`` order, each table
        written straight into its slice (no concatenation copy)."""
        ts = [(self._t(n), k) for n, k in ids.items()]
        dims = {self.state.specs[t].dim for t, _ in ts}
        if len(dims) != 1:
            raise ValueError(f"a joined pull needs tables of one dim, got dims {sorted(dims)}")
        dim = dims.pop()
        total = sum(k.size for _, k in ts)
        out = np.empty((total, dim), np.float32)
        st, step = self.state, self.step

        def one(t: int, k: U64, dest: F32) -> Callable[[CallerMemo], None]:
            def fn(memo: CallerMemo) -> None:
                st.pull(t, k, now=step, out=dest, memo=memo)

            return fn

        work, off = [], 0
        for t, k in ts:
            work.append((t, one(t, k, out[off : off + k.size])))
            off += k.size
        self._split(work, total)
        return out

    def push(self, grads: Mapping[str, tuple[U64, F32]]) -> None:
        st, step = self.state, self.step

        def one(t: int, k: U64, g: F32) -> Callable[[CallerMemo], None]:
            def fn(memo: CallerMemo) -> None:
                st.push(t, k, g, now=step, memo=memo)

            return fn

        work = [(t, one(t, k, g)) for n, (k, g) in grads.items() for t in [self._t(n)]]
        self._split(work, sum(k.size for k, _ in grads.values()))
        self.step += 1

    def count(self, events: Mapping[str, tuple[U64, npt.NDArray[np.uint32]]]) -> None:
        """Exposure (one per occurrence of an id) and click counters; see PSClient.count."""
        for name, (k, c) in events.items():
            self.state.count(self._t(name), as_u64_keys(k, "ids"), np.asarray(c, np.uint32))

    def counter_totals(self) -> dict[str, list[int]]:
        return self.state.counter_totals()

    def progress_metrics(self) -> dict[str, float]:
        """Same keys as :meth:`PSClient.progress_metrics` (one shard, nothing on a wire)."""
        return _progress_metrics([sum(len(tb) for tb in self.state.tables)], 0)


SPARSE_METRIC_PREFIX = "sparse/"
"""Metric names a sparse job reports (``sparse/rows``, ``sparse/rows/shard<i>``,
``sparse/pushed_bytes``); the dashboard's sparse panel and ``/metrics`` read them."""


def _progress_metrics(rows_per_shard: list[int], pushed: int) -> dict[str, float]:
    out = {f"{SPARSE_METRIC_PREFIX}rows": float(sum(rows_per_shard))}
    out.update(
        {f"{SPARSE_METRIC_PREFIX}rows/shard{i}": float(n) for i, n in enumerate(rows_per_shard)}
    )
    out[f"{SPARSE_METRIC_PREFIX}pushed_bytes"] = float(pushed)
    return out


def _take_rows(k: U64, g: F32, sel: npt.NDArray[np.int64], whole: bool) -> tuple[U64, F32]:
    """IDs and gradient rows at ``sel`` (``whole``: sel is every row in order, no copy)."""
    g = np.ascontiguousarray(g, np.float32)
    if whole:
        return k, g
    row = np.dtype((np.void, 4 * g.shape[1]))  # whole rows: one memcpy each
    return k[sel], np.take(g.view(row).reshape(-1), sel).view(np.float32).reshape(sel.size, -1)


def _frame_bytes(n_parts: int, payload: int) -> int:
    """Bytes a request puts on the wire: length prefix, request header, part entries, payload
    (what ``bytes_pushed`` counts, so compression ratios include every header)."""
    return LEN.size + REQ.size + n_parts * PART.size + payload


class _Conn:
    """One persistent socket to one shard; requests on it are serialised by a lock."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.addr = (host, port)
        self.sock = socket.create_connection(self.addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()

    def call(
        self,
        op: int,
        parts: Sequence[tuple[int, int]],
        buffers: Sequence[Any],
        step: int = 0,
        flags: int = 0,
        into: memoryview | None = None,
    ) -> memoryview:
        head = REQ.pack(op, flags, len(parts), step) + b"".join(PART.pack(*p) for p in parts)
        with self.lock:
            send_frame(self.sock, head, buffers)
            (blen,) = LEN.unpack(recv_exact(self.sock, 4))
            status = recv_exact(self.sock, 1)[0]
            if status != 0:
                msg = bytes(recv_exact(self.sock, blen - 1)).decode(errors="replace")
                raise RuntimeError(f"parameter server {self.addr[0]}:{self.addr[1]}: {msg}")
            if into is not None and len(into) == blen - 1:
                return recv_exact(self.sock, blen - 1, into)
            return recv_exact(self.sock, blen - 1)

    def close(self) -> None:
        self.sock.close()


def answers(address: tuple[str, int], timeout: float) -> bool:
    """Whether a shard server at ``address`` answers a PING within ``timeout`` seconds.

    A bare connect is not enough: a SIGKILLed server's listening socket may still accept for a
    moment while the kernel tears the process down, and the next request is then reset."""
    try:
        conn = _Conn(*address, timeout)
    except OSError:
        return False
    try:
        conn.call(OP_PING, [], [])
    except RuntimeError:
        return True  # an error status is still an answer: the server is up
    except OSError:
        return False
    finally:
        conn.close()
    return True


class PSClient:
    """Client of ``num_shards`` shard servers (``addresses[i]`` serves shard ``i``).

    Args:
        addresses: ``(host, port)`` per shard, in shard order.
        staleness: SSP bound ``s`` (0 = synchronous, no cache).
        compression: compress pushes with this config (``None`` = exact float32).
        timeout: socket timeout in seconds.
        async_push: send pushes from a background thread (see :meth:`push`).
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        staleness: int = 0,
        compression: CompressionConfig | None = None,
        timeout: float = 120.0,
        async_push: bool = True,
    ) -> None:
        if not addresses:
            raise ValueError("PSClient needs the address of at least one shard server")
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 steps, got {staleness}")
        self.conns: list[_Conn] = []
        try:
            for h, p in addresses:
                self.conns.append(_Conn(h, p, timeout))
            self._handshake(addresses)
        except BaseException:
            for c in self.conns:
                c.close()
            raise
        self.staleness = staleness
        self.step = 0
        self.max_staleness = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.prefetch_hits = 0  # pulls answered by a prefetch
        self.bytes_pushed = 0
        self.bytes_pushed_raw = 0
        self.compression = compression
        self._compressors: dict[tuple[int, int], GradientCompressor] = {}  # scope "table"
        self._shard_comp: dict[int, ShardCompressor] = {}  # scope "shard"
        self._cache: dict[int, EmbeddingTable] = {}
        self._last_expire = 0
        self._pool = ThreadPoolExecutor(self.num_shards) if self.num_shards > 1 else None
        self._bg = ThreadPoolExecutor(1) if async_push else None
        self._pending: Future[None] | None = None
        # a prefetched pull: (step it was sent at, its ids per table, the rows it returns)
        self._prefetch: tuple[int, dict[int, U64], Future[F32]] | None = None

    def _handshake(self, addresses: Sequence[tuple[str, int]]) -> None:
        """Check every server is the shard the client thinks it is, with the same tables."""
        self.num_shards = len(self.conns)
        hellos = [json.loads(bytes(c.call(OP_HELLO, [], []))) for c in self.conns]
        for i, h in enumerate(hellos):
            if h["shard"] != i or h["num_shards"] != self.num_shards:
                raise ValueError(
                    f"server at {addresses[i]} is shard {h['shard']} of {h['num_shards']}, but "
                    f"the client lists it as shard {i} of {self.num_shards}; pass addresses in "
                    "shard order"
                )
            if h["specs"] != hellos[0]["specs"]:
                raise ValueError(f"shard {i} serves different table specs than shard 0")
        self.specs = [TableSpec.from_dict(d) for d in hellos[0]["specs"]]
        self._index = {s.name: i for i, s in enumerate(self.specs)}

    # ------------------------------------------------------------------ helpers
    def _t(self, table: str) -> int:
        try:
            return self._index[table]
        except KeyError:
            raise KeyError(
                f"no sparse table {table!r} on the servers; they have {sorted(self._index)}"
            ) from None

    def dim(self, table: str) -> int:
        return self.specs[self._t(table)].dim

    def _fanout(self, fn: Any, jobs: Sequence[Any]) -> list[Any]:
        if self._pool is None:
            return [fn(j) for j in jobs]
        return list(self._pool.map(fn, jobs))

    def _split(self, ids: U64) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Order grouping ``ids`` by shard and the start offset of each shard's group."""
        sh = shard_of(ids, self.num_shards)
        order = np.argsort(sh, kind="stable")
        bounds = np.searchsorted(sh[order], np.arange(self.num_shards + 1))
        return order, bounds

    # ------------------------------------------------------------------ pull
    def _fetch(self, wanted: Mapping[int, U64]) -> dict[int, F32]:
        """Read rows of unique ids from the servers: one request per shard, all tables."""
        split = {t: self._split(k) for t, k in wanted.items()}

        def one(s: int) -> tuple[int, memoryview | None]:
            parts, bufs = [], []
            for t, k in wanted.items():
                order, b = split[t]
                sel = order[b[s] : b[s + 1]]
                parts.append((t, sel.size))
                bufs.append(np.ascontiguousarray(k[sel]))
            if sum(p[1] for p in parts) == 0:
                return s, None
            return s, self.conns[s].call(OP_PULL, parts, bufs, step=self.step)

        replies = dict(self._fanout(one, range(self.num_shards)))
        out: dict[int, F32] = {}
        if self.num_shards == 1 and replies[0] is not None:
            # one shard: the reply already holds every table's rows in request order
            flat = np.frombuffer(replies[0], np.float32)
            off = 0
            for t, k in wanted.items():
                dim = self.specs[t].dim
                out[t] = flat[off : off + k.size * dim].reshape(-1, dim)
                off += k.size * dim
            return out
        for t, k in wanted.items():
            out[t] = np.empty((k.size, self.specs[t].dim), np.float32)
        for s in range(self.num_shards):
            rep = replies[s]
            if rep is None:
                continue
            off = 0
            for t in wanted:
                order, b = split[t]
                sel = order[b[s] : b[s + 1]]
                dim = self.specs[t].dim
                row = np.dtype((np.void, 4 * dim))  # whole rows: one memcpy each
                out[t].view(row).reshape(-1)[sel] = np.frombuffer(rep, row, sel.size, off)
                off += 4 * sel.size * dim
        return out

    def _joined_fetch(self, ts: dict[int, U64]) -> F32:
        """``_fetch`` of tables of one dim as one (total, dim) array in request order: with
        one shard a view of the reply buffer itself (no concatenation copy)."""
        got = self._fetch(ts)
        dims = {self.specs[t].dim for t in ts}
        total = sum(k.size for k in ts.values())
        if len(dims) != 1:
            raise ValueError(f"a joined pull needs tables of one dim, got dims {sorted(dims)}")
        dim = dims.pop()
        parts = list(got.values())
        if self.num_shards == 1 and parts and parts[0].base is not None:
            flat = np.frombuffer(parts[0].base, np.float32)  # the reply, every table in order
            if flat.size == total * dim:
                return flat.reshape(total, dim)
        return np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)

    def prefetch(self, ids: Mapping[str, U64]) -> None:
        """Start the pull of ``ids`` now, in the background, behind every push already sent.

        The next :meth:`pull_joined` of exactly these ids (same tables, same order) returns its
        rows, provided no push was sent after this call; anything else discards it and pulls
        afresh. The connection serves requests in order, so the prefetched rows already hold
        every earlier push: ``s = 0`` stays exact. Call it once the current batch's push is out
        (:class:`~coadapt.sparse.embedding.SparseEmbeddingCollection.prefetch` does) and the
        servers work on batch t + 1 while the worker finishes batch t. No-op with a cache
        (``staleness > 0``) or without ``async_push``."""
        if self.staleness or self._bg is None:
            return
        self._drop_prefetch()
        ts = {self._t(name): as_u64_keys(k, "ids") for name, k in ids.items()}
        self._prefetch = (self.step, ts, self._bg.submit(self._joined_fetch, ts))

    def _drop_prefetch(self) -> None:
        pre, self._prefetch = self._prefetch, None
        if pre is not None:
            pre[2].result()  # let it finish (and surface its error) before the socket is reused

    def _take_prefetch(self, ts: dict[int, U64]) -> F32 | None:
        """The prefetched rows if they answer exactly ``ts`` at the current step, else None."""
        pre, self._prefetch = self._prefetch, None
        if pre is None:
            return None
        step, want, fut = pre
        rows = fut.result()
        same = (
            step == self.step
            and list(want) == list(ts)
            and all(np.array_equal(want[t], k) for t, k in ts.items())
        )
        if not same:
            return None
        self.prefetch_hits += 1
        return rows

    def pull_joined(self, ids: Mapping[str, U64]) -> F32:
        """Rows of unique ``ids`` of tables of one dim as one (total, dim) array, in ``ids``
        order (what an embedding collection gathers from); a matching :meth:`prefetch` answers
        it without a round trip."""
        ts = {self._t(name): as_u64_keys(k, "ids") for name, k in ids.items()}
        if self.staleness:
            got = self.pull(ids)
            return np.concatenate([got[self.specs[t].name] for t in ts])
        pre = self._take_prefetch(ts)
        self.wait()
        self.cache_misses += sum(k.size for k in ts.values())
        return pre if pre is not None else self._joined_fetch(ts)

    def pull(self, ids: Mapping[str, U64]) -> dict[str, F32]:
        """Rows of unique ``ids`` per table, from the SSP cache when fresh enough."""
        self._drop_prefetch()
        self.wait()
        ts = {self._t(name): as_u64_keys(k, "ids") for name, k in ids.items()}
        if self.staleness == 0:
            got = self._fetch(ts)
            self.cache_misses += sum(k.size for k in ts.values())
            return {self.specs[t].name: r for t, r in got.items()}
        result: dict[int, F32] = {}
        need: dict[int, U64] = {}
        need_pos: dict[int, npt.NDArray[np.int64]] = {}
        for t, k in ts.items():
            dim = self.specs[t].dim
            cache = self._cache.get(t)
            if cache is None:
                cache = EmbeddingTable(dim, dim + 1, ttl=self.staleness + 1, max_rows=1 << 22)
                self._cache[t] = cache
            idx = cache.lookup(k)
            fresh = idx >= 0
            rows = np.empty((k.size, dim), np.float32)
            if fresh.any():
                hit = cache.rows(idx[fresh])
                fetched = np.ascontiguousarray(hit[:, dim]).view(np.int32).astype(np.int64)
                age = self.step - fetched
                ok = age <= self.staleness
                hit_pos = np.flatnonzero(fresh)[ok]
                rows[hit_pos] = hit[ok, :dim]
                if ok.any():
                    self.max_staleness = max(self.max_staleness, int(age[ok].max()))
                fresh[np.flatnonzero(fresh)[~ok]] = False
            self.cache_hits += int(fresh.sum())
            miss = np.flatnonzero(~fresh)
            self.cache_misses += miss.size
            result[t] = rows
            if miss.size:
                need[t], need_pos[t] = k[miss], miss
        if need:
            got = self._fetch(need)
            stamp = np.full(1, self.step, np.int32).view(np.float32)[0]
            for t, r in got.items():
                result[t][need_pos[t]] = r
                full = np.empty((r.shape[0], r.shape[1] + 1), np.float32)
                full[:, :-1] = r
                full[:, -1] = stamp
                self._cache[t].assign(need[t], full, now=self.step)
        if self.step - self._last_expire > self.staleness:
            self._last_expire = self.step
            for cache in self._cache.values():
                cache.expire(now=self.step)
        return {self.specs[t].name: r for t, r in result.items()}

    # ------------------------------------------------------------------ push
    def push(self, grads: Mapping[str, tuple[U64, F32]]) -> None:
        """Push gradients summed per unique ID (one request per shard) and advance the step.

        With ``async_push`` the request is sent by a background thread and this returns at
        once; the next pull (or save/stats/close) waits for it first, so every pull still sees
        every earlier push (``s = 0`` stays synchronous) while the rest of the backward pass and
        the dense optimizer step overlap with the servers' work. Errors surface at that wait.
        """
        self.wait()
        ts = {self._t(n): (as_u64_keys(k, "ids"), g) for n, (k, g) in grads.items()}
        step = self.step
        self.step += 1
        if self._bg is None:
            self._push_now(ts, step)
        else:
            self._pending = self._bg.submit(self._push_now, ts, step)

    def wait(self) -> None:
        """Block until the outstanding asynchronous push (if any) is applied; re-raise its error."""
        fut, self._pending = self._pending, None
        if fut is not None:
            fut.result()

    def _push_now(self, ts: dict[int, tuple[U64, F32]], step: int) -> None:
        split = {t: self._split(k) for t, (k, _) in ts.items()}

        shard_scope = self.compression is not None and self.compression.scope == "shard"

        def one(s: int) -> int:
            parts: list[tuple[int, int]] = []
            id_bufs: list[Any] = []
            g_bufs: list[Any] = []
            mine: dict[int, tuple[U64, F32]] = {}
            for t, (k, g) in ts.items():
                order, b = split[t]
                sel = order[b[s] : b[s + 1]]
                if sel.size == 0:
                    continue
                kk, gg = _take_rows(k, g, sel, self.num_shards == 1)
                if shard_scope:
                    mine[t] = (kk, gg)
                elif self.compression is not None:
                    comp = self._compressors.get((t, s))
                    if comp is None:
                        comp = GradientCompressor(self.specs[t].dim, self.compression)
                        self._compressors[(t, s)] = comp
                    payload = comp.encode(kk, gg)
                    if is_empty(payload):  # top-k chose nothing: all of it stays in residuals
                        continue
                    parts.append((t, len(payload)))
                    id_bufs.append(payload)
                else:
                    parts.append((t, sel.size))
                    id_bufs.append(np.ascontiguousarray(kk))
                    g_bufs.append(gg)
            if shard_scope and mine:
                return self._send_shard_payload(s, self._shard_compressor(s).encode(mine), step)
            if not parts:
                return 0
            flags = FLAG_COMPRESSED if self.compression is not None else 0
            bufs = id_bufs + g_bufs
            self.conns[s].call(OP_PUSH, parts, bufs, step=step, flags=flags)
            return _frame_bytes(len(parts), sum(memoryview(b).nbytes for b in bufs))

        sent = sum(self._fanout(one, range(self.num_shards)))
        self.bytes_pushed += sent
        self.bytes_pushed_raw += sum(k.size * (8 + 4 * g.shape[1]) for k, g in ts.values())

    def _shard_compressor(self, s: int) -> ShardCompressor:
        comp = self._shard_comp.get(s)
        if comp is None:
            assert self.compression is not None
            comp = ShardCompressor([sp.dim for sp in self.specs], self.compression)
            self._shard_comp[s] = comp
        return comp

    def _send_shard_payload(self, s: int, payload: bytes, step: int) -> int:
        """Send one ShardCompressor payload (nothing when empty); returns the bytes on the wire."""
        if not payload:
            return 0
        flags = FLAG_COMPRESSED | FLAG_SHARD_PAYLOAD
        self.conns[s].call(OP_PUSH, [], [payload], step=step, flags=flags)
        return _frame_bytes(0, len(payload))

    # ------------------------------------------------------------------ control
    def save(self, meta: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Checkpoint every shard in parallel (one atomic file each); ``meta`` (e.g. a stream
        offset) is stored in every shard file. Flushes compression residuals first."""
        self._drop_prefetch()  # the flush below changes rows without advancing the step
        self.wait()
        for (t, s), comp in self._compressors.items():
            payload = comp.flush()
            self.conns[s].call(
                OP_PUSH, [(t, len(payload))], [payload], step=self.step, flags=FLAG_COMPRESSED
            )
            self.bytes_pushed += _frame_bytes(1, len(payload))
        for s, scomp in self._shard_comp.items():
            self.bytes_pushed += self._send_shard_payload(s, scomp.flush(), self.step)
        body = [json.dumps(meta).encode()] if meta is not None else []
        return self._fanout(
            lambda s: json.loads(bytes(self.conns[s].call(OP_SAVE, [], body))),
            range(self.num_shards),
        )

    def count(self, events: Mapping[str, tuple[U64, npt.NDArray[np.uint32]]]) -> None:
        """Add exposure/click counters: per table, ids (one exposure per occurrence, not
        deduplicated) and the clicks of each occurrence. Synchronous, after pending pushes."""
        self.wait()
        ts = {
            self._t(n): (as_u64_keys(k, "ids"), np.ascontiguousarray(c, np.uint32))
            for n, (k, c) in events.items()
        }
        for k, c in ts.values():
            if c.shape != k.shape:
                raise ValueError(f"clicks shape {c.shape} does not match ids shape {k.shape}")
        split = {t: self._split(k) for t, (k, _) in ts.items()}

        def one(s: int) -> None:
            parts, id_bufs, c_bufs = [], [], []
            for t, (k, c) in ts.items():
                order, b = split[t]
                sel = order[b[s] : b[s + 1]]
                if sel.size:
                    parts.append((t, sel.size))
                    id_bufs.append(np.ascontiguousarray(k[sel]))
                    c_bufs.append(np.ascontiguousarray(c[sel]))
            if parts:
                self.conns[s].call(OP_COUNT, parts, id_bufs + c_bufs)

        self._fanout(one, range(self.num_shards))

    def restore(self, seq: int) -> None:
        """Every shard reloads its file of checkpoint generation ``seq`` (a consistent rollback);
        drops the SSP cache and compression residuals, which belong to the abandoned state."""
        self._drop_prefetch()
        self.wait()
        body = [json.dumps({"seq": seq}).encode()]
        self._fanout(lambda s: self.conns[s].call(OP_LOAD, [], body), range(self.num_shards))
        self._cache.clear()
        self._compressors.clear()
        self._shard_comp.clear()

    def counter_totals(self) -> dict[str, list[int]]:
        """[exposures, clicks] per counted table, summed over all shards."""
        out: dict[str, list[int]] = {}
        for st in self.stats():
            for name, (e, c) in st["counters"].items():
                tot = out.setdefault(name, [0, 0])
                tot[0] += e
                tot[1] += c
        return out

    def stats(self) -> list[dict[str, Any]]:
        self.wait()
        return [json.loads(bytes(c.call(OP_STATS, [], []))) for c in self.conns]

    def progress_metrics(self) -> dict[str, float]:
        """What a sparse job reports to the dashboard and ``/metrics``: rows per shard (a cheap
        STATS that skips the counter scan), their total and the push bytes sent so far."""
        self.wait()
        body = [json.dumps({"light": True}).encode()]
        light = self._fanout(
            lambda s: json.loads(bytes(self.conns[s].call(OP_STATS, [], body))),
            range(self.num_shards),
        )
        return _progress_metrics([sum(st["rows"].values()) for st in light], self.bytes_pushed)

    def shutdown_servers(self) -> None:
        self.wait()
        for c in self.conns:
            c.call(OP_SHUTDOWN, [], [])

    def close(self) -> None:
        try:
            self._drop_prefetch()
            self.wait()
        finally:
            for c in self.conns:
                c.close()
            if self._pool is not None:
                self._pool.shutdown()
            if self._bg is not None:
                self._bg.shutdown()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
