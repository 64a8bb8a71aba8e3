"""Online (7x24) training from a sample stream, with exactly-once offsets across crashes.

    python -m coadapt.sparse.online --source file:samples.tsv --model lr --servers 2 \\
        --ckpt-dir ckpt [--checkpoint-every 200] [--checkpoint-every-s 30] [--idle-exit-s 5]

The loop reads Criteo TSV records from a :class:`~coadapt.sparse.stream.StreamSource`, trains a
:mod:`coadapt.sparse.models` model over shard servers (or an in-process store), adds each
sample to the exposure/click counters of its features' rows, and every K batches or T seconds
commits a checkpoint generation (:mod:`coadapt.sparse.checkpoint`):

1. wait for the last asynchronous push (``PSClient.save`` does): from here no push is in flight
   and the trainer, single-threaded, issues none until the checkpoint is committed; the SSP
   cache is worker-side only and never saved;
2. every shard writes its generation file in parallel, the stream offset in its header;
3. the dense parameters and dense optimizer state go to ``dense.g<seq>.pt`` with that offset;
4. ``MANIFEST.json`` naming ``seq`` is renamed into place — the commit point.

On (re)start the trainer reads the manifest, makes *every* shard reload that generation (live
shards roll back too, so shards never mix generations), loads the dense file and seeks the
stream to the offset. A first start commits generation 0 before reading anything, so "no
manifest" always means "the shards are as they started". **What a crash loses:** the updates
applied since the last commit (at most K batches or T seconds), and the stream replays exactly
those samples, so the model reflects every sample once. Dead servers it started itself are
restarted (``--servers N``); with ``--servers-dir`` someone else (the job) restarts them and the
trainer reconnects through the port files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch
from torch import nn

from coadapt.atomicfile import atomic_writer
from coadapt.protocol import (
    CheckpointRecord,
    MetricRecord,
    MetricReport,
    ProgressRecord,
    ReplicaEnv,
    ReplicaEnvError,
)
from coadapt.sparse.checkpoint import (
    Manifest,
    dense_file,
    prune_generations,
    read_manifest,
    shard_file,
    write_manifest,
)
from coadapt.sparse.client import LocalStore, PSClient, SparseStore, answers
from coadapt.sparse.formats import CRITEO_CATEGORICAL, CriteoBatch, ParseStats, parse_criteo
from coadapt.sparse.jobs import MODELS, JobLayout, model_tables
from coadapt.sparse.models import DeepFM, FactorizationMachine, LogisticRegression, auc
from coadapt.sparse.server import ServerProcess, ShardState, TableSpec, launch_servers
from coadapt.sparse.stream import (
    FileTailSource,
    NatsJetStreamSource,
    RedisStreamSource,
    StreamSource,
)

__all__ = [
    "MODELS",
    "ManagedServers",
    "OnlineConfig",
    "OnlineResult",
    "OnlineTrainer",
    "PortFileServers",
    "build_model",
    "model_tables",
    "source_factory",
]

log = logging.getLogger("coadapt.sparse.online")

_COMMIT, _STOP = 1, 2  # what the lead worker tells the others after each read
_FAILURES = (ConnectionError, OSError, RuntimeError, TimeoutError)


# --------------------------------------------------------------------------- models


def build_model(model: str, store: SparseStore, dim: int = 8) -> nn.Module:
    """The model over ``store`` (tables from :func:`model_tables`)."""
    if model == "lr":
        return LogisticRegression(store, optimizer="ftrl", hparams={"alpha": 1.0})
    hp = {"lr": 0.05, "init_scale": 0.01}
    if model == "fm":
        return FactorizationMachine(dim, store, hparams=hp)
    if model in ("deepfm", "widedeep"):
        return DeepFM(dim, fm=model == "deepfm", store=store, hparams=hp)
    raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")


# --------------------------------------------------------------------------- sources


def source_factory(uri: str) -> Callable[[str | None], StreamSource]:
    """``file:PATH``, ``nats://HOST:PORT?stream=S&subject=X`` or ``redis://HOST:PORT/DB?key=K``
    -> a function building the source at an offset (``None``: the stream's start)."""
    if uri.startswith("file:"):
        path = uri[len("file:") :]
        if not path:
            raise ValueError("--source file: needs a path, e.g. file:/data/samples.tsv")
        return lambda off: FileTailSource(path, off)
    u = urlparse(uri)
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    if u.scheme == "nats":
        missing = [k for k in ("stream", "subject") if k not in q]
        if missing:
            raise ValueError(
                f"--source {uri!r} lacks {', '.join(missing)}: use "
                "nats://127.0.0.1:4222?stream=S&subject=X"
            )
        servers = f"nats://{u.netloc or '127.0.0.1:4222'}"
        return lambda off: NatsJetStreamSource(q["stream"], q["subject"], off, servers=servers)
    if u.scheme == "redis":
        if "key" not in q:
            raise ValueError(f"--source {uri!r} lacks key: use redis://127.0.0.1:6379/0?key=K")
        url = uri.split("?", 1)[0]
        return lambda off: RedisStreamSource(q["key"], off, url=url)
    raise ValueError(
        f"--source {uri!r}: expected file:PATH, nats://HOST:PORT?stream=S&subject=X or "
        "redis://HOST:PORT/DB?key=K"
    )


# --------------------------------------------------------------------------- servers


class ServerSet(Protocol):
    """Where the shards are, and what to do when one fails."""

    num_shards: int

    def addresses(self) -> list[tuple[str, int]]:
        """Current ``(host, port)`` per shard; may block until every shard listens."""
        ...

    def repair(self) -> None:
        """Called after a failure: restart dead shards (or wait for someone else to)."""
        ...


class ManagedServers:
    """Shard processes this trainer starts, restarts when they die, and stops by PID."""

    def __init__(
        self, specs: Sequence[TableSpec], num_shards: int, workdir: str, ckpt_dir: str
    ) -> None:
        self.specs, self.num_shards = list(specs), num_shards
        self.workdir, self.ckpt_dir = workdir, ckpt_dir
        self.procs: list[ServerProcess] = launch_servers(
            self.specs, num_shards, workdir, ckpt_dir=ckpt_dir
        )
        self.restarts = 0

    def addresses(self) -> list[tuple[str, int]]:
        return [p.address for p in self.procs]

    def repair(self) -> None:
        for i, p in enumerate(self.procs):
            if _alive(p):
                continue
            log.warning("shard %d (pid %d) exited with %s: restarting", i, p.pid, p.proc.returncode)
            (self.procs[i],) = launch_servers(
                self.specs, self.num_shards, self.workdir, ckpt_dir=self.ckpt_dir, only=[i]
            )
            self.restarts += 1

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def _alive(p: ServerProcess, timeout: float = 2.0) -> bool:
    """Running and answering a PING; a killed shard that is not reaped yet is dead."""
    if p.proc.poll() is not None:
        return False
    if answers(p.address, timeout):
        return True
    try:
        p.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return True  # alive but not answering: let the next attempt tell
    return False


class PortFileServers:
    """Shards run by someone else (the job): ``shard-<i>.port`` files in ``directory``."""

    def __init__(self, directory: str, num_shards: int, wait_s: float = 60.0) -> None:
        self.directory, self.num_shards, self.wait_s = Path(directory), num_shards, wait_s

    def addresses(self) -> list[tuple[str, int]]:
        deadline = time.monotonic() + self.wait_s
        out = []
        for i in range(self.num_shards):
            pf = self.directory / f"shard-{i}.port"
            while not pf.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no shard server wrote {pf} in {self.wait_s}s")
                time.sleep(0.05)
            out.append(("127.0.0.1", int(pf.read_text())))
        return out

    def repair(self) -> None:
        time.sleep(1.0)  # the owner (the controller) restarts the shard, rewrites its port file


# --------------------------------------------------------------------------- the trainer


@dataclass
class OnlineConfig:
    """Knobs of the online loop; every interval is checked after each batch."""

    ckpt_dir: str
    model: str = "lr"
    dim: int = 8
    batch_size: int = 256
    checkpoint_every: int = 100  # batches between commits (K)
    checkpoint_every_s: float = 30.0  # seconds between commits (T)
    dense_lr: float = 0.01
    staleness: int = 0
    seed: int = 0
    auc_window: int = 20_000
    progress_every_s: float = 5.0
    read_timeout_s: float = 0.5
    idle_exit_s: float | None = None  # stop after the stream is idle this long (None: 7x24)
    max_restarts: int = 20  # recoveries in a row without a commit in between

    def __post_init__(self) -> None:
        for name in ("dim", "batch_size", "checkpoint_every", "auc_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every_s <= 0:
            raise ValueError(f"checkpoint_every_s must be > 0, got {self.checkpoint_every_s}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")


@dataclass
class OnlineResult:
    """What a run committed last, plus what it survived."""

    seq: int
    samples: int
    records: int
    malformed: int
    offset: str | None
    recoveries: int
    window_auc: float
    counters: dict[str, list[int]] = field(default_factory=dict)


class _Group:
    """Several workers on one stream, in lockstep (gloo): the lead (rank 0) reads each batch of
    ``world x batch_size`` records and broadcasts it; rank r trains on samples r, r + world, ...
    so every sample is applied by exactly one worker; dense gradients are averaged; the lead
    decides when to commit and stop, and commits after a barrier (no push in flight anywhere).
    A failure anywhere ends every worker (the job restarts them from the last checkpoint)."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout_s: float) -> None:
        import datetime

        import torch.distributed as dist

        self.dist, self.rank, self.world = dist, rank, world
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def share(self, recs: list[bytes], flags: int) -> tuple[list[bytes], int]:
        payload = b"\n".join(recs)
        head = torch.tensor([len(payload), len(recs), flags], dtype=torch.int64)
        self.dist.broadcast(head, 0)
        n_bytes, n_recs, flags = (int(v) for v in head)
        if n_recs == 0:
            return [], flags
        if self.rank == 0:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buf = torch.empty(n_bytes, dtype=torch.uint8)
        self.dist.broadcast(buf, 0)
        return bytes(buf.numpy().tobytes()).split(b"\n"), flags

    def average_grads(self, model: nn.Module) -> None:
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.dist.all_reduce(p.grad)
            p.grad /= self.world

    def barrier(self) -> None:
        self.dist.barrier()

    def broadcast_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        self.dist.broadcast(t, 0)
        return int(t[0])

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Stop(Exception):
    """SIGTERM/SIGINT: commit and leave."""


class OnlineTrainer:
    """The loop of the module docstring; ``servers=None`` trains on an in-process store."""

    def __init__(
        self,
        cfg: OnlineConfig,
        make_source: Callable[[str | None], StreamSource],
        servers: ServerSet | None = None,
        *,
        on_batch: Callable[[OnlineTrainer], None] | None = None,
        stderr: Any = None,
        group: _Group | None = None,
        emit: Callable[[MetricRecord], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.group = group
        self.emit = emit  # progress to the controller (dashboard, /metrics), lead only
        self.batches = 0
        self.make_source = make_source
        self.servers = servers
        self.on_batch = on_batch
        self.stderr = stderr if stderr is not None else sys.stderr
        self.specs, self.counted = model_tables(cfg.model, cfg.dim)
        Path(cfg.ckpt_dir).mkdir(parents=True, exist_ok=True)
        self.recoveries = 0
        self._in_a_row = 0
        self.stats = ParseStats()
        self._stop = False
        self._local: LocalStore | None = None
        self.store: PSClient | LocalStore | None = None
        self.seq = -1
        self.samples = 0
        self.records = 0
        self.offset: str | None = None
        self._window: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._window_n = 0
        self.model: nn.Module | None = None

    # ------------------------------------------------------------------ public
    def request_stop(self) -> None:
        """Commit after the current batch and return (signal handlers call this)."""
        self._stop = True

    def run(self) -> OnlineResult:
        """Train until idle (``idle_exit_s``) or stopped; recover from shard/store failures."""
        while True:
            try:
                return self._session()
            except _FAILURES as exc:
                if self.group is not None:
                    raise  # the others are mid-collective: the job restarts the whole group
                self._drop_store()
                self.recoveries += 1
                self._in_a_row += 1
                if self._in_a_row > self.cfg.max_restarts:
                    raise RuntimeError(
                        f"gave up after {self.cfg.max_restarts} recoveries; last error: {exc}"
                    ) from exc
                print(
                    f"[online] failure ({type(exc).__name__}: {exc}); recovering from the last "
                    f"checkpoint (recovery {self.recoveries})",
                    file=self.stderr,
                    flush=True,
                )
                if self.servers is not None:
                    self.servers.repair()

    # ------------------------------------------------------------------ sessions
    def _connect(self) -> PSClient | LocalStore:
        if self.servers is None:
            if self._local is None:
                self._local = LocalStore(self.specs, seed=self.cfg.seed)
            return self._local
        return PSClient(self.servers.addresses(), staleness=self.cfg.staleness, timeout=30.0)

    def _drop_store(self) -> None:
        if isinstance(self.store, PSClient):
            with contextlib.suppress(*_FAILURES):
                self.store.close()
        self.store = None

    def _restore(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(self.cfg.seed)
        store = self.store
        if store is None:
            raise RuntimeError("no store to restore into")
        model = build_model(self.cfg.model, store, self.cfg.dim)
        opt = torch.optim.Adam(model.parameters(), lr=self.cfg.dense_lr)
        lead = self.group is None or self.group.rank == 0
        man = read_manifest(self.cfg.ckpt_dir)
        if lead and man is None:  # first start: commit the untrained state as generation 0
            self.seq, self.samples, self.records, self.offset = -1, 0, 0, None
            self._commit(model, opt)
        elif lead and man is not None:
            if man.num_shards != self._num_shards():
                raise ValueError(
                    f"{self.cfg.ckpt_dir} holds a checkpoint of {man.num_shards} shard(s) but "
                    f"{self._num_shards()} are running; resharding a checkpoint is not supported"
                )
            if isinstance(store, PSClient):
                store.restore(man.seq)  # live shards roll back too: one generation everywhere
            else:
                store.state = ShardState.load(shard_file(self.cfg.ckpt_dir, 0, 1, man.seq))
        if self.group is not None:
            self.group.barrier()  # the lead has restored the shards (or committed generation 0)
        man = read_manifest(self.cfg.ckpt_dir)
        if man is None:
            raise RuntimeError(f"{self.cfg.ckpt_dir}: no manifest after the first commit")
        blob = torch.load(dense_file(self.cfg.ckpt_dir, man.seq), weights_only=True)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["opt"])
        self.seq, self.samples, self.offset = man.seq, man.samples, man.offset
        self.records = int(man.extra.get("records", 0))
        self.stats.malformed = int(man.extra.get("malformed", 0))
        return model, opt

    def _num_shards(self) -> int:
        return 1 if self.servers is None else self.servers.num_shards

    def _commit(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        seq = self.seq + 1
        meta = {"seq": seq, "offset": self.offset, "samples": self.samples}
        store = self.store
        if isinstance(store, PSClient):
            store.save(meta)  # waits for the pending push, then all shards in parallel
        elif store is not None:
            store.state.save(shard_file(self.cfg.ckpt_dir, 0, 1, seq), meta)
        with atomic_writer(dense_file(self.cfg.ckpt_dir, seq)) as f:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), **meta}, f)
        extra = {"records": self.records, "malformed": self.stats.malformed}
        write_manifest(
            self.cfg.ckpt_dir,
            Manifest(seq, self._num_shards(), self.offset, self.samples, extra),
        )
        self.seq = seq
        self._in_a_row = 0
        if self.emit is not None:
            self.emit(CheckpointRecord(step=self.batches))
        prune_generations(self.cfg.ckpt_dir, seq)

    def _session(self) -> OnlineResult:
        cfg = self.cfg
        group = self.group
        self.store = store = self._connect()
        model, opt = self._restore()
        self.model = model  # the live module, for on_batch hooks (e.g. publishing versions)
        lead = group is None or group.rank == 0  # reads the stream and decides for all
        src = self.make_source(self.offset) if lead else None
        world = 1 if group is None else group.world
        t_commit = t_progress = t_data = time.monotonic()
        t_start, samples_start = t_commit, self.samples
        batches = 0
        try:
            while True:
                recs: list[bytes] = []
                flags = 0
                now = time.monotonic()
                if lead and src is not None:
                    if not self._stop:
                        recs = src.read(cfg.batch_size * world, timeout=cfg.read_timeout_s)
                    now = time.monotonic()
                    t_data = now if recs else t_data
                    pending = batches + (1 if recs else 0)
                    due = (
                        pending >= cfg.checkpoint_every or now - t_commit >= cfg.checkpoint_every_s
                    )
                    idle = (
                        cfg.idle_exit_s is not None and not recs and now - t_data >= cfg.idle_exit_s
                    )
                    flags = (_COMMIT if due and pending else 0) | (
                        _STOP if self._stop or idle else 0
                    )
                if group is not None:
                    recs, flags = group.share(recs, flags)
                if recs:
                    self._step(model, opt, store, recs, group)
                    self.batches += 1
                    if src is not None:
                        self.offset = src.offset()
                    batches += 1
                    if self.on_batch is not None:
                        self.on_batch(self)
                if flags & _COMMIT or (flags & _STOP and batches):
                    self._commit_all(model, opt)
                    t_commit, batches = time.monotonic(), 0
                if lead and now - t_progress >= cfg.progress_every_s:
                    rate = (self.samples - samples_start) / max(now - t_start, 1e-9)
                    self._progress(rate)
                    t_progress = now
                if flags & _STOP:
                    break
        finally:
            if src is not None:
                src.close()
        counters = store.counter_totals()
        if lead:
            self._progress((self.samples - samples_start) / max(time.monotonic() - t_start, 1e-9))
        result = OnlineResult(
            self.seq,
            self.samples,
            self.records,
            self.stats.malformed,
            self.offset,
            self.recoveries,
            self.window_auc(),
            counters,
        )
        self._drop_store()
        return result

    def _step(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        store: PSClient | LocalStore,
        recs: list[bytes],
        group: _Group | None,
    ) -> None:
        """Train on this worker's share of ``recs`` (every record once across the workers),
        count its exposures and clicks; dense gradients are averaged over the workers."""
        batch = parse_criteo(  # the stream's first records must look like Criteo
            b"\n".join(recs),
            first_line=self.records + 1,
            stats=self.stats,
            sniff=self.records == 0,
        )
        self.records += len(recs)
        self.samples += len(batch)
        if group is not None:  # rank r takes samples r, r + world, ...
            sl = slice(group.rank, None, group.world)
            batch = CriteoBatch(batch.labels[sl], batch.dense[sl], batch.cats[sl])
        opt.zero_grad()
        if len(batch):
            logits = model(
                torch.from_numpy(batch.dense), torch.from_numpy(batch.cats.view(np.int64))
            )
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(batch.labels)
            )
            loss.backward()  # pushes the sparse gradients
            clicks = batch.labels.astype(np.uint32)
            store.count(
                {
                    name: (np.ascontiguousarray(batch.cats[:, f]), clicks)
                    for f, name in enumerate(self.counted[:CRITEO_CATEGORICAL])
                }
            )
            self._track(logits.detach().numpy(), batch.labels)
        if group is not None:
            group.average_grads(model)
        opt.step()

    def _commit_all(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        """One cut: every worker's pushes applied (wait + barrier), then the lead commits."""
        group = self.group
        if group is None:
            self._commit(model, opt)
            return
        if isinstance(self.store, PSClient):
            self.store.wait()
        group.barrier()
        if group.rank == 0:
            self._commit(model, opt)
        group.barrier()
        self.seq = group.broadcast_int(self.seq)

    # ------------------------------------------------------------------ progress
    def _track(self, scores: np.ndarray, labels: np.ndarray) -> None:
        """Progressive validation: each batch is scored before the model learns from it."""
        self._window.append((scores, labels))
        self._window_n += len(labels)
        while self._window and self._window_n - len(self._window[0][1]) >= self.cfg.auc_window:
            self._window_n -= len(self._window.popleft()[1])

    def window_auc(self) -> float:
        """AUC of the last ``auc_window`` samples (NaN until both classes were seen)."""
        if not self._window:
            return math.nan
        y = np.concatenate([w[1] for w in self._window])
        if y.min() == y.max():
            return math.nan
        return float(auc(np.concatenate([w[0] for w in self._window]), y))

    def _progress(self, rate: float) -> None:
        if self.emit is not None:
            self.emit(ProgressRecord(step=self.batches, position=self.samples))
            self.emit(MetricReport(name="samples_per_s", value=rate, step=self.batches))
            window = self.window_auc()
            if not math.isnan(window):
                self.emit(MetricReport(name="window_auc", value=window, step=self.batches))
            if self.store is not None:  # rows per shard, push bytes (dashboard, /metrics)
                for name, value in self.store.progress_metrics().items():
                    self.emit(MetricReport(name=name, value=value, step=self.batches))
        print(
            f"[online] samples={self.samples} samples/s={rate:.0f} records={self.records} "
            f"malformed={self.stats.malformed} checkpoint={self.seq} auc@{self.cfg.auc_window}="
            f"{self.window_auc():.4f} offset={self.offset}",
            file=self.stderr,
            flush=True,
        )


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--source", required=True, help="file:PATH | nats://... | redis://...")
    ap.add_argument("--model", choices=MODELS, default="lr")
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--servers", type=int, default=0, help="shard servers (0: in-process store)")
    ap.add_argument(
        "--servers-dir",
        help="connect to shards run by someone else (their shard-<i>.port files) instead of "
        "starting --servers N of them",
    )
    ap.add_argument(
        "--ckpt-dir", help="checkpoint directory (in a coadapt sparse job: the job's own)"
    )
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--checkpoint-every", type=int, default=100, help="batches (K)")
    ap.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=None,
        help="seconds (T); default: the job's sparse.checkpoint_every_s, else 30",
    )
    ap.add_argument("--staleness", type=int, default=0)
    ap.add_argument("--dense-lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--progress-every-s", type=float, default=5.0)
    ap.add_argument("--idle-exit-s", type=float, default=None, help="exit when idle this long")
    ap.add_argument("--json", dest="json_out", help="write the result here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        job = ReplicaEnv.from_env()
        if job.world_size > 1 and not (args.servers_dir or job.sparse_dir):
            raise ValueError(
                f"{job.world_size} workers need shard servers they share (--servers-dir, or a "
                "coadapt job with a sparse: section)"
            )
        if job.sparse_dir is not None and job.sparse_servers is not None and not args.servers_dir:
            layout = JobLayout(Path(job.sparse_dir))  # a coadapt sparse job: its own servers
            args.servers_dir, args.servers = str(layout.servers_dir), job.sparse_servers
            args.ckpt_dir = args.ckpt_dir or str(layout.ckpt_dir)
        if not args.ckpt_dir:
            raise ValueError("--ckpt-dir is required outside a coadapt sparse job")
        make_source = source_factory(args.source)
        cfg = OnlineConfig(
            ckpt_dir=args.ckpt_dir,
            model=args.model,
            dim=args.dim,
            batch_size=args.batch_size,
            checkpoint_every=args.checkpoint_every,
            checkpoint_every_s=args.checkpoint_every_s or job.checkpoint_interval or 30.0,
            dense_lr=args.dense_lr,
            staleness=args.staleness,
            seed=args.seed,
            progress_every_s=args.progress_every_s,
            idle_exit_s=args.idle_exit_s,
        )
        if args.servers < 0:
            raise ValueError(f"--servers must be >= 0, got {args.servers}")
        if args.servers_dir and args.servers < 1:
            raise ValueError("--servers-dir needs --servers N (how many shards to connect to)")
    except (ValueError, ReplicaEnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    managed: ManagedServers | None = None
    servers: ServerSet | None = None
    if args.servers_dir:
        servers = PortFileServers(args.servers_dir, args.servers)
    elif args.servers:
        specs, _ = model_tables(args.model, args.dim)
        work = os.path.join(args.ckpt_dir, "servers")
        managed = servers = ManagedServers(specs, args.servers, work, args.ckpt_dir)
    group = None
    if job.world_size > 1:
        group = _Group(job.rank, job.world_size, job.master_addr, job.master_port, 300.0)
    sink = None
    if job.metrics_url and job.rank == 0:  # a coadapt job: progress to the dashboard, /metrics
        from coadapt.train.metrics import MetricsSink

        base = {"job_id": job.job_id, "rank": job.rank, "restarts": job.restarts}
        sink = MetricsSink(url=job.metrics_url, base=base)
    trainer = OnlineTrainer(
        cfg, make_source, servers, group=group, emit=None if sink is None else sink.emit
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: trainer.request_stop())
    try:
        result = trainer.run()
    finally:
        if managed is not None:
            managed.stop()
        if group is not None:
            group.close()
        if sink is not None:
            sink.close()
    out = json.dumps(result.__dict__)
    print(out)
    if args.json_out and job.rank == 0:
        Path(args.json_out).write_text(out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
