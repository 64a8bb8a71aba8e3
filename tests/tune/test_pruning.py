"""Early-stopping decisions on crafted curves, and learning-curve extrapolation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coadapt.tune.curves import extrapolate
from coadapt.tune.pruning import Curve, asha_rungs, decide
from coadapt.tune.spec import EarlyStopping


def saturating(c: float, a: float, alpha: float, steps: range) -> list[tuple[float, float]]:
    """An accuracy-like pow3 curve c - a * step^-alpha."""
    return [(float(s), c - a * s**-alpha) for s in steps]


ASHA = EarlyStopping(rule="asha", grace_steps=1, reduction_factor=3, min_peers=3)
MEDIAN = EarlyStopping(rule="median", grace_steps=2, min_peers=3)
CURVE = EarlyStopping(rule="curve", theta=0.3)


# -- asha --------------------------------------------------------------------------------------
def test_asha_rungs() -> None:
    assert asha_rungs(ASHA, 30, 100) == [1, 3, 9, 27]
    assert asha_rungs(ASHA, 27, 100) == [1, 3, 9]  # the last step is the end, not a rung
    assert asha_rungs(EarlyStopping(rule="asha", grace_steps=2, reduction_factor=2), None, 10) == [
        2,
        4,
        8,
    ]


def test_asha_stops_a_bad_trial_at_its_rung() -> None:
    peers = [saturating(0.9, 0.5, 0.5, range(1, 10)) for _ in range(5)]
    bad = [(float(s), 0.1) for s in range(1, 4)]  # reached rung 3
    d = decide(ASHA, "maximize", 30, bad, peers, None)
    assert d.stop and "rung 3" in d.reason


def test_asha_keeps_the_top_third() -> None:
    peers = [[(float(s), v) for s in range(1, 4)] for v in (0.2, 0.3, 0.4, 0.5, 0.6)]
    good = [(float(s), 0.7) for s in range(1, 4)]
    assert not decide(ASHA, "maximize", 30, good, peers, None).stop
    # 7 values at the rung (with the good one): the top 7 // 3 = 2 go on; 0.55 is third.
    third = [(float(s), 0.55) for s in range(1, 4)]
    assert decide(ASHA, "maximize", 30, third, [*peers, good], None).stop
    assert not decide(ASHA, "maximize", 30, third, peers, None).stop  # second of 6
    # minimising, the same values rank the other way round
    assert not decide(ASHA, "minimize", 30, [(1.0, 0.1), (3.0, 0.1)], peers, None).stop
    assert decide(ASHA, "minimize", 30, good, peers, None).stop


def test_asha_needs_peers_at_the_rung() -> None:
    short_peers = [[(1.0, 0.9), (2.0, 0.9)] for _ in range(5)]  # none reached step 3
    bad = [(float(s), 0.1) for s in range(1, 4)]
    d = decide(ASHA, "maximize", 30, bad, short_peers, None)
    assert not d.stop and "0 peer(s) at rung 3" in d.reason
    two = [[(float(s), 0.9) for s in range(1, 4)] for _ in range(2)]
    assert not decide(ASHA, "maximize", 30, bad, two, None).stop


def test_asha_before_the_first_rung_and_at_the_end() -> None:
    rule = EarlyStopping(rule="asha", grace_steps=4)
    peers = [[(float(s), 0.9) for s in range(1, 20)] for _ in range(5)]
    assert not decide(rule, "maximize", 30, [(1.0, 0.0), (2.0, 0.0)], peers, None).stop
    finished = [(float(s), 0.0) for s in range(1, 31)]
    assert not decide(rule, "maximize", 30, finished, peers, None).stop


# -- median ------------------------------------------------------------------------------------
def test_median_stops_below_the_median() -> None:
    peers = [saturating(c, 0.4, 0.7, range(1, 21)) for c in (0.8, 0.85, 0.9, 0.95)]
    bad = saturating(0.5, 0.4, 0.7, range(1, 6))
    d = decide(MEDIAN, "maximize", None, bad, peers, None)
    assert d.stop and "median" in d.reason


def test_median_continues_a_good_trial() -> None:
    peers = [saturating(c, 0.4, 0.7, range(1, 21)) for c in (0.8, 0.85, 0.9, 0.95)]
    good = saturating(0.97, 0.4, 0.7, range(1, 6))
    assert not decide(MEDIAN, "maximize", None, good, peers, None).stop
    # a loss curve, minimised
    losses = [[(float(s), v / s) for s in range(1, 10)] for v in (1.0, 2.0, 3.0)]
    assert not decide(MEDIAN, "minimize", None, [(1.0, 0.5), (5.0, 0.1)], losses, None).stop
    assert decide(MEDIAN, "minimize", None, [(1.0, 5.0), (5.0, 4.0)], losses, None).stop


def test_median_uses_the_best_so_far() -> None:
    peers = [[(float(s), 0.6) for s in range(1, 10)] for _ in range(3)]
    dipped = [(1.0, 0.5), (2.0, 0.7), (3.0, 0.4)]  # best 0.7 beats the median 0.6
    assert not decide(MEDIAN, "maximize", None, dipped, peers, None).stop


def test_median_too_few_peers_or_grace() -> None:
    bad = [(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)]
    peers = [[(float(s), 0.9) for s in range(1, 10)] for _ in range(2)]
    assert not decide(MEDIAN, "maximize", None, bad, peers, None).stop
    behind = [[(1.0, 0.9)] for _ in range(5)]  # the peers have not reached step 3
    assert not decide(MEDIAN, "maximize", None, bad, behind, None).stop
    grace = EarlyStopping(rule="median", grace_steps=5, min_peers=1)
    assert not decide(grace, "maximize", None, bad, peers, None).stop


# -- curve (EarlyCurve) ------------------------------------------------------------------------
def test_curve_stops_a_plateau_below_the_best() -> None:
    plateau = [(float(s), 0.6 - 0.3 * math.exp(-s)) for s in range(1, 11)]  # saturated at 0.6
    d = decide(CURVE, "maximize", 30, plateau, [], 0.95)
    assert d.stop and "cannot beat" in d.reason


def test_curve_continues_a_curve_that_may_beat_the_best() -> None:
    rising = saturating(0.98, 0.6, 0.6, range(1, 11))  # 0.83 at step 10, 0.902 at step 30
    assert rising[-1][1] < 0.89
    d = decide(CURVE, "maximize", 30, rising, [], 0.89)
    assert not d.stop and "may beat" in d.reason
    # ... but not a best of 0.95, which it will not reach by step 30
    assert decide(CURVE, "maximize", 30, rising, [], 0.95).stop


def test_curve_minimize() -> None:
    loss = [(float(s), 0.5 + 2.0 * math.exp(-0.5 * s)) for s in range(1, 11)]  # → 0.5
    assert decide(CURVE, "minimize", 30, loss, [], 0.2).stop
    assert not decide(CURVE, "minimize", 30, loss, [], 0.6).stop


def test_curve_waits_for_theta_and_a_best() -> None:
    plateau = [(float(s), 0.3) for s in range(1, 9)]  # 8 < 0.3 * 30
    d = decide(CURVE, "maximize", 30, plateau, [], 0.95)
    assert not d.stop and "theta" in d.reason
    later = [(float(s), 0.3 + 0.001 * s) for s in range(1, 12)]
    assert not decide(CURVE, "maximize", 30, later, [], None).stop
    assert decide(CURVE, "maximize", 30, later, [], 0.95).stop


def test_curve_needs_points_and_keeps_a_trial_already_at_the_best() -> None:
    sparse = [(1.0, 0.1), (10.0, 0.2)]
    d = decide(CURVE, "maximize", 30, sparse, [], 0.95)
    assert not d.stop and "need 3" in d.reason
    ahead = [(float(s), 0.96) for s in range(1, 11)]
    assert not decide(CURVE, "maximize", 30, ahead, [], 0.95).stop


def test_rule_none_and_bad_direction() -> None:
    bad: Curve = [(1.0, 0.0), (2.0, 0.0)]
    assert not decide(EarlyStopping(), "maximize", 10, bad, [bad] * 5, 1.0).stop
    assert not decide(ASHA, "maximize", 10, [], [bad] * 5, 1.0).stop
    with pytest.raises(ValueError):
        decide(ASHA, "up", 10, bad, [], None)


# -- extrapolation -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("c", "a", "alpha", "n", "at"),
    [(0.9, 0.5, 0.7, 30, 1000), (0.95, 0.6, 1.2, 12, 100), (0.8, 0.8, 0.4, 40, 200)],
)
def test_extrapolate_recovers_a_pow3_curve(
    c: float, a: float, alpha: float, n: int, at: int
) -> None:
    curve = saturating(c, a, alpha, range(1, n + 1))
    truth = c - a * at**-alpha
    pred = extrapolate(curve, at)
    assert abs(pred.mean - truth) < 0.02
    assert pred.low <= truth <= pred.high


def test_extrapolate_exponential_loss_from_step_zero_with_noise() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(0, 15)
    values = 0.2 + 2.0 * np.exp(-0.4 * steps) + rng.normal(0.0, 0.01, len(steps))
    pred = extrapolate(list(zip(steps.tolist(), values.tolist(), strict=True)), 60)
    assert abs(pred.mean - 0.2) < 0.05
    assert pred.low < pred.mean < pred.high


def test_extrapolate_short_and_flat_curves() -> None:
    three = extrapolate([(1, 0.3), (2, 0.5), (3, 0.6)], 10)
    assert three.low < 0.6 < three.high and three.high - three.low > 0.1  # honest about it
    flat = extrapolate([(s, 0.5) for s in range(1, 6)], 50)
    assert flat.mean == flat.low == flat.high == 0.5
    one = extrapolate([(1, 0.4)], 10)
    assert one.mean == 0.4
    assert extrapolate([(1, 0.1), (2, float("nan")), (3, 0.3), (4, 0.35)], 10).mean > 0.3
    with pytest.raises(ValueError):
        extrapolate([], 10)
