"""The supervisor: bind the port, start N worker processes, restart the dead, stop by PID.

Each worker is a separate process (``python -m coadapt.serve _worker``) with its own event
loop, its own model copies and ``torch.set_num_threads(cores // workers)``, so N workers use
N cores without sharing a GIL. The supervisor binds the listening socket (so ``port=0`` works
and the port is known before any worker starts) and hands it to every worker. With
``accept="reuseport"`` (the default) workers 1..N-1 also bind their own ``SO_REUSEPORT``
socket on that port and the kernel spreads new connections over the accept queues; with
``accept="shared"`` all workers accept from the one inherited socket.

With ``table_shards=N`` the supervisor first starts N table-shard processes
(``python -m coadapt.serve _table_shard``, :mod:`coadapt.serve.table_shards`) that hold a sparse
model's tables between them, waits until each has loaded, and restarts one that dies as it
does a worker.

When every worker is listening the supervisor prints one JSON line
``{"event": "ready", "url": ..., "port": ..., "workers": [pids], "table_shards": [pids]}`` on
stdout (tests and benchmarks read it), then waits for SIGTERM/SIGINT and stops the processes by
PID (workers first, then the table shards).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from coadapt.serve.config import ServeConfig
from coadapt.serve.metrics import MULTIPROC_ENV, mark_process_dead

READY_TIMEOUT_S = 120.0
RESTART_PAUSE_S = 1.0


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket with SO_REUSEPORT (so workers can join its port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Owns the socket, the metrics directory and the worker processes."""

    def __init__(self, config: ServeConfig) -> None:
        self.sock = listen_socket(config.host, config.port)
        self.port = int(self.sock.getsockname()[1])
        self.metrics_dir = tempfile.mkdtemp(prefix="coadapt-serve-metrics-")
        self.shard_dir = ""
        if config.table_shards:
            self.shard_dir = tempfile.mkdtemp(prefix="coadapt-serve-shards-")
            config = replace(config, shard_socket_dir=self.shard_dir)
        self.config = config
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.shards: dict[int, subprocess.Popen[bytes]] = {}
        self._stop = False

    def _spawn_shard(self, index: int, ready_fd: int | None) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "coadapt.serve", "_table_shard",
            "--index", str(index),
            "--ready-fd", str(-1 if ready_fd is None else ready_fd),
            "--config", self.config.to_json(),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        return subprocess.Popen(cmd, env=env, pass_fds=() if ready_fd is None else (ready_fd,))

    def _wait_ready(self, procs: dict[int, subprocess.Popen[bytes]], r: int, what: str) -> bool:
        """Read "ready INDEX PID" lines from ``r`` until every process said it; False if told
        to stop meanwhile; RuntimeError if one exits or time runs out."""
        ready: set[int] = set()
        buf = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while len(ready) < len(procs):
                left = deadline - time.monotonic()
                dead = [i for i, p in procs.items() if p.poll() is not None]
                if dead or left <= 0 or self._stop:
                    self.stop()
                    if self._stop:
                        return False
                    why = f"{what} {dead[0]} exited" if dead else "timed out"
                    raise RuntimeError(f"serving did not start: {why} (see stderr)")
                rlist, _, _ = select.select([pipe], [], [], min(left, 0.5))
                if rlist:
                    chunk = pipe.read(4096)
                    buf += chunk or b""
                    for line in buf.split(b"\n")[:-1]:
                        ready.add(int(line.split()[1]))
                    buf = buf.rsplit(b"\n", 1)[-1]
        return True

    def _spawn(self, index: int, ready_fd: int | None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env[MULTIPROC_ENV] = self.metrics_dir
        threads = str(self.config.thread_count())
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        cmd = [
            sys.executable, "-m", "coadapt.serve", "_worker",
            "--index", str(index),
            "--listen-fd", str(self.sock.fileno()),
            "--port", str(self.port),
            "--ready-fd", str(-1 if ready_fd is None else ready_fd),
            "--config", self.config.to_json(),
        ]  # fmt: skip
        fds = (self.sock.fileno(),) if ready_fd is None else (self.sock.fileno(), ready_fd)
        return subprocess.Popen(cmd, env=env, pass_fds=fds)

    def start(self) -> list[int]:
        """Start every worker and wait until each listens; their PIDs."""

        def on_signal(signum: int, frame: object) -> None:
            self._stop = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # table shards and workers start together (each imports torch: seconds); a worker
        # waits for the shards to hold a version before it listens
        shard_r = -1
        if self.config.table_shards:
            shard_r, w = os.pipe()
            try:
                for i in range(self.config.table_shards):
                    self.shards[i] = self._spawn_shard(i, w)
            finally:
                os.close(w)
        n = self.config.worker_count()
        r, w = os.pipe()
        try:
            for i in range(n):
                self.procs[i] = self._spawn(i, w)
        finally:
            os.close(w)
        if shard_r >= 0 and not self._wait_ready(self.shards, shard_r, "table shard"):
            os.close(r)
            return []
        if not self._wait_ready(self.procs, r, "worker"):
            return []
        return [p.pid for p in self.procs.values()]

    def run(self) -> int:
        """Print the ready line, restart dead workers until told to stop, then stop."""
        pids = self.start()
        if self._stop:
            return 0
        print(json.dumps({
            "event": "ready",
            "url": f"http://{self.config.host}:{self.port}",
            "port": self.port,
            "workers": pids,
            "threads_per_worker": self.config.thread_count(),
            "table_shards": [p.pid for p in self.shards.values()],
        }), flush=True)  # fmt: skip
        while not self._stop:
            time.sleep(0.2)
            for i, p in list(self.shards.items()):
                if p.poll() is not None and not self._stop:
                    print(f"serve: table shard {i} (pid {p.pid}) exited with {p.returncode}; "
                          "restarting", file=sys.stderr, flush=True)  # fmt: skip
                    self.shards[i] = self._spawn_shard(i, None)
            for i, p in list(self.procs.items()):
                if p.poll() is not None and not self._stop:
                    mark_process_dead(p.pid)
                    print(f"serve: worker {i} (pid {p.pid}) exited with {p.returncode}; "
                          "restarting", file=sys.stderr, flush=True)  # fmt: skip
                    time.sleep(RESTART_PAUSE_S)
                    self.procs[i] = self._spawn(i, None)
        self.stop()
        return 0

    def stop(self) -> None:
        """SIGTERM each worker by PID, then each table shard; SIGKILL what is left after 10 s;
        clean up."""
        for group in (self.procs, self.shards):
            for p in group.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            for p in group.values():
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.sock.close()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        if self.shard_dir:
            shutil.rmtree(self.shard_dir, ignore_errors=True)


def worker_main(config: ServeConfig, index: int, listen_fd: int, port: int, ready_fd: int) -> int:
    """A worker process: take the inherited socket (or join its port), serve until SIGTERM."""
    import asyncio
    import ctypes

    from coadapt.serve.runtime import Worker

    with contextlib.suppress(OSError, AttributeError):  # die with the supervisor, never
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # orphaned (PDEATHSIG)

    inherited = socket.socket(fileno=listen_fd)
    if config.accept == "reuseport" and index > 0:
        sock = listen_socket(config.host, port)
        os.close(inherited.detach())  # the supervisor and worker 0 keep that socket
    else:
        sock = inherited
    sock.setblocking(False)
    asyncio.run(Worker(config, index).serve(sock, ready_fd if ready_fd >= 0 else None))
    # Drained and closed: skip the interpreter's teardown (torch's takes seconds), so a stop or
    # a rolling restart is quick. Metrics live in the shared files and are already written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
