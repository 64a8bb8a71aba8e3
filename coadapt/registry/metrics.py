"""The metrics and drift statistics a gate can bound, as pure NumPy functions.

``predictions`` are the model's outputs on the replayed requests, ``[rows, outputs]``. With
one output a row is a binary score (a probability, or a logit when the gate config says
``logits: true``); with several, one score per class (probabilities or logits). ``labels``
are class indices or 0/1 for classification, targets of the predictions' shape for ``mse``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_EPS = 1e-12
Array = NDArray[np.float64]


class MetricError(ValueError):
    """Predictions and labels that a metric cannot be computed on; says why."""


def probabilities(pred: Array, logits: bool) -> Array:
    """Scores as probabilities: sigmoid (one output) or softmax (several) of logits."""
    if not logits:
        return pred
    if pred.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-pred))
    z = pred - pred.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _classes(labels: NDArray[np.generic], n: int) -> NDArray[np.int64]:
    flat = np.asarray(labels).reshape(n, -1)
    if flat.shape[1] != 1:
        raise MetricError(f"labels must hold one class per row, got shape {labels.shape}")
    out = flat[:, 0]
    if not np.all(np.equal(np.mod(out, 1), 0)):
        raise MetricError("labels must be whole class numbers for this metric")
    return out.astype(np.int64)


def accuracy(pred: Array, labels: NDArray[np.generic], logits: bool) -> float:
    """Share of rows whose predicted class (argmax, or score ≥ 0.5 with one output) is right."""
    y = _classes(labels, len(pred))
    p = probabilities(pred, logits)
    guess = (p[:, 0] >= 0.5).astype(np.int64) if p.shape[1] == 1 else p.argmax(axis=1)
    return float(np.mean(guess == y))


def auc(pred: Array, labels: NDArray[np.generic], logits: bool) -> float:
    """ROC AUC of a binary score (the one output, or the second of two), ties averaged."""
    y = _classes(labels, len(pred))
    if pred.shape[1] == 1:
        score = pred[:, 0]
    elif pred.shape[1] == 2:
        score = probabilities(pred, logits)[:, 1]
    else:
        raise MetricError(f"auc needs one or two outputs per row, the model gives {pred.shape[1]}")
    if not np.isin(y, (0, 1)).all():
        raise MetricError("auc needs 0/1 labels")
    pos, neg = int(y.sum()), int(len(y) - y.sum())
    if pos == 0 or neg == 0:
        raise MetricError("auc needs both classes among the replayed labels")
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score), dtype=np.float64)
    sorted_scores = score[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(pred: Array, labels: NDArray[np.generic], logits: bool) -> float:
    """Mean negative log-likelihood of the right class (probabilities clipped at 1e-12)."""
    y = _classes(labels, len(pred))
    p = probabilities(pred, logits)
    if p.shape[1] == 1:
        if not np.isin(y, (0, 1)).all():
            raise MetricError("log_loss with one output needs 0/1 labels")
        q = np.clip(p[:, 0], _EPS, 1 - _EPS)
        return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))
    if y.min() < 0 or y.max() >= p.shape[1]:
        raise MetricError(f"labels must lie in 0..{p.shape[1] - 1}")
    q = np.clip(p[np.arange(len(y)), y], _EPS, 1.0)
    return float(-np.mean(np.log(q)))


def mse(pred: Array, labels: NDArray[np.generic], logits: bool) -> float:
    """Mean squared error against targets of the predictions' shape (or one per row)."""
    t = np.asarray(labels, dtype=np.float64).reshape(len(pred), -1)
    if t.shape[1] not in (1, pred.shape[1]):
        raise MetricError(f"targets have {t.shape[1]} values per row, predictions {pred.shape[1]}")
    return float(np.mean((pred - t) ** 2))


METRIC_FUNCTIONS = {"accuracy": accuracy, "auc": auc, "log_loss": log_loss, "mse": mse}


def drift(new: Array, live: Array, stat: str) -> float:
    """How far two versions' predictions on the same rows lie apart: mean or max of |Δ|."""
    if new.shape != live.shape:
        raise MetricError(f"predictions of shape {new.shape} vs the live version's {live.shape}")
    diff = np.abs(new - live)
    if stat == "mean_abs":
        return float(diff.mean()) if diff.size else 0.0
    if stat == "max_abs":
        return float(diff.max()) if diff.size else 0.0
    raise MetricError(f"unknown drift statistic {stat!r}")
