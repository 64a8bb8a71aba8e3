"""benchmarks/tta_bench.py: a seconds-long real race gives rows with every field; the table
and the goals are computed from the rows as documented (not speed: that is the benchmark's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tta_bench import WORKLOADS, _to_device, goals, modes_for, parse_mode, table

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"workload", "replicas", "mode", "initial", "seed", "tta_s", "steps", "samples"}


def test_a_short_race_writes_rows_with_every_field(tmp_path: Path) -> None:
    out = tmp_path / "tta.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "tta_bench.py"),
            "--workloads",
            "cancer",
            "--replicas",
            "1",
            "--seeds",
            "1",
            "--modes",
            "adaptive,fixed-16-linear,fixed-32-sqrt",
            "--skip-overhead",
            "--device",
            "cpu",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert sorted(r["mode"] for r in rows) == ["adaptive", "fixed-16-linear", "fixed-32-sqrt"]
    for r in rows:
        assert set(r) >= FIELDS
        assert r["workload"] == "cancer" and r["replicas"] == 1 and r["seed"] == 0
        assert r["initial"] is (r["mode"] == "fixed-16-linear")
        assert r["device"] == "cpu"
        if r["reached"]:
            assert r["tta_s"] > 0 and r["steps"] > 0 and r["samples"] >= r["steps"]
            assert r["cpu_s"] > 0
            assert r["curve"][-1][1] <= WORKLOADS["cancer"].target  # cross-entropy
    fixed32 = next(r for r in rows if r["mode"] == "fixed-32-sqrt")
    assert fixed32["batches"] == [32] and fixed32["lr"] == pytest.approx(1e-3 * 2**0.5)
    assert fixed32["changes"] == [] and fixed32["gate_step"] is None
    adaptive = next(r for r in rows if r["mode"] == "adaptive")
    # where the adaptive job's steps went: (steps, samples, batch, φ) at every change
    assert [c[2] for c in adaptive["changes"]] == adaptive["batches"][1:]
    assert all(c[0] >= (adaptive["gate_step"] or 0) for c in adaptive["changes"])
    assert {"goals", "load_before", "race_s"} <= set(res["summary"])


def _row(mode: str, seed: int, tta: float | None, samples: int = 100) -> dict[str, object]:
    fixed, _ = parse_mode(mode)
    return {
        "workload": "w",
        "replicas": 1,
        "mode": mode,
        "initial": fixed == 32,
        "seed": seed,
        "reached": tta is not None,
        "tta_s": tta,
        "steps": 10 if tta is not None else None,
        "samples": samples if tta is not None else None,
    }


def test_table_and_goals_from_rows() -> None:
    rows = [
        _row("adaptive", 0, 1.0, 300),
        _row("adaptive", 1, 3.0, 300),
        _row("fixed-32-linear", 0, 4.0, 200),
        _row("fixed-32-linear", 1, 2.0, 200),
        _row("fixed-64-sqrt", 0, None),  # missed the target in 2 of 3 seeds: infinite median
        _row("fixed-64-sqrt", 1, None),
        _row("fixed-64-sqrt", 2, 0.5),
    ]
    tab = {t["mode"]: t for t in table(rows)}
    assert tab["adaptive"]["tta_s"] == 2.0 and tab["fixed-32-linear"]["tta_s"] == 3.0
    assert tab["fixed-64-sqrt"]["tta_s"] == float("inf") and tab["fixed-64-sqrt"]["reached"] == 1
    g = goals(list(tab.values()))["w_1r"]
    assert g["best_fixed"] == "fixed-32-linear"
    assert g["vs_best"] == pytest.approx(2 / 3) and g["vs_initial"] == pytest.approx(2 / 3)
    assert g["samples_vs_best"] == pytest.approx(1.5)
    assert "cpu_vs_best" not in g  # rows from before cpu_s: the wall figures only


def test_goals_in_cpu_seconds_pick_their_own_best() -> None:
    """cpu_s (load-independent) is compared on its own: the best fixed mode by CPU may differ
    from the best by wall clock."""
    rows = [
        {**_row("adaptive", 0, 1.0), "cpu_s": 0.30},
        {**_row("fixed-32-linear", 0, 2.0), "cpu_s": 0.60},
        {**_row("fixed-64-sqrt", 0, 0.5), "cpu_s": 0.40},
    ]
    tab = {t["mode"]: t for t in table(rows)}
    assert tab["fixed-64-sqrt"]["cpu_s"] == pytest.approx(0.40)
    g = goals(list(tab.values()))["w_1r"]
    assert g["best_fixed"] == "fixed-64-sqrt" and g["vs_best"] == pytest.approx(2.0)
    assert g["best_fixed_cpu"] == "fixed-64-sqrt"
    assert g["cpu_vs_best"] == pytest.approx(0.75) and g["cpu_vs_initial"] == pytest.approx(0.5)


def test_modes_and_their_names() -> None:
    w = WORKLOADS["digits"]
    modes = modes_for(w)
    assert modes[:2] == ["adaptive", "fixed-32-linear"] and "fixed-256-sqrt" in modes
    assert len(modes) == 2 + 2 * 3  # M0 once, then x2, x4, x8 under both rules
    assert parse_mode("fixed-64-sqrt") == (64, "sqrt")
    with pytest.raises(ValueError, match=r"fixed-<B>-<linear\|sqrt>"):
        parse_mode("fixed-64-cubic")


def test_a_gpu_job_gets_its_workload_on_its_device() -> None:
    """The tensors follow the job's device (``meta`` stands in for a GPU here); on the CPU the
    workload is passed through untouched."""
    import torch
    from torch.utils.data import TensorDataset

    def make(lr: float) -> None:
        return None

    built = (
        TensorDataset(torch.zeros(4, 3), torch.zeros(4)),
        torch.ones(2, 3),
        torch.ones(2),
        make,
    )
    assert _to_device(built, torch.device("cpu")) is built
    train, xte, yte, mk = _to_device(built, torch.device("meta"))
    assert all(t.device.type == "meta" for t in (*train.tensors, xte, yte))
    assert train.tensors[0].shape == (4, 3) and mk is make


@pytest.mark.parametrize("flag", ["--overhead-repeats", "--overhead-repeats-2r"])
def test_too_few_overhead_repeats_are_refused_before_the_race(flag: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tta_bench.py"), flag, "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "need >= 2" in proc.stderr and "--skip-overhead" in proc.stderr
    assert "trials" not in proc.stderr  # no trial ran


def test_a_mistyped_option_is_refused_not_ignored() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tta_bench.py"), "--overhead-repats", "40"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --overhead-repats 40" in proc.stderr
