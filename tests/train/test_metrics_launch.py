"""Metrics channel (never blocks, never raises) and run-local helpers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from coadapt.protocol import GoodputRecord, MetricReport
from coadapt.train import MetricsSink, TrainConfigError, TrainEnv
from coadapt.train.launch import LaunchError, launch, replica_env


def test_file_sink_writes_json_lines(tmp_path: Path) -> None:
    sink = MetricsSink(path=tmp_path / "m.jsonl", base={"job_id": "j"})
    sink.emit(MetricReport(name="acc", value=float("nan"), step=3))
    sink.emit(GoodputRecord(step=4, profile=[{"m": 1}]))
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["metric", "goodput"]
    assert lines[0]["value"] is None and lines[0]["job_id"] == "j"


def test_unreachable_url_is_counted_not_raised() -> None:
    sink = MetricsSink(url="http://127.0.0.1:9/nothing", timeout_s=0.2, maxsize=2)
    for i in range(50):
        sink.emit(MetricReport(value=i))  # never blocks: overflow is dropped and counted
    sink.close(timeout_s=5)
    assert sink.dropped > 0 and sink.failed >= 1


def test_env_parsing() -> None:
    env = TrainEnv.from_env(
        {"RANK": "1", "WORLD_SIZE": "2", "COADAPT_CHECKPOINT_DIR": "/x", "COADAPT_RESTARTS": "3"}
    )
    assert (env.rank, env.world_size, env.local_rank, env.restarts) == (1, 2, 1, 3)
    assert str(env.checkpoint_dir) == "/x" and TrainEnv.from_env({}).world_size == 1
    with pytest.raises(TrainConfigError, match="RANK"):
        TrainEnv.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(TrainConfigError, match="integer"):
        TrainEnv.from_env({"WORLD_SIZE": "two"})
    e = replica_env(1, 2, 1234, "job", "/tmp/ck", base={})
    assert e["MASTER_PORT"] == "1234" and e["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize("zygote", [False, True], ids=["cold", "zygote"])
def test_launch_streams_prefixed_output_and_worst_exit_code(tmp_path: Path, zygote: bool) -> None:
    script = tmp_path / "s.py"
    # Rank 1 fails late, so rank 0 has exited cleanly and is not terminated as a bystander.
    script.write_text(
        "import os, sys, time\nr = int(os.environ['RANK'])\n"
        "print('hello', r, sys.argv[1:], __name__)\n"
        "time.sleep(2.0 * r)\nsys.exit(r * 3)\n"
    )
    out = io.StringIO()
    assert launch(str(script), ["a", "b"], 2, out=out, zygote=zygote) == 3
    text = out.getvalue()
    assert "[0] hello 0 ['a', 'b'] __main__" in text
    assert "[1] hello 1 ['a', 'b'] __main__" in text


def test_elastic_needs_a_control_file() -> None:
    with pytest.raises(LaunchError, match="control-file"):
        launch("x.py", [], 1, elastic=True)
