"""Fitting θ_sys: recovery from noiseless observations, optimistic priors, input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.goodput import (
    FitError,
    Observations,
    PerfParams,
    exploration_cap,
    fit_perf_params,
    grad_time,
    iter_time,
)
from coadapt.goodput import fit as fit_mod
from coadapt.goodput.fit import _objective, fit_profile, profile_key

TRUE = PerfParams(0.02, 0.001, 0.05, 0.005, 0.2, 0.02, 2.0)
CONFIGS = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 4), (2, 8), (4, 16)]


def _observations(params: PerfParams, configs: list[tuple[int, int]]) -> Observations:
    rows = [(n, r, m) for n, r in configs for m in (16, 64, 128)]
    n, r, m = (np.array(col, dtype=float) for col in zip(*rows, strict=False))
    s = np.zeros_like(n)
    return Observations.build(n, r, m, iter_time(params, n, r, m, s), s, grad_time(params, m))


def test_fit_recovers_known_parameters_from_noiseless_data() -> None:
    fitted = fit_perf_params(_observations(TRUE, CONFIGS), regularization=0.0)
    np.testing.assert_allclose(fitted.as_array(), TRUE.as_array(), rtol=2e-2)


def test_regularised_fit_still_predicts_well() -> None:
    obs = _observations(TRUE, CONFIGS)
    fitted = fit_perf_params(obs)
    pred = iter_time(fitted, obs.num_nodes, obs.num_replicas, obs.local_bsz, obs.accum_steps)
    np.testing.assert_allclose(pred, obs.iter_time, rtol=0.08)


def test_analytic_gradient_matches_finite_differences() -> None:
    obs = _observations(TRUE, CONFIGS)
    x = np.array([0.03, 0.002, 0.04, 0.004, 0.1, 0.01, 1.7])
    _, grad = _objective(x, obs)
    num = np.zeros(7)
    for i in range(7):
        e = np.zeros(7)
        e[i] = 1e-7
        num[i] = (_objective(x + e, obs)[0] - _objective(x - e, obs)[0]) / 2e-7
    np.testing.assert_allclose(grad, num, rtol=1e-4, atol=1e-6)


def test_single_gpu_observations_keep_sync_optimistic() -> None:
    fitted = fit_perf_params(_observations(TRUE, [(1, 1)]))
    # No evidence of synchronisation yet: it must look (almost) free, so the scheduler tries.
    assert fitted.alpha_local < 1e-6 and fitted.alpha_node < 1e-6
    assert fitted.alpha_node >= fitted.alpha_local


def test_without_multi_node_data_cross_node_is_at_least_local() -> None:
    fitted = fit_perf_params(_observations(TRUE, [(1, 1), (1, 2), (1, 4)]))
    assert fitted.alpha_node >= fitted.alpha_local
    assert fitted.beta_node >= fitted.beta_local


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_nodes": [], "num_replicas": [], "local_bsz": [], "iter_time": []}, "no observ"),
        (
            {"num_nodes": [1], "num_replicas": [1], "local_bsz": [8], "iter_time": [0.0]},
            "iter_time",
        ),
        (
            {"num_nodes": [2], "num_replicas": [1], "local_bsz": [8], "iter_time": [1.0]},
            "num_nodes",
        ),
        (
            {"num_nodes": [1, 1], "num_replicas": [1], "local_bsz": [8], "iter_time": [1.0]},
            "length",
        ),
    ],
)
def test_bad_observations_are_rejected(kwargs: dict[str, list[float]], message: str) -> None:
    with pytest.raises(FitError, match=message):
        Observations.build(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("held", "maximum", "expected"), [(0, 64, 1), (1, 64, 2), (4, 64, 8), (40, 64, 64), (3, 4, 4)]
)
def test_exploration_cap_is_twice_the_most_held(held: int, maximum: int, expected: int) -> None:
    assert exploration_cap(held, maximum) == expected


def _profile(ks: tuple[int, ...]) -> list[dict[str, object]]:
    return [
        {
            "nodes": 1,
            "replicas": k,
            "local_bsz": 32,
            "accum_steps": 0,
            "iter_time": 0.04 + 0.004 * k,
        }
        for k in ks
    ]


def test_profile_fit_runs_once_per_profile_version(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = fit_mod.fit_perf_params

    def counting(obs: Observations, *args: object, **kwargs: object) -> PerfParams:
        calls.append(obs.num_nodes.size)
        return real(obs)

    monkeypatch.setattr(fit_mod, "fit_perf_params", counting)
    fit_mod._fit_profile.cache_clear()
    first = fit_profile(_profile((1, 2)))
    again = fit_profile(_profile((1, 2)))  # the same data reported again: no refit
    assert first is not None and again == first and calls == [2]
    grown = fit_profile(_profile((1, 2, 4)))  # a new configuration: one refit
    assert grown is not None and calls == [2, 3]
    fit_mod._fit_profile.cache_clear()


def test_profile_key_skips_unusable_rows() -> None:
    rows = [*_profile((1,)), {**_profile((2,))[0], "nodes": True}, "junk", {"nodes": 1}]
    rows.append({**_profile((4,))[0], "iter_time": math.inf})
    assert profile_key(rows) == ((1.0, 1.0, 32.0, 0.0, 0.044),)
    assert profile_key(None) == () and fit_profile([]) is None and fit_profile("x") is None
    bad = [{**r, "iter_time": -1.0} for r in _profile((1, 2))]
    assert fit_profile(bad) is None  # not fittable: no model rather than an error


def test_micro_batch_only_rows_measure_the_split_the_prior_guessed() -> None:
    """One whole-step size plus the halves of a split step (micro-batch times only, NaN
    ``iter_time``): the fit recovers fixed and per-sample cost instead of splitting evenly."""
    alpha, beta = 1e-3, 1e-5
    t32, t16 = alpha + beta * 32, alpha + beta * 16
    obs = Observations.build([1, 1], [1, 1], [32, 16], [t32, np.nan], [0, 0], [t32, t16])
    fitted = fit_perf_params(obs)
    assert fitted.alpha_grad == pytest.approx(alpha, rel=1e-2)
    assert fitted.beta_grad == pytest.approx(beta, rel=5e-2)
    prior = fit_perf_params(Observations.build([1], [1], [32], [t32], [0], [t32]))
    assert prior.alpha_grad == pytest.approx(t32 / 2)  # what the job believed before


def test_every_row_needs_some_time_and_one_row_a_step_time() -> None:
    with pytest.raises(FitError, match="iter_time or a grad_time"):
        Observations.build([1, 1], [1, 1], [32, 16], [1e-3, np.nan], [0, 0], [1e-3, np.nan])
    with pytest.raises(FitError, match="no observation has an iter_time"):
        Observations.build([1], [1], [16], [np.nan], [0], [1e-3])
    with pytest.raises(FitError, match="grad_time must be finite"):
        Observations.build([1], [1], [16], [1e-3], [0], [np.inf])
