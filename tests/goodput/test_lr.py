"""LR scaling rules against hand-computed values."""

from __future__ import annotations

import pytest

from coadapt.goodput import GradParams, LRRule, adascale_gain, lr_factor


def test_adascale_gain_hand_computed() -> None:
    # S = 4, var = 4, sqr = 1: (4 + 1) / (4 / 4 + 1) = 2.5
    assert adascale_gain(GradParams(1.0, 4.0), 32, 128) == pytest.approx(2.5)
    # no noise -> gain 1 (no benefit from a bigger batch); pure noise -> gain S
    assert adascale_gain(GradParams(1.0, 0.0), 32, 128) == pytest.approx(1.0)
    assert adascale_gain(GradParams(0.0, 1.0), 32, 128) == pytest.approx(4.0)
    assert adascale_gain(None, 32, 128) == 1.0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (LRRule.SQRT, 2.0),
        ("sqrt", 2.0),
        (LRRule.LINEAR, 4.0),
        ("none", 1.0),
        (LRRule.ADASCALE, 2.5),
    ],
)
def test_lr_factor_rules(rule: LRRule | str, expected: float) -> None:
    assert lr_factor(rule, 32, 128, GradParams(1.0, 4.0)) == pytest.approx(expected)


def test_user_function() -> None:
    assert lr_factor(lambda m0, m: (m / m0) ** 0.25, 32, 512) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="finite positive"):
        lr_factor(lambda m0, m: -1.0, 32, 64)


def test_unknown_rule_lists_accepted() -> None:
    with pytest.raises(ValueError, match="adascale, adascale-sqrt, sqrt, linear, none"):
        lr_factor("cubic", 32, 64)


def test_adascale_sqrt_is_the_gain_capped_at_the_square_root_rule() -> None:
    low_noise = GradParams(1.0, 1.0)  # gain (1 + 1) / (1 / 4 + 1) = 1.6 < sqrt(4)
    assert lr_factor(LRRule.ADASCALE_SQRT, 32, 128, low_noise) == pytest.approx(1.6)
    pure_noise = GradParams(0.0, 1.0)  # AdaScale says linear (4); the cap says 2
    assert lr_factor(LRRule.ADASCALE_SQRT, 32, 128, pure_noise) == pytest.approx(2.0)
    assert lr_factor("adascale-sqrt", 32, 128, None) == 1.0  # no statistics yet
