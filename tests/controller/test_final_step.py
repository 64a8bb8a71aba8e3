"""A finished job shows its true final step and epoch (the last one its log reached)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt.controller.specfile import load_spec_file
from tests.controller.livecluster import ROOT, LiveController, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "state", slots=1).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


def test_finished_job_reports_the_step_and_epoch_its_log_reached(live: LiveController) -> None:
    spec = load_spec_file(ROOT / "examples" / "cancer_mlp.yaml")
    # 7 epochs of ~27 steps: the last step is not a multiple of the 20-step report interval.
    spec.update(
        name="final-step",
        args=["--epochs", "7", "--batch-size", "16", "--max-batch-size", "16"],
        max_replicas=1,
    )
    with live.client() as c:
        job = c.submit(spec)["id"]
        wait_for(lambda: c.job(job)["state"] in ("SUCCEEDED", "FAILED"), 150, "the job", 0.5)
        view = c.job(job)
        log = c.logs(job)["text"]
    assert view["state"] == "SUCCEEDED", log
    last = re.findall(r"epoch (\d+) step (\d+)", log)[-1]
    assert (view["epoch"], view["step"]) == (int(last[0]), int(last[1])), log
    assert view["step"] % 20 != 0
