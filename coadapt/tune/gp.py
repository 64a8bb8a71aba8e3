"""``gp-ei``: Bayesian optimisation with a Gaussian process and expected improvement.

Why our own and not :class:`optuna.samplers.GPSampler`: neither meets ``sampler_check``'s
target (Hartmann-6 within 1% in 100 trials) on every seed. Over seeds 0-19 Optuna 5's sampler
missed it on 4 (6, 10, 14, 15), this one on 3 (6, 10, 15): both settle in the −3.20 local
basin (this one on seeds 6 and 10 at −2.869, on that basin's x2 = 1 face). That basin is the
largest (flat along x3 and x5), the ARD fit learns exactly that and the global basin is
narrow; on those seeds no point of the 100 lands on its slope (the global term's activation
stays below 0.23). Things that did not move the three misses: a length-scale cap or a stronger
prior, an EI margin (fixed, or every third ask), 20 random or Latin-hypercube start-up trials,
more candidates, a rank output transform, centring the prior mean on a high quantile, every
third ask random or EI-best of 100 random points, EI with the incumbent's basin left out, or
every third ask a local EI search around the best point of another basin (basins told apart
by descending the GP mean from the 30 best points), with or without every third ask random.
Owning the sampler keeps the method documented and its behaviour with pruned and running
trials ours. It is the textbook method:

* inputs mapped to the unit cube (log scale where the parameter says so), categoricals one-hot;
* a GP with a Matérn-5/2 ARD kernel on the standardised objective, its signal variance, noise
  and length scales fitted by maximising the log marginal likelihood (analytic gradients,
  L-BFGS-B, restarts from the previous fit and random points, a weak log-normal prior on the
  length scales so that 10 points cannot collapse them);
* optionally (``iso=True``) a second GP with one length scale shared by all inputs, the
  acquisition then being the two models' mean EI. Off by default: measured over seeds 0-19
  (``benchmarks/sampler_check.py --seeds 20``) it finishes the successful Hartmann-6 runs more
  precisely but misses the same three seeds, and needs a median 38.5 trials to reach Branin's
  1% band against 30.5 without it;
* expected improvement, computed in log space so it keeps a gradient far from the incumbent,
  maximised from the 16 best of a few thousand random candidates and perturbations of the
  best three points, all polished in one batched L-BFGS-B run (the starts are independent,
  so the summed objective separates); integer and stepped parameters are rounded afterwards.

The first ``n_startup_trials`` trials, and any parameter outside the intersection of the
finished trials' spaces (a conditional parameter), are sampled at random. Pruned trials take
the worst completed value (they were stopped for being bad, and their configurations should
not look unexplored); running trials are "kriging believers": their posterior mean is added as
if observed, so parallel asks spread out instead of proposing the same point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import ndtr
from threadpoolctl import threadpool_limits

_SQRT5 = math.sqrt(5.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
#: Bounds of the fitted hyper-parameters (log scale; inputs in [0,1], outputs standardised).
_LOG_LS = (math.log(0.01), math.log(20.0))
_LOG_SF2 = (math.log(0.05), math.log(20.0))
_LOG_NOISE = (math.log(1e-6), math.log(1.0))
#: Weak prior on length scales: log ℓ ~ N(log 0.5, 1.5²).
_LS_PRIOR_MU, _LS_PRIOR_SD = math.log(0.5), 1.5
#: Beyond this many observations keep the best half and the most recent half.
_MAX_POINTS = 300


# -- kernel and GP ------------------------------------------------------------------------------
def _matern(x1: np.ndarray, x2: np.ndarray, ls: np.ndarray, sf2: float) -> np.ndarray:
    d = (x1[:, None, :] - x2[None, :, :]) / ls
    r = np.sqrt(np.maximum(np.sum(d * d, axis=-1), 1e-300))
    return np.asarray(sf2 * (1 + _SQRT5 * r + 5.0 / 3.0 * r * r) * np.exp(-_SQRT5 * r))


def _neg_lml(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood (+ length-scale prior) and its gradient."""
    n, dim = x.shape
    ls = np.exp(theta[:dim])
    sf2, noise = math.exp(theta[dim]), math.exp(theta[dim + 1])
    diff2 = ((x[:, None, :] - x[None, :, :]) / ls) ** 2  # n × n × d
    r = np.sqrt(np.sum(diff2, axis=-1))
    e = np.exp(-_SQRT5 * r)
    k_sig = sf2 * (1 + _SQRT5 * r + 5.0 / 3.0 * r * r) * e
    k = k_sig + (noise + 1e-9) * np.eye(n)
    try:
        c, low = cho_factor(k, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = cho_solve((c, low), y, check_finite=False)
    k_inv = cho_solve((c, low), np.eye(n), check_finite=False)
    nll = 0.5 * float(y @ alpha) + float(np.sum(np.log(np.diag(c)))) + n * _LOG_SQRT_2PI
    w = np.outer(alpha, alpha) - k_inv  # d nll / dK = -w / 2
    grad = np.empty_like(theta)
    common = sf2 * 5.0 / 3.0 * (1 + _SQRT5 * r) * e  # dk/dlogℓ_i = common * diff2_i
    grad[:dim] = -0.5 * np.einsum("ij,ijk->k", w * common, diff2)
    grad[dim] = -0.5 * float(np.sum(w * k_sig))
    grad[dim + 1] = -0.5 * noise * float(np.trace(w))
    z = (theta[:dim] - _LS_PRIOR_MU) / _LS_PRIOR_SD
    nll += 0.5 * float(np.sum(z * z))
    grad[:dim] += z / _LS_PRIOR_SD
    return nll, grad


@dataclass
class _GP:
    x: np.ndarray
    ls: np.ndarray
    sf2: float
    noise: float
    chol: np.ndarray
    alpha: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, theta: np.ndarray) -> _GP:
        dim = x.shape[1]
        ls, sf2, noise = np.exp(theta[:dim]), math.exp(theta[dim]), math.exp(theta[dim + 1])
        k = _matern(x, x, ls, sf2) + (noise + 1e-9) * np.eye(len(x))
        chol = np.linalg.cholesky(k)
        alpha = cho_solve((chol, True), y, check_finite=False)
        return cls(x, ls, sf2, noise, chol, alpha)

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = _matern(xs, self.x, self.ls, self.sf2)
        mu = ks @ self.alpha
        v = solve_triangular(self.chol, ks.T, lower=True, check_finite=False)
        var = np.maximum(self.sf2 - np.sum(v * v, axis=0), 1e-12)
        return mu, var

    def predict_grad(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Mean, variance and their gradients (``m × dim``) at ``m`` points at once."""
        d = (xs[:, None, :] - self.x[None, :, :]) / self.ls  # m × n × dim
        r = np.sqrt(np.maximum(np.sum(d * d, axis=-1), 1e-300))
        e = np.exp(-_SQRT5 * r)
        ks = self.sf2 * (1 + _SQRT5 * r + 5.0 / 3.0 * r * r) * e  # m × n
        dks = -(self.sf2 * 5.0 / 3.0 * (1 + _SQRT5 * r) * e)[:, :, None] * d / self.ls
        mu = ks @ self.alpha
        dmu = np.einsum("mnd,n->md", dks, self.alpha)
        kinv_ks = cho_solve((self.chol, True), ks.T, check_finite=False)  # n × m
        var = np.maximum(self.sf2 - np.sum(ks * kinv_ks.T, axis=1), 1e-12)
        dvar = -2.0 * np.einsum("mnd,nm->md", dks, kinv_ks)
        return mu, var, dmu, dvar


def fit_hyperparameters(
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    start: np.ndarray | None = None,
    restarts: int = 2,
) -> np.ndarray:
    """Maximum a-posteriori kernel hyper-parameters ``[log ℓ_1..d, log σ², log noise]``."""
    dim = x.shape[1]
    bounds = [_LOG_LS] * dim + [_LOG_SF2, _LOG_NOISE]
    starts = [np.array([math.log(0.5)] * dim + [0.0, math.log(1e-3)])]
    if start is not None:
        starts.insert(0, np.clip(start, [b[0] for b in bounds], [b[1] for b in bounds]))
    for _ in range(restarts):
        starts.append(
            np.array(
                [
                    rng.uniform(lo, hi)
                    for lo, hi in [(math.log(0.05), math.log(2.0))] * dim
                    + [(-1.0, 1.0), (math.log(1e-5), math.log(1e-2))]
                ]
            )
        )
    best, best_f = starts[0], math.inf
    for s in starts:
        res = minimize(
            _neg_lml,
            s,
            args=(x, y),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"maxiter": 200},
        )
        if np.isfinite(res.fun) and res.fun < best_f:
            best, best_f = res.x, float(res.fun)
    return np.asarray(best)


def fit_isotropic(x: np.ndarray, y: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """MAP hyper-parameters with one length scale shared by all inputs, as a full ``theta``.

    Why: an ARD fit learns the basin it has sampled (an input that does not matter there gets a
    long length scale) and then sees no reason to look elsewhere; the shared-scale model stays
    uncertain away from the data and keeps EI's exploration honest.
    """
    dim = x.shape[1]

    def f(t: np.ndarray) -> tuple[float, np.ndarray]:
        nll, g = _neg_lml(np.concatenate([np.full(dim, t[0]), t[1:]]), x, y)
        return nll, np.concatenate([[g[:dim].sum()], g[dim:]])

    bounds = [_LOG_LS, _LOG_SF2, _LOG_NOISE]
    starts = [np.array([math.log(0.5), 0.0, math.log(1e-3)])]
    if start is not None:
        starts.insert(
            0,
            np.clip(
                np.array([start[:dim].mean(), start[dim], start[dim + 1]]),
                [b[0] for b in bounds],
                [b[1] for b in bounds],
            ),
        )
    best, best_f = starts[0], math.inf
    for s in starts:
        res = minimize(f, s, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 200})
        if np.isfinite(res.fun) and res.fun < best_f:
            best, best_f = res.x, float(res.fun)
    return np.concatenate([np.full(dim, best[0]), best[1:]])


# -- expected improvement -----------------------------------------------------------------------
def _log_h(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(φ(z) + zΦ(z)) and its derivative Φ(z)/h(z), stable for very negative z."""
    z = np.asarray(z, dtype=float)
    out, dout = np.empty_like(z), np.empty_like(z)
    big = z > -6.0
    zb = z[big]
    h = np.exp(-0.5 * zb * zb - _LOG_SQRT_2PI) + zb * ndtr(zb)
    h = np.maximum(h, 1e-300)
    out[big] = np.log(h)
    dout[big] = ndtr(zb) / h
    zs = z[~big]
    # h(z) ≈ φ(z)/z² (1 - 3/z²) for z → -∞ (the Mills ratio's asymptotic expansion).
    out[~big] = -0.5 * zs * zs - _LOG_SQRT_2PI - 2 * np.log(-zs) + np.log1p(-3 / zs**2)
    dout[~big] = -zs - 2 / zs
    return out, dout


def _log_ei_grad(
    gps: Sequence[_GP], xs: np.ndarray, best: float, xi: float
) -> tuple[np.ndarray, np.ndarray]:
    """log of the models' mean EI (minimisation) at ``m`` points, and its gradient."""
    vals, grads = [], []
    for gp in gps:
        mu, var, dmu, dvar = gp.predict_grad(xs)
        s = np.sqrt(var)
        z = (best - xi - mu) / s
        lh, dlh = _log_h(z)
        ds = dvar / (2 * s)[:, None]
        dz = (-dmu - z[:, None] * ds) / s[:, None]
        vals.append(lh + np.log(s))
        grads.append(dlh[:, None] * dz + ds / s[:, None])
    if len(gps) == 1:
        return vals[0], grads[0]
    lv = np.stack(vals)
    top = lv.max(axis=0)
    w = np.exp(lv - top)
    tot = w.sum(axis=0)
    grad = np.einsum("km,kmd->md", w / tot, np.stack(grads))
    return top + np.log(tot) - math.log(len(gps)), grad


def log_ei(gps: Sequence[_GP], xs: np.ndarray, best: float, xi: float) -> np.ndarray:
    """log of the models' mean EI (minimisation) at many points (no gradient)."""
    vals = []
    for gp in gps:
        mu, var = gp.predict(xs)
        s = np.sqrt(var)
        lh, _ = _log_h((best - xi - mu) / s)
        vals.append(lh + np.log(s))
    lv = np.stack(vals)
    top = lv.max(axis=0)
    return np.asarray(top + np.log(np.exp(lv - top).sum(axis=0)) - math.log(len(gps)))


def _neg_log_ei_batch(
    flat: np.ndarray, gps: Sequence[_GP], best: float, xi: float, full: np.ndarray, mask: np.ndarray
) -> tuple[float, np.ndarray]:
    """Minus the summed log EI of ``m`` independent starts (one L-BFGS-B run for all)."""
    xs = full.copy()
    xs[:, mask] = flat.reshape(len(full), -1)
    val, grad = _log_ei_grad(gps, xs, best, xi)
    return -float(val.sum()), -grad[:, mask].ravel()


# -- the sampler --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Dim:
    name: str
    dist: BaseDistribution
    start: int  # first column in the encoded space
    width: int  # 1, or the number of choices of a categorical


def _encode_value(dist: BaseDistribution, value: Any) -> list[float]:
    if isinstance(dist, CategoricalDistribution):
        idx = dist.to_internal_repr(value)
        return [1.0 if i == int(idx) else 0.0 for i in range(len(dist.choices))]
    assert isinstance(dist, FloatDistribution | IntDistribution)
    lo, hi, v = float(dist.low), float(dist.high), float(value)
    if dist.log:
        lo, hi, v = math.log(lo), math.log(hi), math.log(v)
    return [(v - lo) / (hi - lo)]


def _decode_value(dist: BaseDistribution, cols: np.ndarray) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(np.argmax(cols))]
    assert isinstance(dist, FloatDistribution | IntDistribution)
    u = float(np.clip(cols[0], 0.0, 1.0))
    lo, hi = float(dist.low), float(dist.high)
    v = (
        math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        if dist.log
        else lo + u * (hi - lo)
    )
    step = dist.step
    if isinstance(dist, IntDistribution):
        step = step or 1
        v = dist.low + round((v - dist.low) / step) * step
        return int(min(max(v, dist.low), dist.high))
    if step is not None:
        v = lo + round((v - lo) / step) * step
    return float(min(max(v, lo), hi))


class GPEISampler(BaseSampler):
    """Gaussian-process expected-improvement sampler (see the module docstring).

    ``n_startup_trials`` random trials come first; ``xi`` is the EI margin in standardised
    units (a little exploration); ``n_candidates``/``n_local`` size the acquisition search.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 10,
        xi: float = 0.0,
        n_candidates: int = 2000,
        n_local: int = 16,
        iso: bool = False,
        n_top: int = 3,
        fit_restarts: int = 2,
    ) -> None:
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._random = RandomSampler(seed=seed)
        self._space = IntersectionSearchSpace(include_pruned=True)
        self.n_startup_trials = n_startup_trials
        self.xi = xi
        self.n_candidates = n_candidates
        self.n_local = n_local
        self.iso = iso
        self.n_top = n_top
        self.fit_restarts = fit_restarts
        self._theta: np.ndarray | None = None
        self._theta_iso: np.ndarray | None = None

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        space = self._space.calculate(study)
        return {n: d for n, d in space.items() if not d.single()}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        # Matrices of a few hundred rows: BLAS threads only add contention with the trials.
        with threadpool_limits(limits=1):
            return self._sample(study, trial, search_space)

    def _sample(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        self._raise_error_if_multi_objective(study)
        trials = study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        )
        complete = [
            t
            for t in trials
            if t.state == TrialState.COMPLETE and all(n in t.params for n in search_space)
        ]
        if len(complete) < self.n_startup_trials:
            return {}
        dims, width = self._dims(search_space)
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        x_obs = np.array([self._encode(dims, width, t.params) for t in complete])
        y_obs = np.array([sign * float(t.value) for t in complete])  # type: ignore[arg-type]
        pruned = [
            t
            for t in trials
            if t.state == TrialState.PRUNED and all(n in t.params for n in search_space)
        ]
        if pruned:
            x_obs = np.vstack([x_obs] + [self._encode(dims, width, t.params) for t in pruned])
            y_obs = np.concatenate([y_obs, np.full(len(pruned), y_obs.max())])
        x_obs, y_obs = _thin(x_obs, y_obs)
        y = (y_obs - y_obs.mean()) / (float(y_obs.std()) or 1.0)
        self._theta = fit_hyperparameters(x_obs, y, self._rng, self._theta, self.fit_restarts)
        thetas = [self._theta]
        if self.iso:
            self._theta_iso = fit_isotropic(x_obs, y, self._theta_iso)
            thetas.append(self._theta_iso)
        gps = [_GP.fit(x_obs, y, th) for th in thetas]
        running = [
            t
            for t in trials
            if t.state == TrialState.RUNNING
            and t.number != trial.number
            and all(n in t.params for n in search_space)
        ]
        if running:  # kriging believer: pending points at their posterior mean
            x_run = np.array([self._encode(dims, width, t.params) for t in running])
            gps = [
                _GP.fit(np.vstack([x_obs, x_run]), np.concatenate([y, gp.predict(x_run)[0]]), th)
                for gp, th in zip(gps, thetas, strict=True)
            ]
        top = x_obs[np.argsort(y)[: self.n_top]]
        best_x = self._maximise_ei(gps, dims, width, float(y.min()), top, self.xi)
        return {d.name: _decode_value(d.dist, best_x[d.start : d.start + d.width]) for d in dims}

    # -- encoding --------------------------------------------------------------------------
    @staticmethod
    def _dims(space: dict[str, BaseDistribution]) -> tuple[list[_Dim], int]:
        dims, col = [], 0
        for name in sorted(space):
            dist = space[name]
            width = len(dist.choices) if isinstance(dist, CategoricalDistribution) else 1
            dims.append(_Dim(name, dist, col, width))
            col += width
        return dims, col

    @staticmethod
    def _encode(dims: Sequence[_Dim], width: int, params: dict[str, Any]) -> np.ndarray:
        out = np.empty(width)
        for d in dims:
            out[d.start : d.start + d.width] = _encode_value(d.dist, params[d.name])
        return out

    def _random_points(self, dims: Sequence[_Dim], width: int, n: int) -> np.ndarray:
        pts = self._rng.uniform(size=(n, width))
        for d in dims:
            if isinstance(d.dist, CategoricalDistribution):
                one = np.zeros((n, d.width))
                one[np.arange(n), self._rng.integers(d.width, size=n)] = 1.0
                pts[:, d.start : d.start + d.width] = one
        return pts

    def _maximise_ei(
        self,
        gps: Sequence[_GP],
        dims: Sequence[_Dim],
        width: int,
        best: float,
        top: np.ndarray,
        xi: float,
    ) -> np.ndarray:
        cont = np.zeros(width, dtype=bool)
        for d in dims:
            if not isinstance(d.dist, CategoricalDistribution):
                cont[d.start] = True
        cands = self._random_points(dims, width, self.n_candidates)
        # Candidates near the best few points: EI's optimum is often a small step from one.
        n_near = self.n_candidates // 4
        near = top[self._rng.integers(len(top), size=n_near)]
        for scale, part in zip((0.02, 0.1), np.array_split(np.arange(n_near), 2), strict=True):
            near[np.ix_(part, cont)] = np.clip(
                near[np.ix_(part, cont)]
                + self._rng.normal(scale=scale, size=(len(part), int(cont.sum()))),
                0.0,
                1.0,
            )
        cands = np.vstack([cands, near])
        scores = log_ei(gps, cands, best, xi)
        order = np.argsort(-scores)[: self.n_local]
        i0 = int(order[0])
        if not cont.any():
            return np.asarray(cands[i0])
        starts = cands[order]
        res = minimize(
            _neg_log_ei_batch,
            starts[:, cont].ravel(),
            args=(gps, best, xi, starts, cont),
            jac=True,
            method="L-BFGS-B",
            bounds=[(0.0, 1.0)] * (len(starts) * int(cont.sum())),
            options={"maxiter": 200},
        )
        opt = starts.copy()
        opt[:, cont] = np.clip(res.x.reshape(len(starts), -1), 0.0, 1.0)
        final = log_ei(gps, np.vstack([opt, starts]), best, xi)
        return np.asarray(np.vstack([opt, starts])[int(np.argmax(final))])


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most ``_MAX_POINTS`` observations: the best half and the most recent half."""
    if len(y) <= _MAX_POINTS:
        return x, y
    half = _MAX_POINTS // 2
    keep = set(np.argsort(y)[:half].tolist()) | set(range(len(y) - half, len(y)))
    idx = np.array(sorted(keep))
    return x[idx], y[idx]


__all__ = ["GPEISampler", "fit_hyperparameters", "fit_isotropic", "log_ei"]
