"""End to end on a real controller process with real trial processes (coadapt.train.report):
a trial killed with SIGKILL is marked failed and retried with a new job, the experiment
finishes, and the CLI lists, shows and plots it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controller.livecluster import ROOT, LiveController, wait_for

HERE = Path(__file__).resolve().parent


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "state", slots=2, extra=["--tune-policy", "ei-per-gpu"]).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


def tune_cli(ctl: LiveController, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COADAPT_SERVER": ctl.url,
        "COADAPT_TOKEN": ctl.token,
    }
    return subprocess.run(
        [sys.executable, "-m", "coadapt.cli", "tune", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def replica_pid(ctl: LiveController, job_id: str) -> int | None:
    for pid_file in ctl.state_dir.glob(f"jobs/{job_id}/runs/*/rank0.pid"):
        try:
            return int(json.loads(pid_file.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
    return None


@pytest.mark.timeout(120)
def test_a_killed_trial_is_retried_and_the_experiment_finishes(
    live: LiveController, tmp_path: Path
) -> None:
    spec: dict[str, Any] = {
        "name": "live",
        "space": {"x": {"type": "categorical", "choices": [0.1, 0.2, 0.3, 0.5, 0.7]}},
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "sampler": "random",
        "seed": 1,
        "parallelism": 2,
        "max_trials": 3,
        "max_retries": 1,
        "dead_after_s": 60,
        "trial": {
            "script": str(HERE / "tiny_trial.py"),
            "args": ["--epochs", "4", "--sleep", "0.6"],
        },
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    sub = tune_cli(live, "submit", str(path))
    assert sub.returncode == 0, sub.stderr
    exp_id = sub.stdout.strip()
    with live.client() as client:
        _check(live, client, exp_id, tmp_path)


def _check(live: LiveController, client: Any, exp_id: str, tmp_path: Path) -> None:

    def detail() -> dict[str, Any]:
        return dict(client.request("GET", f"/api/v1/experiments/{exp_id}"))

    def reporting_trial() -> dict[str, Any] | None:
        for t in detail()["trials"]:
            if t["state"] == "RUNNING" and t["curve"] and replica_pid(live, t["job_id"]):
                return dict(t)
        return None

    victim = wait_for(reporting_trial, 40, "a trial to report a first epoch", every=0.2)
    pid = replica_pid(live, victim["job_id"])
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    first_job = victim["job_id"]

    def finished() -> dict[str, Any] | None:
        d = detail()
        return d if d["experiment"]["state"] != "RUNNING" else None

    done = wait_for(finished, 60, "the experiment to finish", every=0.5)
    assert done["experiment"]["state"] == "SUCCEEDED", done["experiment"]
    trials = {t["number"]: t for t in done["trials"]}
    assert len(trials) == 3 and all(t["state"] == "SUCCEEDED" for t in trials.values())
    killed = trials[victim["number"]]
    assert killed["attempts"] == 2 and killed["job_id"] != first_job
    assert client.job(first_job)["state"] == "FAILED"
    best = max(t["value"] for t in trials.values())
    assert done["experiment"]["best_value"] == pytest.approx(best)
    # the CLI: list, show with a plot
    ls = tune_cli(live, "ls")
    assert ls.returncode == 0 and exp_id in ls.stdout and "SUCCEEDED" in ls.stdout
    png = tmp_path / "exp.png"
    show = tune_cli(live, "show", exp_id, "--plot", str(png))
    assert show.returncode == 0, show.stderr
    assert "best so far" in show.stdout and png.read_bytes()[:4] == b"\x89PNG"
    assert tune_cli(live, "cancel", exp_id).returncode == 2  # already ended: 409
