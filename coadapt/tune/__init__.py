"""coadapt.tune — multi-tenant hyper-parameter tuning on the goodput scheduler.

The pure core (no controller, no database of its own):

* :mod:`~coadapt.tune.spec`: the experiment spec (search space, objective, sampler, budgets,
  early stopping, trial job template) and :func:`trial_job_spec`, a trial's job spec;
* :mod:`~coadapt.tune.samplers`: one Optuna study per experiment, driven by ask/tell;
* :mod:`~coadapt.tune.pruning` and :mod:`~coadapt.tune.curves`: early-stopping decisions as
  pure functions of reported curves, so the live loop and the simulator share them.

Optuna (and its torch/scipy use) loads on first use of a sampler name, not on import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coadapt.tune.spec import (
    EarlyStopping,
    ExperimentSpec,
    Objective,
    ParamSpec,
    load_experiment_file,
    parse_experiment,
    trial_job_spec,
)

if TYPE_CHECKING:
    from coadapt.tune.curves import CurvePrediction, extrapolate
    from coadapt.tune.pruning import Curve, PruneDecision, decide
    from coadapt.tune.samplers import (
        SAMPLER_NAMES,
        GridExhausted,
        ask_params,
        create_study,
        make_sampler,
    )

_LAZY = {
    "CurvePrediction": "curves",
    "extrapolate": "curves",
    "Curve": "pruning",
    "PruneDecision": "pruning",
    "decide": "pruning",
    "SAMPLER_NAMES": "samplers",
    "GridExhausted": "samplers",
    "ask_params": "samplers",
    "create_study": "samplers",
    "make_sampler": "samplers",
}

__all__ = [
    "SAMPLER_NAMES",
    "Curve",
    "CurvePrediction",
    "EarlyStopping",
    "ExperimentSpec",
    "GridExhausted",
    "Objective",
    "ParamSpec",
    "PruneDecision",
    "ask_params",
    "create_study",
    "decide",
    "extrapolate",
    "load_experiment_file",
    "make_sampler",
    "parse_experiment",
    "trial_job_spec",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coadapt.tune' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"coadapt.tune.{module}"), name)
    globals()[name] = value
    return value
