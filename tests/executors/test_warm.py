"""The local executor's warm path: replicas of a coadapt.train job forked by the job's zygote.

One zygote per job outlives the attempts, so the second attempt of a rescale starts with torch
already imported; the shim's guarantees (pid/exit records, SIGTERM forwarded, a force-stopped
replica does not survive its shim) must hold through it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from coadapt.executors import LocalExecutor, ReplicaHandle, ReplicaPhase, ReplicaSpec
from coadapt.executors._proc import proc_state
from coadapt.train.zygote import MAX_MESSAGE

pytestmark = pytest.mark.timeout(120)

# Mentions coadapt.train, so the executor starts it warm; reports what it inherited.
JOB = """# a coadapt.train job (the executor looks for that name)
import os, signal, sys, time
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(5)
signal.signal(signal.SIGTERM, term)
print("started", os.getpid(), os.getppid(), "torch" in sys.modules, os.environ["RANK"], flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""


def spec(job: Path, attempt: int, seconds: float, code: int, **env: str) -> ReplicaSpec:
    return ReplicaSpec(
        job_id=job.name,
        attempt=attempt,
        rank=0,
        world_size=1,
        argv=(sys.executable, str(job / "job.py"), str(seconds), str(code)),
        cwd=str(job),
        run_dir=str(job / "runs" / str(attempt)),
        log_path=str(job / "logs" / f"attempt-{attempt}.log"),
        slot=0,
        env={**os.environ, "RANK": "0", **env},
    )


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "warmjob"
    d.mkdir()
    (d / "job.py").write_text(JOB)
    yield d
    for line in _zygotes(d):  # end the zygote this test started (it would idle-exit later)
        os.kill(line, signal.SIGKILL)


def _zygotes(job: Path) -> list[int]:
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if b"coadapt.train.zygote" in cmd and b"--listen" in cmd and cwd == str(job):
            out.append(int(pid))
    return out


def started(ex: LocalExecutor, h: ReplicaHandle, log: str, timeout: float = 90) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = Path(log).read_text() if Path(log).exists() else ""
        for line in text.splitlines():
            if line.startswith("started"):
                return line.split()
        assert ex.poll(h).phase == ReplicaPhase.RUNNING, text
        time.sleep(0.02)
    raise AssertionError(f"replica never started: {Path(log).read_text()}")


def done(ex: LocalExecutor, h: ReplicaHandle, timeout: float = 30) -> tuple[int | None, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(h)
        if st.done:
            return st.exit_code, st.reason
        time.sleep(0.02)
    raise AssertionError("replica did not end")


def wait_ready(sock: str, timeout: float = 90) -> None:
    """Until the zygote at ``sock`` has done its imports (it says "ready" on accept)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(1.0)
            try:
                conn.connect(sock)
                if b"ready" in conn.recv(MAX_MESSAGE):
                    return
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"zygote at {sock} never became ready")


def test_a_replica_does_not_wait_for_a_zygote_still_importing(job: Path) -> None:
    """The first attempt starts cold at once (the zygote warms up for the next attempt), and a
    SIGTERM that lands while the shim looks for the zygote is not lost."""
    ex = LocalExecutor(slots=2)
    s1 = spec(job, 1, 30, 0)
    h1 = ex.launch(s1)
    _, _, parent1, has_torch, _ = started(ex, h1, s1.log_path)
    assert has_torch == "False" and int(parent1) == h1.pid  # the shim's own child: cold
    assert "starting cold" in Path(s1.log_path).read_text()
    ex.stop(h1)
    assert done(ex, h1) == (5, "exited")


def test_attempts_fork_from_one_zygote_and_keep_the_shims_guarantees(job: Path) -> None:
    ex = LocalExecutor(slots=2)
    s1 = spec(job, 1, 30, 0)
    Path(s1.run_dir).mkdir(parents=True)  # where launch() would put the zygote's log
    sock = ex.warm_zygote(s1)
    assert sock is not None
    wait_ready(sock)
    h1 = ex.launch(s1)
    _, _, parent1, has_torch, rank = started(ex, h1, s1.log_path)
    assert has_torch == "True" and rank == "0"  # forked from the zygote, env is the replica's
    assert int(parent1) != h1.pid  # not the shim's child: the zygote's
    ex.stop(h1)  # SIGTERM reaches the training process through the zygote
    assert done(ex, h1) == (5, "exited")
    assert "got SIGTERM" in Path(s1.log_path).read_text()

    # A "controller restart": a new executor finds the same zygote by its socket.
    ex2 = LocalExecutor(slots=2)
    s2 = spec(job, 2, 30, 0)
    h2 = ex2.launch(s2)
    _, pid2, parent2, has_torch2, _ = started(ex2, h2, s2.log_path, timeout=10)
    assert parent2 == parent1 and has_torch2 == "True"
    rec = ex2.recover(s2.run_dir, 0)
    assert rec is not None and rec.pid == h2.pid
    ex2.stop(h2, force=True)  # the shim dies with SIGKILL: its replica must not survive it
    assert done(ex2, h2)[0] == 137
    deadline = time.monotonic() + 5
    while proc_state(int(pid2)) not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc_state(int(pid2)) in (None, "Z", "X")

    s3 = spec(job, 3, 0, 7)  # an ordinary exit code comes back through the exit record
    h3 = ex2.launch(s3)
    assert done(ex2, h3) == (7, "exited")
    assert len(_zygotes(job)) == 1


def test_opt_out_and_non_training_scripts_start_cold(job: Path) -> None:
    ex = LocalExecutor(slots=2)
    s = spec(job, 1, 0, 0, COADAPT_WARM="0")
    h = ex.launch(s)
    assert done(ex, h) == (0, "exited")
    line = Path(s.log_path).read_text().split()
    assert line[3] == "False" and int(line[2]) == h.pid  # the shim's own child, no torch
    (job / "plain.py").write_text(JOB.replace("coadapt.train", "no library"))
    plain = spec(job, 2, 0, 0)
    plain = replace(plain, argv=(sys.executable, str(job / "plain.py"), "0", "0"))
    assert ex.warm_zygote(plain) is None
    assert _zygotes(job) == []
