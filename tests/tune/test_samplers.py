"""Ask/tell with every sampler on a small conditional space, in an SQLite study that survives a
reopen (resume); pruned and failed tells; the grid's bookkeeping."""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from coadapt.controller.errors import SpecError
from coadapt.tune.samplers import (
    GRID_ATTR,
    SAMPLER_NAMES,
    SPEC_ATTR,
    ConditionalGridSampler,
    GridExhausted,
    ask_params,
    create_study,
    make_sampler,
    require_sampler,
)
from coadapt.tune.spec import ExperimentSpec, parse_experiment


@pytest.fixture(autouse=True)
def _quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


def spec_for(sampler: str, **extra: Any) -> ExperimentSpec:
    grid = sampler == "grid"
    return parse_experiment(
        {
            "name": f"small-{sampler}",
            "space": {
                "lr": {
                    "type": "float",
                    "low": 1e-4,
                    "high": 1.0,
                    "log": True,
                    **({"grid_points": 3} if grid else {}),
                },
                "hidden": {
                    "type": "int",
                    "low": 8,
                    "high": 64,
                    "log": True,
                    **({"grid_points": 2} if grid else {}),
                },
                "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
                "momentum": {
                    "type": "float",
                    "low": 0.0,
                    "high": 0.9,
                    "when": {"optimizer": ["sgd"]},
                    **({"step": 0.45} if grid else {}),
                },
            },
            "objective": {"metric": "loss", "direction": "minimize"},
            "sampler": sampler,
            "seed": 7,
            "max_trials": 20,
            "trial": {"command": "python train.py"},
            **extra,
        }
    )


def objective(p: dict[str, Any]) -> float:
    """A loss with its optimum at lr = 1e-2, wide layers, sgd with momentum 0.9."""
    loss = (math.log10(p["lr"]) + 2.0) ** 2 + 8.0 / p["hidden"]
    return loss + (0.9 - p["momentum"] if p["optimizer"] == "sgd" else 0.5)


def check_params(spec: ExperimentSpec, p: dict[str, Any]) -> None:
    assert 1e-4 <= p["lr"] <= 1.0 and 8 <= p["hidden"] <= 64
    assert isinstance(p["hidden"], int) and p["optimizer"] in ("sgd", "adam")
    # the conditional parameter exists exactly when its condition holds
    assert ("momentum" in p) == (p["optimizer"] == "sgd")
    assert list(p) == [n for n in spec.space if n in p]


@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_ask_tell_lifecycle_and_resume(sampler: str, tmp_path: Path) -> None:
    spec = spec_for(sampler)
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    study = create_study(url, "exp-1", spec)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.user_attrs[SPEC_ATTR]["sampler"] == sampler
    seen = []
    for i in range(12):  # past the GP's and TPE's 10 random start-up trials
        trial, params = ask_params(study, spec)
        check_params(spec, params)
        assert trial.params == params
        seen.append(params)
        if i == 3:
            study.tell(trial.number, state=TrialState.PRUNED)
        elif i == 4:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial.number, objective(params))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 10
    assert states[3] == TrialState.PRUNED and states[4] == TrialState.FAIL
    best = study.best_value

    # A new process: reopen the same study by name and go on from where it stopped.
    reopened = create_study(url, "exp-1", spec)
    assert len(reopened.trials) == 12 and reopened.best_value == best
    for _ in range(2):
        trial, params = ask_params(reopened, spec)
        check_params(spec, params)
        reopened.tell(trial, objective(params))
    assert [t.number for t in reopened.trials] == list(range(14))
    if sampler != "random":  # the model-based and grid samplers do not repeat a point
        keys = [tuple(sorted(t.params.items())) for t in reopened.trials]
        assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("sampler", ["random", "tpe", "gp-ei"])
def test_seeded_studies_are_deterministic(sampler: str) -> None:
    spec = spec_for(sampler)

    def run() -> list[dict[str, Any]]:
        study = create_study(optuna.storages.InMemoryStorage(), "s", spec)
        out = []
        for _ in range(12):
            trial, params = ask_params(study, spec)
            study.tell(trial, objective(params))
            out.append(params)
        return out

    assert run() == run()


def test_gp_ei_improves_on_random_start() -> None:
    spec = spec_for("gp-ei")
    study = create_study(optuna.storages.InMemoryStorage(), "gp", spec)
    for _ in range(25):
        trial, params = ask_params(study, spec)
        study.tell(trial, objective(params))
    startup = min(t.value for t in study.trials[:10] if t.value is not None)
    assert study.best_value < startup
    assert study.best_value < 0.6  # the optimum is 0.125 (hidden = 64)


def test_parallel_asks_with_running_trials_differ() -> None:
    spec = spec_for("gp-ei")
    study = create_study(optuna.storages.InMemoryStorage(), "par", spec)
    for _ in range(10):
        trial, params = ask_params(study, spec)
        study.tell(trial, objective(params))
    pending = [ask_params(study, spec) for _ in range(3)]  # three trials running at once
    points = [tuple(sorted(p.items())) for _, p in pending]
    assert len(set(points)) == 3
    for trial, params in pending:
        study.tell(trial, objective(params))


def test_grid_visits_every_active_point_once_then_is_exhausted(tmp_path: Path) -> None:
    spec = spec_for("grid")
    points = spec.grid()
    assert len(points) == 3 * 2 * (1 + 3)  # lr × hidden × (adam | sgd × 3 momenta)
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    study = create_study(url, "grid", spec)
    seen = []
    for i in range(len(points)):
        if i == 10:  # resume half way: the taken points are read back from the database
            study = create_study(url, "grid", spec)
        trial, params = ask_params(study, spec)
        check_params(spec, params)
        seen.append(params)
        study.tell(trial, objective(params))
    assert sorted(map(repr, seen)) == sorted(map(repr, points))
    with pytest.raises(GridExhausted):
        ask_params(study, spec)
    assert all(GRID_ATTR in t.system_attrs for t in study.trials)


def test_grid_counts_running_and_failed_points_as_taken() -> None:
    spec = spec_for("grid")
    study = create_study(optuna.storages.InMemoryStorage(), "g", spec)
    sampler = study.sampler
    assert isinstance(sampler, ConditionalGridSampler)
    total = sampler.remaining(study)
    running, _ = ask_params(study, spec)
    failed, _ = ask_params(study, spec)
    study.tell(failed, state=TrialState.FAIL)
    assert sampler.remaining(study) == total - 2
    study.tell(running, 1.0)


def test_make_sampler_kinds() -> None:
    assert isinstance(make_sampler(spec_for("random")), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler(spec_for("tpe")), optuna.samplers.TPESampler)
    db = optuna.storages.InMemoryStorage()
    assert isinstance(make_sampler(spec_for("grid"), storage=db), ConditionalGridSampler)
    # "gp-ei" is the historical name of Optuna's GPSampler (our own GP code was removed)
    assert isinstance(make_sampler(spec_for("gp-ei")), optuna.samplers.GPSampler)


def test_grid_needs_the_study_storage() -> None:
    with pytest.raises(ValueError, match="storage="):
        make_sampler(spec_for("grid"))


def test_gp_ei_without_torch_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def no_torch(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    with pytest.raises(SpecError) as err:
        make_sampler(spec_for("gp-ei"))
    assert "coadapt[train]" in err.value.details[0]["message"]
    require_sampler("tpe")  # the other samplers need nothing beyond the base install


def test_maximize_direction() -> None:
    spec = spec_for("tpe", objective={"metric": "accuracy", "direction": "maximize"})
    study = create_study(optuna.storages.InMemoryStorage(), "max", spec)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    for v in (0.1, 0.9, 0.5):
        trial, _ = ask_params(study, spec)
        study.tell(trial, v)
    assert study.best_value == 0.9
