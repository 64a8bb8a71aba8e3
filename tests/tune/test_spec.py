"""Experiment specs: a valid one round-trips; bad ones name the field and what it accepts; a
trial's job spec carries its parameters and passes the job-spec validation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from coadapt.controller.errors import SpecError
from coadapt.controller.spec import parse_spec
from coadapt.tune.spec import (
    ExperimentSpec,
    load_experiment_file,
    param_env_name,
    parse_experiment,
    trial_job_spec,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

YAML = """
name: mlp-search
space:
  lr: {type: float, low: 1.0e-4, high: 0.3, log: true}
  hidden: {type: int, low: 16, high: 256, log: true}
  optimizer: {type: categorical, choices: [sgd, adam]}
  momentum: {type: float, low: 0.0, high: 0.99, when: {optimizer: [sgd]}}
  batch-size: {type: int, low: 16, high: 128, step: 16}
objective: {metric: accuracy, direction: maximize}
sampler: gp-ei
seed: 3
parallelism: 4
max_trials: 40
max_time_s: 3600
target: 0.99
max_steps: 20
early_stopping: {rule: curve, theta: 0.25}
trial:
  script: train.py
  args: [--epochs, "20"]
  working_dir: /srv/exp
  env: {OMP_NUM_THREADS: "1"}
  max_replicas: 1
params_as: both
"""


def base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(YAML)
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def rejected(data: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_experiment(data)
    return info.value


def test_valid_yaml_round_trips(tmp_path: Path) -> None:
    exp = parse_experiment(base())
    assert exp.sampler == "gp-ei" and exp.seed == 3 and exp.parallelism == 4
    assert exp.space["lr"].log and exp.space["momentum"].when == {"optimizer": ["sgd"]}
    assert exp.early_stopping.rule == "curve" and exp.early_stopping.theta == 0.25
    assert exp.early_stopping.reduction_factor == 3  # defaults fill the rest
    assert exp.objective.direction == "maximize" and exp.max_retries == 2
    again = parse_experiment(json.loads(exp.model_dump_json()))
    assert again == exp
    dumped = tmp_path / "exp.yaml"
    dumped.write_text(yaml.safe_dump(exp.model_dump(mode="json"), sort_keys=False))
    assert load_experiment_file(dumped) == exp
    as_json = tmp_path / "exp.json"
    as_json.write_text(exp.model_dump_json())
    assert load_experiment_file(as_json) == exp


def test_defaults_and_active() -> None:
    exp = parse_experiment(
        {
            "name": "e",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "objective": {"metric": "loss", "direction": "minimize"},
            "target": 0.1,
            "trial": {"command": "python t.py"},
        }
    )
    assert exp.sampler == "tpe" and exp.early_stopping.rule == "none"
    assert exp.params_as == "args" and exp.dead_after_s == 600.0
    full = parse_experiment(base())
    assert full.active("momentum", {"optimizer": "sgd"})
    assert not full.active("momentum", {"optimizer": "adam"})
    assert full.active("lr", {})


@pytest.mark.parametrize(
    ("overrides", "field", "accepted"),
    [
        ({"space": {}}, "space", "non-empty"),
        ({"space": {"lr": {"type": "float", "low": 1.0, "high": 0.1}}}, "space.lr.low", "<= high"),
        (
            {"space": {"lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}},
            "space.lr.low",
            "> 0 with log",
        ),
        ({"space": {"n": {"type": "int", "low": 1.5, "high": 4}}}, "space.n.low", "integer"),
        ({"space": {"c": {"type": "categorical", "choices": []}}}, "space.c.choices", "non-empty"),
        (
            {"space": {"x": {"type": "float", "low": 0, "high": 1, "step": 0.1, "log": True}}},
            "space.x.step",
            "not combined with log",
        ),
        (
            {"space": {"x": {"type": "vector", "low": 0, "high": 1}}},
            "space.x.type",
            "float, int, categorical",
        ),
        ({"sampler": "bohb"}, "sampler", "random, grid, tpe, gp-ei"),
        ({"surprise": 1}, "surprise", "fields: name, space"),
        (
            {"space": {"lr": {"type": "float", "low": 0, "high": 1, "bogus": 2}}},
            "space.lr.bogus",
            "fields: type, low, high",
        ),
        (
            {"objective": {"metric": "acc", "direction": "up"}},
            "objective.direction",
            "maximize, minimize",
        ),
        (
            {"max_trials": None, "max_time_s": None, "target": None},
            "max_trials",
            "at least one of max_trials, max_time_s or target",
        ),
        ({"max_steps": None}, "max_steps", "required by asha and curve"),
        ({"early_stopping": {"rule": "curve", "theta": 1.5}}, "early_stopping.theta", "(0, 1)"),
        (
            {"early_stopping": {"rule": "hyperband"}},
            "early_stopping.rule",
            "none, asha, median, curve",
        ),
        ({"parallelism": 0}, "parallelism", ">= 1"),
        ({"name": "x" * 60}, "name", "1-48 characters"),
        ({"params_as": "stdin"}, "params_as", "args, env, both"),
        ({"trial": {"script": "t.py", "working_dir": "relative"}}, "trial.working_dir", "absolute"),
        ({"trial": {"working_dir": "/srv"}}, "trial.command", "exactly one of command"),
        ({"trial": {"script": "t.py", "surprise": 1}}, "trial.surprise", "fields: name"),
    ],
)
def test_bad_spec_names_the_field(overrides: dict[str, Any], field: str, accepted: str) -> None:
    err = rejected(base(**overrides))
    assert field in err.message
    detail = next(d for d in err.details if d["field"] == field)
    assert accepted in detail["accepted"], detail


@pytest.mark.parametrize(
    ("space", "field", "message"),
    [
        # a parent that does not exist
        (
            {"a": {"type": "float", "low": 0, "high": 1, "when": {"ghost": ["x"]}}},
            "space.a.when.ghost",
            "unknown parameter",
        ),
        # a cycle: a needs b, b needs c, c needs a
        (
            {
                "a": {"type": "int", "low": 0, "high": 1, "when": {"b": ["x"]}},
                "b": {"type": "categorical", "choices": ["x", "y"], "when": {"c": [1]}},
                "c": {"type": "int", "low": 0, "high": 3, "when": {"a": [1]}},
            },
            "space.a.when.b",
            "cycle: a -> b -> c -> a",
        ),
        (
            {
                "b": {"type": "categorical", "choices": ["x", "y"]},
                "a": {"type": "float", "low": 0, "high": 1, "when": {"b": ["z"]}},
            },
            "space.a.when.b",
            "not one of b's choices",
        ),
        (
            {
                "f": {"type": "float", "low": 0, "high": 1},
                "a": {"type": "float", "low": 0, "high": 1, "when": {"f": [0.5]}},
            },
            "space.a.when.f",
            "float parameter",
        ),
        (
            {"a": {"type": "float", "low": 0, "high": 1, "when": {"a": [0.5]}}},
            "space.a.when.a",
            "itself",
        ),
    ],
)
def test_bad_condition(space: dict[str, Any], field: str, message: str) -> None:
    err = rejected(base(space=space))
    detail = next(d for d in err.details if d["field"] == field)
    assert message in detail["message"]
    assert "no cycles" in detail["accepted"]


def test_parent_may_be_declared_after_its_child() -> None:
    exp = parse_experiment(
        base(
            space={
                "momentum": {"type": "float", "low": 0, "high": 1, "when": {"opt": ["sgd"]}},
                "opt": {"type": "categorical", "choices": ["sgd", "adam"]},
            }
        )
    )
    assert exp.order() == ["opt", "momentum"]


def test_every_problem_is_reported_at_once() -> None:
    err = rejected(
        base(
            space={
                "a": {"type": "float", "low": 2, "high": 1},
                "b": {"type": "categorical", "choices": []},
            },
            max_trials=None,
            max_time_s=None,
            target=None,
        )
    )
    fields = {d["field"] for d in err.details}
    assert {"space.a.low", "space.b.choices", "max_trials"} <= fields


def test_grid_needs_a_step_for_floats() -> None:
    err = rejected(base(sampler="grid"))
    assert {d["field"] for d in err.details} == {"space.lr.step", "space.momentum.step"}
    exp = parse_experiment(
        base(
            sampler="grid",
            space={
                "lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True, "grid_points": 3},
                "opt": {"type": "categorical", "choices": ["sgd", "adam"]},
                "mom": {
                    "type": "float",
                    "low": 0.0,
                    "high": 0.9,
                    "step": 0.3,
                    "when": {"opt": ["sgd"]},
                },
            },
        )
    )
    grid = exp.grid()
    # 3 lr × (adam + 4 momenta under sgd): conditional values only where active.
    assert len(grid) == 3 * (1 + 4)
    assert {g["lr"] for g in grid} == {1e-3, 1e-2, 1e-1}
    assert {g.get("mom") for g in grid if g["opt"] == "sgd"} == {0.0, 0.3, 0.6, 0.9}
    assert all("mom" not in g for g in grid if g["opt"] == "adam")


def test_not_a_mapping() -> None:
    err = rejected(["name", "x"])
    assert err.details[0]["field"] == "spec"


def test_load_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml"):
        load_experiment_file(bad)
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump(base(sampler="bohb")))
    with pytest.raises(SpecError, match=r"invalid\.yaml.*sampler") as info:
        load_experiment_file(invalid)
    assert info.value.details[0]["field"] == "sampler"
    with pytest.raises(SpecError, match="cannot read"):
        load_experiment_file(tmp_path / "missing.yaml")


def test_relative_working_dir_resolves_against_the_file(tmp_path: Path) -> None:
    data = base()
    del data["trial"]["working_dir"]
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(data))
    assert load_experiment_file(tmp_path / "e.yaml").trial["working_dir"] == str(tmp_path.resolve())


def test_trial_job_spec_args_and_env() -> None:
    exp = parse_experiment(base())
    params = {"lr": 0.01, "hidden": 64, "optimizer": "sgd", "momentum": 0.9, "batch-size": 32}
    job = trial_job_spec(exp, params, 7)
    assert job["name"] == "mlp-search-t7"
    assert job["args"] == [
        "--epochs",
        "20",
        "--lr",
        "0.01",
        "--hidden",
        "64",
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--batch-size",
        "32",
    ]
    assert job["env"] == {
        "OMP_NUM_THREADS": "1",
        "COADAPT_PARAM_LR": "0.01",
        "COADAPT_PARAM_HIDDEN": "64",
        "COADAPT_PARAM_OPTIMIZER": "sgd",
        "COADAPT_PARAM_MOMENTUM": "0.9",
        "COADAPT_PARAM_BATCH_SIZE": "32",
        "COADAPT_TRIAL": "7",
    }
    parsed = parse_spec(job)
    assert parsed.name == "mlp-search-t7" and parsed.max_replicas == 1
    assert exp.trial["args"] == ["--epochs", "20"]  # the template is not modified


@pytest.mark.parametrize(
    ("params_as", "has_args", "has_env"),
    [("args", True, False), ("env", False, True), ("both", True, True)],
)
def test_params_as(params_as: str, has_args: bool, has_env: bool) -> None:
    exp = parse_experiment(base(params_as=params_as))
    job = trial_job_spec(exp, {"lr": 0.5, "optimizer": "adam"}, 0)
    assert ("--lr" in job["args"]) is has_args
    assert ("COADAPT_PARAM_LR" in job["env"]) is has_env
    assert job["env"]["COADAPT_TRIAL"] == "0"
    parse_spec(job)


def test_trial_names_fit_the_job_name_rules() -> None:
    exp = parse_experiment(base(name="e" * 48))
    assert parse_spec(trial_job_spec(exp, {"lr": 0.1, "optimizer": "adam"}, 10**9)).name
    assert param_env_name("batch-size.v2") == "COADAPT_PARAM_BATCH_SIZE_V2"


def test_env_name_collision_is_rejected() -> None:
    err = rejected(
        base(
            space={
                "a-b": {"type": "float", "low": 0, "high": 1},
                "a_b": {"type": "float", "low": 0, "high": 1},
            }
        )
    )
    assert "COADAPT_PARAM_A_B" in err.details[0]["message"]


def test_template_is_validated_with_a_sample_point() -> None:
    # The env the template brings must not collide with what the controller sets.
    data = base()
    data["trial"] = copy.deepcopy(data["trial"]) | {"env": {"RANK": "0"}}
    err = rejected(data)
    assert err.details[0]["field"] == "trial.env"


def test_example_experiment_parses() -> None:
    exp = load_experiment_file(EXAMPLES / "tune_digits_mlp.yaml")
    assert isinstance(exp, ExperimentSpec)
    assert exp.trial["script"] == "tune_digits_mlp.py"
    assert (EXAMPLES / exp.trial["script"]).is_file()
    assert exp.objective.metric == "accuracy"
