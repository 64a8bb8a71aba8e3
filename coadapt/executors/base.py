"""The executor seam: how the controller starts, watches and stops replica processes.

The controller only ever talks to an :class:`Executor` (nodes / launch_group / poll / stop /
retain), so the same reconciliation logic drives real processes (:mod:`coadapt.executors.local`),
Ray actors on a cluster (:mod:`coadapt.executors.ray_executor`) and the in-memory fake the unit
tests use (:mod:`coadapt.executors.fake`), like httpx's transport seam.

An executor reports its inventory as nodes with slots; the policy's per-node allocation is
realised by giving every :class:`ReplicaSpec` a ``node`` and launching all replicas of one
attempt together (:meth:`Executor.launch_group`): a cluster executor needs the whole gang at
once (a Ray placement group), a single machine just starts them one by one.

A :class:`ReplicaHandle` is plain data the controller persists in its database; any executor
can :meth:`~Executor.poll` a handle written by an earlier controller process, which is how a
restarted controller re-adopts live replicas instead of starting them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

from coadapt.policies.base import DEFAULT_GPU_TYPE


class ExecutorError(RuntimeError):
    """A replica could not be started (bad command, missing working directory, no slot)."""


# A training process that ran out of memory itself (CUDA OOM, or a host allocation that
# failed) exits with this code after recording the per-replica batch that did not fit; the
# kernel's OOM killer is told apart by the executor (cgroup counters). Either way the replica's
# status carries ``oom=True`` and the controller retries with a smaller per-replica batch.
OOM_EXIT_CODE = 86


@dataclass(frozen=True)
class NodeInventory:
    """A node the executor can place replicas on, and how many replicas fit there at once."""

    name: str  # stable for the node's lifetime; persisted in replica rows and allocations
    slots: int
    # Every slot of a node has one GPU type (coadapt.executors.gpu_types); a machine or
    # cluster that declares none is the one type DEFAULT_GPU_TYPE.
    gpu_type: str = DEFAULT_GPU_TYPE
    # Where other machines reach a service on this node (a serving replica's listen address,
    # which the controller's gateway connects to): a Ray node's IP; a single machine's own
    # loopback, where the controller runs too.
    address: str = "127.0.0.1"


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
    slot: int  # which slot (GPU index, or CPU slot number) on its node the replica occupies
    env: Mapping[str, str] = field(default_factory=dict)  # full environment of the replica
    node: str = "local"  # the inventory node the policy placed this replica on
    # Trees the replica must read that confinement would hide (a served model's version
    # root): bound back read-only in a mount namespace; nothing else changes.
    expose: tuple[str, ...] = ()


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
    # Not the job's fault: the replica's node left the cluster, or the resources for its
    # group never came (placement timed out). The attempt is redone without counting a failure.
    EVICTED = "evicted"


@dataclass(frozen=True)
class ReplicaStatus:
    phase: ReplicaPhase
    exit_code: int | None = None  # shell convention: 128 + N when killed by signal N
    reason: str = ""
    oom: bool = False  # ended for lack of memory (OOM killer, or exit code OOM_EXIT_CODE)

    @property
    def done(self) -> bool:
        return self.phase is not ReplicaPhase.RUNNING


@runtime_checkable
class Executor(Protocol):
    """Starts and stops replicas; knows nothing about jobs, policies or the database."""

    name: str
    # Whether two replicas (of two jobs) may share one slot: GPU sharing, the policy's
    # ``Decision.packed``. An executor that cannot (its replicas hold their slots alone) leaves
    # a packed guest pending until the policy gives it slots of its own.
    shares_slots: bool

    def nodes(self) -> list[NodeInventory]:
        """The nodes replicas can run on now (a node that left is simply absent)."""
        ...

    def slots(self) -> int:
        """How many replicas can run at once on this executor (all nodes together)."""
        ...

    def uses_gpus(self) -> bool:
        """Whether slots are GPUs (replicas then get CUDA_VISIBLE_DEVICES)."""
        ...

    def launch_group(self, specs: Sequence[ReplicaSpec]) -> list[ReplicaHandle | ExecutorError]:
        """Start all replicas of one attempt (each on its ``spec.node``); one result per spec,
        in order. Must not block for long: a group whose resources are slow to come is
        reported by :meth:`poll` (RUNNING while it waits, EVICTED once it gives up)."""
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

    def retain(self, run_dirs: Collection[str]) -> None:
        """Release what the executor holds for attempts not in ``run_dirs`` (the attempts with
        live replicas): Ray placement groups of finished or abandoned attempts."""
        ...


def launch_each(
    launch: Callable[[ReplicaSpec], ReplicaHandle], specs: Sequence[ReplicaSpec]
) -> list[ReplicaHandle | ExecutorError]:
    """:meth:`Executor.launch_group` for executors that start replicas independently."""
    out: list[ReplicaHandle | ExecutorError] = []
    for spec in specs:
        try:
            out.append(launch(spec))
        except ExecutorError as exc:
            out.append(exc)
    return out
