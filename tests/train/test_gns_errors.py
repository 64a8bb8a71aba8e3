"""The noise EMA's standard errors, which the agent uses to act only on what φ can tell."""

from __future__ import annotations

import math
import random

import pytest

from coadapt.train.gns import GradNoiseEMA


def test_errors_match_the_spread_of_the_readings() -> None:
    """Readings with a known spread: the error is σ·sqrt(Σw²)/W, ~σ/sqrt(19) for a long EMA."""
    rng = random.Random(0)
    errs = []
    for _ in range(200):
        ema = GradNoiseEMA(0.9)
        for _ in range(200):
            ema.update(2.0 + rng.gauss(0.0, 1.0), 50.0 + rng.gauss(0.0, 10.0))
        errs.append(ema.errors())
    sqr_err = sum(e[0] for e in errs) / len(errs)
    trace_err = sum(e[1] for e in errs) / len(errs)
    n_eff = (1 + 0.9) / (1 - 0.9)  # (Σw)² / Σw² of an infinite EMA
    assert sqr_err == pytest.approx(1.0 / math.sqrt(n_eff), rel=0.1)
    assert trace_err == pytest.approx(10.0 / math.sqrt(n_eff), rel=0.1)


def test_errors_shrink_with_readings_and_are_infinite_after_one() -> None:
    ema = GradNoiseEMA(0.9)
    ema.update(1.0, 10.0)
    assert ema.errors() == (math.inf, math.inf)
    for x in (3.0, -1.0, 2.0, 0.0, 1.5, 0.5, 1.0):
        ema.update(x, 10.0 + x)
    early = ema.errors()[0]
    for x in (3.0, -1.0, 2.0, 0.0, 1.5, 0.5, 1.0) * 6:
        ema.update(x, 10.0 + x)
    assert 0 < ema.errors()[0] < early
    grad = ema.grad_params(32)
    assert grad is not None
    assert grad.sqr_err == pytest.approx(ema.errors()[0])
    assert grad.var_err == pytest.approx(ema.errors()[1] / 32)


def test_identical_readings_have_no_error() -> None:
    ema = GradNoiseEMA(0.9)
    for _ in range(5):
        ema.update(2.0, 8.0)
    assert ema.errors() == pytest.approx((0.0, 0.0), abs=1e-9)


def test_checkpoint_round_trip_and_a_checkpoint_without_errors() -> None:
    ema = GradNoiseEMA(0.9)
    for x in (1.0, 3.0, 2.0, 0.5):
        ema.update(x, 5 * x)
    restored = GradNoiseEMA(0.9)
    restored.load_state_dict(ema.state_dict())
    assert restored.errors() == pytest.approx(ema.errors())
    old = {k: v for k, v in ema.state_dict().items() if k not in ("sqr2", "trace2", "weight2")}
    legacy = GradNoiseEMA(0.9)
    legacy.load_state_dict(old)
    assert legacy.values() == pytest.approx(ema.values())
    assert legacy.errors() == pytest.approx((0.0, 0.0), abs=1e-9)  # taken as exact, as then
