"""Fitting θ_sys to a job's observed iteration times (seed 000 §4.1, eq. 13).

The job records ``(nodes, replicas, m, s, T_grad, T_iter)`` for every configuration it ran and
refits whenever it sees a new one. We minimise the mean squared *log* error of eq. 12 (and of
T_grad when measured) with L-BFGS-B under the paper's bounds (α, β ≥ 0, γ ∈ [1, 10]). Log
error treats a 10 ms and a 10 s step alike; the analytic gradient keeps a fit near a
millisecond so the simulator can refit hundreds of jobs.

Parameters without evidence stay at optimistic priors, so the scheduler is willing to try
what the job has not tried yet: no multi-node observation → cross-node sync costs what
single-node sync costs; no multi-GPU observation → sync is free; one micro-batch size → the
fixed and per-sample compute costs split the observed time evenly (scaling the batch then looks
cheap). Together with the 2× cap (:func:`exploration_cap`) this is how a job explores.
A row may carry a micro-batch time only (``iter_time`` NaN): the halves of a one-replica
job's split measuring steps, which time a second size before the job changes its batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from coadapt.goodput.model import FloatArray, PerfParams

_TINY = 1e-8  # lower bound of α/β: keeps logs and ratios finite
_REG_GAMMA = 1e-3  # pulls γ towards 1 (α/β are easier to identify with little overlap)
_REG_RETRO = 1e-2  # prefers small retrogression β/α: optimistic about adding replicas


class FitError(ValueError):
    """The observations cannot be fitted (empty, non-positive or non-finite times)."""


@dataclass(frozen=True)
class Observations:
    """A job's throughput profile, one row per distinct configuration it ran."""

    num_nodes: FloatArray
    num_replicas: FloatArray
    local_bsz: FloatArray
    accum_steps: FloatArray
    iter_time: FloatArray  # T_iter: seconds per optimizer step, eq. 12; NaN: grad_time only
    grad_time: FloatArray  # T_grad: seconds per micro-batch pass; NaN where not measured

    @classmethod
    def build(
        cls,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        local_bsz: ArrayLike,
        iter_time: ArrayLike,
        accum_steps: ArrayLike | None = None,
        grad_time: ArrayLike | None = None,
    ) -> Observations:
        n = np.asarray(num_nodes, dtype=np.float64).ravel()
        size = n.size

        def col(x: ArrayLike | None, fill: float) -> FloatArray:
            if x is None:
                return np.full(size, fill)
            a = np.asarray(x, dtype=np.float64).ravel()
            if a.size != size:
                raise FitError(f"observation columns differ in length: {a.size} != {size}")
            return a

        obs = cls(
            num_nodes=n,
            num_replicas=col(num_replicas, 1.0),
            local_bsz=col(local_bsz, 1.0),
            accum_steps=col(accum_steps, 0.0),
            iter_time=col(iter_time, np.nan),
            grad_time=col(grad_time, np.nan),
        )
        if size == 0:
            raise FitError("no observations to fit; run the job at least one step first")
        measured = ~np.isnan(obs.grad_time)
        timed = ~np.isnan(obs.iter_time)
        if not np.all(timed | measured):
            raise FitError("every observation needs an iter_time or a grad_time")
        if not np.all(np.isfinite(obs.iter_time[timed])) or np.any(obs.iter_time[timed] <= 0):
            raise FitError("iter_time must be finite and > 0 where measured")
        if not np.all(np.isfinite(obs.grad_time[measured])) or np.any(obs.grad_time[measured] <= 0):
            raise FitError("grad_time must be finite and > 0 where measured")
        if not np.any(timed):
            raise FitError("no observation has an iter_time; run at least one optimizer step")
        if np.any(obs.num_nodes < 1) or np.any(obs.num_replicas < obs.num_nodes):
            raise FitError("need 1 <= num_nodes <= num_replicas in every observation")
        if np.any(obs.local_bsz < 1) or np.any(obs.accum_steps < 0):
            raise FitError("need local_bsz >= 1 and accum_steps >= 0 in every observation")
        return obs


def _predict_log_iter(
    x: FloatArray, obs: Observations
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """log T_iter and its gradient w.r.t. the 7 parameters; also T_grad."""
    ag, bg, al, bl, an, bn, g = x
    multi_node = obs.num_nodes > 1
    multi_gpu = obs.num_replicas > 1
    local = multi_gpu & ~multi_node
    retro = np.maximum(obs.num_replicas - 2, 0)
    tg = ag + bg * obs.local_bsz
    ts = np.where(multi_node, an + bn * retro, np.where(local, al + bl * retro, 0.0))
    tsg = ts**g
    tgg = tg**g
    ssum = tgg + tsg
    over = ssum ** (1.0 / g)
    total = obs.accum_steps * tg + over
    # d over / d tg = (tg / over)^(g-1);  d over / d ts = (ts / over)^(g-1)
    d_tg = obs.accum_steps + (tg / over) ** (g - 1)
    d_ts = np.where(ts > 0, (ts / over) ** (g - 1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ts_term = np.where(ts > 0, tsg * np.log(np.where(ts > 0, ts, 1.0)), 0.0)
    dlog_over_dg = -np.log(ssum) / g**2 + (tgg * np.log(tg) + log_ts_term) / (g * ssum)
    d_g = over * dlog_over_dg
    jac = np.zeros((7, obs.num_nodes.size))
    jac[0] = d_tg
    jac[1] = d_tg * obs.local_bsz
    jac[2] = np.where(local, d_ts, 0.0)
    jac[3] = np.where(local, d_ts * retro, 0.0)
    jac[4] = np.where(multi_node, d_ts, 0.0)
    jac[5] = np.where(multi_node, d_ts * retro, 0.0)
    jac[6] = d_g
    return np.log(total), jac / total, tg


def _objective(
    x: FloatArray, obs: Observations, regularization: float = 1.0
) -> tuple[float, FloatArray]:
    log_pred, dlog, tg = _predict_log_iter(x, obs)
    # Rows with a micro-batch time only (the halves of a split measuring step) add to the
    # T_grad term alone; they cost a row of ones in a mask, not a second code path.
    timed = ~np.isnan(obs.iter_time)
    r1 = np.where(timed, log_pred - np.log(np.where(timed, obs.iter_time, 1.0)), 0.0)
    n1 = int(np.count_nonzero(timed))
    value = float(np.sum(r1**2)) / n1
    grad = 2.0 * (dlog @ r1) / n1
    measured = ~np.isnan(obs.grad_time)
    if np.any(measured):
        r2 = np.log(tg[measured]) - np.log(obs.grad_time[measured])
        value += float(np.mean(r2**2))
        coef = 2.0 * r2 / tg[measured] / r2.size
        grad[0] += np.sum(coef)
        grad[1] += np.sum(coef * obs.local_bsz[measured])
    if regularization > 0:
        _ag, _bg, al, bl, an, bn, g = x
        rg, rr = regularization * _REG_GAMMA, regularization * _REG_RETRO
        value += rg * (g - 1.0) ** 2 + rr * ((bn / an) ** 2 + (bl / al) ** 2)
        grad[6] += 2.0 * rg * (g - 1.0)
        grad[5] += 2.0 * rr * bn / an**2
        grad[4] -= 2.0 * rr * bn**2 / an**3
        grad[3] += 2.0 * rr * bl / al**2
        grad[2] -= 2.0 * rr * bl**2 / al**3
    return value, grad


def fit_perf_params(
    obs: Observations,
    regularization: float = 1.0,
    initial: PerfParams | None = None,
    *,
    exact_one_replica: bool = False,
) -> PerfParams:
    """Fit θ_sys to a job's observations by L-BFGS-B on the mean squared log error.

    ``exact_one_replica``: where every row ran on one replica, minimise the same objective
    by Gauss-Newton on (α, β) instead (:func:`_fit_one_replica`, ~0.16 ms against 2-3 ms;
    the training library's re-tunes use it). The simulator keeps L-BFGS-B: the two fits
    differ only within L-BFGS-B's stopping tolerance, yet that moved one artifact workload's
    simulated JCT by 7% (the schedule is chaotic in the fits' last digits), and its stored
    results stay comparable run to run.

    ``regularization`` scales two small priors (γ near 1, small retrogression β/α) that
    keep fits on few observations optimistic and well-posed; 0 gives the plain least-squares
    fit, which recovers θ_sys exactly from noiseless observations. ``initial`` (the job's
    previous fit) warm-starts the search: a job refits after each new configuration, and one
    new point rarely moves θ_sys far, so the warm start converges in a few iterations.
    """
    # Reference time scale of one micro-batch, for the starting point and the priors.
    measured = ~np.isnan(obs.grad_time)
    base = (
        float(np.mean(obs.grad_time[measured]))
        if np.any(measured)
        else float(np.nanmean(obs.iter_time / (obs.accum_steps + 1)))
    )
    mean_bsz = float(np.mean(obs.local_bsz))
    x0 = np.array(
        [base / 2, base / 2 / mean_bsz, base / 10, base / 100, base / 10, base / 100, 1.0 + 1e-3]
    )
    lower = np.array([_TINY] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [10.0])

    def fix(i: int, value: float) -> None:
        x0[i] = lower[i] = upper[i] = value

    if np.unique(obs.local_bsz).size == 1:
        # One micro-batch size cannot separate fixed from per-sample cost: split evenly.
        fix(0, base / 2)
    multi_node = obs.num_nodes > 1
    single_node_multi = (obs.num_nodes == 1) & (obs.num_replicas > 1)
    if not np.any(multi_node):
        fix(4, _TINY)
        fix(5, _TINY)
    if not np.any(single_node_multi):
        fix(2, _TINY)
        fix(3, _TINY)
    if not np.any(obs.num_replicas > 2):
        fix(3, _TINY)
        fix(5, _TINY)
    if initial is not None:
        warm = initial.as_array()
        usable = (lower < upper) & (warm > 10 * _TINY) & np.isfinite(warm)
        usable[6] = lower[6] < upper[6]
        x0 = np.where(usable, warm, x0)
    x0 = np.clip(x0, lower, upper)
    if exact_one_replica and np.all(obs.num_replicas == 1):
        # One replica: no sync term, so T = (s + 1)(α + β m) and γ has no data gradient.
        # Two parameters at most: a projected Gauss-Newton in plain Python is ~10x cheaper
        # than L-BFGS-B through SciPy (2-3 ms), and a short job re-fits after each of its
        # batch changes: 3 fits were a fifth of the cancer MLP's 70-step run (issue 19).
        x = x0.copy()
        x[0], x[1] = _fit_one_replica(obs, x0[0], x0[1], lower[0] == upper[0])
        if regularization > 0:
            x[6] = 1.0  # the γ prior's optimum; the data cannot move it
        return _optimistic_cross_node(x, obs)
    # Optimise in units of the starting point: α, β and γ then all move on a scale of ~1,
    # which L-BFGS-B converges on in a few dozen evaluations instead of hundreds.
    unit = np.where(x0 > _TINY, x0, np.maximum(np.abs(x0), 1.0))
    unit[6] = 1.0

    def scaled(u: FloatArray) -> tuple[float, FloatArray]:
        value, grad = _objective(u * unit, obs, regularization)
        return value, grad * unit

    import scipy.optimize  # deferred: a training replica imports this module, rarely fits

    result = scipy.optimize.minimize(
        scaled,
        x0 / unit,
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(lower / unit, upper / unit, strict=True)),
    )
    return _optimistic_cross_node(np.asarray(result.x, dtype=np.float64) * unit, obs)


def _optimistic_cross_node(x: FloatArray, obs: Observations) -> PerfParams:
    if not np.any(obs.num_nodes > 1):
        # Optimistic but not absurd: crossing nodes is at least as slow as staying on one.
        x[4] = max(x[4], x[2] * 1.1)
        x[5] = max(x[5], x[3] * 1.1)
    return PerfParams.from_array(x)


def _fit_one_replica(
    obs: Observations, alpha: float, beta: float, alpha_fixed: bool
) -> tuple[float, float]:
    """(α, β) minimising the one-replica objective of :func:`_objective` (the mean squared
    log error of (s + 1)(α + β m) against T_iter, plus that of α + β m against T_grad), by
    Gauss-Newton with a halving line search, α, β >= ``_TINY`` (a bound is held while the
    gradient pushes into it); ``alpha_fixed`` when one micro-batch size leaves α at its prior.
    """
    rows: list[tuple[float, float, float]] = []  # (m, log target, weight)
    timed = ~np.isnan(obs.iter_time)
    measured = ~np.isnan(obs.grad_time)
    n1, n2 = int(np.count_nonzero(timed)), int(np.count_nonzero(measured))
    for i in range(obs.local_bsz.size):
        m = float(obs.local_bsz[i])
        if timed[i]:
            rows.append((m, math.log(obs.iter_time[i] / (obs.accum_steps[i] + 1.0)), 1.0 / n1))
        if measured[i]:
            rows.append((m, math.log(obs.grad_time[i]), 1.0 / n2))

    def loss(a: float, b: float) -> float:
        return sum(w * (math.log(a + b * m) - y) ** 2 for m, y, w in rows)

    a, b = max(alpha, _TINY), max(beta, _TINY)
    f = loss(a, b)
    for _ in range(100):
        g0 = g1 = h00 = h01 = h11 = 0.0
        for m, y, w in rows:
            t = a + b * m
            r, j0, j1 = math.log(t) - y, 1.0 / t, m / t
            g0 += w * r * j0
            g1 += w * r * j1
            h00 += w * j0 * j0
            h01 += w * j0 * j1
            h11 += w * j1 * j1
        free_a = not alpha_fixed and not (a <= _TINY and g0 > 0)
        free_b = not (b <= _TINY and g1 > 0)
        da = db = 0.0
        det = h00 * h11 - h01 * h01
        if free_a and free_b and det > 1e-12 * h00 * h11:
            da, db = -(h11 * g0 - h01 * g1) / det, -(h00 * g1 - h01 * g0) / det
        elif free_b and h11 > 0:
            db = -g1 / h11
        elif free_a and h00 > 0:
            da = -g0 / h00
        else:
            break
        step = 1.0
        while step > 1e-12:
            na, nb = max(a + step * da, _TINY), max(b + step * db, _TINY)
            nf = loss(na, nb)
            if nf < f:
                break
            step /= 2
        else:
            break  # no step lowers the loss: at the minimum (to rounding)
        done = f - nf <= 1e-15 * f
        a, b, f = na, nb, nf
        if done:
            break
    return a, b


#: The columns of a job's reported profile table (``coadapt.train.profile``) the fit reads.
PROFILE_KEYS = ("nodes", "replicas", "local_bsz", "accum_steps", "iter_time")
#: Distinct profiles whose fit is kept (a few per active job is plenty).
PROFILE_CACHE_SIZE = 4096

ProfileKey = tuple[tuple[float, ...], ...]


def profile_key(rows: Any) -> ProfileKey:
    """The usable rows of a reported profile table as hashable data: the profile's version.

    Rows that are not mappings or lack a finite number in a :data:`PROFILE_KEYS` column are
    left out (a sender may omit or garble a row; the others still count). Equal keys mean the
    job reported nothing new, so its fit can be reused.
    """
    if not isinstance(rows, list):
        return ()
    out = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        vals = [row.get(k) for k in PROFILE_KEYS]
        nums = [
            float(v)
            for v in vals
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ]
        if len(nums) == len(PROFILE_KEYS):
            out.append(tuple(nums))
    return tuple(out)


@functools.lru_cache(maxsize=PROFILE_CACHE_SIZE)
def _fit_profile(key: ProfileKey) -> PerfParams | None:
    try:
        obs = Observations.build(
            [r[0] for r in key],
            [r[1] for r in key],
            [r[2] for r in key],
            [r[4] for r in key],
            accum_steps=[r[3] for r in key],
        )
        return fit_perf_params(obs)
    except (FitError, ValueError):
        return None


def fit_profile(rows: Any) -> PerfParams | None:
    """θ_sys fitted on a job's reported profile table, or None when it has no usable rows or
    cannot be fitted.

    The controller asks for a job's θ_sys every scheduling round and on every dashboard
    request, while the profile changes only when the job reports a new configuration; the fit
    (tens of milliseconds) is therefore cached by :func:`profile_key` and runs once per
    profile version. Thread-safe (the API and the reconciler ask concurrently).
    """
    key = profile_key(rows)
    return _fit_profile(key) if key else None


def exploration_cap(max_gpus_held: int, max_replicas: int) -> int:
    """Most GPUs a job may get: 2× the most it ever held (seed 000 §4.1), within its max.

    A model fitted on small allocations extrapolates badly; growing at most 2× per step lets
    the job measure before the scheduler bets on it.
    """
    return max(1, min(max_replicas, 2 * max(max_gpus_held, 0) if max_gpus_held > 0 else 1))
