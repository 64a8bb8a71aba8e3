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
"""

from __future__ import annotations

import asyncio
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

from coadapt.serve import artifacts, codec
from coadapt.serve.batching import AimdBatchSize, Batcher, BatchResult
from coadapt.serve.config import ServeConfig
from coadapt.serve.http import HttpProtocol, Request, Response, error
from coadapt.serve.metrics import CONTENT_TYPE, ServeMetrics

PREDICT_PREFIX = "/v1/models/"
VERSION_HEADER = "X-Coadapt-Version"


@dataclass
class Live:
    """A loaded version: the module and what it was built from."""

    version: str
    module: torch.nn.Module
    manifest: artifacts.Manifest
    state: dict[str, torch.Tensor]


@dataclass
class ModelSlot:
    """The live version of one model name, and the swap machinery around it."""

    name: str
    root: Path
    live: Live | None = None
    refused: dict[str, str] = field(default_factory=dict)  # version -> why
    _refused_stamp: dict[str, float] = field(default_factory=dict)

    def run(self, x: np.ndarray) -> BatchResult[str]:
        """One forward on whatever version is live now (read once: the swap point)."""
        live = self.live
        if live is None:
            raise RuntimeError(f"model {self.name} has no version loaded")
        with torch.inference_mode():
            out = live.module(torch.from_numpy(x))
        return BatchResult(out.numpy(), live.version)

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

    def load(self, version: str) -> Live:
        """Build, verify and warm up ``version`` (on a side thread; the live one serves on)."""
        base = (self.live.version, self.live.state) if self.live is not None else None
        module, manifest, state = artifacts.build_model(self.root, version, base)
        dtype = np.float32 if manifest.inputs.dtype == "float32" else np.int64
        with torch.inference_mode():  # the first forward allocates; do it off the hot path
            module(torch.from_numpy(np.zeros((1, *manifest.inputs.shape), dtype=dtype)))
        return Live(version, module, manifest, state)

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
        }


class Worker:
    """The routes, batchers and swap loop of one worker process."""

    def __init__(self, config: ServeConfig, index: int = 0) -> None:
        self.config = config
        self.index = index
        self.metrics = ServeMetrics()
        self.slots = {n: ModelSlot(n, Path(d)) for n, d in config.models.items()}
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
        """Load whatever each slot should serve and is not serving yet."""
        for name, slot in self.slots.items():
            want = slot.target()
            if want is None:
                continue
            try:
                new = await asyncio.to_thread(slot.load, want)
            except (ValueError, OSError, RuntimeError, TypeError) as exc:  # ArtifactError too
                slot.refuse(want, str(exc))
                self.metrics.load_failures.labels(name).inc()
                print(f"serve[{self.index}]: refused {name} version {want}: {exc}",
                      file=sys.stderr, flush=True)  # fmt: skip
                continue
            first = slot.live is None
            slot.live = new  # the swap: the next batch runs on it
            slot.refused.pop(want, None)
            if not first:
                self.metrics.swaps.labels(name).inc()
            self.metrics.version.labels(name).set(int(want))

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
            rows = slot.validate(codec.decode(ctype, req.body), self.config.max_rows)
        except codec.CodecError as exc:
            self.metrics.requests.labels(name, str(exc.status)).inc()
            self.metrics.errors.labels(name, "client").inc()
            return error(exc.status, str(exc))
        try:
            out, version = await self.batchers[name].submit(rows)
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
        latency.observe(time.perf_counter() - t0)
        return resp

    # ------------------------------------------------------------------------- lifecycle

    async def serve(self, sock: socket.socket, ready: int | None = None) -> None:
        """Load every model, accept on ``sock`` until SIGTERM/SIGINT, then drain and return."""
        torch.set_num_threads(self.config.thread_count())
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
