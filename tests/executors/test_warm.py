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
    """The job's zygote processes. A replica (or its shim) is forked by the zygote without an
    exec, so while it starts or exits it shows the zygote's command line too; a process whose
    parent is one of them is such a child, not another zygote (CI once listed a replica just
    SIGKILLed beside the zygote)."""
    found: dict[int, int] = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if cmd[1:3] == [b"-m", b"coadapt.train.zygote"] and b"--listen" in cmd and cwd == str(job):
            ppid = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("PPid:"))
            found[int(pid)] = ppid
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


def started(ex: LocalExecutor, h: ReplicaHandle, log: str, timeout: float = 90) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = Path(log).read_text() if Path(log).exists() else ""
        for line in text.split("\n")[:-1]:  # whole lines only: the replica may be mid-write
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
    logs = sorted((Path(h.run_dir).parent.parent / "logs").glob("*.log"))
    tails = {p.name: p.read_text()[-2000:] for p in logs}
    raise AssertionError(f"replica did not end in {timeout} s; logs: {tails}")


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


# A coadapt.train job run confined: reports what it can see, and can eat memory on request.
SANDBOXED_JOB = """# a coadapt.train job (the executor looks for that name)
import os, signal, sys, time
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(5)
signal.signal(signal.SIGTERM, term)
cg = [l for l in open("/proc/self/cgroup").read().splitlines() if "memory" in l]
pids = len([p for p in os.listdir("/proc") if p.isdigit()])
secret = os.path.exists(os.environ["SECRET"])
print("started", os.getpid(), os.getppid(), "torch" in sys.modules, os.getuid(), secret, pids,
      cg[0].rsplit("/", 1)[-1] if cg else "-", flush=True)
if sys.argv[1] == "hog":
    hog = [bytearray(16 << 20) for _ in range(200)]
    print("survived", flush=True)
time.sleep(30)
"""


@pytest.fixture
def sandboxed(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A state dir under /tmp (reachable by the run-as user) with one job and a secret."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="coadapt-warm-sbx-"))
    top.chmod(0o755)
    state = top / "state"
    job = state / "jobs" / "boxed"
    job.mkdir(parents=True)
    (job / "job.py").write_text(SANDBOXED_JOB)
    (state / "admin-token").write_text("TOPSECRET")
    (state / "admin-token").chmod(0o600)
    yield state, job
    for pid in _zygotes(job):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(top, ignore_errors=True)


def test_a_sandboxed_jobs_replicas_fork_warm_and_stay_confined(
    sandboxed: tuple[Path, Path],
) -> None:
    """Under namespace isolation with a memory limit, attempts after the first fork from the
    job's zygote, which runs inside the job's sandbox: the replica runs as the run-as user,
    in a PID namespace, cannot see the state dir, sits in its own memory cgroup (an OOM there
    is reported as one), and SIGTERM / a forced stop behave as for a cold replica."""
    from coadapt.executors.memlimit import RLIMIT, detect
    from coadapt.executors.sandbox import SandboxError, parse_run_as, resolve
    from tests.requirements import unavailable

    state, job = sandboxed
    if os.geteuid() != 0:
        unavailable("a sandboxed zygote test needs root (run-as user, memory cgroups)")
    limit = detect(768 << 20)
    if limit.mechanism == RLIMIT:
        unavailable("no writable memory cgroup (v1 or v2): the OOM killer cannot be observed")
    try:
        iso = resolve("namespace", hide=(str(state),), jobs_root=str(state / "jobs"), memory=limit)
    except SandboxError as exc:
        unavailable(f"namespace isolation unavailable: {exc}")
    ex = LocalExecutor(slots=2, isolation=iso)
    nobody = parse_run_as("nobody").uid

    def boxed(attempt: int, mode: str) -> ReplicaSpec:
        s = spec(job, attempt, 0, 0, SECRET=str(state / "admin-token"))
        return replace(s, argv=(sys.executable, str(job / "job.py"), mode))

    s1 = boxed(1, "quick")
    h1 = ex.launch(s1)  # starts the job's zygote (inside the sandbox) as a side effect
    started(ex, h1, s1.log_path)
    ex.stop(h1)
    assert done(ex, h1)[0] == 5
    sock = ex.warm_zygote(s1, iso.confinement(job.name, None, str(job)))
    assert sock is not None
    wait_ready(sock)
    [zygote] = _zygotes(job)
    assert Path(f"/proc/{zygote}/status").read_text().count(f"\t{nobody}\t") >= 1

    s2 = boxed(2, "quick")
    h2 = ex.launch(s2)
    _, pid2, parent2, torch2, uid2, secret2, pids2, cgroup2 = started(ex, h2, s2.log_path, 20)
    log2 = Path(s2.log_path).read_text()
    assert torch2 == "True" and int(parent2) > 1, log2  # forked by the zygote, not init
    assert (uid2, secret2) == (str(nobody), "False"), log2
    assert int(pids2) < 8 and int(pid2) < 100, log2  # the job's own PID namespace
    assert cgroup2.endswith(f"-r0-{h2.pid}"), log2  # its own memory cgroup, made by its shim
    ex.stop(h2)
    assert done(ex, h2) == (5, "exited")
    assert "got SIGTERM" in Path(s2.log_path).read_text()

    s3 = boxed(3, "hog")
    h3 = ex.launch(s3)
    st3 = done(ex, h3, timeout=60)
    log3 = Path(s3.log_path).read_text()
    assert "started" in log3 and "True" in log3.split("started")[1].split()[:3], log3
    assert st3[0] == 137 and st3[1].startswith("out of memory"), (st3, log3)
    assert "survived" not in log3
    assert ex.poll(h3).oom

    s4 = boxed(4, "quick")
    h4 = ex.launch(s4)
    started(ex, h4, s4.log_path, 20)
    ex.stop(h4, force=True)
    assert done(ex, h4)[0] == 137
    assert _zygotes(job) == [zygote]  # one zygote served every warm attempt
    os.kill(zygote, signal.SIGKILL)  # its supervisor (outside) removes the socket file
    deadline = time.monotonic() + 10
    while Path(sock).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(sock).exists()


def test_the_rlimit_fallback_applies_to_each_warm_replica(job: Path) -> None:
    """Without a memory cgroup the per-slot limit is RLIMIT_AS: the zygote is started like a
    replica, under that limit, and each replica it forks inherits it."""
    from coadapt.executors.memlimit import RLIMIT, MemoryLimit
    from coadapt.executors.sandbox import Isolation

    limit = 64 << 30  # roomy: torch reserves address space at import
    ex = LocalExecutor(slots=2, isolation=Isolation(memory=MemoryLimit(RLIMIT, limit)))
    (job / "limits.py").write_text(
        JOB.replace(
            'print("started"',
            'import resource; print("limit", resource.getrlimit(resource.RLIMIT_AS)[0])\n'
            'print("started"',
        )
    )

    def limited(attempt: int) -> ReplicaSpec:
        s = spec(job, attempt, 0, 0)
        return replace(s, argv=(sys.executable, str(job / "limits.py"), "0", "0"))

    s1 = limited(1)
    assert done(ex, ex.launch(s1)) == (0, "exited")
    sock = ex.warm_zygote(s1, ex.isolation.confinement(job.name, None, str(job)))
    assert sock is not None
    wait_ready(sock)
    s2 = limited(2)
    h2 = ex.launch(s2)
    _, _, parent2, torch2, _ = started(ex, h2, s2.log_path, 20)
    assert done(ex, h2) == (0, "exited")
    log2 = Path(s2.log_path).read_text()
    assert torch2 == "True" and int(parent2) != h2.pid, log2  # forked by the zygote
    assert f"limit {limit}" in log2, log2
