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


def _scipy_one_replica(obs: Observations, alpha_fixed: float | None) -> float:
    """The lowest objective L-BFGS-B finds over (α, β) from a few starts (the general path's
    method, run here directly): what the one-replica fast path must match or beat."""
    import scipy.optimize

    base = float(np.nanmean(obs.iter_time))
    best = math.inf
    for start in (0.5, 0.1, 0.9):
        a0 = base * start if alpha_fixed is None else alpha_fixed
        b0 = base * (1 - start) / float(np.mean(obs.local_bsz))
        unit = np.array([a0, b0])

        def f(u: np.ndarray, unit: np.ndarray = unit) -> tuple[float, np.ndarray]:
            a = unit[0] if alpha_fixed is not None else u[0] * unit[0]
            x = np.array([a, u[1] * unit[1], 1e-8, 1e-8, 1.1e-8, 1.1e-8, 1.0])
            value, grad = _objective(x, obs, 0.0)
            g = grad[:2] * unit
            if alpha_fixed is not None:
                g[0] = 0.0
            return value, g

        lo = 1e-8 / unit
        bounds = [(float(lo[0]), None), (float(lo[1]), None)]
        res = scipy.optimize.minimize(f, np.ones(2), jac=True, method="L-BFGS-B", bounds=bounds)
        best = min(best, float(res.fun))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_one_replica_fit_finds_the_least_squares_optimum(seed: int) -> None:
    """At one replica the fit is a two-parameter Gauss-Newton, not L-BFGS-B (10x cheaper;
    a short job re-fits after every batch change): its fits are as good as L-BFGS-B's, on
    noisy steps, accumulation, micro-batch-only rows, a flat step cost (β at its bound) and
    one batch size (α at its prior)."""
    rng = np.random.default_rng(seed)
    kind = seed % 4
    alpha = float(rng.uniform(1e-4, 5e-3))
    beta = 0.0 if kind == 2 else float(alpha * rng.uniform(1e-3, 0.2))
    sizes = [32.0] if kind == 3 else sorted(rng.choice([8, 16, 32, 53, 64, 128], 3, False))
    m = np.array(sizes, dtype=float)
    s = np.array([0.0] * len(sizes)) if kind != 1 else rng.integers(0, 3, len(sizes)) * 1.0
    noise = np.exp(rng.normal(0, 0.05, len(sizes)))
    t = (s + 1) * (alpha + beta * m) * noise
    grad = np.full(len(sizes), np.nan)
    if kind == 0:  # the halves of a split step: micro-batch times only
        m = np.append(m, m[0] // 2)
        s, t = np.append(s, 0.0), np.append(t, np.nan)
        grad = np.append(grad, (alpha + beta * m[-1]) * float(rng.uniform(0.95, 1.05)))
    obs = Observations.build(np.ones_like(m), np.ones_like(m), m, t, s, grad)
    fitted = fit_perf_params(obs, exact_one_replica=True)
    x = fitted.as_array()
    assert fitted.gamma == 1.0 and fitted.alpha_local == pytest.approx(1e-8)
    ours = _objective(x, obs, 0.0)[0]
    alpha_fixed = x[0] if kind == 3 else None
    assert ours <= _scipy_one_replica(obs, alpha_fixed) * (1 + 1e-6) + 1e-12
    if kind == 3:
        assert fitted.alpha_grad == pytest.approx(float(np.nanmean(t)) / 2)
    warm = fit_perf_params(obs, initial=fitted, exact_one_replica=True)  # same fit
    assert warm.alpha_grad == pytest.approx(fitted.alpha_grad, rel=1e-6)
    assert warm.beta_grad == pytest.approx(fitted.beta_grad, rel=1e-6, abs=1e-9)
