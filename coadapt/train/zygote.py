"""The warm fork server ("zygote") behind ``coadapt run-local``: import once, fork replicas.

``import torch`` costs seconds per process, and K replicas starting at once on a small machine
import it concurrently, which is most of a rescale's latency. The launcher (which imports
nothing heavy) starts this helper once per job; it imports torch, ``coadapt.train`` and any
``--preload`` modules *before* any thread pool starts and *without running a single torch op*
(an initialised OpenMP pool does not survive ``fork``), then serves requests over an
``AF_UNIX``/``SOCK_SEQPACKET`` socket inherited from the launcher:

* ``spawn`` (JSON, with the replica's stdout/stderr pipe passed as ``SCM_RIGHTS``): fork; the
  child wires its stdio to the pipe, takes the replica's environment (RANK, WORLD_SIZE,
  MASTER_PORT, ...), argv, cwd and fresh RNG seeds, and runs the script with
  ``runpy.run_path(script, run_name="__main__")`` — exactly what ``python script.py`` would
  do, minus the imports already done. Replies ``spawned`` with the child's pid.
* ``signal``: deliver a signal to a child. The zygote is the parent, so a child it has not
  reaped yet cannot have had its pid reused: no race against pid recycling.

It reports every child's exit (``exit`` with a shell-style code) and, when the launcher's end
of the socket closes, terminates its children and exits. Environment variables that libraries
read at import time (OMP_NUM_THREADS, ...) come from the launcher's environment, as they are
the same for every replica anyway.

Run as ``python -m coadapt.train.zygote --fd N [--preload a,b]`` by the launcher only.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import importlib
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

# Imported before any fork so children find them in sys.modules.
DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.data",
    "torch.optim",
    "torch._dynamo",  # the first optimizer imports it: ~2 s per replica otherwise
    "coadapt.train.checkpoint",
    "coadapt.train.context",
    "coadapt.train.data",
    "coadapt.train.gns",
    "coadapt.train.metrics",
    "coadapt.train.model",
    "coadapt.train.profile",
)
MAX_MESSAGE = 1 << 20
_KILL_AFTER_S = 10.0
#: Exit code of a held child whose release never came (its supervisor went away first).
SPAWN_ABANDONED = 125


class ZygoteProtocolError(RuntimeError):
    """The launcher sent a request the zygote cannot understand."""


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One JSON message per SEQPACKET record (with file descriptors attached, if any)."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def preload(modules: list[str]) -> list[str]:
    """Import ``modules``; return one warning line per module that failed to import."""
    problems = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a bad --preload must not take the job down: warn instead
            problems.append(f"cannot preload {name}: {type(exc).__name__}: {exc}")
    return problems


def _exit_code(exc: SystemExit) -> int:
    """The status ``python script.py`` would exit with after ``raise SystemExit(code)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _reset_child_state(stdio_fd: int, env: dict[str, str], cwd: str) -> None:
    """Make the forked child look like a fresh ``python script.py`` process."""
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdio_fd, 1)
    os.dup2(stdio_fd, 2)
    os.close(stdio_fd)
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    # Line-buffered and written through, as PYTHONUNBUFFERED=1 gives a cold replica.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding=encoding, line_buffering=True, write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding=encoding,
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # What the interpreter does at start-up for PYTHONFAULTHANDLER (the zygote started
    # without the replica's environment): a native crash prints the Python stacks.
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)
    elif faulthandler.is_enabled():
        faulthandler.disable()
    # Every child would otherwise inherit the zygote's RNG states.
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _run_child(
    sock: socket.socket,
    extra_fds: list[int],
    stdio_fd: int,
    request: dict[str, Any],
    die_with_parent: bool = False,
    hold_fd: int | None = None,
) -> None:
    """Body of a forked replica; never returns. With ``hold_fd`` it first waits for one byte
    there (the supervisor has put it in its memory cgroup: nothing runs before that)."""
    code = 1
    try:
        if die_with_parent:
            _die_with_parent()
        sock.close()
        for fd in extra_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if hold_fd is not None:
            released = os.read(hold_fd, 1)
            os.close(hold_fd)
            if not released:  # the zygote closed it without a release: do not run
                os._exit(SPAWN_ABANDONED)
        _reset_child_state(stdio_fd, request["env"], request["cwd"])
        script = str(request["script"])
        sys.argv = [script, *request["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 130
        except BaseException:
            traceback.print_exc()
            code = 1
        # What interpreter shutdown would do: join non-daemon threads, run atexit handlers.
        shutdown_threads = getattr(threading, "_shutdown", None)
        if shutdown_threads is not None:
            shutdown_threads()
        atexit._run_exitfuncs()
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                if stream is not None:
                    stream.flush()
        os._exit(code)


class Zygote:
    """The server loop: spawn and signal requests in, spawned and exit reports out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def serve(self) -> int:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # The launcher handles SIGINT/SIGTERM for the job; the zygote ends when its socket does.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self._wake_r], [], [], 1.0)
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 512):
                        pass
            self._reap()
            if self.sock.fileno() in ready:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                if not data:
                    for fd in fds:
                        os.close(fd)
                    return self._finish()
                self._handle(json.loads(data), fds)

    def _handle(self, request: dict[str, Any], fds: list[int]) -> None:
        op = request.get("op")
        if op == "spawn":
            if len(fds) != 1:
                raise ZygoteProtocolError(f"spawn needs one stdio descriptor, got {len(fds)}")
            pid = os.fork()
            if pid == 0:
                _run_child(self.sock, [self._wake_r, self._wake_w], fds[0], request)
            os.close(fds[0])
            self.children.add(pid)
            send(self.sock, {"event": "spawned", "id": request["id"], "pid": pid})
        elif op == "signal":
            pid = int(request["pid"])
            if pid in self.children:  # not reaped yet, so the pid is still this child's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(request["signal"]))
        else:
            raise ZygoteProtocolError(f"unknown request {op!r}")

    def _reap(self) -> None:
        for pid, code in _reaped(self.children):
            self.children.discard(pid)
            with contextlib.suppress(OSError):
                send(self.sock, {"event": "exit", "pid": pid, "code": code})

    def _finish(self) -> int:
        """The launcher is gone: do not leave replicas behind."""
        for sig, wait_s in ((signal.SIGTERM, _KILL_AFTER_S), (signal.SIGKILL, 5.0)):
            for pid in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while self.children and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.01)
        return 0


def _reaped(live: set[int] | dict[int, int]) -> Iterator[tuple[int, int]]:
    """(pid, exit code) of each child that has ended, without blocking, while ``live`` (the
    server's record of its children) is not empty; no child left at all empties it."""
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            live.clear()
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the zygote) dies: no orphaned replica."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: best effort
        pass


class ZygoteServer:
    """Listening mode, for the controller's local executor: one zygote serves every attempt.

    A rescale ends one attempt and starts the next; a zygote per launcher would die with the
    first and the second would start cold. So the executor starts one per job (``--listen
    PATH``) and each replica's supervisor (:mod:`coadapt.executors._shim`) connects, asks for
    one ``spawn``, forwards signals, and waits for the ``exit`` report. The shim's guarantee
    that a replica cannot outlive its record holds through the connection: when a shim's
    connection closes (it died, or was SIGKILLed by a forced stop) its child gets SIGKILL at
    once, and a child whose zygote dies gets SIGKILL from the kernel (``PR_SET_PDEATHSIG``).
    With no connection and no child for ``idle_exit_s``, or none while the ``watch`` directory
    (the job's) is gone, the server removes its socket and exits (a job that ended, or a
    controller that went away, leaves nothing behind for long).

    A sandboxed job's zygote runs *inside* the job's confinement (``--bound-fd``: started by
    the replica supervisor under ``--sandbox``), so what it forks is confined as a cold
    replica would be. A ``spawn`` with ``hold`` forks a child that waits for ``release``
    (sent once the supervisor has moved it into the replica's own memory cgroup). Under the
    cgroup-less RLIMIT_AS fallback the zygote runs with the per-slot limit, which its forks
    inherit.
    """

    def __init__(
        self, listener: socket.socket, path: str, idle_exit_s: float, watch: str | None = None
    ) -> None:
        self.listener, self.path, self.idle_exit_s = listener, path, idle_exit_s
        self.watch = watch  # the job's directory: once it is gone, so is the job
        self.conns: dict[int, socket.socket] = {}
        self.owner: dict[int, int] = {}  # child pid -> connection fd
        self.holds: dict[int, int] = {}  # held child pid -> write end of its release pipe
        self.problems: list[str] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def serve(self) -> int:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        idle_since = time.monotonic()
        try:
            while True:
                fds = [self.listener.fileno(), self._wake_r, *self.conns]
                ready, _, _ = select.select(fds, [], [], 1.0)
                if self._wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 512):
                            pass
                self._reap()
                if self.listener.fileno() in ready:
                    conn, _ = self.listener.accept()
                    self.conns[conn.fileno()] = conn
                    try:  # a liveness probe connects and leaves at once
                        send(conn, {"event": "ready", "problems": self.problems})
                    except OSError:
                        self._drop(conn.fileno())
                for fd in ready:
                    if fd in self.conns:
                        self._receive(fd)
                if self.conns or self.owner:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self.idle_exit_s or (
                    self.watch is not None and not os.path.isdir(self.watch)
                ):
                    return 0
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _receive(self, fd: int) -> None:
        conn = self.conns[fd]
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            for extra in fds:
                os.close(extra)
            self._drop(fd)
            return
        request = json.loads(data)
        op = request.get("op")
        if op == "spawn" and len(fds) == 1:
            others = [self.listener.fileno(), self._wake_r, self._wake_w]
            others += [c for c in self.conns if c != fd] + list(self.holds.values())
            hold_r, hold_w = os.pipe() if request.get("hold") else (None, None)
            if hold_w is not None:
                others.append(hold_w)
            pid = os.fork()
            if pid == 0:
                for other in [c for c in self.conns.values() if c is not conn]:
                    with contextlib.suppress(OSError):
                        other.detach()
                _run_child(conn, others, fds[0], request, die_with_parent=True, hold_fd=hold_r)
            os.close(fds[0])
            if hold_r is not None and hold_w is not None:
                os.close(hold_r)
                self.holds[pid] = hold_w
            self.owner[pid] = fd
            try:
                send(conn, {"event": "spawned", "id": request.get("id"), "pid": pid})
            except OSError:
                self._drop(fd)  # the shim is gone already: so is its replica
        elif op == "signal":
            pid = int(request["pid"])
            if self.owner.get(pid) == fd:  # its own, not reaped: the pid is still the child's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(request["signal"]))
        elif op == "release":
            pid = int(request["pid"])
            if self.owner.get(pid) == fd and pid in self.holds:
                hold = self.holds.pop(pid)
                with contextlib.suppress(OSError):
                    os.write(hold, b"1")
                os.close(hold)
        else:
            for extra in fds:
                os.close(extra)
            with contextlib.suppress(OSError):
                send(conn, {"event": "error", "message": f"bad request {op!r} ({len(fds)} fds)"})

    def _drop(self, fd: int) -> None:
        """The shim is gone: its replica must not outlive it (SIGKILL, as its death signal)."""
        conn = self.conns.pop(fd)
        conn.close()
        for pid, owner in self.owner.items():
            if owner == fd:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.owner[pid] = -1  # reaped later; nobody to report to
                hold = self.holds.pop(pid, None)
                if hold is not None:
                    os.close(hold)

    def _reap(self) -> None:
        for pid, code in _reaped(self.owner):
            hold = self.holds.pop(pid, None)
            if hold is not None:
                os.close(hold)
            conn = self.conns.get(self.owner.pop(pid, -1))
            if conn is not None:
                with contextlib.suppress(OSError):
                    send(conn, {"event": "exit", "pid": pid, "code": code})


def listen(path: str) -> socket.socket:
    """Bind ``path`` (owner-only) before the slow imports, so early connects wait, not fail."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o077)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coadapt.train.zygote")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="inherited SEQPACKET socket (run-local)")
    where.add_argument("--listen", help="serve supervisors on this AF_UNIX path (executor)")
    parser.add_argument(
        "--bound-fd",
        type=int,
        default=None,
        help="--listen: PATH is already bound to this inherited socket (a sandboxed zygote)",
    )
    parser.add_argument("--idle-exit", type=float, default=60.0, help="--listen: seconds")
    parser.add_argument("--watch", default=None, help="--listen: exit when idle and it is gone")
    parser.add_argument("--preload", default="", help="extra modules, comma-separated")
    args = parser.parse_args(argv)
    listener = None
    if args.listen and args.bound_fd is not None:
        # Started inside the job's sandbox (which cannot bind in the controller's directory):
        # the executor bound PATH; listening here makes this process the socket's peer, so a
        # supervisor's SO_PEERCRED names the zygote (and finds the replicas it forks).
        listener = socket.socket(fileno=args.bound_fd)
        listener.listen(64)
    elif args.listen:
        listener = listen(args.listen)
        if os.fork() > 0:
            # Detach: the executor's child exits once the socket is bound (nothing for it to
            # reap later); the server goes on in the grandchild, in the session it was given.
            os._exit(0)
    extra = [m.strip() for m in args.preload.split(",") if m.strip()]
    problems = preload([*DEFAULT_PRELOAD, *extra])
    for line in problems:
        print(f"coadapt zygote: warning: {line}", file=sys.stderr, flush=True)
    # Python 3.12+ warns on fork() in a process with OS threads (BLAS pools, which install
    # fork handlers); the zygote forks by design and has run no torch op.
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    if listener is not None:
        server = ZygoteServer(listener, args.listen, args.idle_exit, args.watch)
        server.problems = problems
        return server.serve()
    sock = socket.socket(fileno=args.fd)
    send(sock, {"event": "ready", "problems": problems})
    return Zygote(sock).serve()


if __name__ == "__main__":
    raise SystemExit(main())
