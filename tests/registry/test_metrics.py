"""The gate metrics against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.registry.metrics import MetricError, accuracy, auc, drift, log_loss, mse


def col(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64).reshape(-1, 1)


def test_auc_counts_ordered_pairs_and_halves_ties() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(col(0.1, 0.4, 0.35, 0.8), y, False) == 0.75  # 3 of 4 pairs ordered
    assert auc(col(0.5, 0.5, 0.5, 0.5), y, False) == 0.5
    assert auc(col(0.1, 0.2, 0.3, 0.4), y, True) == 1.0  # logits rank the same
    two = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.3, 0.7]])
    assert auc(two, y, False) == 1.0
    with pytest.raises(MetricError, match="both classes"):
        auc(col(0.1, 0.2), np.array([1, 1]), False)


def test_accuracy_log_loss_mse() -> None:
    y = np.array([1, 0, 1, 0])
    assert accuracy(col(0.9, 0.2, 0.4, 0.6), y, False) == 0.5
    assert accuracy(col(3.0, -2.0, 0.5, -0.1), y, True) == 1.0
    multi = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    assert accuracy(multi, np.array([0, 1]), False) == 0.5
    expected = -(math.log(0.8) + math.log(0.5)) / 2
    assert log_loss(col(0.8, 0.5), np.array([1, 0]), False) == pytest.approx(expected)
    soft = log_loss(np.array([[0.0, 0.0]]), np.array([1]), True)
    assert soft == pytest.approx(math.log(2))
    assert mse(col(1.0, 2.0), np.array([0.0, 0.0]), False) == 2.5
    with pytest.raises(MetricError, match="whole class numbers"):
        accuracy(col(0.5), np.array([0.5]), False)


def test_drift() -> None:
    a, b = col(0.0, 1.0, 2.0), col(0.5, 1.0, 1.0)
    assert drift(a, b, "mean_abs") == 0.5 and drift(a, b, "max_abs") == 1.0
    with pytest.raises(MetricError, match="shape"):
        drift(a, col(1.0), "max_abs")
