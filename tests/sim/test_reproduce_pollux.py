"""benchmarks/reproduce_pollux.py at a held-out job load: the artifact's 80-job traces run, the
authors' results at that load are the reference, and Tiresias reproduces them exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import reproduce_pollux


def test_a_held_out_load_runs_against_the_authors_results_at_that_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "r.json"
    argv = ["reproduce_pollux.py", "--policies", "tiresias", "--workloads", "2", "--load", "0.5"]
    monkeypatch.setattr(sys, "argv", [*argv, "--processes", "1", "--json", str(out)])
    assert reproduce_pollux.main() == 0
    report = json.loads(out.read_text())
    assert report["load"] == "0.5"
    wl = report["policies"]["tiresias"]["workloads"]["workload-2"]
    assert (
        wl["authors_avg_jct_s"]
        == reproduce_pollux.reference("tiresias", "0.5")["avgs"]["workload-2"]
    )
    assert wl["deviation"] == pytest.approx(0.0, abs=1e-9)
    assert wl["jobs_matching_authors"] == 80  # every job of the 80-job trace, to the second


def test_every_load_has_its_reference_for_every_policy() -> None:
    for load in ("0.5", "1.0", "1.5", "2.0"):
        for policy in ("pollux", "tiresias", "optimus"):
            assert len(reproduce_pollux.reference(policy, load)["avgs"]) == 8
