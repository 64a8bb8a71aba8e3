"""benchmarks/hetero_bench.py writes its JSON after every finished row, atomically, so a run
killed part-way (a full run takes about an hour) keeps the rows it finished."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.hetero_bench import HOMOGENEOUS, collect, write_report


def _row(workload: int, jct_h: float) -> dict[str, Any]:
    return {
        "workload": f"pollux-{workload}",
        "cluster": HOMOGENEOUS,
        "policy": "pollux",
        "packing": True,
        "avg_jct_s": jct_h * 3600.0,
        "restarts_per_job": 1.5,
    }


def test_a_run_killed_after_two_rows_keeps_both(tmp_path: Path) -> None:
    out = tmp_path / "out.json"

    def results() -> Iterator[dict[str, Any]]:
        yield _row(2, 0.8)
        yield _row(1, 0.5)
        raise KeyboardInterrupt  # the run is stopped while the third row simulates

    with pytest.raises(KeyboardInterrupt):
        collect(results(), [], out, 0.0)
    report = json.loads(out.read_text())
    assert [r["workload"] for r in report["rows"]] == ["pollux-1", "pollux-2"]
    assert report["averages"][HOMOGENEOUS]["pollux"] == pytest.approx(0.65 * 3600.0)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_rows_merge_over_an_older_run_as_they_finish(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    old = [_row(1, 0.9), _row(3, 0.6)]
    seen: list[int] = []

    def results() -> Iterator[dict[str, Any]]:
        yield _row(1, 0.5)
        seen.append(len(json.loads(out.read_text())["rows"]))  # written before the next row
        yield _row(2, 0.7)

    rows = collect(results(), old, out, 0.0)
    assert seen == [2]
    assert [(r["workload"], r["avg_jct_s"] / 3600) for r in rows] == [
        ("pollux-1", pytest.approx(0.5)),
        ("pollux-2", pytest.approx(0.7)),
        ("pollux-3", pytest.approx(0.6)),
    ]
    assert json.loads(out.read_text())["rows"] == rows


def test_a_failed_write_leaves_the_previous_report_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.json"
    write_report(out, [_row(1, 0.5)], 0.0)

    def boom(*args: object, **kwargs: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr("benchmarks.hetero_bench.json.dumps", boom)
    with pytest.raises(OSError):
        write_report(out, [_row(1, 0.5), _row(2, 0.7)], 0.0)
    assert len(json.loads(out.read_text())["rows"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
