"""An in-memory executor for unit tests: replicas are records the test finishes by hand."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coadapt.executors.base import (
    ExecutorError,
    NodeInventory,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
    launch_each,
)
from coadapt.executors.gpu_types import DEFAULT_GPU_TYPE


@dataclass
class FakeReplica:
    spec: ReplicaSpec
    handle: ReplicaHandle
    status: ReplicaStatus
    signals: list[str]


class FakeExecutor:
    """Records launches and signals; a SIGTERM makes a replica exit 0 on the next poll.

    ``exit_on_stop`` mimics the training library (checkpoint and exit 0 on SIGTERM); tests
    call :meth:`finish` to end replicas with a chosen exit code, :meth:`fail_launches`
    to make the next launches raise, and :meth:`add_node` / :meth:`remove_node` to change the
    cluster (replicas on a removed node are EVICTED, as a cluster executor reports them).
    ``slots`` alone is one node named ``local``; ``nodes`` maps several names to slots, and
    ``gpu_types`` gives a node's GPU type (default :data:`DEFAULT_GPU_TYPE`).
    """

    name = "fake"
    shares_slots = True

    def __init__(
        self,
        slots: int = 4,
        gpus: bool = False,
        exit_on_stop: bool = True,
        nodes: Mapping[str, int] | None = None,
        gpu_types: Mapping[str, str] | None = None,
    ) -> None:
        self._nodes: dict[str, int] = dict(nodes) if nodes is not None else {"local": slots}
        self.gpu_types: dict[str, str] = dict(gpu_types or {})
        self._gpus = gpus
        self.exit_on_stop = exit_on_stop
        self.replicas: dict[int, FakeReplica] = {}
        self.launch_failures = 0
        self.groups: list[list[ReplicaSpec]] = []  # every launch_group call, in order
        self.retained: list[set[str]] = []  # every retain() call
        self._next_pid = 1000

    def nodes(self) -> list[NodeInventory]:
        return [
            NodeInventory(n, s, self.gpu_types.get(n, DEFAULT_GPU_TYPE))
            for n, s in self._nodes.items()
        ]

    def slots(self) -> int:
        return sum(self._nodes.values())

    def uses_gpus(self) -> bool:
        return self._gpus

    def launch_group(self, specs: Sequence[ReplicaSpec]) -> list[ReplicaHandle | ExecutorError]:
        self.groups.append(list(specs))
        return launch_each(self.launch, specs)

    def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        if self.launch_failures > 0:
            self.launch_failures -= 1
            raise ExecutorError(f"fake launch failure for {spec.job_id} rank {spec.rank}")
        if spec.node not in self._nodes:
            raise ExecutorError(f"no node {spec.node!r}")
        if not Path(spec.cwd).is_dir():  # as the real executors refuse it
            raise ExecutorError(f"working_dir {spec.cwd!r} does not exist")
        self._next_pid += 1
        handle = ReplicaHandle(self._next_pid, self._next_pid * 10, spec.run_dir, spec.rank)
        self.replicas[handle.pid] = FakeReplica(
            spec, handle, ReplicaStatus(ReplicaPhase.RUNNING), []
        )
        return handle

    def poll(self, handle: ReplicaHandle) -> ReplicaStatus:
        rep = self.replicas.get(handle.pid)
        if rep is None or rep.handle.start_ticks != handle.start_ticks:
            return ReplicaStatus(ReplicaPhase.LOST, None, "unknown to the fake executor")
        return rep.status

    def stop(self, handle: ReplicaHandle, force: bool = False) -> None:
        rep = self.replicas.get(handle.pid)
        if rep is None or rep.status.done:
            return
        rep.signals.append("SIGKILL" if force else "SIGTERM")
        if force:
            rep.status = ReplicaStatus(ReplicaPhase.EXITED, 137, "killed")
        elif self.exit_on_stop:
            rep.status = ReplicaStatus(ReplicaPhase.EXITED, 0, "stopped for rescale")

    def recover(self, run_dir: str, rank: int) -> ReplicaHandle | None:
        for rep in self.replicas.values():
            if rep.spec.run_dir == run_dir and rep.spec.rank == rank:
                return rep.handle
        return None

    def retain(self, run_dirs: Collection[str]) -> None:
        self.retained.append(set(run_dirs))

    # -- test helpers ---------------------------------------------------------------------
    def running(self, job_id: str | None = None) -> list[FakeReplica]:
        return [
            r
            for r in self.replicas.values()
            if not r.status.done and (job_id is None or r.spec.job_id == job_id)
        ]

    def finish(self, job_id: str, exit_code: int = 0, rank: int | None = None) -> int:
        """End the running replicas of a job (or one rank) with ``exit_code``."""
        count = 0
        for rep in self.running(job_id):
            if rank is None or rep.spec.rank == rank:
                rep.status = ReplicaStatus(ReplicaPhase.EXITED, exit_code, "finished by test")
                count += 1
        return count

    def add_node(self, name: str, slots: int, gpu_type: str | None = None) -> None:
        self._nodes[name] = slots
        if gpu_type is not None:
            self.gpu_types[name] = gpu_type

    def remove_node(self, name: str) -> int:
        """The node leaves: its running replicas are evicted. Returns how many."""
        self._nodes.pop(name, None)
        count = 0
        for rep in self.running():
            if rep.spec.node == name:
                rep.status = ReplicaStatus(ReplicaPhase.EVICTED, None, f"node {name} lost")
                count += 1
        return count

    def evict(self, job_id: str, reason: str = "placement timed out") -> int:
        """Report the job's running replicas as never placed (a placement-group timeout)."""
        count = 0
        for rep in self.running(job_id):
            rep.status = ReplicaStatus(ReplicaPhase.EVICTED, None, reason)
            count += 1
        return count
