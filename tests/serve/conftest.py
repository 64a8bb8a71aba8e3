"""Shared helpers for the serving tests: a published MLP and a real server process."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from coadapt.serve import artifacts  # noqa: E402
from coadapt.serve.models import make_mlp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FACTORY = "coadapt.serve.models:make_mlp"
KW = {"in_features": 6, "hidden": 16, "out_features": 3, "depth": 2}


def publish_mlp(root: Path, seed: int, **extra: object) -> artifacts.Manifest:
    """Publish the seeded test MLP as a new version of ``root``."""
    kw = {"seed": seed, **KW}
    return artifacts.publish(
        make_mlp(seed, **KW),
        root,
        factory=FACTORY,
        factory_kwargs=kw,
        **extra,  # type: ignore[arg-type]
    )


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    root: Path

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        c = self.conn()
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def predict_json(self, rows: list[list[float]]) -> tuple[int, dict[str, object]]:
        status, _, body = self.request(
            "POST", "/v1/models/mlp:predict", json.dumps({"instances": rows}).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        return status, json.loads(body)

    def worker_versions(self) -> list[int]:
        """The version each live worker serves (from /metrics, summed over workers)."""
        _, _, body = self.request("GET", "/metrics")
        found = re.findall(rb'coadapt_serve_model_version\{model="mlp",pid="\d+"\} (\S+)', body)
        return [int(float(v)) for v in found]

    def wait_all_on(self, version: str, timeout: float = 30.0) -> None:
        want = int(version)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            vs = self.worker_versions()
            if len(vs) == WORKERS and all(v == want for v in vs):
                return
            time.sleep(0.05)
        raise AssertionError(f"workers did not all reach version {version}: {vs}")


WORKERS = 2


def start_server(root: Path, *extra: str) -> Server:
    """``python -m coadapt.serve`` on a free loopback port, 2 workers; ready when it says so."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coadapt.serve", "--model", f"mlp={root}", "--port", "0",
         "--workers", str(WORKERS), "--poll-s", "0.05", *extra],
        stdout=subprocess.PIPE, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    line = b""
    while time.monotonic() < deadline and proc.poll() is None:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            line = proc.stdout.readline()
            break
    if not line:
        stop_server(proc)
        raise AssertionError("the server did not print its ready line")
    return Server(proc, int(json.loads(line)["port"]), root)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID; SIGKILL if it lingers."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("models") / "mlp"
    publish_mlp(root, seed=1)
    srv = start_server(root)
    try:
        yield srv
    finally:
        stop_server(srv.proc)
