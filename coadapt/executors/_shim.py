"""Replica supervisor: ``python -m coadapt.executors._shim RUN_DIR RANK [--sandbox CONF] -- ARGV``.

The controller may be killed at any moment while replicas keep training, and a process that
is not our child cannot be waited on. So every replica runs under this tiny supervisor, which
records its own PID and start time first (``rank<R>.pid``: a controller that crashed mid-launch
finds it), forwards SIGTERM/SIGINT to the training process, and writes the exit code
atomically to ``rank<R>.exit`` for whichever controller polls next. The training process gets
SIGKILL if the supervisor dies, so a replica can never outlive its record.

With ``--sandbox`` (a :class:`~coadapt.executors.sandbox.Confinement` as JSON) the supervisor,
which stays the controller's user and outside any namespace, makes the replica's memory cgroup,
starts the training process through the sandbox launcher, and on exit records whether the
replica ran out of memory (the cgroup's ``oom_kill`` counter, or exit code ``OOM_EXIT_CODE``).

With ``--zygote SOCKET`` the training process is forked by the job's warm zygote
(:class:`coadapt.train.zygote.ZygoteServer`, torch already imported) instead of started with
``exec``: the shim still writes the pid and exit records and forwards SIGTERM/SIGINT (over the
socket), and the zygote SIGKILLs the replica when this shim's connection closes. If the zygote
is not there or dies before spawning, the replica starts cold, as without the flag.

With both flags the zygote is the job's *sandboxed* one: it runs inside the job's confinement
(started by a shim with ``--sandbox CONF --keep-fd N -- python -m coadapt.train.zygote``), so
what it forks is confined like a cold replica. The shim checks that (the zygote's uid is the
run-as user's, its PID namespace is not ours), has the child held at fork, moves it (its real
PID found through ``NSpid``) into this replica's memory cgroup, and only then releases it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType

from coadapt.executors import memlimit
from coadapt.executors._proc import child_by_inner_pid, proc_start_ticks
from coadapt.executors.base import OOM_EXIT_CODE
from coadapt.executors.sandbox import Confinement, SandboxError, enter_pid_namespace
from coadapt.train.zygote import MAX_MESSAGE, send

#: How long a replica waits for its zygote's "ready" before it starts cold instead. Short:
#: a zygote still importing torch is slower than a cold start of a light script, and it keeps
#: warming up in the background for the job's next attempt (a rescale), where warm pays.
ZYGOTE_WAIT_S = 0.5

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: best effort
        pass


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _make_cgroup(conf: Confinement, run_dir: Path, rank: int) -> Path | None:
    """The replica's own memory cgroup (None: no limit, or RLIMIT_AS)."""
    if conf.memory is None:
        return None
    name = f"{run_dir.parent.parent.name}-{run_dir.name}-r{rank}-{os.getpid()}"
    return memlimit.create(conf.memory, name)


def _confine(conf: Confinement, cgroup: Path | None, cmd: list[str]) -> list[str]:
    """The launcher command line for ``cmd`` (this process enters the PID namespace)."""
    conf = replace(
        conf,
        cgroup=str(cgroup) if cgroup else None,
        outer_uid=os.getuid(),
        outer_gid=os.getgid(),
    )
    enter_pid_namespace(conf)
    launcher = [sys.executable, "-m", "coadapt.executors.sandbox", conf.to_json(), "--"]
    return [*launcher, *cmd]


def _outcome(code: int, cgroup: Path | None, conf: Confinement | None) -> dict[str, object]:
    """The exit record: code, reason, and whether the replica ran out of memory."""
    if code < 0:
        reason, code = f"killed by signal {-code}", 128 - code
    elif conf is not None and conf.namespace and 128 < code < 128 + signal.NSIG:
        reason = f"killed by signal {code - 128}"  # the sandbox's init reports it this way
    else:
        reason = "exited"
    oom = False
    if cgroup is not None and memlimit.oom_kills(cgroup) > 0:
        oom = True
        assert conf is not None and conf.memory is not None
        reason = (
            f"out of memory: killed by the kernel OOM killer at the replica's limit of "
            f"{conf.memory.limit_bytes >> 20} MiB ({conf.memory.mechanism}); {reason}"
        )
    elif code == OOM_EXIT_CODE:
        oom = True
        reason = f"out of memory: the training process exited with code {OOM_EXIT_CODE}"
    return {"code": code, "reason": reason, "oom": oom}


class _SignalWake:
    """Wakes a blocking wait for a signal that landed just before the wait began.

    A Python signal handler runs between bytecodes. A SIGTERM that arrives after the
    interpreter's last check but before a blocking ``waitpid``/``recv`` enters the kernel
    leaves that call blocked, so the handler (which forwards the stop to the replica) would
    run only when the replica ends by itself. The C-level handler also writes a byte to this
    pipe (``signal.set_wakeup_fd``), so a wait that selects on it returns at once, runs the
    handler and waits again.
    """

    def __init__(self) -> None:
        self._read, write = os.pipe()  # not inherited by the replica (PEP 446)
        os.set_blocking(self._read, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)

    def wait(self, fds: list[int], timeout_s: float) -> bool:
        """Until one of ``fds`` is readable (True), a signal came, or ``timeout_s`` passed."""
        ready, _, _ = select.select([self._read, *fds], [], [], timeout_s)
        if self._read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read, 512):
                    pass
        return any(fd in ready for fd in fds)

    def wait_child(self, child: subprocess.Popen[bytes]) -> int:
        """``child.wait()``, with the signal handlers run as soon as a signal comes."""
        try:
            pidfd: int | None = os.pidfd_open(child.pid)
        except (OSError, AttributeError):  # not Linux >= 5.3: look every 0.1 s instead
            pidfd = None
        try:
            while (code := child.poll()) is None:
                self.wait([pidfd] if pidfd is not None else [], 1.0 if pidfd is not None else 0.1)
            return code
        finally:
            if pidfd is not None:
                os.close(pidfd)


class _WarmUnavailable(Exception):
    """The zygote cannot take this replica (not there, or it died before spawning)."""


def _connect_zygote(path: str, timeout_s: float) -> socket.socket:
    """Connect to the job's zygote and wait for its ``ready`` (its imports are done)."""
    deadline = time.monotonic() + timeout_s
    # The executor saw the socket bound before starting this shim: gone means the zygote is.
    connect_by = time.monotonic() + 2.0
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    while True:
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if time.monotonic() > connect_by:
                sock.close()
                raise _WarmUnavailable(f"no zygote at {path}: {exc}") from exc
            time.sleep(0.05)
    sock.settimeout(max(0.05, deadline - time.monotonic()))
    try:
        data = sock.recv(MAX_MESSAGE)
    except OSError as exc:
        sock.close()
        raise _WarmUnavailable(f"zygote at {path} did not answer: {exc}") from exc
    sock.settimeout(None)
    if not data or json.loads(data).get("event") != "ready":
        sock.close()
        raise _WarmUnavailable(f"zygote at {path} closed before it was ready")
    return sock


def _check_sandboxed(sock: socket.socket, conf: Confinement) -> int:
    """The zygote behind ``sock`` is confined as ``conf`` asks; its PID in our namespace."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if conf.uid is not None and uid != conf.uid:
        raise _WarmUnavailable(f"the zygote runs as uid {uid}, not the run-as uid {conf.uid}")
    if conf.namespace:
        try:
            theirs = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError as exc:
            raise _WarmUnavailable(f"cannot inspect the zygote (pid {pid}): {exc}") from exc
        if theirs == os.readlink("/proc/self/ns/pid"):
            raise _WarmUnavailable("the zygote is not in a PID namespace of its own")
    return pid


class _Placement:
    """Puts a held replica into its memory cgroup, then lets it run (sandboxed zygote)."""

    def __init__(self, sock: socket.socket, conf: Confinement, cgroup: Path | None) -> None:
        self.zygote = _check_sandboxed(sock, conf)
        self.cgroup = cgroup  # None: no limit, or RLIMIT_AS (the zygote's, which forks inherit)

    def request(self) -> dict[str, object]:
        return {"hold": True}

    def place(self, sock: socket.socket, inner_pid: int) -> None:
        if self.cgroup is not None:
            host = child_by_inner_pid(self.zygote, inner_pid)
            if host is None:
                raise _WarmUnavailable(f"cannot find the forked replica (pid {inner_pid})")
            try:
                memlimit.move(self.cgroup, host)
            except OSError as exc:
                raise _WarmUnavailable(
                    f"cannot move the replica into {self.cgroup}: {exc}"
                ) from exc
        send(sock, {"op": "release", "pid": inner_pid})


def _run_warm(
    sock: socket.socket,
    cmd: list[str],
    early: list[int],
    wake: _SignalWake,
    conf: Confinement | None = None,
    cgroup: Path | None = None,
) -> int:
    """Have the zygote fork ``cmd`` (``python script.py ARGS``); forward signals; its exit code.

    The replica's stdout/stderr is this shim's (the log file), passed over the socket. With
    ``conf`` the zygote must be a confined one and the replica is placed in ``cgroup`` before
    it runs. If the warm start fails before the replica runs, the connection is closed (the
    zygote kills a held child) and :class:`_WarmUnavailable` says why.
    """
    try:
        placement = _Placement(sock, conf, cgroup) if conf is not None else None
        return _serve_warm(sock, cmd, early, wake, placement)
    except _WarmUnavailable:
        sock.close()
        raise


def _serve_warm(
    sock: socket.socket,
    cmd: list[str],
    early: list[int],
    wake: _SignalWake,
    placement: _Placement | None,
) -> int:
    pid: list[int] = []
    pending: list[int] = early  # signals that came while the zygote was being reached

    def forward(signum: int, frame: FrameType | None) -> None:
        if not pid:
            pending.append(signum)
        else:
            with contextlib.suppress(OSError):
                send(sock, {"op": "signal", "pid": pid[0], "signal": signum})

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    request = {
        "op": "spawn",
        "id": 0,
        "script": cmd[1],
        "argv": cmd[2:],
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        **(placement.request() if placement is not None else {}),
    }
    try:
        send(sock, request, [sys.stdout.fileno()])
    except OSError as exc:
        raise _WarmUnavailable(f"zygote gone before spawn: {exc}") from exc
    while True:
        if not wake.wait([sock.fileno()], 1.0):
            continue
        data = sock.recv(MAX_MESSAGE)
        if not data:
            if not pid:
                raise _WarmUnavailable("zygote closed before spawning the replica")
            # The zygote died; its child got SIGKILL from the kernel (PDEATHSIG).
            print("coadapt: the warm zygote died under the replica", file=sys.stderr, flush=True)
            return -int(signal.SIGKILL)
        msg = json.loads(data)
        if msg.get("event") == "spawned":
            if placement is not None:
                placement.place(sock, int(msg["pid"]))
            pid.append(int(msg["pid"]))
            for signum in pending:
                send(sock, {"op": "signal", "pid": pid[0], "signal": signum})
        elif msg.get("event") == "exit" and pid and int(msg["pid"]) == pid[0]:
            return int(msg["code"])
        elif msg.get("event") == "error":
            raise _WarmUnavailable(str(msg.get("message")))


def _identity(path: str) -> tuple[int, int, int] | None:
    """(device, inode, mtime) of ``path``, or None if it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _record(run_dir: Path, rank: int, record: dict[str, object]) -> int:
    _write_atomic(run_dir / f"rank{rank}.exit", json.dumps(record))
    return int(str(record["code"]))


def main(argv: list[str]) -> int:
    conf: Confinement | None = None
    zygote: str | None = None
    keep_fds: list[int] = []
    cleanup: list[str] = []
    detach = False
    options = ("--sandbox", "--zygote", "--keep-fd", "--cleanup", "--detach")
    while len(argv) >= 3 and argv[2] in options:
        if argv[2] == "--detach":  # a long-lived supervisor (a zygote's): nobody reaps it
            detach = True
            argv = [*argv[:2], *argv[3:]]
            continue
        if len(argv) < 4:
            break
        if argv[2] == "--sandbox":
            conf = Confinement.from_json(argv[3])
        elif argv[2] == "--zygote":
            zygote = argv[3]
        elif argv[2] == "--cleanup":  # removed when the process ends (a zygote's socket file)
            cleanup.append(argv[3])
        else:
            keep_fds.append(int(argv[3]))  # inherited by the training process (its socket)
        argv = [*argv[:2], *argv[4:]]
    if len(argv) < 4 or argv[2] != "--":
        print(
            "usage: python -m coadapt.executors._shim RUN_DIR RANK [--sandbox CONF] "
            "[--zygote SOCKET] [--keep-fd N] [--cleanup PATH] [--detach] -- ARGV...",
            file=sys.stderr,
        )
        return 2
    if detach and os.fork() > 0:
        os._exit(0)  # the caller's child ends at once; the supervisor goes on, orphaned
    # Removed at the end only if still the same file (not one bound at that path since).
    owned = [(path, _identity(path)) for path in cleanup]
    run_dir, rank, cmd = Path(argv[0]), int(argv[1]), argv[3:]
    me = os.getpid()
    _write_atomic(
        run_dir / f"rank{rank}.pid", json.dumps({"pid": me, "start_ticks": proc_start_ticks(me)})
    )
    # From here on a SIGTERM/SIGINT is kept for the replica, whichever way it starts: a stop
    # that lands before the child exists is delivered right after it starts.
    pending: list[int] = []
    wake = _SignalWake()

    def keep(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    signal.signal(signal.SIGTERM, keep)
    signal.signal(signal.SIGINT, keep)
    cgroup: Path | None = None
    if conf is not None:
        try:
            cgroup = _make_cgroup(conf, run_dir, rank)
        except (OSError, memlimit.MemoryLimitError) as exc:
            print(f"coadapt: cannot confine the replica: {exc}", file=sys.stderr, flush=True)
            return _record(run_dir, rank, {"code": 126, "reason": f"cannot confine: {exc}"})
    if zygote is not None and len(cmd) >= 2:
        try:
            sock = _connect_zygote(zygote, ZYGOTE_WAIT_S)
            code = _run_warm(sock, cmd, pending, wake, conf, cgroup)
        except _WarmUnavailable as exc:  # nothing was started: start it cold instead
            print(f"coadapt: starting cold: {exc}", file=sys.stderr, flush=True)
        else:
            # The zygote reports a signal as a negative code (it is the replica's parent).
            warm_conf = replace(conf, namespace=False) if conf is not None else None
            record = _outcome(code, cgroup, warm_conf)
            if cgroup is not None:
                memlimit.release(cgroup)
            return _record(run_dir, rank, record)
    if conf is not None:
        try:
            cmd = _confine(conf, cgroup, cmd)
        except (OSError, SandboxError) as exc:
            print(f"coadapt: cannot confine the replica: {exc}", file=sys.stderr, flush=True)
            if cgroup is not None:
                memlimit.release(cgroup)
            return _record(run_dir, rank, {"code": 126, "reason": f"cannot confine: {exc}"})
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        # A signal that arrives before the child exists is delivered right after it starts.
        if not children:
            pending.append(signum)
        elif children[0].poll() is None:
            children[0].send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        children.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent, pass_fds=keep_fds))
    except OSError as exc:
        print(f"coadapt: cannot start {cmd[0]!r}: {exc}", file=sys.stderr, flush=True)
        if cgroup is not None:
            memlimit.release(cgroup)
        return _record(run_dir, rank, {"code": 127, "reason": f"cannot start: {exc}"})
    for fd in keep_fds:  # the child has its own copy now
        os.close(fd)
    child = children[0]
    for signum in pending:
        child.send_signal(signum)
    record = _outcome(wake.wait_child(child), cgroup, conf)
    if cgroup is not None:
        memlimit.release(cgroup)
    for path, ident in owned:
        if ident is not None and _identity(path) == ident:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return _record(run_dir, rank, record)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
