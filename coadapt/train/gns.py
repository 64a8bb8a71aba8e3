"""Unbiased gradient-noise statistics from gradients the job computes anyway.

Let G be the true (pre-conditioned) gradient and Σ the per-sample gradient covariance, so a
mean of b i.i.d. per-sample gradients has ``E|g_b|² = |G|² + tr(Σ)/b``. Training produces n
such "pieces" of b samples each — the K replicas' local gradients before the all-reduce, or
the s + 1 micro-batches of one replica, or the two halves of a step split to measure
(:func:`halves_estimate`), always at one set of weights — and their mean ḡ over
n·b samples, with ``E|ḡ|² = |G|² + tr(Σ)/(n b)``. Given p̂ = mean (or any one) of the piece
squared norms and ĝ = |ḡ|², the two equations solve to the unbiased estimators

    tr(Σ)^ = (p̂ − ĝ) / (1/b − 1/(n b)),       |G|²^ = ĝ − tr(Σ)^ / (n b).

Pre-conditioning (Adam's ``P = diag(1 / (sqrt(v̂) + ε))``) applies P to every piece first; the
same algebra then gives tr(PΣPᵀ) and |PG|². The PGNS is φ = tr(PΣPᵀ)/|PG|² (seed 000 eq. 6)
and :class:`coadapt.goodput.GradParams` wants ``var = tr/M0`` so that ``φ = M0·var/sqr``.
Single estimates are very noisy (and may be negative), so both are smoothed by an EMA with
bias correction and their ratio is taken only at the end (ratio of means, as AdaptDL does).
"""

from __future__ import annotations

from typing import Any

import torch

from coadapt.goodput import GradParams

_TINY = 1e-30


def estimate(
    piece_sqr: float, total_sqr: float, piece_bsz: float, num_pieces: float
) -> tuple[float, float]:
    """Unbiased (|G|², tr Σ) from piece and combined squared norms (see module doc)."""
    if num_pieces <= 1 or piece_bsz <= 0:
        raise ValueError("need at least two pieces of at least one sample each")
    b, n = float(piece_bsz), float(num_pieces)
    trace = (piece_sqr - total_sqr) / (1.0 / b - 1.0 / (n * b))
    sqr = total_sqr - trace / (n * b)
    return sqr, trace


def halves_estimate(
    piece_sqr: float, cross: float, total_sqr: float, first_bsz: float, second_bsz: float
) -> tuple[float, float]:
    """Unbiased (|G|², tr Σ) from one step split into two micro-batches of b1 and b2 samples.

    Takes |g1|², g1·ḡ and |ḡ|² (ḡ the step's gradient, the Gram matrix of g1 and ḡ), recovers
    g2 = (ḡ − w1 g1) / w2 with w_i = b_i / (b1 + b2), and uses both halves symmetrically:
    |G|²^ = g1·g2 and tr Σ^ = |g1 − g2|² / (1/b1 + 1/b2). Using the first piece alone (as
    :func:`estimate` does) adds (|g2|² − |g1|²)/2 to |G|²^, a term as noisy as the gradient
    noise itself; when the noise dwarfs |G|² (φ ≫ M), that term made the smoothed |G|² go
    negative on the examples (issue 19).
    """
    if first_bsz <= 0 or second_bsz <= 0:
        raise ValueError(f"need two non-empty halves, got {first_bsz} and {second_bsz}")
    w1 = first_bsz / (first_bsz + second_bsz)
    w2 = 1.0 - w1
    dot = (cross - w1 * piece_sqr) / w2  # g1·g2
    second_sqr = (total_sqr - 2.0 * w1 * cross + w1 * w1 * piece_sqr) / (w2 * w2)  # |g2|²
    diff = piece_sqr + second_sqr - 2.0 * dot  # |g1 − g2|²
    return dot, diff / (1.0 / first_bsz + 1.0 / second_bsz)


def consecutive_estimate(gram: list[list[float]], bsz: float) -> tuple[float, float]:
    """(|G|², tr Σ) from the 3x3 Gram matrix of three consecutive steps' gradients.

    No longer used by the library, kept to show its bias (``benchmarks/gns_check.py``): each
    step's noise ξ1 moves the next steps' weights, so E[g1·g2] = G1·G2 − η tr(HΣ)/b (more
    with momentum). On the examples, in training, |G|²^ read 0.03-0.9x and φ 2.3-31x the
    brute-force value (issue 19); :func:`halves_estimate` takes both pieces at one point.

    Consecutive steps see different weights: the true gradient drifts by D per step. Taking
    two steps as two pieces of one gradient (the old estimator) counts that drift as noise,
    tr Σ^ = tr Σ + b|D|²/2 and |G|²^ = |G|² − |D|²/4, which on the examples drove |G|²^ below
    zero and the noise scale to 1e32 once the LR grew (AdaScale then scaled linearly). With
    three steps g1, g2, g3 the second difference x = g2 − (g1 + g3)/2 cancels linear drift:
    E|x|² = 1.5 tr Σ / b, and the cross products are unbiased for |G|² without subtracting
    noise: E[g2·(g1 + g3)/2] = G2·(G1 + G3)/2.
    """
    if bsz <= 0:
        raise ValueError(f"need a batch of at least one sample, got {bsz}")
    (a, ab, ac), (_, b, bc), (_, _, c) = gram
    sqr = 0.5 * (ab + bc)
    second = b + 0.25 * (a + c + 2.0 * ac) - (ab + bc)
    return sqr, float(bsz) * second / 1.5


def sq_norm(tensors: list[torch.Tensor], pinv: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Σ |t / pinv|² over a list of tensors with fused (foreach) kernels, as a 0-d tensor."""
    if not tensors:
        return torch.zeros(())
    if pinv is not None:
        tensors = list(torch._foreach_div(tensors, pinv))
    norms = torch._foreach_norm(tensors)
    return torch.stack(list(norms)).square().sum()


class GradNoiseEMA:
    """Bias-corrected EMA of |G|² and tr Σ (per sample), and the standard errors of both;
    yields :class:`GradParams`.

    One measurement's |G|² is as noisy as the gradient noise itself (a dot product of two
    noisy halves), so an EMA over ~20 of them can still be off by a multiple: on the digits
    CNN the first readings gave φ = 324-903 where brute force says 30-44, the agent grew the
    batch, then shrank it when φ settled (issue 19). The errors let the agent act only on
    what the estimate can tell apart. The error of a weighted mean Σ wᵢxᵢ / W of readings
    with variance σ² is σ·sqrt(Σ wᵢ²) / W; σ² is the EMA's own second moment minus its mean²
    (drift of the true value over the window counts as noise: the errors err wide).
    """

    def __init__(self, smoothing: float = 0.9) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.sqr = 0.0
        self.trace = 0.0
        self.weight = 0.0  # 1 - smoothing**count, the bias correction
        self.count = 0
        self._held: tuple[float, float] | None = None  # the last values with |G|² > 0
        # Σ wᵢ xᵢ² of both readings, and Σ wᵢ², for the standard errors
        self.sqr2 = 0.0
        self.trace2 = 0.0
        self.weight2 = 0.0

    def update(self, sqr: float, trace: float) -> None:
        if not (abs(sqr) < float("inf") and abs(trace) < float("inf")):
            return  # a NaN/inf gradient (e.g. an AMP overflow) says nothing about noise
        a = self.smoothing
        self.sqr = a * self.sqr + (1 - a) * sqr
        self.trace = a * self.trace + (1 - a) * trace
        self.weight = a * self.weight + (1 - a)
        self.sqr2 = a * self.sqr2 + (1 - a) * sqr * sqr
        self.trace2 = a * self.trace2 + (1 - a) * trace * trace
        self.weight2 = a * a * self.weight2 + (1 - a) ** 2
        self.count += 1
        if self.sqr / self.weight > _TINY:
            self._held = (self.sqr / self.weight, max(self.trace / self.weight, 0.0))

    @property
    def ready(self) -> bool:
        return self.count > 0 and self.weight > 0

    def values(self) -> tuple[float, float]:
        """Smoothed (|G|², tr Σ), with tr >= 0; while the smoothed |G|² is <= 0, the last
        values that had it positive.

        An EMA of |G|² at or below zero means noise swamped the window, not that the noise
        scale is infinite: clamping it to ~0 made φ 1e32 on the examples (issue 19), so
        AdaScale scaled the LR linearly and the agent took the largest batch allowed.
        """
        if not self.ready:
            return 0.0, 0.0
        sqr, trace = self.sqr / self.weight, max(self.trace / self.weight, 0.0)
        if sqr > _TINY:
            return sqr, trace
        return self._held if self._held is not None else (_TINY, trace)

    def errors(self) -> tuple[float, float]:
        """Standard errors of the smoothed (|G|², tr Σ); infinite after one reading (no
        spread to judge it by)."""
        if self.count < 2 or self.weight <= 0:
            return float("inf"), float("inf")
        share = self.weight2 / (self.weight * self.weight)  # Σ wᵢ² / W²: 1 / n_eff

        def err(first: float, second: float) -> float:
            mean = first / self.weight
            return (max(second / self.weight - mean * mean, 0.0) * share) ** 0.5

        return err(self.sqr, self.sqr2), err(self.trace, self.trace2)

    def grad_params(self, init_batch_size: int) -> GradParams | None:
        if not self.ready:
            return None
        sqr, trace = self.values()
        sqr_err, trace_err = self.errors()
        return GradParams(
            sqr=sqr,
            var=trace / init_batch_size,
            sqr_err=sqr_err,
            var_err=trace_err / init_batch_size,
        )

    def pgns(self) -> float:
        """φ = tr Σ / |G|² in samples (NaN before the first measurement)."""
        if not self.ready:
            return float("nan")
        sqr, trace = self.values()
        return trace / sqr

    def state_dict(self) -> dict[str, Any]:
        return {
            "smoothing": self.smoothing,
            "sqr": self.sqr,
            "trace": self.trace,
            "weight": self.weight,
            "count": self.count,
            "held": list(self._held) if self._held is not None else None,
            "sqr2": self.sqr2,
            "trace2": self.trace2,
            "weight2": self.weight2,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sqr, self.trace = float(state["sqr"]), float(state["trace"])
        self.weight, self.count = float(state["weight"]), int(state["count"])
        held = state.get("held")
        self._held = (float(held[0]), float(held[1])) if held else None
        # A checkpoint from before the errors were kept: no spread, so errors of 0 (the
        # estimate taken as exact, as the agent did then) until new readings add spread.
        self.sqr2 = float(state.get("sqr2", self.sqr * self.sqr / max(self.weight, _TINY)))
        self.trace2 = float(state.get("trace2", self.trace * self.trace / max(self.weight, _TINY)))
        self.weight2 = float(state.get("weight2", self.weight * self.weight))
