"""The CLI's reads ride out a controller restart: retried with backoff, writes not."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coadapt.controller.client import Client, ClientError, backoff_delays
from tests.controller.conftest import make_spec
from tests.controller.livecluster import ROOT, LiveController, wait_for
from tests.controller.test_integration import job_spec


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def monotonic(self) -> float:
        return self.now


def flaky_client(failures: int, retry_for: float = 60.0) -> tuple[Client, list[str], io.StringIO]:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if len(calls) <= failures:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"id": "j-1", "state": "RUNNING"})

    err = io.StringIO()
    clock = FakeTime()
    client = Client(
        "http://127.0.0.1:1", None, retry_for=retry_for, stderr=err,
        sleep=clock.sleep, monotonic=clock.monotonic,
    )  # fmt: skip
    client._http = httpx.Client(base_url=client.url, transport=httpx.MockTransport(handler))
    return client, calls, err


def test_reads_retry_connection_errors_and_warn_once() -> None:
    client, calls, err = flaky_client(failures=5)
    assert client.job("j-1")["state"] == "RUNNING"
    assert len(calls) == 6
    assert err.getvalue().count("unreachable") == 1 and "retrying" in err.getvalue()


def test_reads_give_up_after_their_retry_window() -> None:
    client, calls, _ = flaky_client(failures=10_000, retry_for=10.0)
    with pytest.raises(ClientError) as exc:
        client.jobs()
    assert exc.value.status == 0 and "cannot reach" in exc.value.message
    assert 3 < len(calls) < 100  # backed off, not spun


def test_submit_is_not_retried_but_cancel_is() -> None:
    client, calls, _ = flaky_client(failures=1)
    with pytest.raises(ClientError):
        client.submit(make_spec())
    assert calls == ["POST /api/v1/jobs"]
    client, calls, _ = flaky_client(failures=2)
    assert client.cancel("j-1")["id"] == "j-1" and len(calls) == 3


def test_backoff_is_capped_exponential_with_jitter() -> None:
    import random

    delay = backoff_delays(first=0.2, factor=2.0, cap=5.0, rng=random.Random(0))
    ds = [delay() for _ in range(10)]
    assert 0.1 <= ds[0] <= 0.2 and all(2.5 <= d <= 5.0 for d in ds[6:])
    assert len(set(ds)) == len(ds)  # jittered


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "state").start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


@pytest.mark.timeout(120)
def test_wait_rides_out_a_controller_kill9_and_restart(
    live: LiveController, tmp_path: Path
) -> None:
    spec = job_spec(tmp_path, max_replicas=1, args=["--steps", "100", "--step-time", "0.05"])
    job = live.cli("submit", str(spec)).stdout.strip()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COADAPT_SERVER": live.url,
           "COADAPT_TOKEN": live.token}  # fmt: skip
    waiter = subprocess.Popen(
        [sys.executable, "-m", "coadapt.cli", "wait", job, "--timeout", "90"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        live.kill9()
        time.sleep(2.0)  # the waiter now meets a refused connection
        assert waiter.poll() is None, waiter.communicate()
        restarted = LiveController(live.state_dir, port=live.port).start()
        try:
            out, err = waiter.communicate(timeout=90)
            assert waiter.returncode == 0, out + err
            assert f"{job} SUCCEEDED" in out
            assert err.count("unreachable") == 1, err
        finally:
            restarted.stop()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


@pytest.mark.timeout(120)
def test_sigterm_logs_what_it_did_and_checkpoints_the_wal(
    live: LiveController, tmp_path: Path
) -> None:
    spec = job_spec(tmp_path, max_replicas=1, args=["--steps", "100000", "--step-time", "0.05"])
    job = live.cli("submit", str(spec)).stdout.strip()
    with live.client() as c:
        wait_for(lambda: c.job(job)["state"] == "RUNNING", 30, "the job to run")
    assert live.proc is not None
    os.kill(live.proc.pid, signal.SIGTERM)
    assert live.proc.wait(timeout=30) == 0
    log = live.log.read_text()
    assert "left 1 replica(s) of 1 job(s) running for the next controller to adopt" in log
    assert "checkpointed the SQLite WAL" in log and "closed the database" in log
    assert "stopped the scheduling and tuning loops" in log
    wal = live.state_dir / "coadapt.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
