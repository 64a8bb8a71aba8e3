"""The local executor with real (tiny, torch-free) processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
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

pytestmark = pytest.mark.timeout(60)

SLEEPER = """
import signal, sys, time
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("started", flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""


def spec(tmp_path: Path, seconds: float = 30, code: int = 0, rank: int = 0) -> ReplicaSpec:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    return ReplicaSpec(
        job_id="j",
        attempt=1,
        rank=rank,
        world_size=1,
        argv=(sys.executable, str(script), str(seconds), str(code)),
        cwd=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        log_path=str(tmp_path / f"rank{rank}.log"),
        slot=0,
        env=dict(os.environ),
    )


def wait_done(ex: LocalExecutor, h: ReplicaHandle, timeout: float = 20) -> ReplicaStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(h)
        if st.done:
            return st
        time.sleep(0.05)
    raise AssertionError("replica did not finish")


def wait_log(path: Path, text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_exit_codes_and_logs(tmp_path: Path) -> None:
    ex = LocalExecutor(slots=2)
    assert (ex.slots(), ex.uses_gpus()) == (2, False)
    h = ex.launch(spec(tmp_path, seconds=0, code=4))
    assert h.start_ticks is not None
    st = wait_done(ex, h)
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 4)
    assert "started" in (tmp_path / "rank0.log").read_text()


def test_sigterm_stop_and_sigkill(tmp_path: Path) -> None:
    ex = LocalExecutor(slots=2)
    s = spec(tmp_path)
    h = ex.launch(s)
    wait_log(Path(s.log_path), "started")
    ex.stop(h)
    assert wait_done(ex, h).exit_code == 0
    assert "got SIGTERM" in Path(s.log_path).read_text()
    h2 = ex.launch(spec(tmp_path, rank=1))
    ex.stop(h2, force=True)
    st = wait_done(ex, h2)
    assert st.exit_code == 137 or st.phase is ReplicaPhase.LOST
    ex.stop(h2)  # stopping a finished replica is a no-op


def test_a_new_executor_adopts_and_reads_exit_status(tmp_path: Path) -> None:
    """What a restarted controller does: poll a replica it did not start."""
    first = LocalExecutor(slots=1)
    s = spec(tmp_path)
    h = first.launch(s)
    wait_log(Path(s.log_path), "started")
    second = LocalExecutor(slots=1)
    assert second.poll(h).phase is ReplicaPhase.RUNNING
    recovered = second.recover(s.run_dir, 0)
    assert recovered == h
    # kill -9 of the training process: the supervisor records 128 + 9.
    child = int(Path(f"/proc/{h.pid}/task/{h.pid}/children").read_text().split()[0])
    os.kill(child, signal.SIGKILL)
    st = wait_done(second, h)
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 137)
    first.poll(h)  # reap
    assert json.loads((Path(s.run_dir) / "rank0.exit").read_text())["code"] == 137


def test_pid_reuse_is_not_mistaken_for_the_replica(tmp_path: Path) -> None:
    ex = LocalExecutor(slots=1)
    h = ReplicaHandle(os.getpid(), 12345, str(tmp_path), 0)  # our PID, another start time
    assert ex.poll(h).phase is ReplicaPhase.LOST
    ex.stop(h)  # must not signal the impostor (the test itself)
    assert ex.recover(str(tmp_path), 0) is None


def test_launch_errors(tmp_path: Path) -> None:
    ex = LocalExecutor(slots=1)
    s = spec(tmp_path)
    with pytest.raises(ExecutorError, match="does not exist"):
        ex.launch(ReplicaSpec(**{**s.__dict__, "cwd": str(tmp_path / "nope")}))
    bad = ex.launch(ReplicaSpec(**{**s.__dict__, "argv": ("/no/such/binary",)}))
    st = wait_done(ex, bad)
    assert st.exit_code == 127 and "cannot start" in st.reason


def test_fake_executor_contract() -> None:
    fake = FakeExecutor(slots=3)
    s = ReplicaSpec("j", 1, 0, 1, ("x",), "/", "/run", "/log", 0)
    h = fake.launch(s)
    assert fake.poll(h).phase is ReplicaPhase.RUNNING
    fake.stop(h)
    assert fake.poll(h).exit_code == 0
    assert fake.recover("/run", 0) == h
    assert fake.poll(ReplicaHandle(1, 1, "/", 0)).phase is ReplicaPhase.LOST
    fake.launch_failures = 1
    with pytest.raises(ExecutorError):
        fake.launch(s)
