"""The executor seam: how the controller starts, watches and stops replica processes.

The controller only ever talks to an :class:`Executor` (launch / poll / stop), so the same
reconciliation logic drives real processes (:mod:`coadapt.executors.local`) and the in-memory
fake the unit tests use (:mod:`coadapt.executors.fake`), like httpx's transport seam.

A :class:`ReplicaHandle` is plain data the controller persists in its database; any executor
can :meth:`~Executor.poll` a handle written by an earlier controller process, which is how a
restarted controller re-adopts live replicas instead of starting them twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable


class ExecutorError(RuntimeError):
    """A replica could not be started (bad command, missing working directory, no slot)."""


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything needed to start one replica of one attempt of a job."""

    job_id: str
    attempt: int  # the controller's attempt counter: a rescale or a retry starts a new one
    rank: int
    world_size: int
    argv: tuple[str, ...]
    cwd: str
    run_dir: str  # per-attempt scratch directory (pid and exit files live here)
    log_path: str  # stdout and stderr of the replica go here (appended)
    slot: int  # which slot (GPU index, or CPU slot number) the replica occupies
    env: Mapping[str, str] = field(default_factory=dict)  # full environment of the replica


@dataclass(frozen=True)
class ReplicaHandle:
    """Identifies a started replica across controller restarts.

    ``start_ticks`` is the process start time (clock ticks since boot on Linux): a PID alone
    may be reused by an unrelated process after the replica exits, the pair may not.
    """

    pid: int
    start_ticks: int | None
    run_dir: str
    rank: int


class ReplicaPhase(str, Enum):
    """What :meth:`Executor.poll` observed."""

    RUNNING = "running"
    EXITED = "exited"  # the process ended and its exit code is known
    LOST = "lost"  # the process is gone and its exit code is unknown (e.g. killed with -9)


@dataclass(frozen=True)
class ReplicaStatus:
    phase: ReplicaPhase
    exit_code: int | None = None  # shell convention: 128 + N when killed by signal N
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.phase is not ReplicaPhase.RUNNING


@runtime_checkable
class Executor(Protocol):
    """Starts and stops replicas; knows nothing about jobs, policies or the database."""

    name: str

    def slots(self) -> int:
        """How many replicas can run at once on this executor."""
        ...

    def uses_gpus(self) -> bool:
        """Whether slots are GPUs (replicas then get CUDA_VISIBLE_DEVICES)."""
        ...

    def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        """Start a replica; raise :class:`ExecutorError` if it cannot be started."""
        ...

    def poll(self, handle: ReplicaHandle) -> ReplicaStatus:
        """Observe a replica, including one started by an earlier controller process."""
        ...

    def stop(self, handle: ReplicaHandle, force: bool = False) -> None:
        """Ask a replica to checkpoint and exit (SIGTERM), or kill it (``force``)."""
        ...

    def recover(self, run_dir: str, rank: int) -> ReplicaHandle | None:
        """The handle of a replica whose launch was not yet recorded (crash mid-launch)."""
        ...
