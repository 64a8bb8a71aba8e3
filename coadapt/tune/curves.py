"""Learning-curve extrapolation for the ``curve`` early-stopping rule (SpotTune's EarlyCurve).

A trial's metric curve ``[(step, value), ...]`` is fitted by several saturating parametric
families (least squares, :func:`scipy.optimize.least_squares`, a few starts each):

=============  =====================================  ==========================================
family         form (x = step, c = the asymptote)     why
=============  =====================================  ==========================================
``pow3``       c − a·x^(−α)                           power-law learning curves (Domhan et al.)
``exp3``       c − a·e^(−b·x)                         fast geometric convergence
``log-power``  c − a / (1 + (x/x₀)^k)                 sigmoid in log x (MMF / Hill): slow starts
``weibull``    c − a·e^(−(b·x)^k)                     flexible knee
``inv-quad``   c + a / (1 + b·x + d·x²)               SpotTune's EarlyCurve stage (eq. 2.3)
=============  =====================================  ==========================================

``a`` is free in sign, so the families fit rising (accuracy) and falling (loss) curves alike.
The prediction at ``at_step`` is a weighted mean of the families' predictions, each weighted
by ``exp(−BIC/2)`` (fit quality against parameter count). Its uncertainty adds up the spread
between the families, the residual noise (inflated with the extrapolation distance) and, for
very short curves, a share of the curve's observed range; ``low``/``high`` are ±2 standard
deviations.

Assumptions: the metric saturates (no phase changes after the fitted part; a learning-rate
drop later in training can still improve it, which is why ``high`` is generous); steps are
increasing and positive after a shift (a curve starting at step 0 is shifted by its first
spacing); three points are the minimum, and the estimate is honest about being rough there.
Fits whose prediction wanders more than ten observed ranges per horizon from the last value
are discarded; with none left the prediction is the last value with a wide band.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

Curve = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class CurvePrediction:
    """A curve's predicted value at a later step: the mean and a ±2σ band."""

    mean: float
    low: float
    high: float


_Model = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class _Family:
    name: str
    model: _Model
    #: Starting points as functions of (last value, first value) in normalised units.
    starts: tuple[tuple[float, ...], ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]


def _pow3(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    c, a, alpha = p
    return np.asarray(c - a * x ** (-alpha))


def _exp3(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    c, a, b = p
    return np.asarray(c - a * np.exp(-b * x))


def _logpower(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    c, a, logx0, k = p
    return np.asarray(c - a / (1.0 + (x / math.exp(logx0)) ** k))


def _weibull(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    c, a, b, k = p
    return np.asarray(c - a * np.exp(-((b * x) ** k)))


def _invquad(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    c, a, b, d = p
    return np.asarray(c + a / (1.0 + b * x + d * x * x))


_INF = np.inf
#: Parameters in normalised units: x/x_last in (0, 1], y scaled to a unit range.
_FAMILIES: tuple[_Family, ...] = (
    _Family(
        "pow3",
        _pow3,
        ((0.2, 1.0, 0.5), (1.0, 2.0, 1.5), (0.0, 0.5, 0.2)),
        (-_INF, -_INF, 1e-3),
        (_INF, _INF, 5.0),
    ),
    _Family(
        "exp3",
        _exp3,
        ((0.1, 3.0, 3.0), (0.5, 2.0, 1.0), (0.0, 10.0, 10.0)),
        (-_INF, -_INF, 1e-3),
        (_INF, _INF, 100.0),
    ),
    _Family(
        "log-power",
        _logpower,
        ((0.2, 1.5, math.log(0.2), 1.0), (1.0, 2.0, math.log(0.5), 2.0)),
        (-_INF, -_INF, math.log(1e-4), 0.1),
        (_INF, _INF, math.log(1e3), 10.0),
    ),
    _Family(
        "weibull",
        _weibull,
        ((0.1, 2.0, 3.0, 1.0), (0.5, 2.0, 1.0, 0.5)),
        (-_INF, -_INF, 1e-3, 0.1),
        (_INF, _INF, 100.0, 5.0),
    ),
    _Family(
        "inv-quad",
        _invquad,
        ((0.1, -2.0, 5.0, 5.0), (0.5, -1.0, 1.0, 1.0)),
        (-_INF, -_INF, 0.0, 0.0),
        (_INF, _INF, 1e4, 1e4),
    ),
)


def _clean(curve: Curve) -> tuple[np.ndarray, np.ndarray]:
    pts = sorted(
        (float(s), float(v))
        for s, v in curve
        if math.isfinite(float(s)) and math.isfinite(float(v))
    )
    # One value per step (the last reported wins).
    by_step = dict(pts)
    xs = np.array(sorted(by_step))
    ys = np.array([by_step[s] for s in xs])
    return xs, ys


def extrapolate(curve: Curve, at_step: float) -> CurvePrediction:
    """Predict the curve's value at ``at_step`` from its ``(step, value)`` points.

    Needs at least one finite point (one or two give the last value with a band as wide as
    the data allow); three or more are fitted by the ensemble described in the module.
    """
    xs, ys = _clean(curve)
    if len(xs) == 0:
        raise ValueError("cannot extrapolate an empty curve")
    last = float(ys[-1])
    span = float(np.ptp(ys)) if len(ys) > 1 else 0.0
    scale = max(span, 1e-9 * max(1.0, abs(last)))
    if len(xs) < 3 or span == 0.0:
        width = 2.0 * scale if len(xs) < 3 else 0.0
        return CurvePrediction(last, last - width, last + width)

    shift = 0.0
    if xs[0] <= 0:
        shift = float(np.min(np.diff(xs))) - xs[0]
    x_last = float(xs[-1] + shift)
    x = (xs + shift) / x_last
    target = (float(at_step) + shift) / x_last
    horizon = max(target, 1.0)
    y = (ys - last) / scale  # last point at 0, unit range
    n = len(x)

    preds, bics, sigmas = [], [], []
    for fam in _FAMILIES:
        fit = _fit(fam, x, y)
        if fit is None:
            continue
        params, rss = fit
        pred = float(fam.model(params, np.array([target]))[0])
        if not math.isfinite(pred) or abs(pred) > 10.0 * horizon:
            continue  # the fit runs away outside the data
        k = len(params)
        # Floor the residual at 0.1% of the range: an exact fit of 3 points is not certainty.
        rss = max(rss, n * 1e-6)
        preds.append(pred)
        bics.append(n * math.log(rss / n) + k * math.log(n))
        sigmas.append(math.sqrt(rss / max(n - k, 1)))
    if not preds:
        width = 2.0 * scale * horizon
        return CurvePrediction(last, last - width, last + width)

    b = np.array(bics)
    w = np.exp(-0.5 * (b - b.min()))
    w /= w.sum()
    p = np.array(preds)
    mean = float(w @ p)
    between = float(w @ (p - mean) ** 2)
    resid = float(w @ np.array(sigmas) ** 2) * horizon
    short = (max(0.0, (8 - n) / 8) * 0.25) ** 2 * horizon  # few points: rough by construction
    sd = math.sqrt(between + resid + short)
    return CurvePrediction(
        last + mean * scale, last + (mean - 2 * sd) * scale, last + (mean + 2 * sd) * scale
    )


def _fit(fam: _Family, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The best of ``fam``'s starts: (parameters, residual sum of squares), or None."""
    best: tuple[np.ndarray, float] | None = None
    lo, hi = np.array(fam.lower), np.array(fam.upper)
    y0 = float(y[0])
    for start in fam.starts:
        p0 = np.array(start, dtype=float)
        # Starts are given for a rising curve from -1 to 0; scale the amplitude to this one.
        p0[1] *= -y0 if y0 != 0 else 1.0
        if fam.name == "inv-quad":
            p0[1] = y0 - p0[0]
        finite_lo, finite_hi = np.isfinite(lo), np.isfinite(hi)
        p0[finite_lo] = np.maximum(p0[finite_lo], lo[finite_lo] + 1e-6)
        p0[finite_hi] = np.minimum(p0[finite_hi], hi[finite_hi] - 1e-6)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # Overflowing trial points inside the optimiser are rejected by it; not our error.
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                res = least_squares(
                    lambda p: fam.model(p, x) - y,
                    p0,
                    bounds=(lo, hi),
                    method="trf",
                    max_nfev=100 * len(p0),
                )
            except (ValueError, FloatingPointError):
                continue
        if not np.all(np.isfinite(res.fun)):
            continue
        rss = float(np.sum(res.fun**2))
        if best is None or rss < best[1]:
            best = (res.x, rss)
    return best


__all__ = ["Curve", "CurvePrediction", "extrapolate"]
