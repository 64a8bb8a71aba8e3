"""An in-memory executor for unit tests: replicas are records the test finishes by hand."""

from __future__ import annotations

from dataclasses import dataclass

from coadapt.executors.base import (
    ExecutorError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)


@dataclass
class FakeReplica:
    spec: ReplicaSpec
    handle: ReplicaHandle
    status: ReplicaStatus
    signals: list[str]


class FakeExecutor:
    """Records launches and signals; a SIGTERM makes a replica exit 0 on the next poll.

    ``exit_on_stop`` mimics the training library (checkpoint and exit 0 on SIGTERM); tests
    call :meth:`finish` to end replicas with a chosen exit code, and :meth:`fail_launches`
    to make the next launches raise.
    """

    name = "fake"

    def __init__(self, slots: int = 4, gpus: bool = False, exit_on_stop: bool = True) -> None:
        self._slots = slots
        self._gpus = gpus
        self.exit_on_stop = exit_on_stop
        self.replicas: dict[int, FakeReplica] = {}
        self.launch_failures = 0
        self._next_pid = 1000

    def slots(self) -> int:
        return self._slots

    def uses_gpus(self) -> bool:
        return self._gpus

    def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        if self.launch_failures > 0:
            self.launch_failures -= 1
            raise ExecutorError(f"fake launch failure for {spec.job_id} rank {spec.rank}")
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
