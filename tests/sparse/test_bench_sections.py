"""Smoke test of the training and scaling sections of ``benchmarks/sparse_bench.py``.

Tiny configurations (seconds): checks that every section runs end to end through real shard
servers and reports the documented row fields with sane values — not the speed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import pytest

from benchmarks.sparse.scaling import best, scaling_section
from benchmarks.sparse.training import (
    TrainSetup,
    compression_section,
    freshness_section,
    staleness_section,
)

TINY = TrainSetup(rows=3 * 16 * 256, batch=256)


def _is_prob(x: Any) -> bool:
    return isinstance(x, float) and 0.0 <= x <= 1.0


def test_compression_rows_report_bytes_ratio_and_auc_loss() -> None:
    rows = compression_section(TINY, ["none", "topk1%+int8"])
    assert [r["name"] for r in rows] == ["compression/none", "compression/topk1%+int8"]
    base, comp = rows
    # every header on the wire is counted: uncompressed pushes cost a little more than raw
    assert 1.0 < base["pushed_bytes_ratio"] < 1.1 and base["auc_loss"] == 0.0
    assert 0 < comp["pushed_bytes_ratio"] < 0.2  # top-1 % rows of int8: far fewer bytes
    assert comp["auc_loss"] == pytest.approx(base["auc"] - comp["auc"])
    for r in rows:
        assert _is_prob(r["auc"]) and _is_prob(r["planted_auc"]) and r["samples_per_s"] > 0
        assert r["auc"] > 0.55  # it learned something on the planted data


def test_compression_needs_the_uncompressed_baseline_first() -> None:
    with pytest.raises(ValueError, match="'none' first"):
        compression_section(TINY, ["int8"])


def test_staleness_rows_have_an_auc_curve_and_respect_the_bound() -> None:
    rows = staleness_section(TINY, (0, 4), points=2)
    assert [r["name"] for r in rows] == ["staleness/s=0", "staleness/s=4"]
    for r, s in zip(rows, (0, 4), strict=True):
        assert r["max_staleness"] <= s
        assert len(r["auc_curve"]) == 2 and r["auc_curve"][-1][1] == r["auc"]
        assert _is_prob(r["auc"]) and r["samples_per_s"] > 0
    assert rows[0]["cache_hit_rate"] == 0.0 and rows[1]["cache_hit_rate"] > 0.0


def test_freshness_online_beats_frozen_on_a_drifting_stream() -> None:
    setup = dataclasses.replace(TINY, rows=4 * 16 * 256, drift_period=4 * 16 * 256)
    online, frozen = freshness_section(setup, windows=4)
    assert (online["name"], frozen["name"]) == ("freshness/online", "freshness/frozen")
    assert len(online["auc_per_window"]) == 4 and len(online["planted_auc_per_window"]) == 4
    assert online["auc"] > frozen["auc"]  # weights rotate by 360 degrees over the stream
    assert all(_is_prob(a) for a in online["auc_per_window"] + frozen["auc_per_window"])


def test_scaling_grid_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.sparse_bench as sb

    monkeypatch.setenv("SPARSE_BENCH_ROWS_PER_TABLE", "2000")  # children prefill tiny tables
    rows = scaling_section(sb._run_workers, [1], [2], 1, 1, None)
    assert [r["name"] for r in rows] == ["scaling/coadapt/1x2"]
    for r in rows:
        assert r["samples_per_s"] > 0 and math.isfinite(r["ms_per_step"])
        assert r["cpus"] == os.cpu_count() and r["repeats"] == 1


def test_best_keeps_the_fastest_repeat() -> None:
    got = best([{"samples_per_s": 1.0, "k": "a"}, {"samples_per_s": 3.0, "k": "b"}])
    assert got == {"samples_per_s": 3.0, "k": "b", "repeats": 2}


def test_hotpath_row_reports_cpu_ms() -> None:
    from benchmarks.sparse.hotpath import hotpath_section

    (row,) = hotpath_section(rows_per_table=3000, tables=2, dim=8, reps=2)
    assert row["name"] == "hotpath/server_pull_push" and 0 < row["unique_rows"] <= 2 * 2048
    assert row["pull_cpu_ms"] >= 0 and row["push_cpu_ms"] >= 0
    assert row["pull_push_cpu_ms"] >= max(row["pull_cpu_ms"], row["push_cpu_ms"]) * 0.5
