"""A real controller process on 127.0.0.1 for integration tests, stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coadapt.controller.client import Client
from coadapt.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class LiveController:
    """``python -m coadapt.cli server`` with a temp SQLite DB and real replicas."""

    def __init__(
        self,
        state_dir: Path,
        port: int | None = None,
        slots: int = 4,
        extra: list[str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.slots = slots
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir.parent / f"controller-{self.port}.log"

    def start(self) -> LiveController:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "coadapt.cli",
            "server",
            "--state-dir",
            str(self.state_dir),
            "--port",
            str(self.port),
            "--slots",
            str(self.slots),
            "--interval",
            "2",
            "--tick",
            "0.2",
            "--restart-delay",
            "1",
            "--stop-grace",
            "5",
            "--backoff",
            "0.5",
            *self.extra,
        ]
        if "--isolation" not in self.extra:
            # Test jobs run the venv's interpreter, which a run-as user may not reach (it can
            # live under root's 0700 home); confinement has its own tests (test_isolation.py).
            argv += ["--isolation", "none"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        probe = Client(self.url, None)
        try:
            wait_for(lambda: probe.healthy() or self._died(), 30, "the controller to start")
        finally:
            probe.close()
        if self._died():
            raise AssertionError(f"controller exited: {self.log.read_text()[-2000:]}")
        return self

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    @property
    def token(self) -> str:
        return (self.state_dir / "admin-token").read_text().strip()

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.token)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def kill_replicas(self) -> None:
        """Tear down every replica this controller's state dir knows of (by PID)."""
        for pid_file in self.state_dir.glob("jobs/*/runs/*/rank*.pid"):
            try:
                pid = int(json.loads(pid_file.read_text())["pid"])
                os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "coadapt.cli", *args]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "COADAPT_SERVER": self.url,
            "COADAPT_TOKEN": token or self.token,
        }
        return subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )


def runs(state_dir: Path, job_id: str) -> list[dict[str, Any]]:
    path = state_dir / "jobs" / job_id / "checkpoints" / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
