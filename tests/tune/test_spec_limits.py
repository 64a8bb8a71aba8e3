"""Experiment specs: the bad-input classes of issue 13 (point 5) on the tuning side."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from coadapt.controller.errors import SpecError
from coadapt.tune.spec import MAX_CHOICES, MAX_GRID_POINTS, load_experiment_file, parse_experiment


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "exp",
        "space": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "step": 0.001}},
        "objective": {"metric": "acc"},
        "max_trials": 4,
        "trial": {"script": "t.py", "working_dir": "/"},
    }
    return base | overrides


def fields_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    with pytest.raises(SpecError) as info:
        parse_experiment(data)
    return {d["field"]: d for d in info.value.details}


@pytest.mark.parametrize(
    "param",
    [
        {"type": "int", "low": 0, "high": 10**15},
        {"type": "float", "low": 0.0, "high": 1e300, "step": 1e-300},
        {"type": "float", "low": 0.0, "high": 1.0, "grid_points": 10**9},
    ],
)
def test_huge_grids_are_refused_before_they_are_listed(param: dict[str, Any]) -> None:
    start = time.monotonic()
    fields = fields_of(spec(sampler="grid", space={"x": param}))
    assert time.monotonic() - start < 1.0
    (field,) = fields
    assert field.startswith("space.x")
    assert str(MAX_GRID_POINTS) in fields[field]["accepted"] + fields[field]["message"]


def test_string_choices_reach_argv_so_nul_is_refused() -> None:
    fields = fields_of(spec(space={"opt": {"type": "categorical", "choices": ["a", "b\x00"]}}))
    assert "NUL" in fields["space.opt.choices"]["message"]


def test_too_many_choices_names_the_limit() -> None:
    choices = list(range(MAX_CHOICES + 1))
    fields = fields_of(spec(space={"n": {"type": "categorical", "choices": choices}}))
    assert str(MAX_CHOICES) in fields["space.n.choices"]["message"]


@pytest.mark.parametrize("seed", [-1, 2**32, 10**40])
def test_seed_is_one_numpy_accepts(seed: int) -> None:
    assert "[0, 2^32)" in fields_of(spec(seed=seed))["seed"]["accepted"]


def test_trial_template_strings_are_checked_like_a_job_spec() -> None:
    fields = fields_of(spec(trial={"command": ["python", "x\x00"], "working_dir": "/"}))
    assert "NUL" in fields["trial.command"]["message"]


def test_experiment_file_errors_are_one_line_with_position(tmp_path: Path) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match=r"latin\.yaml:1:10: not UTF-8"):
        load_experiment_file(latin)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: e\nspace: {lr: [\n")
    with pytest.raises(SpecError, match=r"broken\.yaml:3:1: not valid YAML"):
        load_experiment_file(broken)
