"""Executor conformance: the same scenarios on every executor the controller can drive.

Each executor is exercised through the protocol only (launch_group, poll, stop, recover);
what differs is how a replica is made to exit on its own (the fake has no process: the test
finishes it, as the fake's users do). The replica is a ``/bin/sh`` script so the sandboxed
run-as user can run it.

Ray runs the same scenario functions (:data:`SCENARIOS`) in one subprocess inside a
loopback-only network namespace, against one Ray instance started once for all of them
(``ray_conformance.py``); each scenario's outcome comes back as its own test id,
``test_ray_executor[<scenario>]``. Where Ray legitimately differs it says so through the
:class:`Kit` (handles carry no PID; the working dir is checked on the node, not at launch).
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
from tests.executors.ray_support import run_ray_conformance, why_no_ray
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
    node: str = "local"  # the inventory node replicas are placed on
    pids: bool = True  # handles carry the supervisor's PID (Ray's carry none: actors)
    # A missing working dir is refused at launch; a cluster executor cannot see the node's
    # disks from the controller, so there the replica ends instead (exit 127, naming it).
    cwd_checked_at_launch: bool = True


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
        node=kit.node,
        env={
            "PATH": "/usr/bin:/bin",
            "SECS": str(secs),
            "CODE": str(code),
            "COADAPT_CHECKPOINT_DIR": str(d / "checkpoints"),
        },
    )


def launch_one(ex: Executor, s: ReplicaSpec) -> ReplicaHandle:
    """One replica through the protocol's ``launch_group``; its error raised."""
    [result] = ex.launch_group([s])
    if isinstance(result, ExecutorError):
        raise result
    return result


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
    h = launch_one(ex, s)
    assert h.rank == 0 and h.run_dir == s.run_dir
    assert ex.poll(h).phase is ReplicaPhase.RUNNING
    kit.finish(ex, s, 3)
    st = until_done(ex, h)
    assert (st.phase, st.exit_code, st.oom) == (ReplicaPhase.EXITED, 3, False)


def test_stop_delivers_sigterm_and_the_replica_exits_cleanly(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    h = launch_one(ex, s)
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
    h = launch_one(ex, s)
    until_started(kit, s)
    ex.stop(h, force=True)
    st = until_done(ex, h)
    assert st.phase is ReplicaPhase.EXITED and st.exit_code == 137, st


def test_a_restarted_controller_recovers_and_polls_persisted_handles(kit: Kit) -> None:
    ex = kit.make()
    s = spec(kit)
    h = launch_one(ex, s)
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
    assert [h.rank for h in hs] == [0, 1]
    if kit.pids:
        assert hs[0].pid != hs[1].pid
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
    if kit.cwd_checked_at_launch:
        with pytest.raises(ExecutorError, match="gone"):
            launch_one(ex, bad)
        return
    st = until_done(ex, launch_one(ex, bad))
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 127) and "gone" in st.reason, st


#: Every scenario above, in order: what the Ray subprocess runs (ray_conformance.py).
SCENARIOS: list[Callable[[Kit], None]] = [
    test_launch_runs_and_an_exit_code_is_reported,
    test_stop_delivers_sigterm_and_the_replica_exits_cleanly,
    test_force_stop_kills,
    test_a_restarted_controller_recovers_and_polls_persisted_handles,
    test_launch_group_of_two,
    test_a_missing_working_dir_is_a_clear_error,
]


@pytest.fixture(scope="module")
def ray_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Run every scenario on Ray once (one subprocess, one Ray instance); outcome by name."""
    why = why_no_ray()
    if why is not None:
        unavailable(why)
    return run_ray_conformance(tmp_path_factory.mktemp("ray-conformance"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", [f.__name__.removeprefix("test_") for f in SCENARIOS])
def test_ray_executor(scenario: str, ray_results: dict[str, dict[str, object]]) -> None:
    result = ray_results.get(scenario)
    if result is None:
        output = ray_results.get("_output", {}).get("text", "")
        pytest.fail(f"the Ray run did not reach {scenario}:\n{output}")
    assert result["ok"], f"{scenario} failed on Ray:\n{result['error']}"
