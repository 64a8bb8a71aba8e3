"""Unbiased gradient-noise statistics from gradients the job computes anyway.

Let G be the true (pre-conditioned) gradient and Σ the per-sample gradient covariance, so a
mean of b i.i.d. per-sample gradients has ``E|g_b|² = |G|² + tr(Σ)/b``. Training produces n
such "pieces" of b samples each — the K replicas' local gradients before the all-reduce, or
the s + 1 micro-batches of one replica, or two consecutive steps — and their mean ḡ over
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


def sq_norm(tensors: list[torch.Tensor], pinv: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Σ |t / pinv|² over a list of tensors with fused (foreach) kernels, as a 0-d tensor."""
    if not tensors:
        return torch.zeros(())
    if pinv is not None:
        tensors = list(torch._foreach_div(tensors, pinv))
    norms = torch._foreach_norm(tensors)
    return torch.stack(list(norms)).square().sum()


class GradNoiseEMA:
    """Bias-corrected EMA of |G|² and tr Σ (per sample); yields :class:`GradParams`."""

    def __init__(self, smoothing: float = 0.9) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.sqr = 0.0
        self.trace = 0.0
        self.weight = 0.0  # 1 - smoothing**count, the bias correction
        self.count = 0

    def update(self, sqr: float, trace: float) -> None:
        if not (abs(sqr) < float("inf") and abs(trace) < float("inf")):
            return  # a NaN/inf gradient (e.g. an AMP overflow) says nothing about noise
        a = self.smoothing
        self.sqr = a * self.sqr + (1 - a) * sqr
        self.trace = a * self.trace + (1 - a) * trace
        self.weight = a * self.weight + (1 - a)
        self.count += 1

    @property
    def ready(self) -> bool:
        return self.count > 0 and self.weight > 0

    def values(self) -> tuple[float, float]:
        """Smoothed (|G|², tr Σ), clamped to sqr > 0 and tr >= 0."""
        if not self.ready:
            return 0.0, 0.0
        return max(self.sqr / self.weight, _TINY), max(self.trace / self.weight, 0.0)

    def grad_params(self, init_batch_size: int) -> GradParams | None:
        if not self.ready:
            return None
        sqr, trace = self.values()
        return GradParams(sqr=sqr, var=trace / init_batch_size)

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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sqr, self.trace = float(state["sqr"]), float(state["trace"])
        self.weight, self.count = float(state["weight"]), int(state["count"])
