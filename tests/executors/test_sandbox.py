"""Replica confinement and memory limits with real processes (namespaces, cgroups).

The hostile replica is a shell script (``/bin/sh`` is reachable by any run-as user, unlike
an interpreter under the controller's home). Needs namespaces and a memory cgroup: on a
developer's machine without them these tests skip; under CI they fail (tests/requirements.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt.executors import LocalExecutor, ReplicaHandle, ReplicaPhase, ReplicaSpec
from coadapt.executors.base import OOM_EXIT_CODE, ReplicaStatus
from coadapt.executors.memlimit import RLIMIT, MemoryLimit, MemoryLimitError, detect, parse_size
from coadapt.executors.sandbox import (
    Isolation,
    SandboxError,
    parse_run_as,
    resolve,
)
from tests.requirements import unavailable

pytestmark = pytest.mark.timeout(60)

HOSTILE = """
echo "uid=$(id -u)"
cat "$STATE/admin-token" && echo LEAK-token
cat "$STATE/coadapt.db" && echo LEAK-db
ls "$STATE/jobs/victim/checkpoints" && echo LEAK-listing
cat "$STATE/jobs/victim/checkpoints/model.pt" && echo LEAK-checkpoint
kill -0 "$CONTROLLER_PID" 2>/dev/null && echo LEAK-signal
cat "/proc/$CONTROLLER_PID/environ" 2>/dev/null && echo LEAK-environ
echo ok > "$COADAPT_CHECKPOINT_DIR/mine.txt" && echo WROTE-own
ls /proc | grep -c '^[0-9]' | sed 's/^/pids=/'
"""


@pytest.fixture
def state() -> Iterator[Path]:
    """A controller-like state dir under /tmp (pytest's tmp dirs are 0700 root)."""
    top = Path(tempfile.mkdtemp(prefix="coadapt-sbx-"))
    root = top / "state"
    for job in ("victim", "attacker"):
        (root / "jobs" / job / "checkpoints").mkdir(parents=True)
    for name, text in (("admin-token", "TOPSECRET"), ("coadapt.db", "SQLITE")):
        (root / name).write_text(text)
        (root / name).chmod(0o600)
    (root / "jobs" / "victim" / "checkpoints" / "model.pt").write_text("WEIGHTS")
    yield root
    shutil.rmtree(top, ignore_errors=True)


def _spec(root: Path, argv: tuple[str, ...], env: dict[str, str] | None = None) -> ReplicaSpec:
    job = root / "jobs" / "attacker"
    return ReplicaSpec(
        job_id="attacker",
        attempt=1,
        rank=0,
        world_size=1,
        argv=argv,
        cwd=str(job),
        run_dir=str(job / "runs" / "1"),
        log_path=str(job / "logs" / "attempt-1.rank-0.log"),
        slot=0,
        env={
            "PATH": "/usr/bin:/bin",
            "STATE": str(root),
            "CONTROLLER_PID": str(os.getpid()),
            "COADAPT_CHECKPOINT_DIR": str(job / "checkpoints"),
            **(env or {}),
        },
    )


def _wait(ex: LocalExecutor, h: ReplicaHandle, timeout: float = 30) -> ReplicaStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(h)
        if st.done:
            return st
        time.sleep(0.05)
    raise AssertionError("replica did not finish")


# An interpreter every user can run (the venv's may live under root's 0700 home).
SYSTEM_PYTHON = "/usr/bin/python3"


def _namespaced(root: Path) -> Isolation:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        unavailable(f"{SYSTEM_PYTHON} (the namespace probe's interpreter) is missing")
    try:
        iso = resolve(
            "namespace", hide=(str(root),), jobs_root=str(root / "jobs"), python=SYSTEM_PYTHON
        )
    except SandboxError as exc:
        unavailable(f"namespace isolation unavailable: {exc}")
    return iso


def test_a_hostile_replica_sees_no_state_no_other_job_and_no_controller(state: Path) -> None:
    ex = LocalExecutor(slots=1, isolation=_namespaced(state))
    spec = _spec(state, ("/bin/sh", "-c", HOSTILE))
    st = _wait(ex, ex.launch(spec))
    log = Path(spec.log_path).read_text()
    assert st.phase is ReplicaPhase.EXITED, log
    assert "LEAK" not in log, log
    assert "TOPSECRET" not in log and "SQLITE" not in log and "WEIGHTS" not in log
    assert "WROTE-own" in log  # confined, not broken: its own checkpoint dir is writable
    assert int(log.split("pids=")[1].split()[0]) <= 8  # its own PID namespace (a pipeline)
    if os.geteuid() == 0:
        assert f"uid={parse_run_as('nobody').uid}" in log
        mine = Path(spec.env["COADAPT_CHECKPOINT_DIR"]) / "mine.txt"
        assert mine.stat().st_uid == parse_run_as("nobody").uid
        assert (Path(spec.run_dir) / "rank0.exit").stat().st_uid == 0  # not the replica's
    # The controller's own files are untouched and still its own.
    assert (state / "admin-token").read_text() == "TOPSECRET"


def test_sigterm_reaches_the_confined_replica_through_its_init(state: Path) -> None:
    ex = LocalExecutor(slots=1, isolation=_namespaced(state))
    script = "trap 'echo got-term; exit 0' TERM; echo started; while :; do sleep 0.1; done"
    spec = _spec(state, ("/bin/sh", "-c", script))
    h = ex.launch(spec)
    log = Path(spec.log_path)
    deadline = time.monotonic() + 20
    while "started" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "replica never started"
        time.sleep(0.05)
    ex.stop(h)
    st = _wait(ex, h)
    assert (st.phase, st.exit_code, st.oom) == (ReplicaPhase.EXITED, 0, False)
    assert "got-term" in log.read_text()


def test_a_replica_past_its_memory_limit_is_reported_oom(tmp_path: Path) -> None:
    limit = detect(64 << 20)
    if limit.mechanism == RLIMIT:
        unavailable("no writable memory cgroup (v1 or v2): the OOM killer cannot be observed")
    ex = LocalExecutor(slots=1, isolation=Isolation(memory=limit))
    hog = "b = []\nfor _ in range(50): b.append(bytearray(4 << 20))\nprint('survived')"
    spec = ReplicaSpec(
        job_id="hog",
        attempt=1,
        rank=0,
        world_size=1,
        argv=(sys.executable, "-c", hog),
        cwd=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        log_path=str(tmp_path / "hog.log"),
        slot=0,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    st = _wait(ex, ex.launch(spec))
    assert st.oom, (st, (tmp_path / "hog.log").read_text())
    assert st.exit_code == 137 and st.reason.startswith("out of memory"), st
    assert "survived" not in (tmp_path / "hog.log").read_text()
    assert not any(Path(str(limit.parent)).glob("hog-*")), "per-replica cgroup left behind"


def test_exit_code_86_is_an_oom_without_any_cgroup(tmp_path: Path) -> None:
    ex = LocalExecutor(slots=1, isolation=Isolation(memory=MemoryLimit(RLIMIT, 1 << 30)))
    spec = ReplicaSpec(
        job_id="j",
        attempt=1,
        rank=0,
        world_size=1,
        argv=("/bin/sh", "-c", f"exit {OOM_EXIT_CODE}"),
        cwd=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        log_path=str(tmp_path / "j.log"),
        slot=0,
        env={"PATH": "/usr/bin:/bin"},
    )
    st = _wait(ex, ex.launch(spec))
    assert (st.exit_code, st.oom) == (OOM_EXIT_CODE, True)
    assert st.reason.startswith("out of memory")


def test_bad_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(SandboxError, match="accepted: auto, namespace, user, none"):
        resolve("chroot")
    with pytest.raises(SandboxError, match="no user 'no-such-user-x'"):
        parse_run_as("no-such-user-x")
    with pytest.raises(SandboxError, match="is root"):
        parse_run_as("0")
    assert parse_size("64M") == 64 << 20 and parse_size("1.5g") == 3 << 29
    with pytest.raises(MemoryLimitError, match="accepted: a positive number"):
        parse_size("lots")


def test_the_venv_interpreter_runs_confined_even_under_an_untraversable_home(
    state: Path,
) -> None:
    """The controller's own interpreter (here a venv whose base lives in root's 0700 home)
    is bound back read-only for the run-as user, so ``python`` jobs run confined as is."""
    try:
        iso = resolve("namespace", hide=(str(state),), jobs_root=str(state / "jobs"))
    except SandboxError as exc:
        unavailable(f"namespace isolation unavailable: {exc}")
    ex = LocalExecutor(slots=1, isolation=iso)
    code = "import os, coadapt.executors.base as b; print('RAN', os.getuid(), b.OOM_EXIT_CODE)"
    spec = _spec(state, (sys.executable, "-c", code))
    st = _wait(ex, ex.launch(spec))
    log = Path(spec.log_path).read_text()
    assert (st.phase, st.exit_code) == (ReplicaPhase.EXITED, 0), log
    uid = parse_run_as("nobody").uid if os.geteuid() == 0 else os.getuid()
    assert f"RAN {uid} {OOM_EXIT_CODE}" in log, log
