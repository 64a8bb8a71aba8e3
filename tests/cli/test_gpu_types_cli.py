"""GPU types from the command line: ``coadapt server --slots t4:1,a100:1`` (one local node
per type), ``coadapt cluster`` printing them, a spec's ``gpu_types`` steering the job to its
type, and a type no node has refused at submit with exit 2. A real server and real replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from coadapt.cli import main
from tests.controller.conftest import TINY_JOB, make_spec
from tests.controller.livecluster import LiveController

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("bad", ["a100:x", "0", "a100:2,a100:1", "a 1:2"])
def test_bad_slots_exit_2_naming_the_flag(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["server", "--state-dir", str(tmp_path), "--slots", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coadapt server: --slots:") and "a100:2,t4:2" in err


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "state", extra=["--policy", "fifo"])
    # fifo is type-unaware and fills nodes in order: t4 first, so the job's one allowed type
    # is where it lands (the loop refuses a placement outside gpu_types; test_hetero_loop.py).
    ctl.slots = "t4:1,a100:1"  # type: ignore[assignment]
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        ctl.kill_replicas()


def spec_file(tmp_path: Path, name: str, gpu_types: list[str]) -> Path:
    spec = make_spec(
        name=name,
        max_replicas=1,
        gpu_types=gpu_types,
        args=["--steps", "5", "--step-time", "0.01"],
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_typed_slots_cluster_view_and_submit(live: LiveController, tmp_path: Path) -> None:
    assert TINY_JOB.exists()
    out = live.cli("cluster")
    assert out.returncode == 0, out.stderr
    assert "node local-a100: a100, 0/1 slots used" in out.stdout
    assert "node local-t4: t4, 0/1 slots used" in out.stdout
    refused = live.cli("submit", str(spec_file(tmp_path, "nowhere", ["h100"])))
    assert refused.returncode == 2
    assert "gpu_types" in refused.stderr and "a100, t4" in refused.stderr
    ok = live.cli("submit", str(spec_file(tmp_path, "on-t4", ["t4"])))
    assert ok.returncode == 0, ok.stderr
    job = ok.stdout.strip()
    done = live.cli("wait", job, "--timeout", "60")
    assert f"{job} SUCCEEDED" in done.stdout, done.stdout + done.stderr
    with live.client() as c:
        placed = [
            e["data"]["allocation"]
            for e in c.events(job)
            if e["kind"] == "alloc" and (e.get("data") or {}).get("allocation")
        ]
    assert placed == [{"local-t4": 1}]  # its one attempt, on the t4 node
