"""The real controller (subprocess) with real replica processes of a tiny training job."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controller.conftest import TINY_JOB, make_spec
from tests.controller.livecluster import LiveController, runs, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "state").start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


def job_spec(tmp_path: Path, name: str = "tiny", **overrides: Any) -> Path:
    spec = make_spec(name=name, script=TINY_JOB.name, working_dir=None, **overrides)
    path = tmp_path / f"{name}.yaml"
    # No working_dir: the CLI resolves it to the spec's folder, so copy the script there.
    (tmp_path / TINY_JOB.name).write_text(TINY_JOB.read_text())
    path.write_text(yaml.safe_dump(spec))
    return path


def state_of(ctl: LiveController, job_id: str) -> dict[str, Any]:
    with ctl.client() as c:
        return c.job(job_id)


def test_submit_run_rescale_finish_with_the_cli(tmp_path: Path) -> None:
    # The paper's policy starts a new job on one slot and grows it once profiled; the default
    # ``pollux`` may start it on all four of this cluster's slots at once (nothing to grow).
    live = LiveController(tmp_path / "state", extra=["--policy", "pollux-unaware"]).start()
    try:
        _submit_run_rescale_finish(live, tmp_path)
    finally:
        live.stop()
        live.kill_replicas()


def _submit_run_rescale_finish(live: LiveController, tmp_path: Path) -> None:
    spec = job_spec(tmp_path, args=["--steps", "160", "--step-time", "0.05"])
    out = live.cli("submit", str(spec))
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    wait_for(lambda: state_of(live, job)["attempt"] >= 2, 40, "a rescale")
    done = live.cli("wait", job, "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{job} SUCCEEDED" in done.stdout
    history = runs(live.state_dir, job)
    assert len(history) == state_of(live, job)["attempt"] >= 2
    assert history[0]["start_step"] == 0 and history[1]["start_step"] > 0  # resumed
    assert history[1]["world"] > history[0]["world"]  # grew
    for args in (["ls"], ["show", job], ["cluster"], ["logs", job], ["logs", "-f", job]):
        res = live.cli(*args)
        assert res.returncode == 0, (args, res.stderr)
    assert "done at step 160" in live.cli("logs", job).stdout
    assert "SUCCEEDED" in live.cli("ls").stdout


def test_controller_kill9_and_restart_readopts(live: LiveController, tmp_path: Path) -> None:
    spec = job_spec(tmp_path, max_replicas=1, args=["--steps", "120", "--step-time", "0.05"])
    job = live.cli("submit", str(spec)).stdout.strip()
    first = wait_for(lambda: runs(live.state_dir, job), 30, "the job to start")[0]
    wait_for(lambda: (state_of(live, job).get("step") or 0) >= 10, 30, "progress")
    live.kill9()
    os.kill(first["pid"], 0)  # the replica survived its controller
    restarted = LiveController(live.state_dir, port=live.port).start()
    try:
        wait_for(lambda: state_of(restarted, job)["state"] == "SUCCEEDED", 60, "success")
        history = runs(live.state_dir, job)
        assert [h["pid"] for h in history] == [first["pid"]]  # adopted, never run twice
        assert state_of(restarted, job)["failures"] == 0
    finally:
        restarted.stop()


def test_replica_kill9_resumes_from_checkpoint(live: LiveController, tmp_path: Path) -> None:
    spec = job_spec(tmp_path, max_replicas=1, args=["--steps", "120", "--step-time", "0.05"])
    job = live.cli("submit", str(spec)).stdout.strip()
    first = wait_for(lambda: runs(live.state_dir, job), 30, "the job to start")[0]
    wait_for(lambda: (state_of(live, job).get("step") or 0) >= 20, 30, "progress")
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: state_of(live, job)["state"] == "SUCCEEDED", 60, "success")
    view = state_of(live, job)
    assert view["failures"] == 1 and view["attempt"] == 2
    history = runs(live.state_dir, job)
    assert history[1]["start_step"] >= 20  # from its checkpoint, not from scratch
    with live.client() as c:
        exits = [e for e in c.events(job) if e["kind"] == "replica-exit"]
    assert "code 137" in exits[0]["message"]


def test_failures_cancel_isolation_and_bad_specs(live: LiveController, tmp_path: Path) -> None:
    bad = live.cli("submit", str(job_spec(tmp_path, "broken", max_replicas=0)))
    assert bad.returncode == 2 and "max_replicas" in bad.stderr and "accepted" in bad.stderr
    failing = live.cli(
        "submit", str(job_spec(tmp_path, "failing", max_restarts=1, args=["--fail-always"]))
    ).stdout.strip()
    long = live.cli(
        "submit", str(job_spec(tmp_path, "long", max_replicas=1, args=["--steps", "100000"]))
    ).stdout.strip()
    bob = live.cli("tenant", "create", "bob")
    assert bob.returncode == 0, bob.stderr
    bob_token = bob.stdout.strip()
    assert live.cli("ls", token=bob_token).stdout.count("\n") == 1  # header only
    for args in (["show", long], ["cancel", long], ["logs", long]):
        res = live.cli(*args, token=bob_token)
        assert res.returncode == 2 and "404" in res.stderr, (args, res.stderr)
    wait_for(lambda: state_of(live, long)["state"] == "RUNNING", 30, "the long job to run")
    assert live.cli("cancel", long).returncode == 0
    waited = live.cli("wait", failing, long, "--timeout", "60")
    assert waited.returncode == 1
    assert f"{failing} FAILED" in waited.stdout and f"{long} CANCELLED" in waited.stdout
    assert "gave up after 1 restarts" in state_of(live, failing)["reason"]
    wait_for(
        lambda: not any(_alive(h["pid"]) for h in runs(live.state_dir, long)),
        20,
        "the cancelled job's replicas to exit",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
