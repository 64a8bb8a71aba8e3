"""The process-wide training context: who am I, where do checkpoints go, am I asked to stop.

``init()`` reads the torchrun-compatible environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) plus coadapt's own variables, joins the process group when there is
more than one replica (gloo on CPU, NCCL with CUDA), loads the latest checkpoint, and turns
SIGTERM into a "checkpoint at the next step boundary and exit 0" request, which is how the
scheduler rescales a job. With no environment at all it is a plain single process.
"""

from __future__ import annotations

import contextlib
import gc
import random
import signal
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from coadapt.protocol import MetricReport, ReplicaEnv, ReplicaEnvError, StoppedRecord
from coadapt.train.checkpoint import load_checkpoint, save_checkpoint
from coadapt.train.memory import effective_cap, exit_for_oom, is_oom, read_limit
from coadapt.train.metrics import MetricsSink

_SHUTDOWN_BARRIER_S = 10.0  # how long shutdown waits for the other ranks


class TrainConfigError(ValueError):
    """The environment or the arguments describe an impossible training setup."""


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# Periodic checkpoints by default: at most this many seconds of work are lost to a crash
# (stretched so that checkpointing costs at most CHECKPOINT_BUDGET of the time; docs/train.md).
DEFAULT_CHECKPOINT_INTERVAL = 120.0


@dataclass(frozen=True)
class TrainEnv:
    """Everything a replica learns from its environment."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    job_id: str = ""
    num_nodes: int = 1
    checkpoint_dir: Path | None = None
    metrics_url: str | None = None
    metrics_file: Path | None = None
    restarts: int = 0
    # How the scheduler treats the batch (its policy's BatchMode): only "adaptive" lets the job
    # retune (m, s); under "fixed" / "fixed_batch" policies (Tiresias, Optimus, FIFO) it stays
    # at the submitted batch, as those policies assume.
    batch_mode: str = "adaptive"
    checkpoint_every: int = 0  # also checkpoint every N steps (0: only periodically)
    # seconds between periodic checkpoints (0 = none)
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL
    # the controller's learned per-replica batch cap (after an OOM)
    max_local_bsz: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrainEnv:
        """Read the replica environment (:class:`coadapt.protocol.ReplicaEnv`, the contract
        the controller and launcher write) and apply the library's defaults."""
        try:
            wire = ReplicaEnv.from_env(environ)
        except ReplicaEnvError as exc:
            raise TrainConfigError(str(exc)) from None
        return cls(
            rank=wire.rank,
            world_size=wire.world_size,
            local_rank=wire.rank if wire.local_rank is None else wire.local_rank,
            master_addr=wire.master_addr,
            master_port=wire.master_port,
            job_id=wire.job_id,
            num_nodes=wire.num_nodes,
            checkpoint_dir=Path(wire.checkpoint_dir) if wire.checkpoint_dir else None,
            metrics_url=wire.metrics_url,
            metrics_file=Path(wire.metrics_file) if wire.metrics_file else None,
            restarts=wire.restarts,
            batch_mode=wire.batch_mode or "adaptive",
            checkpoint_every=wire.checkpoint_every or 0,
            checkpoint_interval=(
                DEFAULT_CHECKPOINT_INTERVAL
                if wire.checkpoint_interval is None
                else wire.checkpoint_interval
            ),
            max_local_bsz=wire.max_local_bsz,
        )


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TrainingContext:
    """The one process-wide training context (created by :func:`init`)."""

    def __init__(self, env: TrainEnv, backend: str | None = None) -> None:
        self.env = env
        self.device = (
            torch.device("cuda", env.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        self.stop_requested = False
        self.start_time = time.time()
        self._states: dict[str, Stateful] = {}
        self._owns_group = False
        self._previous_hook = sys.excepthook
        if env.world_size > 1 and not dist.is_initialized():
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(self.device)
            dist.init_process_group(
                backend,
                init_method=f"tcp://{env.master_addr}:{env.master_port}",
                rank=env.rank,
                world_size=env.world_size,
            )
            self._owns_group = True
        self.checkpoint: dict[str, Any] | None = (
            load_checkpoint(env.checkpoint_dir) if env.checkpoint_dir is not None else None
        )
        self.metrics = self._make_sink()
        learned = read_limit(env.checkpoint_dir)
        # The per-replica batch cap learned from out-of-memory failures (controller's or ours).
        self.memory_cap: int | None = effective_cap(
            env.max_local_bsz, learned.max_local_bsz if learned else None
        )
        # The per-replica batch in flight, for the OOM record (set by the data loader).
        self.local_batch: Callable[[], int] | None = None
        self.last_save_seconds: float | None = None  # how long the last checkpoint took
        self._save_seconds: deque[float] = deque(maxlen=5)  # the last few, for pacing

    def _make_sink(self) -> MetricsSink:
        base = {"job_id": self.env.job_id, "rank": self.env.rank, "restarts": self.env.restarts}
        if self.env.rank != 0:
            return MetricsSink(base=base)  # only rank 0 speaks for the job
        if self.env.metrics_url:
            return MetricsSink(url=self.env.metrics_url, base=base)
        path = self.env.metrics_file
        if path is None:
            path = (
                self.env.checkpoint_dir / "metrics.jsonl"
                if self.env.checkpoint_dir
                else Path("coadapt-metrics.jsonl")
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        return MetricsSink(path=path, base=base)

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def distributed(self) -> bool:
        return self.env.world_size > 1 and dist.is_initialized()

    @property
    def restored(self) -> bool:
        """Whether this run resumed from a checkpoint."""
        return self.checkpoint is not None

    # -- state and checkpoints ------------------------------------------------------------
    def register(self, name: str, obj: Stateful) -> bool:
        """Include ``obj`` in checkpoints; load its saved state now if there is one."""
        if name in self._states and self._states[name] is not obj:
            raise TrainConfigError(f"a different object is already registered as {name!r}")
        self._states[name] = obj
        if self.checkpoint is not None and name in self.checkpoint.get("states", {}):
            obj.load_state_dict(self.checkpoint["states"][name])
            return True
        return False

    def restore_rng(self) -> None:
        """Restore the RNG states saved with the checkpoint (rank 0's, on every rank)."""
        if self.checkpoint is not None and "rng" in self.checkpoint:
            set_rng_state(self.checkpoint["rng"])

    def save(self) -> Path | None:
        """Checkpoint every registered object (rank 0 writes; all ranks then agree)."""
        path: Path | None = None
        started = time.perf_counter()
        if self.env.checkpoint_dir is not None and self.rank == 0:
            payload = {
                "states": {k: v.state_dict() for k, v in self._states.items()},
                "rng": rng_state(),
                "world_size": self.world_size,
                "saved_at": time.time(),
            }
            path = save_checkpoint(self.env.checkpoint_dir, payload)
        if self.distributed:
            dist.barrier()
        self.last_save_seconds = time.perf_counter() - started
        self._save_seconds.append(self.last_save_seconds)
        return path

    @property
    def typical_save_seconds(self) -> float | None:
        """The lower median of the last few checkpoints' durations (None before the first).

        Pacing by the last save alone let one stalled fsync (41 ms where saves took 2-3 ms)
        stretch the period 20-fold, and a SIGKILL then lost 17 % of the steps instead of
        <= 2 %; the median follows a disk that got slower, not one hiccup."""
        if not self._save_seconds:
            return None
        return float(statistics.median_low(self._save_seconds))

    # -- out of memory --------------------------------------------------------------------
    def exit_for_oom(self, exc: BaseException) -> None:
        """Record the per-replica batch that did not fit and exit with OOM_EXIT_CODE."""
        failed = self.local_batch() if self.local_batch is not None else 0
        exit_for_oom(exc, self.env.checkpoint_dir, failed, self.metrics.emit, self.metrics.close)

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        """An OOM anywhere in the user's loop (not only inside the model) is an OOM exit."""
        if is_oom(exc) and self.local_batch is not None:
            sys.__excepthook__(kind, exc, tb)
            self.exit_for_oom(exc)
        self._previous_hook(kind, exc, tb)

    # -- stopping -------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask for a checkpoint at the next step boundary followed by exit 0."""
        self.stop_requested = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def install_signal_handlers(self) -> None:
        # Outside the main thread this fails: the caller must request_stop() itself.
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook

    def exit_for_rescale(self) -> None:
        """Checkpoint, report, leave the process group and exit with status 0."""
        path = self.save()
        self.metrics.emit(StoppedRecord(checkpoint=str(path) if path else None))
        self.shutdown()
        sys.exit(0)

    def report(self, name: str, value: float, step: int | None = None) -> None:
        self.metrics.emit(MetricReport(name=name, value=float(value), step=step))

    def shutdown(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook
        self.metrics.close()
        if self._owns_group and dist.is_initialized():
            # Every rank arrives before any tears its sockets down: a peer that closed first
            # could fail a gloo thread still reading from it (C++ terminate at exit, seen
            # under load).
            # Bounded: a peer that died must not hold this rank's exit.
            with contextlib.suppress(RuntimeError):
                work = dist.barrier(async_op=True)
                if work is not None:
                    work.wait(timeout=timedelta(seconds=_SHUTDOWN_BARRIER_S))
            # destroy_process_group only unregisters the group: each DDP wrapper still held
            # it (seen: alive after shutdown, referred to by the wrapper's __dict__), so the
            # wrapper, its reducer and (until the library stopped registering one) its Python
            # comm hook lived until interpreter finalization, where a rank now and then died
            # with "terminate called without an active exception" (not reproduced on demand).
            # Registered models let go of their wrappers and those are collected here, while
            # Python still runs. (The group's Python object stays alive after this, held from
            # C++, not from Python.)
            for obj in self._states.values():
                leave = getattr(obj, "leave_process_group", None)
                if callable(leave):
                    leave()
            dist.destroy_process_group()
            gc.collect()
            self._owns_group = False


_CONTEXT: TrainingContext | None = None


def init(backend: str | None = None, environ: dict[str, str] | None = None) -> TrainingContext:
    """Create (once) and return the process-wide training context."""
    global _CONTEXT
    if _CONTEXT is None:
        env = TrainEnv.from_env(environ)
        if not env.job_id:
            env = TrainEnv(**{**env.__dict__, "job_id": f"local-{uuid.uuid4().hex[:8]}"})
        _CONTEXT = TrainingContext(env, backend)
        _CONTEXT.install_signal_handlers()
    return _CONTEXT


def current() -> TrainingContext:
    """The context created by :func:`init` (created on first use with the default env)."""
    return _CONTEXT if _CONTEXT is not None else init()


def shutdown() -> None:
    """Tear the context down (tests and scripts that run several trainings in one process)."""
    global _CONTEXT
    if _CONTEXT is not None:
        _CONTEXT.shutdown()
        _CONTEXT = None


def report(name: str, value: float, step: int | None = None) -> None:
    """Report a user metric (loss, accuracy, ...) on the job's metrics channel."""
    current().report(name, value, step)
