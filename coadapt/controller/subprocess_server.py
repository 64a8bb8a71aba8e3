"""Run ``coadapt server`` as a child process on a free loopback port (demo, benchmarks).

One place owns starting the controller, waiting until ``/healthz`` answers (bounded), reading
its admin token, and stopping it by PID (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coadapt.controller.client import Client
from coadapt.ports import free_port

__all__ = ["ControllerStartError", "RunningController", "free_port", "running_controller"]

ROOT = Path(__file__).resolve().parents[2]


class ControllerStartError(RuntimeError):
    """The controller exited or did not answer within the start timeout."""


@dataclass(frozen=True)
class RunningController:
    url: str
    state_dir: Path
    process: subprocess.Popen[bytes]

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin-token").read_text().strip()


@contextmanager
def running_controller(
    state_dir: Path,
    log_path: Path,
    server_args: Sequence[str] = (),
    start_timeout: float = 60.0,
    stop_timeout: float = 20.0,
    port: int | None = None,
) -> Iterator[RunningController]:
    """Start ``coadapt server --state-dir STATE --port P *server_args``; stop it on exit.

    ``port``: a fixed port (a restarted controller must keep its URL: adopted replicas post
    their metrics to it); default a free one."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [
        sys.executable,
        "-m",
        "coadapt.cli",
        "server",
        "--state-dir",
        str(state_dir),
        "--port",
        str(port),
        *server_args,
    ]
    with open(log_path, "ab") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + start_timeout
            with Client(url, None) as probe:
                while not probe.healthy():
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise ControllerStartError(f"controller did not start; see {log_path}")
                    time.sleep(0.2)
            yield RunningController(url, state_dir, server)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=stop_timeout)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=stop_timeout)
