"""``coadapt simulate`` end to end through ``coadapt.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coadapt.cli import main


def test_simulate_writes_json_and_plot(
    small_workload_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    rc = main(
        [
            "simulate",
            "--workload",
            str(small_workload_path),
            "--cluster",
            "2x2",
            "--policy",
            "tiresias",
            "--policy",
            "fifo",
            "--seed",
            "3",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [d["policy"] for d in data] == ["tiresias", "fifo"]
    for d in data:
        for key in (
            "avg_jct_s",
            "p50_jct_s",
            "p99_jct_s",
            "makespan_s",
            "restarts",
            "gpu_hours",
            "sim_wall_s",
            "utilisation",
            "jobs",
        ):
            assert key in d
        assert len(d["jobs"]) == 5
        assert {
            "name",
            "application",
            "submit_s",
            "jct_s",
            "queue_s",
            "restarts",
            "gpu_hours",
        } <= set(d["jobs"][0])
    assert png.stat().st_size > 0
    assert "tiresias" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--cluster", "16by4"], ["'16by4'", "NODESxGPUS"]),
        (["--policy", "slurm"], ["'slurm'", "tiresias"]),
    ],
)
def test_bad_input_is_one_line_exit_2(
    small_workload_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needles: list[str],
) -> None:
    rc = main(["simulate", "--workload", str(small_workload_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_bad_workload_row_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nx,0,gpt5,1,12\n")
    rc = main(["simulate", "--workload", str(bad), "--policy", "fifo"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"{bad}:2" in err and "'gpt5'" in err and "bert" in err
