"""Samplers and the ask/tell life cycle of one experiment's Optuna study.

One experiment is one Optuna study (in the controller's database through an RDB URL, or any
:class:`optuna.storages.BaseStorage`); the controller drives it with ask/tell, never
``study.optimize``::

    study = create_study("sqlite:///coadapt.db", "exp-42", spec)   # creates, or resumes
    trial, params = ask_params(study, spec)        # only the parameters active for this trial
    ...                                            # run trial_job_spec(spec, params, trial.number)
    study.tell(trial.number, final_value)                         # finished: its objective
    study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)  # stopped early
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)    # crashed / dead

``tell`` takes the trial or its number, so a controller that restarted (and lost the
:class:`optuna.Trial` objects) tells by number. A PRUNED tell takes no value; Optuna records
the trial's last intermediate value (``trial.report(value, step)``, if any) as its value.

Samplers (``spec.sampler``):

* ``random``: :class:`optuna.samplers.RandomSampler`.
* ``grid``: :class:`ConditionalGridSampler`, every distinct *active* configuration once
  (:meth:`ExperimentSpec.grid`): floats need ``step`` or ``grid_points``; conditional parameters
  are enumerated only under the parent values that activate them. :func:`ask_params` raises
  :class:`GridExhausted` once every point has been started (FAIL counts as visited; re-running
  a failed trial is the controller's retry, not a new grid point).
* ``tpe``: :class:`optuna.samplers.TPESampler` (multivariate; ``group=True`` when the space is
  conditional, so each sub-space gets its own joint density; constant liar for parallel
  trials, Optuna 5's default).
* ``gp-ei``: :class:`optuna.samplers.GPSampler` (seeded): a Gaussian process (Matérn-5/2 ARD)
  with log expected improvement, running trials handled by Optuna. The name predates the switch
  and stays accepted. Our own GP-EI was removed: on ``benchmarks/sampler_check.py`` it did not
  beat GPSampler clearly (Hartmann-6, 20 seeds: 17/20 vs 16/20 reached the target; Branin
  20/20 both), and hand-written code must earn its place by a measured margin. GPSampler needs
  torch (the ``train`` extra): on a controller without it a ``gp-ei`` experiment is refused at
  submission with an error that says so (:func:`require_sampler`), never silently run with
  another sampler (a seeded experiment would then depend on what the controller has installed).

A study's sampler is not stored: :func:`create_study` rebuilds it, and on a resumed study
re-seeds it from ``(seed, number of trials)`` so a seeded experiment does not replay the
configurations it already tried.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, GPSampler, RandomSampler, TPESampler
from optuna.storages import BaseStorage
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from coadapt.controller.errors import SpecError
from coadapt.tune.spec import ExperimentSpec, ParamSpec

SAMPLER_NAMES: tuple[str, ...] = ("random", "grid", "tpe", "gp-ei")

#: Trial system attribute holding the grid point a ``grid`` trial runs.
GRID_ATTR = "coadapt:grid_id"
#: Study user attribute holding the experiment spec the study was created with.
SPEC_ATTR = "coadapt:spec"


class GridExhausted(RuntimeError):
    """Every point of a ``grid`` experiment has been started: the experiment is complete."""


def distribution(p: ParamSpec) -> BaseDistribution:
    """The Optuna distribution of one (validated) parameter."""
    if p.type == "categorical":
        return CategoricalDistribution(list(p.choices or []))
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return FloatDistribution(p.low, p.high, log=p.log, step=p.step)


class ConditionalGridSampler(BaseSampler):
    """Runs each distinct active configuration of a (possibly conditional) space once.

    Optuna's :class:`~optuna.samplers.GridSampler` needs every parameter in every trial, so a
    conditional space would repeat configurations that differ only in inactive parameters.
    Like it, the chosen point is kept in a trial system attribute (so a resumed study, or
    several processes on one database, see which points are taken).
    """

    def __init__(
        self, points: Sequence[dict[str, Any]], storage: BaseStorage, seed: int | None = None
    ) -> None:
        self._points = [dict(p) for p in points]
        # The study's own storage object (the one handed to create_study): system attributes
        # are written through its public methods, never through the study's private handle.
        self._db = storage
        self._order = [int(i) for i in np.random.default_rng(seed).permutation(len(points))]
        self._rng = np.random.default_rng(seed)

    @property
    def points(self) -> list[dict[str, Any]]:
        return [dict(p) for p in self._points]

    def taken(self, study: Study) -> set[int]:
        """Grid ids of trials that are waiting, running or finished (any end state)."""
        out: set[int] = set()
        for t in study.get_trials(deepcopy=False):
            gid = t.system_attrs.get(GRID_ATTR)
            if gid is not None:
                out.add(int(gid))
        return out

    def remaining(self, study: Study) -> int:
        return len(self._points) - len(self.taken(study) & set(range(len(self._points))))

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if GRID_ATTR in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return  # an enqueued (retried) configuration keeps its parameters
        taken = self.taken(study)
        free = [i for i in self._order if i not in taken]
        # Exhausted (a race between processes): repeat a random point rather than fail.
        gid = free[0] if free else int(self._rng.integers(len(self._points)))
        self._db.set_trial_system_attr(self._trial_id(study, trial), GRID_ATTR, gid)
        trial.system_attrs[GRID_ATTR] = gid  # the Trial keeps this cached copy

    def _trial_id(self, study: Study, trial: FrozenTrial) -> int:
        """The storage's id of ``trial``, looked up by study name and trial number."""
        study_id = self._db.get_study_id_from_name(study.study_name)
        return self._db.get_trial_id_from_study_id_trial_number(study_id, trial.number)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        gid = trial.system_attrs.get(GRID_ATTR)
        if gid is None:
            gid = self._db.get_trial(self._trial_id(study, trial)).system_attrs.get(GRID_ATTR)
        if gid is None or param_name not in self._points[int(gid)]:
            raise ValueError(f"parameter {param_name!r} is not in grid point {gid}")
        return self._points[int(gid)][param_name]


def require_sampler(name: str) -> None:
    """Raise :class:`SpecError` if sampler ``name`` cannot run here (a missing extra).

    Called where an experiment is accepted (the API) and where its sampler is built, so a
    controller installed without torch refuses ``gp-ei`` up front instead of failing later.
    """
    if name == "gp-ei" and importlib.util.find_spec("torch") is None:
        raise SpecError(
            "sampler 'gp-ei' (Optuna's GPSampler) needs torch, which this controller lacks",
            [
                {
                    "field": "sampler",
                    "message": "needs torch: install coadapt[train] on the controller",
                    "accepted": "random, grid or tpe without torch; gp-ei with coadapt[train]",
                }
            ],
        )


def make_sampler(
    spec: ExperimentSpec, *, storage: BaseStorage | None = None, seed_offset: int = 0
) -> BaseSampler:
    """The sampler ``spec.sampler`` names, seeded from ``spec.seed`` (+ ``seed_offset``).

    ``storage`` is the study's storage object: the ``grid`` sampler records each trial's grid
    point there (so resumed studies and other processes see which points are taken).
    """
    seed = None if spec.seed is None else (spec.seed + 7919 * seed_offset) % 2**32
    if spec.sampler == "random":
        return RandomSampler(seed=seed)
    if spec.sampler == "grid":
        if storage is None:
            raise ValueError(
                "sampler 'grid' records its points in the study's storage: pass storage= "
                "(the optuna.storages.BaseStorage the study is created on)"
            )
        # The visiting order depends on the spec's seed only, so a resumed study keeps it.
        return ConditionalGridSampler(spec.grid(), storage, seed=spec.seed)
    if spec.sampler == "tpe":
        if spec.is_conditional():
            # group=True is flagged experimental by Optuna; it is what conditional spaces need
            # (one joint density per sub-space), so take it knowingly.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return TPESampler(seed=seed, multivariate=True, group=True)
        return TPESampler(seed=seed, multivariate=True)
    if spec.sampler == "gp-ei":
        require_sampler(spec.sampler)
        # Conditional parameters outside the intersection space are drawn by GPSampler's
        # independent (random) sampler; that is expected here, so Optuna need not warn on
        # every trial.
        return GPSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"unknown sampler {spec.sampler!r}; accepted: {', '.join(SAMPLER_NAMES)}")


def create_study(
    storage: str | optuna.storages.BaseStorage, study_name: str, spec: ExperimentSpec
) -> optuna.Study:
    """Create the experiment's study, or load it (resume) if ``study_name`` exists.

    ``storage`` is an RDB URL (``sqlite:///...``, ``postgresql+psycopg://...``) or a storage
    object; the direction comes from the objective, the sampler from :func:`make_sampler`.
    """
    db = optuna.storages.RDBStorage(storage) if isinstance(storage, str) else storage
    study = optuna.create_study(
        storage=db,
        sampler=make_sampler(spec, storage=db),
        study_name=study_name,
        direction=spec.objective.direction,
        load_if_exists=True,
    )
    n = len(study.get_trials(deepcopy=False))
    if n:
        study.sampler = make_sampler(spec, storage=db, seed_offset=n)
    if SPEC_ATTR not in study.user_attrs:
        study.set_user_attr(SPEC_ATTR, spec.model_dump(mode="json"))
    return study


def _suggest(trial: optuna.trial.Trial, name: str, p: ParamSpec) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(name, list(p.choices or []))
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)


def ask_params(
    study: optuna.Study, spec: ExperimentSpec
) -> tuple[optuna.trial.Trial, dict[str, Any]]:
    """Ask for a trial and suggest the space define-by-run; return it and its active params.

    A conditional parameter is suggested only when its ``when`` holds for the values already
    suggested, so inactive parameters never reach the trial (nor its job). Raises
    :class:`GridExhausted` when a ``grid`` experiment has no point left.
    """
    sampler = study.sampler
    if isinstance(sampler, ConditionalGridSampler) and sampler.remaining(study) <= 0:
        raise GridExhausted(f"all {len(sampler.points)} grid points have been tried")
    trial = study.ask()
    params: dict[str, Any] = {}
    for name in spec.order():
        if spec.active(name, params):
            params[name] = _suggest(trial, name, spec.space[name])
    return trial, {n: params[n] for n in spec.space if n in params}


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that ended (COMPLETE, PRUNED, FAIL), in number order."""
    return study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    )


__all__ = [
    "GRID_ATTR",
    "SAMPLER_NAMES",
    "SPEC_ATTR",
    "ConditionalGridSampler",
    "GridExhausted",
    "ask_params",
    "create_study",
    "distribution",
    "finished_trials",
    "make_sampler",
    "require_sampler",
]
