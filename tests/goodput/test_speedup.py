"""SPEEDUP (eq. 16) relative to a reference allocation."""

from __future__ import annotations

import numpy as np
import pytest

from coadapt.goodput import BatchLimits, GoodputModel, GradParams, PerfParams, SpeedupFunction

MODEL = GoodputModel(PerfParams(0.05, 0.001, 0.05, 0.005, 0.2, 0.02, 1.5), GradParams(1, 30), 32)
LIMITS = BatchLimits(32, 4096, 8, 256)


def test_speedup_is_one_at_the_reference() -> None:
    fn = SpeedupFunction(MODEL, LIMITS, ref_nodes=1, ref_replicas=4)
    assert float(fn(1, 4)) == pytest.approx(1.0)
    expected = MODEL.optimize(2, 8, LIMITS).goodput / MODEL.optimize(1, 4, LIMITS).goodput
    assert float(fn(2, 8)) == pytest.approx(float(expected))


def test_no_model_means_perfect_scaling() -> None:
    fn = SpeedupFunction(None, LIMITS, ref_nodes=1, ref_replicas=4)
    np.testing.assert_allclose(fn([1, 1, 2], [2, 4, 8]), [0.5, 1.0, 2.0])
    assert fn.scalar(1, 0) == 0.0


def test_zero_replicas_zero_speedup_and_memo_consistency() -> None:
    fn = SpeedupFunction(MODEL, LIMITS, prefetch=(np.array([1, 1]), np.array([2, 4])))
    first = fn([0, 1, 1], [0, 2, 4])
    assert first[0] == 0.0
    assert fn.scalar(1, 4) == pytest.approx(float(first[2]))


def test_bad_reference_rejected() -> None:
    with pytest.raises(ValueError, match="reference"):
        SpeedupFunction(MODEL, LIMITS, ref_nodes=2, ref_replicas=1)
