"""Executor conformance: the same scenarios on every executor the controller can drive.

Each executor is exercised through the protocol only (launch, launch_group, poll, stop,
recover); what differs is how a replica is made to exit on its own (the fake has no
process: the test finishes it, as the fake's users do). The replica is a ``/bin/sh`` script
so the sandboxed run-as user can run it. Ray runs its own scenario in a loopback namespace
(test_ray.py, ray_scenario.py); it is not in this parametrisation yet.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coadapt.executors import (
    ExecutorError,
    FakeExecutor,
    LocalExecutor,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from coadapt.executors.base import Executor
from coadapt.executors.sandbox import SandboxError, resolve
from tests.requirements import unavailable

pytestmark = pytest.mark.timeout(60)

# Honours SIGTERM (checkpoint-and-exit stands in as exit 0); else exits $CODE after $SECS.
REPLICA = 'trap "echo got-term; exit 0" TERM; echo started; sleep "$SECS" & wait; exit "$CODE"'
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Kit:
    """One executor under test and how to end a replica "naturally" with a code."""

    name: str
    make: Callable[[], Executor]
    finish: Callable[[Executor, ReplicaSpec, int], None]
    root: Path


def _no_op(ex: Executor, spec: ReplicaSpec, code: int) -> None:
    """A real replica ends by itself (its script exits with ``code``)."""


def _fake_finish(ex: Executor, spec: ReplicaSpec, code: int) -> None:
    assert isinstance(ex, FakeExecutor)
    ex.finish(spec.job_id, code, spec.rank)


@pytest.fixture(params=["fake", "local", "local-isolated"])
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    # Under /tmp, world-traversable: the sandbox's run-as user must reach the job dir.
    top = Path(tempfile.mkdtemp(prefix="coadapt-conf-"))
    top.chmod(0o755)
    root = top / "state"
    (root / "jobs").mkdir(parents=True)
    try:
        if request.param == "fake":
            fake = FakeExecutor(slots=4)
            yield Kit("fake", lambda: fake, _fake_finish, root)
        elif request.param == "local":
            yield Kit("local", lambda: LocalExecutor(slots=4), _no_op, root)
        else:
            if not os.access(SYSTEM_PYTHON, os.X_OK):
                unavailable(f"{SYSTEM_PYTHON} (the sandbox launcher's interpreter) is missing")
            try:
                iso = resolve(
                    "namespace", hide=(), jobs_root=str(root / "jobs"), python=SYSTEM_PYTHON
                )
            except SandboxError as exc:
                unavailable(f"namespace isolation unavailable: {exc}")
            yield Kit("local-isolated", lambda: LocalExecutor(slots=4, isolation=iso), _no_op, root)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def spec(kit: Kit, job: str = "j", rank: int = 0, secs: float = 30, code: int = 0) -> ReplicaSpec:
    d = kit.root / "jobs" / job
    (d / "checkpoints").mkdir(parents=True, exist_ok=True)
    return ReplicaSpec(
        job_id=job,
        attempt=1,
        rank=rank,
        world_size=1,
        argv=("/bin/sh", "-c", REPLICA),
        cwd=str(d),
        run_dir=str(d / "runs" / "1"),
        log_path=str(d / "logs" / f"attempt-1.rank-{rank}.log"),
        slot=rank,
        env={
            "PATH": "/usr/bin:/bin",
            "SECS": str(secs),
            "CODE": str(code),
            "COADAPT_CHECKPOINT_DIR": str(d / "checkpoints"),
        },
    )


def until_done(ex: Executor, h: ReplicaHandle, timeout: float = 20) -> ReplicaStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(h)
        if st.done:
            return st
        time.sleep(0.02)
    raise AssertionError(f"replica {h} still running after {timeout} s")


def until_started(kit: Kit, s: ReplicaSpec, timeout: float = 20) -> None:
    """A real replica has run its first line (so its SIGTERM trap is installed)."""
    if kit.name == "fake":
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(s.log_path).exists() and "started" in Path(s.log_path).read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"replica never started: {Path(s.log_path).read_text()}")


def test_launch_runs_and_an_exit_code_is_reported(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit, secs=0.2, code=3)
    h = ex.launch(s)
    assert h.rank == 0 and h.run_dir == s.run_dir
    assert ex.poll(h).phase is ReplicaPhase.RUNNING
    kit.finish(ex, s, 3)
    st = until_done(ex, h)
    assert (st.phase, st.exit_code, st.oom) == (ReplicaPhase.EXITED, 3, False)


def test_stop_delivers_sigterm_and_the_replica_exits_cleanly(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    h = ex.launch(s)
    until_started(kit, s)
    ex.stop(h)
    st = until_done(ex, h)
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 0)
    if kit.name != "fake":
        assert "got-term" in Path(s.log_path).read_text()
    ex.stop(h)  # stopping an ended replica is a no-op


def test_force_stop_kills(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    h = ex.launch(s)
    until_started(kit, s)
    ex.stop(h, force=True)
    st = until_done(ex, h)
    assert st.phase is ReplicaPhase.EXITED and st.exit_code == 137


def test_a_restarted_controller_recovers_and_polls_persisted_handles(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    h = ex.launch(s)
    until_started(kit, s)
    again = kit.make()  # a new executor: only the run directory is known
    found = again.recover(s.run_dir, s.rank)
    assert found is not None and (found.pid, found.start_ticks) == (h.pid, h.start_ticks)
    assert again.poll(found).phase is ReplicaPhase.RUNNING
    assert again.recover(str(kit.root / "nowhere"), 0) is None
    again.stop(found)
    st = until_done(again, found)
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 0)
    until_done(ex, h)  # in one test process the "crashed" executor still has to reap its child


def test_launch_group_of_two(kit: Kit) -> None:
    ex = kit.make()
    specs = [spec(kit, rank=r) for r in range(2)]
    handles = ex.launch_group(specs)
    assert all(isinstance(h, ReplicaHandle) for h in handles)
    hs = [h for h in handles if isinstance(h, ReplicaHandle)]
    assert [h.rank for h in hs] == [0, 1] and hs[0].pid != hs[1].pid
    for s, h in zip(specs, hs, strict=True):
        until_started(kit, s)
        assert ex.poll(h).phase is ReplicaPhase.RUNNING
    for h in hs:
        ex.stop(h)
    assert [until_done(ex, h).exit_code for h in hs] == [0, 0]


def test_a_missing_working_dir_is_a_clear_error(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    missing = str(kit.root / "jobs" / "gone")
    bad = ReplicaSpec(**{**s.__dict__, "cwd": missing})
    with pytest.raises(ExecutorError, match="gone"):
        ex.launch(bad)
