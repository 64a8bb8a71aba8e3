"""One serving worker: its event loop, its copy of each model, its batchers, its routes.

HTTP API (all on one port, 127.0.0.1 by default):

- ``POST /v1/models/{name}:predict`` with ``application/json`` (``{"instances": [[...]]}``)
  or ``application/x-coadapt-batch`` (see :mod:`coadapt.serve.codec`); the answer uses the
  request's encoding and carries the version in ``X-Coadapt-Version``.
- ``GET /v1/models`` and ``GET /v1/models/{name}``: live version, input spec, batch limit,
  the last refused version and why.
- ``GET /healthz`` (the process runs), ``GET /readyz`` (every model has a version loaded),
  ``GET /metrics`` (Prometheus text, summed over workers).

Hot swap: every ``poll_s`` a worker reads the model directory's ``LIVE`` pointer (else its
newest complete version). A new target is loaded, verified and warmed up on a side thread
beside the live model; then one attribute assignment switches the pointer, which the batcher
reads once per batch: the batch in flight finishes on the old model and the next runs on the
new one, so no request fails or is dropped. A version that fails to load is recorded (and
counted in ``/metrics``) and the live one keeps serving; it is retried only if its manifest
changes.

Sparse models (a ``sparse`` section in the manifest, :mod:`coadapt.serve.sparse_artifacts`)
take one or more arrays per request (feature IDs as uint64/int64, dense features as float32).
A full version is loaded and swapped like a dense one; an incremental version is applied
*live* (:mod:`coadapt.serve.sparse_model`): prepared beside the live tables, made visible by
the same pointer switch, and merged into the shared tables between batches. Each batch runs on
exactly one version.

With ``table_shards`` > 0 a sparse model's tables live in table-shard processes
(:mod:`coadapt.serve.table_shards`) instead of in every worker: a worker holds the dense part,
switches to the newest version every shard holds, and its embeddings look rows up on the shards
(tagged with the version, in parallel); a shard that does not answer fails the batch with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coadapt.serve import artifacts, codec, sparse_artifacts
from coadapt.serve.batching import AimdBatchSize, Batcher, BatchResult
from coadapt.serve.config import ServeConfig
from coadapt.serve.http import HttpProtocol, Request, Response, error
from coadapt.serve.metrics import CONTENT_TYPE, ServeMetrics
from coadapt.serve.sparse_model import (
    MERGE_PAUSE,
    PendingMerge,
    SparseView,
    prepare_delta,
    serving_module,
)
from coadapt.serve.table_shards import (
    OP_STATUS,
    OP_USING,
    RemoteView,
    ShardSet,
    ShardUnavailableError,
    common_version,
)

PREDICT_PREFIX = "/v1/models/"
VERSION_HEADER = "X-Coadapt-Version"
SERVER_TIME_HEADER = "X-Coadapt-Server-Ms"
SWITCH_INTERVAL_S = 0.0005
SHARD_WAIT_S = 120.0  # how long a starting worker waits for the table shards to load


@dataclass
class Live:
    """A loaded version: the module and what it was built from (and, for a sparse model, the
    tables it reads, its request arrays and the chain digest of the state it holds)."""

    version: str
    module: torch.nn.Module
    manifest: artifacts.Manifest
    state: dict[str, torch.Tensor]
    view: SparseView | None = None
    inputs: list[sparse_artifacts.SparseInput] | None = None
    chain: str | None = None
    remote: bool = False  # the tables are on table-shard processes
    busy: int = 0  # batches running on it now (a remote version is released only at 0)


@dataclass
class ModelSlot:
    """The live version of one model name, and the swap machinery around it."""

    name: str
    root: Path
    live: Live | None = None
    refused: dict[str, str] = field(default_factory=dict)  # version -> why
    _refused_stamp: dict[str, float] = field(default_factory=dict)
    shards: ShardSet | None = None  # table-shard processes (sparse models), if any
    model_index: int = 0  # this model's number on the table shards' wire
    shard_status: list[dict[str, Any]] = field(default_factory=list)

    def run(self, x: np.ndarray) -> BatchResult[str]:
        """One forward on whatever version is live now (read once: the swap point)."""
        live = self.live
        if live is None:
            raise RuntimeError(f"model {self.name} has no version loaded")
        live.busy += 1
        try:
            with torch.inference_mode():
                if x.dtype.names:  # several arrays per row (a sparse model)
                    out = live.module(
                        *(torch.from_numpy(np.ascontiguousarray(x[n])) for n in x.dtype.names)
                    )
                else:
                    out = live.module(torch.from_numpy(x))
        finally:
            live.busy -= 1
        return BatchResult(out.numpy(), live.version)

    def remote_target(self) -> bool:
        """Whether this slot's versions are served from the table shards (a sparse model)."""
        if self.shards is None:
            return False
        if self.live is not None and self.live.remote:
            return True
        want = artifacts.live_version(self.root)
        if want is None:
            return False
        try:
            return artifacts.read_manifest(self.root, want).sparse is not None
        except (ValueError, OSError):
            return False  # the ordinary path refuses it, with the reason

    def load_remote(self, version: str) -> Live:
        """The dense part of ``version`` around a view of the table shards, warmed up (the
        warm-up's look-ups prove every shard answers for this version)."""
        assert self.shards is not None
        m = artifacts.read_manifest(self.root, version)
        inputs = sparse_artifacts.inputs_of(m)
        live = self.live
        base = (live.version, live.state) if live is not None and live.remote else None
        dense = sparse_artifacts.dense_state(self.root, version, base)
        module = serving_module(m, dense, RemoteView.of(m, self.shards, self.model_index))
        with torch.inference_mode():
            module(*(torch.zeros((1, *i.shape), dtype=torch.float32 if i.dtype == "float32"
                                 else torch.int64) for i in inputs))  # fmt: skip
        chain = None if m.sparse is None else str(m.sparse["chain"])
        return Live(version, module, m, dict(module.state_dict()), None, inputs, chain, True)

    def input_names(self) -> list[str] | None:
        """The names of the arrays a sparse model takes (None: one array, a dense model)."""
        live = self.live
        return None if live is None or live.inputs is None else [i.name for i in live.inputs]

    def id_inputs(self) -> list[bool] | None:
        """Which of a sparse model's arrays hold feature IDs."""
        live = self.live
        return (
            None
            if live is None or live.inputs is None
            else [i.dtype != "float32" for i in live.inputs]
        )

    def validate_arrays(self, arrays: list[np.ndarray], max_rows: int) -> np.ndarray:
        """A sparse model's request arrays as one batchable array (one array: as is; several:
        a structured array, one field per input), or a CodecError saying what is wrong."""
        live = self.live
        if live is None or live.inputs is None:
            raise codec.CodecError(f"model {self.name} has no version loaded yet", 503)
        specs = live.inputs
        if len(arrays) != len(specs):
            raise codec.CodecError(
                f"model {self.name} takes {len(specs)} array(s) {[i.name for i in specs]}, "
                f"the request holds {len(arrays)}"
            )
        rows = arrays[0].shape[0] if arrays[0].ndim else 0
        out: list[np.ndarray] = []
        for spec, arr in zip(specs, arrays, strict=True):
            if arr.ndim != 1 + len(spec.shape) or tuple(arr.shape[1:]) != spec.shape:
                raise codec.CodecError(
                    f"input {spec.name!r} has shape {list(arr.shape)}; model {self.name} expects "
                    f"[rows, {', '.join(map(str, spec.shape))}]",
                    422,
                )
            if arr.shape[0] != rows:
                raise codec.CodecError(
                    f"input {spec.name!r} has {arr.shape[0]} rows, input {specs[0].name!r} {rows}: "
                    "every input needs one row per item",
                    422,
                )
            if spec.dtype in ("uint64", "int64"):
                if arr.dtype.kind not in "iu":
                    raise codec.CodecError(
                        f"input {spec.name!r} holds feature IDs: send uint64 or int64 integers, "
                        f"not {arr.dtype}"
                    )
                ids = arr if arr.dtype.itemsize == 8 else arr.astype(np.int64)
                out.append(ids.view(np.int64))  # bit for bit: the embedding reads them as uint64
            else:
                if arr.dtype.kind not in "fiu":
                    raise codec.CodecError(f"input {spec.name!r} takes numbers, got {arr.dtype}")
                f32 = arr.astype(np.float32, copy=False)
                if not np.isfinite(f32).all():
                    bad = int(np.argwhere(~np.isfinite(f32))[0][0])
                    raise codec.CodecError(
                        f"input {spec.name!r} row {bad} holds NaN or Inf (or a value too large "
                        "for float32)"
                    )
                out.append(f32)
        if not 1 <= rows <= max_rows:
            raise codec.CodecError(f"{rows} rows; a request holds 1 to {max_rows} rows", 413)
        if len(out) == 1:
            return out[0]
        packed = np.empty(
            rows, np.dtype([(s.name, a.dtype, s.shape) for s, a in zip(specs, out, strict=True)])
        )
        for s, a in zip(specs, out, strict=True):
            packed[s.name] = a
        return packed

    def validate(self, arr: np.ndarray, max_rows: int) -> np.ndarray:
        """The request's rows in the model's dtype, or a CodecError saying what is wrong."""
        live = self.live
        if live is None:
            raise codec.CodecError(f"model {self.name} has no version loaded yet", 503)
        spec = live.manifest.inputs
        want = [-1, *spec.shape]
        if arr.ndim != len(want) or tuple(arr.shape[1:]) != spec.shape:
            raise codec.CodecError(
                f"input shape {list(arr.shape)} does not fit model {self.name}: expected "
                f"[rows, {', '.join(map(str, spec.shape))}]",
                422,
            )
        if not 1 <= arr.shape[0] <= max_rows:
            raise codec.CodecError(
                f"{arr.shape[0]} rows; a request holds 1 to {max_rows} rows", 413
            )
        if spec.dtype == "float32":
            if arr.dtype.kind not in "fiu":
                raise codec.CodecError(f"model {self.name} takes numbers, got {arr.dtype}")
            out = arr.astype(np.float32, copy=False)
            if not np.isfinite(out).all():
                bad = int(np.argwhere(~np.isfinite(out))[0][0])
                raise codec.CodecError(
                    f"row {bad} holds NaN or Inf (or a value too large for float32)"
                )
            return out
        if arr.dtype.kind not in "iu":
            raise codec.CodecError(f"model {self.name} takes int64 ids, got {arr.dtype}")
        return arr.astype(np.int64, copy=False)

    def load(self, version: str) -> tuple[Live, PendingMerge | None]:
        """Build, verify and warm up ``version`` (on a side thread; the live one serves on).
        For a sparse model this is the next step towards ``version``: its full base, or the
        next delta on the live state (then with the merge still to run between batches)."""
        manifest = artifacts.read_manifest(self.root, version)
        if manifest.sparse is not None:
            if self.shards is not None:
                # remote_target() said no only because it could not read this manifest a
                # moment ago: never load the whole table into a worker the shards exist to spare
                raise ShardUnavailableError(
                    f"version {version} of {self.name} is served from the table shards"
                )
            return self._load_sparse(version)
        base = (self.live.version, self.live.state) if self.live is not None else None
        module, manifest, state = artifacts.build_model(self.root, version, base)
        dtype = np.float32 if manifest.inputs.dtype == "float32" else np.int64
        with torch.inference_mode():  # the first forward allocates; do it off the hot path
            module(torch.from_numpy(np.zeros((1, *manifest.inputs.shape), dtype=dtype)))
        return Live(version, module, manifest, state), None

    def _load_sparse(self, version: str) -> tuple[Live, PendingMerge | None]:
        live = self.live
        have = live.version if live is not None and live.view is not None else None
        step = sparse_artifacts.resolve_path(self.root, version, have)[0]
        m = artifacts.read_manifest(self.root, step)
        inputs = sparse_artifacts.inputs_of(m)
        pending: PendingMerge | None = None
        if m.kind == "full":
            tables = sparse_artifacts.load_tables(self.root, step, packed=True)
            dense = sparse_artifacts.dense_state(self.root, step)
            view, chain = SparseView.of(tables), tables.chain
        else:
            assert live is not None and live.view is not None
            delta = sparse_artifacts.read_delta(self.root, step)
            if delta.parent_chain != live.chain:
                raise artifacts.IntegrityError(
                    f"version {step} is a delta on a state this server does not hold (chain "
                    f"{delta.parent_chain[:12]}… vs live {str(live.chain)[:12]}…): wrong base"
                )
            pending = prepare_delta(live.view, delta.parts, step)
            dense = sparse_artifacts.dense_state(self.root, step, (live.version, live.state))
            view, chain = pending.view, delta.chain
        module = serving_module(m, dense, view)
        with torch.inference_mode():  # warm up: the first forward allocates
            module(*(torch.zeros((1, *i.shape), dtype=torch.float32 if i.dtype == "float32"
                                 else torch.int64) for i in inputs))  # fmt: skip
        return Live(step, module, m, dict(module.state_dict()), view, inputs, chain), pending

    def target(self) -> str | None:
        """The version this slot should serve now, unless it was refused already."""
        want = artifacts.live_version(self.root)
        if want is None or (self.live is not None and want == self.live.version):
            return None
        if want in self.refused:
            try:
                stamp = (self.root / want / artifacts.MANIFEST).stat().st_mtime
            except FileNotFoundError:
                return None
            if stamp == self._refused_stamp.get(want):
                return None  # refused; retried only when its manifest changes
        return want

    def refuse(self, version: str, why: str) -> None:
        self.refused[version] = why
        try:
            stamp = (self.root / version / artifacts.MANIFEST).stat().st_mtime
        except FileNotFoundError:
            stamp = -1.0
        self._refused_stamp[version] = stamp

    def status(self, max_batch: int) -> dict[str, Any]:
        live = self.live
        return {
            "name": self.name,
            "version": live.version if live else None,
            "kind": live.manifest.kind if live else None,
            "inputs": asdict(live.manifest.inputs) if live else None,
            "lineage": asdict(live.manifest.lineage) if live else None,
            "max_batch_rows": max_batch,
            "refused": self.refused,
            "pid": os.getpid(),
            "sparse": (
                None if live is None
                else _remote_status(live, self.shard_status) if live.remote
                else None if live.view is None
                else _sparse_status(live)
            ),
        }  # fmt: skip


def _remote_status(live: Live, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows and bytes summed over the table shards, and each shard's own report."""
    rows: dict[str, int] = {}
    for st in shards:
        for n, k in st.get("rows", {}).items():
            rows[n] = rows.get(n, 0) + int(k)
    nbytes = sum(int(st.get("nbytes", 0)) for st in shards)
    raw = sum(int(st.get("raw_bytes", 0)) for st in shards)
    return {
        "rows": rows,
        "nbytes": nbytes,
        "raw_bytes": raw,
        "ratio": nbytes / raw if raw else None,
        "inputs": [asdict(i) for i in live.inputs or []],
        "chain": live.chain,
        "merging": any(st.get("merging") for st in shards),
        "table_shards": shards,
    }


def _sparse_status(live: Live) -> dict[str, Any]:
    """Rows, bytes held and raw bytes of the live tables (memory per row vs raw)."""
    assert live.view is not None
    held = [b for t in live.view.tables.values() for b in (*t.bases, *t.extras) if b is not None]
    nbytes = sum(b.nbytes() for b in held)
    raw = sum(len(b) * b.raw_bytes_per_row() for b in held)
    return {
        "rows": {
            n: sum(t.rows(s) for s in range(len(t.bases))) for n, t in live.view.tables.items()
        },
        "nbytes": nbytes,
        "raw_bytes": raw,
        "ratio": nbytes / raw if raw else None,
        "inputs": [asdict(i) for i in live.inputs or []],
        "chain": live.chain,
        "merging": any(o is not None for t in live.view.tables.values() for o in t.overlays),
    }


class Worker:
    """The routes, batchers and swap loop of one worker process."""

    def __init__(self, config: ServeConfig, index: int = 0) -> None:
        self.config = config
        self.index = index
        self.metrics = ServeMetrics()
        self.slots = {n: ModelSlot(n, Path(d)) for n, d in config.models.items()}
        if config.table_shards:
            shards = ShardSet(
                config.shard_socket_dir, config.table_shards, config.shard_timeout_ms / 1000
            )
            for i, slot in enumerate(self.slots.values()):
                slot.shards, slot.model_index = shards, i
        # Forwards run on the event loop by default: handing each batch to a thread costs a GIL
        # hand-off per batch (measured: 52-56 vs 41-44 us of CPU per request, small MLP, 32
        # clients), and a worker per core already gives the parallelism. --forward-thread is
        # for models whose forward is long enough that parsing beside it pays.
        # torch.set_num_threads is per OpenMP thread: set it in that thread too, or it uses
        # every core and spins (a 0.1 ms forward took 7-19 ms on a busy machine).
        self._forward: ThreadPoolExecutor | None = None
        if config.forward_thread:
            self._forward = ThreadPoolExecutor(
                1,
                thread_name_prefix="forward",
                initializer=torch.set_num_threads,
                initargs=(config.thread_count(),),
            )
        # the success path's labelled children, looked up once (labels() costs ~5 us a call)
        self._hot = {
            n: (self.metrics.requests.labels(n, "200"), self.metrics.latency.labels(n))
            for n in self.slots
        }
        self.batchers: dict[str, Batcher[str]] = {}
        for name, slot in self.slots.items():
            self.batchers[name] = Batcher(
                slot.run,
                AimdBatchSize(slo_s=config.slo_ms / 1000),
                executor=self._forward,
                on_batch=self._on_batch(name),
            )

    def _on_batch(self, name: str) -> Callable[[int, float], None]:
        rows_h = self.metrics.batch_rows.labels(name)
        fwd_h = self.metrics.forward.labels(name)
        limit_g = self.metrics.max_batch.labels(name)

        def record(rows: int, duration_s: float) -> None:
            rows_h.observe(rows)
            fwd_h.observe(duration_s)
            limit_g.set(self.batchers[name].policy.current)  # each worker's own, kept fresh

        return record

    # ------------------------------------------------------------------------- swapping

    async def refresh(self) -> None:
        """Load whatever each slot should serve and is not serving yet (a sparse model may
        take several steps: its full base, then each delta, each applied live)."""
        for name, slot in self.slots.items():
            if slot.remote_target():
                await self._refresh_remote(name, slot)
                continue
            for _ in range(64):  # bounded: one step per delta between the live and the target
                want = slot.target()
                if want is None:
                    break
                try:
                    new, pending = await asyncio.to_thread(slot.load, want)
                except ShardUnavailableError:
                    break  # a sparse version on table shards: the next poll takes it remotely
                except (ValueError, OSError, RuntimeError, TypeError, KeyError) as exc:
                    slot.refuse(want, str(exc))  # ArtifactError is a ValueError
                    self.metrics.load_failures.labels(name).inc()
                    print(f"serve[{self.index}]: refused {name} version {want}: {exc}",
                          file=sys.stderr, flush=True)  # fmt: skip
                    break
                first = slot.live is None
                slot.live = new  # the swap: the next batch runs on it
                slot.refused.pop(new.version, None)
                if not first:
                    self.metrics.swaps.labels(name).inc()
                self.metrics.version.labels(name).set(int(new.version))
                if pending is not None:
                    await self._merge(name, slot, pending)

    async def _refresh_remote(self, name: str, slot: ModelSlot) -> None:
        """Switch to the newest version every table shard holds, then tell them (so they can
        drop the old one once every worker did); copy their refusals."""
        assert slot.shards is not None
        try:
            status = await asyncio.to_thread(slot.shards.control, OP_STATUS, slot.model_index)
        except ShardUnavailableError:
            return  # a shard is restarting: try again next poll
        slot.shard_status = status
        for st in status:
            for v, why in st.get("refused", {}).items():
                if v not in slot.refused:  # once per version (shards word it differently)
                    slot.refuse(v, why)
                    self.metrics.load_failures.labels(name).inc()
        pick = common_version([st["held"] for st in status])
        live = slot.live
        if pick is not None and pick not in slot.refused and (live is None or live.version != pick):
            await self._switch_remote(name, slot, pick)
        live = slot.live
        if live is not None and live.remote:
            # said on every poll, not only after a switch: a restarted shard's (or a re-opened
            # connection's) pin starts at its oldest version and must learn ours
            with contextlib.suppress(ShardUnavailableError):
                await asyncio.to_thread(
                    slot.shards.control, OP_USING, slot.model_index, int(live.version)
                )

    async def _switch_remote(self, name: str, slot: ModelSlot, pick: str) -> None:
        try:
            new = await asyncio.to_thread(slot.load_remote, pick)
        except ShardUnavailableError:
            return
        except (ValueError, OSError, RuntimeError, TypeError, KeyError) as exc:
            slot.refuse(pick, str(exc))
            self.metrics.load_failures.labels(name).inc()
            print(f"serve[{self.index}]: refused {name} version {pick}: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        old, first = slot.live, slot.live is None
        slot.live = new  # the swap: the next batch runs on it
        slot.refused.pop(new.version, None)
        if not first:
            self.metrics.swaps.labels(name).inc()
        self.metrics.version.labels(name).set(int(new.version))
        while old is not None and old.busy:  # a batch on a forward thread may still read it
            await asyncio.sleep(0.001)

    async def _between_batches(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` where no forward runs beside it: on the event loop (forwards run there
        too) or on the forward thread, queued behind the batch in flight. Then leave the loop
        to requests for ``MERGE_PAUSE`` times as long as ``fn`` took (a 25 % duty cycle): an
        800 KB body arrives in a dozen socket reads, and one merge step between each read would
        delay it 12-fold."""
        t0 = time.perf_counter()
        if self._forward is None:
            out = fn()
        else:
            out = await asyncio.get_running_loop().run_in_executor(self._forward, fn)
        await asyncio.sleep(MERGE_PAUSE * (time.perf_counter() - t0))
        return out

    async def _merge(self, name: str, slot: ModelSlot, pending: PendingMerge) -> None:
        """Step (3) of a live delta: merge the overlays into the base tables, chunk by chunk."""
        for step in pending.steps():
            await self._between_batches(step)
        problems: list[str] = await self._between_batches(pending.finish)
        if problems:  # cannot happen if the pre-check passed; say so loudly if it does
            live = slot.live
            why = "; ".join(problems)
            if live is not None:
                slot.refuse(live.version, f"merged state differs from the publisher's: {why}")
            self.metrics.load_failures.labels(name).inc()
            print(f"serve[{self.index}]: {name}: {why}", file=sys.stderr, flush=True)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            await self.refresh()

    # ------------------------------------------------------------------------- routes

    async def handle(self, req: Request) -> Response:
        path = req.path
        if path.startswith(PREDICT_PREFIX):
            rest = path[len(PREDICT_PREFIX) :]
            name, _, verb = rest.partition(":")
            if verb == "predict":
                if req.method != "POST":
                    return error(405, f"{path} takes POST")
                return await self.predict(name, req)
            if verb or "/" in name:
                return error(404, f"unknown path {path}: use {PREDICT_PREFIX}NAME:predict")
            if name not in self.slots:
                return error(404, f"no model {name!r}; serving: {sorted(self.slots)}")
            return self._json(self.slots[name].status(self.batchers[name].policy.current))
        if req.method != "GET":
            return error(405, f"{path} takes GET")
        if path == "/healthz":
            return self._json({"status": "ok", "pid": os.getpid()})
        if path == "/readyz":
            missing = [n for n, s in self.slots.items() if s.live is None]
            if missing:
                return error(503, f"no version loaded yet for {missing}")
            return self._json({"status": "ready", "pid": os.getpid()})
        if path == "/metrics":
            return Response(200, self.metrics.exposition(), CONTENT_TYPE)
        if path in ("/v1/models", "/v1/models/"):
            return self._json(
                {"models": [s.status(self.batchers[n].policy.current)
                            for n, s in self.slots.items()]}
            )  # fmt: skip
        return error(404, f"unknown path {path}")

    @staticmethod
    def _json(doc: dict[str, Any]) -> Response:
        return Response(200, json.dumps(doc).encode())

    async def predict(self, name: str, req: Request) -> Response:
        t0 = time.perf_counter()
        slot = self.slots.get(name)
        if slot is None:
            return error(404, f"no model {name!r}; serving: {sorted(self.slots)}")
        ctype = req.headers.get("content-type", "")
        try:
            names = slot.input_names()
            if names is None:
                rows = slot.validate(codec.decode(ctype, req.body), self.config.max_rows)
            else:
                arrays = codec.decode_inputs(ctype, req.body, names, slot.id_inputs())
                rows = slot.validate_arrays(arrays, self.config.max_rows)
        except codec.CodecError as exc:
            self.metrics.requests.labels(name, str(exc.status)).inc()
            self.metrics.errors.labels(name, "client").inc()
            return error(exc.status, str(exc))
        try:
            out, version = await self.batchers[name].submit(rows)
        except ShardUnavailableError as exc:  # a table shard is down or slow: retry later
            self.metrics.requests.labels(name, "503").inc()
            self.metrics.errors.labels(name, "server").inc()
            return error(503, f"model {name}: {exc}")
        except Exception as exc:  # the model itself failed: a server error, counted
            self.metrics.requests.labels(name, "500").inc()
            self.metrics.errors.labels(name, "server").inc()
            return error(500, f"model {name} failed: {exc!r}")
        if ctype.startswith(codec.BINARY):
            body = codec.encode_arrays([np.ascontiguousarray(out, dtype=np.float32)])
            resp = Response(200, body, codec.BINARY, {VERSION_HEADER: version})
        else:
            resp = Response(200, codec.encode_json(out, name, version), codec.JSON,
                            {VERSION_HEADER: version})  # fmt: skip
        ok, latency = self._hot[name]
        ok.inc()
        took = time.perf_counter() - t0
        latency.observe(took)
        # server-side time (body parsed to answer ready, queueing for the batch included):
        # what a load generator on the same cores cannot measure from outside
        resp.headers[SERVER_TIME_HEADER] = f"{took * 1e3:.3f}"
        return resp

    # ------------------------------------------------------------------------- lifecycle

    async def serve(self, sock: socket.socket, ready: int | None = None) -> None:
        """Load every model, accept on ``sock`` until SIGTERM/SIGINT, then drain and return."""
        torch.set_num_threads(self.config.thread_count())
        # A version loads on a side thread while batches run on the loop; every GIL hand-off
        # back to the loop may wait a full switch interval (5 ms by default), and a sparse
        # forward hands off dozens of times: measured p99 8x steady during a 500k-row delta.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        await self.refresh()
        # table shards start beside the workers: wait (bounded) until they hold a version
        deadline = time.monotonic() + SHARD_WAIT_S
        while time.monotonic() < deadline and any(
            s.live is None and s.remote_target() for s in self.slots.values()
        ):
            await asyncio.sleep(min(self.config.poll_s, 0.1))
            await self.refresh()
        # Everything imported and loaded so far lives as long as the process: move it out of
        # the collector's sight. A full collection otherwise walks torch's ~170k objects and
        # stalls every request for tens to hundreds of milliseconds: the p99 tail.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        for b in self.batchers.values():
            b.start()
        server = await loop.create_server(
            lambda: HttpProtocol(self.handle, self.config.max_body), sock=sock, backlog=1024
        )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watcher = loop.create_task(self.watch())
        if ready is not None:
            try:
                os.write(ready, f"ready {self.index} {os.getpid()}\n".encode())
            except BrokenPipeError:  # the supervisor is gone: nobody to serve for
                stop.set()
            os.close(ready)
        await stop.wait()
        server.close()  # no new connections; requests already queued are answered
        for b in self.batchers.values():
            await b.stop()
        watcher.cancel()
        if self._forward is not None:
            self._forward.shutdown(wait=True)
